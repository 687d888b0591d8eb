"""A worker process crashes mid-turn (SIGKILL); a new session on the same transcript resumes with full history."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from legion.workers.context import SessionContext
from legion.workers.outcome import derive_outcome
from legion.workers.providers.registry import ProviderRegistry
from legion.workers.session import NOTE_TYPE_RESTART, Session
from legion.workers.transcript import create_empty, read_transcript, text_of

pytestmark = pytest.mark.timeout(60)

SCRIPT = {"turns": [{"text": "step one"},
                    {"text": "running", "tool_calls": [{"name": "bash", "arguments": {"command": "CMD"}}]},
                    {"text": "resumed fine"}]}

WORKER = textwrap.dedent("""
    import asyncio, json, sys
    from legion.workers.context import SessionContext
    from legion.workers.providers.registry import ProviderRegistry
    from legion.workers.session import Session

    async def main() -> None:
        cwd, path, script = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
        s = Session(context=SessionContext(node_id="w", cwd=cwd), model="scripted/t", transcript_path=path,
                    registry=ProviderRegistry(scripts={"t": script}))
        await s.prompt("first")
        await s.wait_settled(10)
        await s.prompt("second")
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


def test_crash_mid_tool_then_resume(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    script = json.loads(json.dumps(SCRIPT).replace("CMD", f"echo $$ > {tmp_path}/tool.pgid; touch {marker}; sleep 60"))
    path = create_empty(tmp_path / "runs" / "w.jsonl")
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), str(path), json.dumps(script)],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, "worker exited early"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        before = path.read_bytes()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and nothing else: its group
        proc.wait(10)
    # the tool ran in its own process group (it outlives the worker): kill it, as a supervisor's sweep would
    os.killpg(int((tmp_path / "tool.pgid").read_text()), signal.SIGKILL)
    after_crash = path.read_bytes()
    assert after_crash == before and after_crash.endswith(b"\n")
    roles_before = [e["message"]["role"] for e in read_transcript(path).entries if e["type"] == "message"]
    assert roles_before == ["user", "assistant", "user", "assistant"]
    assert derive_outcome(path) == "unknown"

    async def resume() -> list[str]:
        s = Session(context=SessionContext(node_id="w", cwd=str(tmp_path)), model="scripted/t",
                    transcript_path=path, registry=ProviderRegistry(scripts={"t": script}), restarted=True)
        assert s.stats()["turns"] == 2 and s.stats()["toolCalls"] == 1
        await s.prompt("continue")
        r = await s.wait_settled(10)
        assert r.outcome == "success"
        out = [f"{m['role']}:{text_of(m)}" for m in s.transcript.messages()]
        await s.dispose()
        return out

    history = asyncio.run(resume())
    assert history[:4] == ["user:first", "assistant:step one", "user:second", "assistant:running"]
    assert history[4].startswith("toolResult:the worker stopped while this tool call was running")
    assert history[5].startswith("user:[legion] The worker hosting this session restarted")
    assert history[6:] == ["user:continue", "assistant:resumed fine"]
    assert path.read_bytes().startswith(before)
    notes = [e for e in read_transcript(path).entries if e.get("customType") == NOTE_TYPE_RESTART]
    assert len(notes) == 1 and notes[0]["display"] is True
