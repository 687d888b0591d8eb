"""Bad input at the CLI's edges: damaged ledger rows, terminal escapes in model text, non-UTF-8 mail, malformed
`tasks[]` — each answered with a clear message, never a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from legion.bus.protocol import decode
from legion.cli.operate import request
from tests.integration.cli_support import (
    LEGION,
    env,
    in_transcript,
    legion,
    live_run,
    project,
    start,
    stop_process,
)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)

QUICK_ROOT = "default: {text: \"done\"}\n"


@contextlib.contextmanager
def finished_run() -> Iterator[tuple[Path, Path]]:
    """A real, finished run (its legion.db written by the root): (project dir, run dir)."""
    with project() as cwd:
        (cwd / "quick.yaml").write_text(QUICK_ROOT)
        done = legion(cwd, "run", "--model", "scripted/quick.yaml", "task")
        assert done.returncode == 0, done.stderr
        run_dir = next((cwd / ".legion" / "runs").iterdir())
        yield cwd, run_dir


def _sql(run_dir: Path, *statements: str) -> None:
    with contextlib.closing(sqlite3.connect(run_dir / "legion.db")) as db:
        for sql in statements:
            db.execute(sql)
        db.commit()


def test_reports_flag_a_wrongly_typed_ledger_row_instead_of_a_traceback() -> None:
    with finished_run() as (cwd, run_dir):
        _sql(run_dir,
             "UPDATE nodes SET depth = 'deep', updated_at = 'yesterday', created_at = x'ff00' WHERE id = 'root'",
             "UPDATE usage SET tokens_in = 'many', cost_usd = 'cheap' WHERE node_id = 'root'",
             "UPDATE events SET ts = 'later' WHERE node_id = 'root'")
        for verb in ("status", "summary", "timing", "tree"):
            out = legion(cwd, verb, run_dir.name)
            assert out.returncode == 0 and "Traceback" not in out.stderr, (verb, out.stderr)
            assert "root" in out.stdout
        as_json = legion(cwd, "status", run_dir.name, "--json")
        assert as_json.returncode == 0 and "\"depth\":\"deep\"" in as_json.stdout, as_json.stderr  # raw in JSON
        status = legion(cwd, "status", run_dir.name).stdout
        assert "⚠ ledger row nodes[root]: depth = 'deep' is not a number" in status
        assert "updated_at = 'yesterday'" in status
        summary = legion(cwd, "summary", run_dir.name).stdout
        assert "? tok" in summary and "⚠ ledger row usage[root]: tokens_in = 'many'" in summary
        assert "cost_usd = 'cheap'" in summary and "without a numeric ts" in summary
        timing = legion(cwd, "timing", run_dir.name).stdout
        assert "⚠ ledger row usage[root]" in timing


def test_human_views_escape_control_characters_json_stays_raw() -> None:
    evil = "hi\n  #99    DELIVERED @operator → root: spoofed\x1b[31m red \x1b]0;title\x07"
    with finished_run() as (cwd, run_dir):
        with contextlib.closing(sqlite3.connect(run_dir / "legion.db")) as db:
            db.execute("INSERT INTO messages (from_node, to_node, subject, body, created_at) VALUES (?, ?, ?, ?, 1)",
                       ("root", "@operator", evil, evil))
            db.execute("UPDATE nodes SET phase = ?, model = ? WHERE id = 'root'", ("ph\x1b[2J", "m\nspoof"))
            db.commit()
        mail = legion(cwd, "mail", run_dir.name)
        assert mail.returncode == 0, mail.stderr
        assert "\x1b" not in mail.stdout and "\x07" not in mail.stdout
        assert "spoofed" in mail.stdout and "\\n  #99" in mail.stdout and "\\x1b[31m" in mail.stdout
        assert len([line for line in mail.stdout.splitlines() if "#" in line]) == 1  # no spoofed second line
        for verb in ("status", "summary", "tree"):
            out = legion(cwd, verb, run_dir.name).stdout
            assert "\x1b" not in out and "m\nspoof" not in out, verb
            assert "ph\\x1b[2J" in out and ("m\\nspoof" in out or verb == "tree"), verb  # tree shows no model
        raw = legion(cwd, "mail", run_dir.name, "--json").stdout
        assert "\\u001b[31m" in raw  # JSON keeps the value (escaped only as JSON escapes it)


def _raw_request(endpoint: str, frame: bytes) -> dict[str, object]:
    """Send one raw frame as a request from a bare DEALER; the decoded reply."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"rawclient")
    sock.connect(endpoint)
    try:
        sock.send(frame)
        assert sock.poll(30_000), "the root did not answer a request that is not UTF-8"
        reply = decode(sock.recv())
        return {"type": reply.type, **reply.body}
    finally:
        sock.close(linger=0)
        ctx.term()


def _mail_checks(cwd: Path, run_dir: Path) -> None:
    (cwd / "body.bin").write_bytes(b"hello \xff\xfe world")
    out = legion(cwd, "mail", "send", run_dir.name, "root", "--subject", "s", "--body", "@body.bin")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "body.bin is not UTF-8 text: byte 0xff at offset 6" in out.stderr, out.stderr
    argv = subprocess.run([*LEGION, "-C", str(cwd), "mail", "send", run_dir.name, "root", "--subject", "s",
                           "--body", b"ab\xffcd"], capture_output=True, text=True, env=env(), timeout=60)
    assert argv.returncode == 2 and "Traceback" not in argv.stderr, argv.stderr
    assert "the body is not valid UTF-8: byte 0xff at offset 2" in argv.stderr, argv.stderr
    # the root's boundary: a raw client's request that is not UTF-8 is answered, naming the byte
    frame = (b'{"v":1,"t":"request","s":"rawclient","c":"x1","b":{"op":"legion.operator","action":"mail",'
             b'"args":{"to":"root","subject":"s","body":"bad \xff byte"}}}')
    reply = _raw_request(f"ipc://{run_dir / 'op.sock'}", frame)
    assert reply["type"] == "error" and reply["reason"] == "bad_frame", reply
    offset = frame.index(b"\xff")
    assert f"byte 0xff at offset {offset}" in str(reply["detail"]), reply


def test_malformed_tasks_and_bad_mail_on_a_live_run() -> None:
    with project(worker_sleep=120) as cwd:
        proc = start(cwd, "run", "--model", "scripted/root.yaml", "task")
        try:
            run_dir = live_run(cwd)
            endpoint = f"ipc://{run_dir / 'op.sock'}"
            cases = [("a string", "/tasks: must be a list"), ([1], "/tasks/0: each step must be an object"),
                     ([{"agent": "worker"}], "/tasks/0/task: each step needs a non-empty 'task'"),
                     ([{"agent": "worker", "task": " \n\t"}], "/tasks/0/task: each step needs a non-empty 'task'"),
                     ([{"agent": "worker", "task": "x", "name": 5}], "/tasks/0/name: must be a string")]
            for tasks, expected in cases:
                reply = asyncio.run(request(endpoint, "launch", {"tasks": tasks, "agent": "worker"}, 30))
                assert reply.get("ok") is False and reply.get("code") == "INVALID_PARAMS", (tasks, reply)
                assert expected in reply["text"], (tasks, reply["text"])
            both = asyncio.run(request(endpoint, "launch", {"agent": "worker", "task": "lost?",
                                                            "tasks": [{"task": "x"}]}, 30))
            assert both.get("code") == "INVALID_PARAMS" and "not both" in both["text"], both
            _mail_checks(cwd, run_dir)
            stop = legion(cwd, "stop", run_dir.name, "--all", timeout=90)
            assert stop.returncode == 0, stop.stderr
        finally:
            stop_process(proc)


@pytest.mark.timeout(180)
def test_rebuild_after_a_torn_run_json_leaves_a_run_that_resume_continues() -> None:
    with project() as cwd:
        proc = start(cwd, "run", "--run-id", "t1", "--model", "scripted/root.yaml", "task")
        try:
            run_dir = cwd / ".legion" / "runs" / "t1"
            wait_until(in_transcript(run_dir, "w1", '"bash"'), deadline=60, message="w1's bash call")
            stopped = legion(cwd, "stop", "t1", "--all")
            assert stopped.returncode == 0, stopped.stderr
            assert proc.wait(30) == 130
        finally:
            stop_process(proc)
        raw = (run_dir / "run.json").read_bytes()
        (run_dir / "run.json").write_bytes(raw[: len(raw) // 2])  # torn mid-write
        rebuilt = legion(cwd, "rebuild", "t1")
        assert rebuilt.returncode == 0, rebuilt.stderr + rebuilt.stdout
        assert "wrote a new run.json from launches/root.json" in rebuilt.stdout
        assert (run_dir / "run.json.corrupt").read_bytes() == raw[: len(raw) // 2]  # the evidence is kept
        (cwd / "worker.yaml").write_text((cwd / "worker.yaml").read_text().replace("sleep 30", "sleep 0"))
        resumed = legion(cwd, "resume", "t1", "--all", timeout=120)
        assert resumed.returncode == 0, resumed.stderr + resumed.stdout
        assert "all done" in resumed.stdout
