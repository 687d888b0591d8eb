"""A small OpenAI-compatible chat-completions server for tests (asyncio, 127.0.0.1, ephemeral port).

Each POST to ``/v1/chat/completions`` takes the next scripted ``Reply`` from the queue (or the
``default``) and records the request (path, headers, JSON body) in ``requests``.

Reply kinds:
- ``Reply(text_chunks=[...])`` — streamed content deltas, then ``finish_reason: stop``
- ``Reply(tool_calls=[(id, name, [arg chunk, …]), …])`` — streamed tool-call deltas, ``tool_calls`` finish
- ``Reply(status=500, body="…")`` — an HTTP error response
- ``Reply(..., chunk_delay=0.2)`` — a slow stream
- ``Reply(..., disconnect_after=2)`` — the connection is cut after that many chunks (no finish, no DONE)
- ``usage=(prompt, completion)`` — a final usage chunk (``stream_options.include_usage``)
- ``Reply(raw_lines=[b"data: {bad\\n\\n"])`` — bytes sent verbatim (malformed streams)
- ``reasoning_chunks`` (``reasoning_content`` deltas first), ``refusal`` (a refusal delta), ``cached``
  (``prompt_tokens_details.cached_tokens``), ``headers`` on an error reply (``retry-after``), and
  ``content_type`` for a 200 answer that is not an event stream (an HTML page in ``body``)

``keep_alive = True`` serves plain replies (no delay, disconnect or raw lines) with a Content-Length and
keeps the connection open for the next request; ``connections`` counts accepted TCP connections.
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
    tool_calls: list[tuple[str, str, list[str]]] = field(default_factory=list)
    status: int = 200
    body: str = ""
    chunk_delay: float = 0.0
    disconnect_after: int | None = None
    usage: tuple[int, int] | None = (10, 5)
    finish: str | None = None
    raw_lines: list[bytes] | None = None  # sent verbatim instead of generated chunks (malformed streams)
    reasoning_chunks: list[str] = field(default_factory=list)
    refusal: str | None = None
    cached: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream"


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class OpenAIStub:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.default = Reply(text_chunks=["ok"])
        self.requests: list[Recorded] = []
        self.keep_alive = False
        self.connections = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> OpenAIStub:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                _method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append(Recorded(path, headers, json.loads(body or b"{}")))
                reply = self.replies.popleft() if self.replies else self.default
                if not (self.keep_alive and reply.status == 200 and reply.raw_lines is None
                        and reply.disconnect_after is None and not reply.chunk_delay):
                    await self._respond(reply, writer)
                    return
                data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in self._chunks(reply))
                data += b"data: [DONE]\n\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _respond(self, reply: Reply, writer: asyncio.StreamWriter) -> None:
        if reply.status != 200 or reply.content_type != "text/event-stream":
            data = reply.body.encode()
            ctype = "application/json" if reply.body.startswith("{") else reply.content_type
            extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
            writer.write(f"HTTP/1.1 {reply.status} Error\r\nContent-Type: {ctype}\r\n{extra}"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Connection: close\r\n\r\n")
        if reply.raw_lines is not None:
            for line in reply.raw_lines:
                writer.write(line)
            await writer.drain()
            return
        chunks = self._chunks(reply)
        for i, chunk in enumerate(chunks):
            if reply.disconnect_after is not None and i >= reply.disconnect_after:
                writer.transport.abort()
                return
            if i and reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await writer.drain()
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()

    @staticmethod
    def _chunks(reply: Reply) -> list[dict[str, Any]]:
        def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": "c1", "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        out = [choice({"role": "assistant", "reasoning_content": t}) for t in reply.reasoning_chunks]
        out += [choice({"role": "assistant", "content": t}) for t in reply.text_chunks]
        if reply.refusal:
            out.append(choice({"refusal": reply.refusal}))
        for idx, (cid, name, parts) in enumerate(reply.tool_calls):
            out.append(choice({"tool_calls": [{"index": idx, "id": cid, "type": "function",
                                               "function": {"name": name, "arguments": ""}}]}))
            out += [choice({"tool_calls": [{"index": idx, "function": {"arguments": p}}]}) for p in parts]
        out.append(choice({}, reply.finish or ("tool_calls" if reply.tool_calls else "stop")))
        if reply.usage:
            usage: dict[str, Any] = {"prompt_tokens": reply.usage[0], "completion_tokens": reply.usage[1]}
            if reply.cached:
                usage["prompt_tokens_details"] = {"cached_tokens": reply.cached}
            out.append({"id": "c1", "choices": [], "usage": usage})
        return out
