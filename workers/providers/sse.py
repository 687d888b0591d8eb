"""Server-sent events read straight off a streaming HTTP response, for the providers' hot loop.

The ``data:`` payloads come as bytes, one list per network read: the consumer's generator is resumed
once per read instead of once per line, and orjson parses the bytes without a decode — this loop runs
once per streamed token, so its cost is the provider layer's cost (bench/providers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

DRAIN_S: Final = 1.0


async def data_batches(resp: Any) -> AsyncIterator[list[bytes]]:
    """The ``data:`` payloads of ``resp``'s event stream (comments, ``event:`` lines and blanks skipped)."""
    rest = b""
    async for chunk in resp.aiter_bytes():
        if rest:
            chunk = rest + chunk
        lines = chunk.split(b"\n")
        rest = lines.pop()
        batch = [line[5:] for line in lines if line.startswith(b"data:")]
        if batch:
            yield batch
    if rest.startswith(b"data:"):
        yield [rest[5:]]


async def drain(batches: AsyncIterator[list[bytes]]) -> None:
    """Read to the end of the body so the kept-alive connection goes back to the pool; a server that
    holds the stream open after the last event gets a short grace, then the connection is dropped."""
    with contextlib.suppress(Exception):  # the answer is complete; a broken tail is harmless
        async with asyncio.timeout(DRAIN_S):
            async for _ in batches:
                pass


def text(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()
