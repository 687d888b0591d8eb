"""Server-sent events read straight off a streaming HTTP response, for the providers' hot loop.

The ``data:`` payloads come as bytes, one list per network read: the consumer's generator is resumed
once per read instead of once per line, and orjson parses the bytes without a decode — this loop runs
once per streamed token, so its cost is the provider layer's cost (bench/providers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any, Final

DRAIN_S: Final = 1.0


DATA_LINE: Final = re.compile(rb"^data:(.*)", re.MULTILINE)  # one C call per read, not a Python loop per line


HEAD_BYTES: Final = 512


async def data_batches(resp: Any, head: bytearray | None = None) -> AsyncIterator[list[bytes]]:
    """The ``data:`` payloads of ``resp``'s event stream (comments, ``event:`` lines and blanks skipped);
    ``head`` receives the body's first bytes, so a body with no events can be described."""
    rest = b""
    async for chunk in resp.aiter_bytes():
        if head is not None and len(head) < HEAD_BYTES:
            head += chunk[:HEAD_BYTES - len(head)]
        if rest:
            chunk = rest + chunk
        end = chunk.rfind(b"\n") + 1  # the complete lines; the tail waits for the next read
        rest = chunk[end:]
        batch = DATA_LINE.findall(chunk, 0, end) if end else None
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
