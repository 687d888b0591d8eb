"""The providers' event-stream reader: data payloads found across any read boundaries, the body's head kept,
and a body without events described."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from hypothesis import given, settings
from hypothesis import strategies as st

from legion.workers.providers.errors import no_events
from legion.workers.providers.sse import HEAD_BYTES, data_batches

LINE = st.one_of(st.binary(max_size=40).map(lambda b: b"data:" + b.replace(b"\n", b"")),
                 st.sampled_from([b"", b": keep-alive", b"event: message_start", b"id: 7", b"data: [DONE]"]),
                 st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"")))


class _Resp:
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for r in self.reads:
            yield r


def _read(reads: list[bytes]) -> tuple[list[bytes], bytes]:
    async def go() -> tuple[list[bytes], bytes]:
        head = bytearray()
        out = [data async for batch in data_batches(_Resp(reads), head) for data in batch]
        return out, bytes(head)
    return asyncio.run(go())


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(LINE, max_size=30), crlf=st.booleans(), cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_payloads_and_head_whatever_the_reads(lines: list[bytes], crlf: bool, cuts: list[int]) -> None:
    body = (b"\r\n" if crlf else b"\n").join(lines)
    bounds = sorted({0, len(body), *(c for c in cuts if c < len(body))})
    reads = [body[a:b] for a, b in itertools.pairwise(bounds)]
    got, head = _read(reads)
    assert got == [line[5:] for line in body.split(b"\n") if line.startswith(b"data:")]
    assert head == body[:HEAD_BYTES]


def test_a_body_without_events_says_what_came_instead() -> None:
    url = "http://h/v1/chat/completions"
    html = no_events(b"\n<!DOCTYPE html><html><body>Sign in</body></html>", "p", url)
    assert html and "HTML page instead of an event stream" in html and url in html and "baseUrl" in html
    whole = no_events(b'{"choices": [{"message": {"content": "hi"}}]}', "p", url)
    assert whole and "no server-sent events but: {\"choices\"" in whole
    assert no_events(b": keep-alive\n\n", "p", url) is None  # a stream, cut short: said elsewhere
    assert no_events(b"data: {\"a\": 1", "p", url) is None and no_events(b"", "p", url) is None
