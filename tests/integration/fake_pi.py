"""A protocol fake of ``pi --mode rpc`` (pi-mono docs/rpc.md) for testing legion's pi engine.

Speaks JSON lines: commands ``prompt`` (with ``streamingBehavior`` while streaming), ``steer``,
``follow_up``, ``abort``, ``get_state``; answers ``{"type": "response", "id", "command", "success"}``
and streams ``agent_start``, ``turn_start``, ``message_update`` (text deltas), ``message_end``,
``tool_execution_start``/``_end``, ``turn_end``, ``agent_end``. It appends pi v3 entries to the
``--session`` file (continuing its id/parentId chain). Replies: ``pi says: <prompt>``; a prompt
containing ``SLOW`` streams 100 deltas 10 ms apart (abortable); one containing ``TOOL`` makes one
``bash`` tool call first; ``CRASH`` exits with code 3 mid-run; ``DIE_ON_ABORT`` exits with code 4 when
the run is aborted, without answering.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from datetime import UTC, datetime
from typing import Any


class Session:
    def __init__(self, path: str, model: str) -> None:
        self.path = path
        self.provider, _, self.model = model.partition("/")
        self.leaf: str | None = None
        with open(path, encoding="utf-8") as f:
            for line in f:
                obj = json.loads(line)
                if obj.get("type") != "session":
                    self.leaf = obj["id"]

    def append(self, message: dict[str, Any]) -> None:
        eid = secrets.token_hex(4)
        entry = {"type": "message", "id": eid, "parentId": self.leaf,
                 "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                 "message": {**message, "timestamp": int(time.time() * 1000)}}
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, json.dumps(entry).encode() + b"\n")
        os.close(fd)
        self.leaf = eid

    def assistant(self, content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
        msg = {"role": "assistant", "content": content, "api": "fake", "provider": self.provider,
               "model": self.model, "stopReason": stop,
               "usage": {"input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 15,
                         "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0.001}}}
        if stop == "aborted":
            msg["errorMessage"] = "Request was aborted"
        return msg


class FakePi:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.streaming = False
        self.abort = asyncio.Event()
        self.steering: list[str] = []
        self.follow_ups: list[str] = []
        self.die_on_abort = False

    def out(self, obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def respond(self, cmd: dict[str, Any], success: bool = True, error: str | None = None) -> None:
        reply = {"type": "response", "command": cmd.get("type"), "success": success, "id": cmd.get("id")}
        if error:
            reply["error"] = error
        self.out(reply)

    async def handle(self, cmd: dict[str, Any]) -> None:
        kind = cmd.get("type")
        if kind == "prompt":
            if self.streaming:
                behavior = cmd.get("streamingBehavior")
                if behavior not in ("steer", "followUp"):
                    self.respond(cmd, False, "Agent is streaming; specify streamingBehavior")
                    return
                (self.steering if behavior == "steer" else self.follow_ups).append(cmd["message"])
                self.respond(cmd)
                return
            self.respond(cmd)
            self.streaming = True
            asyncio.get_running_loop().create_task(self.run(cmd["message"]))
        elif kind in ("steer", "follow_up"):
            (self.steering if kind == "steer" else self.follow_ups).append(cmd["message"])
            self.respond(cmd)
        elif kind == "abort":
            if self.die_on_abort:
                os._exit(4)  # dies instead of answering the abort
            self.abort.set()
            self.respond(cmd)
        elif kind == "get_state":
            self.respond(cmd)
        else:
            self.respond(cmd, False, f"Unknown command: {kind}")

    async def run(self, text: str) -> None:
        self.abort.clear()
        self.die_on_abort = "DIE_ON_ABORT" in text
        self.out({"type": "agent_start"})
        pending = [text]
        while pending:
            prompt = pending.pop(0)
            self.session.append({"role": "user", "content": [{"type": "text", "text": prompt}]})
            if not await self.turn(prompt):
                break
            if self.steering:
                pending.extend(self.steering)
                self.steering.clear()
            elif self.follow_ups:
                pending.append(self.follow_ups.pop(0))
        self.streaming = False
        self.out({"type": "agent_end", "messages": []})

    async def turn(self, prompt: str) -> bool:
        self.out({"type": "turn_start"})
        if "CRASH" in prompt:
            os._exit(3)
        if "TOOL" in prompt:
            call = {"type": "toolCall", "id": "call_1", "name": "bash", "arguments": {"command": "true"}}
            self.session.append(self.session.assistant([call], "toolUse"))
            self.out({"type": "tool_execution_start", "toolCallId": "call_1", "toolName": "bash",
                      "args": {"command": "true"}})
            self.session.append({"role": "toolResult", "toolCallId": "call_1", "toolName": "bash",
                                 "content": [{"type": "text", "text": ""}], "isError": False})
            self.out({"type": "tool_execution_end", "toolCallId": "call_1", "toolName": "bash",
                      "result": {"content": []}, "isError": False})
        reply = f"pi says: {prompt}"
        deltas = [reply] if "SLOW" not in prompt else [reply[i % len(reply)] for i in range(100)]
        streamed = ""
        for delta in deltas:
            if self.abort.is_set():
                message = self.session.assistant([{"type": "text", "text": streamed}], "aborted")
                self.session.append(message)
                self.out({"type": "message_end", "message": message})
                self.out({"type": "turn_end", "message": message, "toolResults": []})
                return False
            streamed += delta
            self.out({"type": "message_update", "message": {},
                      "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": delta}})
            if "SLOW" in prompt:
                await asyncio.sleep(0.01)
        message = self.session.assistant([{"type": "text", "text": streamed}], "stop")
        self.session.append(message)
        self.out({"type": "message_end", "message": message})
        self.out({"type": "turn_end", "message": message, "toolResults": []})
        return True


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--append-system-prompt")
    args = ap.parse_args()
    assert args.mode == "rpc"
    fake = FakePi(Session(args.session, args.model))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        await fake.handle(json.loads(line))


if __name__ == "__main__":
    asyncio.run(main())
