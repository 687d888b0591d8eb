"""A small Anthropic Messages API server for tests (asyncio, 127.0.0.1, ephemeral port).

Each POST to ``/v1/messages`` takes the next scripted ``Reply`` (or ``default``) and records the request.
A reply streams, in order: ``message_start`` (with ``usage``), a thinking block (``thinking`` chunks and a
``signature``), a text block (``text_chunks``), one ``tool_use`` block per entry of ``tool_calls`` (their
``input_json_delta`` parts), ``message_delta`` (``stop_reason``, output tokens) and ``message_stop``.

- ``status``/``body``/``headers``: an HTTP error (e.g. 429 with ``retry-after``, 529 overloaded)
- ``content_type``/``body`` with status 200: a non-stream answer (an HTML page)
- ``disconnect_after=n``: the connection is cut after n events; ``raw_lines``: bytes sent verbatim
- ``error_event``: an ``event: error`` is sent after the text block instead of the rest
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    text_chunks: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    signature: str = "sig-1"
    tool_calls: list[tuple[str, str, list[str]]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 10, "output_tokens": 5})
    stop_reason: str | None = None
    status: int = 200
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream"
    disconnect_after: int | None = None
    raw_lines: list[bytes] | None = None
    error_event: dict[str, Any] | None = None


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def events(reply: Reply) -> list[tuple[str, dict[str, Any]]]:
    """The (event name, data) sequence of one streamed reply."""
    start_usage = {k: v for k, v in reply.usage.items() if k != "output_tokens"} | {"output_tokens": 1}
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "usage": start_usage}})]
    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        out.extend(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas)
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1

    if reply.thinking:
        block({"type": "thinking", "thinking": ""},
              [{"type": "thinking_delta", "thinking": t} for t in reply.thinking]
              + [{"type": "signature_delta", "signature": reply.signature}])
    if reply.text_chunks:
        block({"type": "text", "text": ""}, [{"type": "text_delta", "text": t} for t in reply.text_chunks])
    if reply.error_event is not None:
        out.append(("error", {"type": "error", "error": reply.error_event}))
        return out
    for cid, name, parts in reply.tool_calls:
        block({"type": "tool_use", "id": cid, "name": name, "input": {}},
              [{"type": "input_json_delta", "partial_json": p} for p in parts])
    stop = reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")
    out.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": reply.usage.get("output_tokens", 0)}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


class AnthropicStub:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.default = Reply(text_chunks=["ok"])
        self.requests: list[Recorded] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> AnthropicStub:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(Recorded(path, headers, json.loads(body or b"{}")))
            await self._respond(self.replies.popleft() if self.replies else self.default, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _respond(self, reply: Reply, writer: asyncio.StreamWriter) -> None:
        if reply.status != 200 or reply.content_type != "text/event-stream":
            data = reply.body.encode()
            ctype = "application/json" if reply.status != 200 and reply.body.startswith("{") else reply.content_type
            extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
            writer.write(f"HTTP/1.1 {reply.status} X\r\nContent-Type: {ctype}\r\n{extra}"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        if reply.raw_lines is not None:
            for line in reply.raw_lines:
                writer.write(line)
            await writer.drain()
            return
        for i, (name, data) in enumerate(events(reply)):
            if reply.disconnect_after is not None and i >= reply.disconnect_after:
                await writer.drain()
                writer.transport.abort()
                return
            writer.write(sse(name, data))
        await writer.drain()
