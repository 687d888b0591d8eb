"""Pause and resume across runs through the CLI (docs/spec-conformance.md §2.10): `legion stop RUN --all`, SIGINT, SIGKILL of
the root, then `legion resume`: one run, the transcripts continue, the team completes; refusals say why."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import psutil
import pytest

from legion.ledger import SCHEMA_VERSION, open_ledger
from legion.workers.session import NOTE_TYPE_RESTART
from legion.workers.transcript import context_messages, read_transcript, text_of
from tests.integration.cli_support import (
    env,
    gate_worker,
    in_transcript,
    legion,
    legion_here,
    project,
    start,
    stop_process,
)
from tests.support import wait_until


def _events(run_dir: Path, node: str) -> list[tuple[str, dict[str, object]]]:
    ledger = open_ledger(run_dir / "legion.db")
    try:
        return [(e.type, e.data) for e in ledger.events_after(0, node_id=node, limit=1000)]
    finally:
        ledger.close()


def _started(cwd: Path, run_id: str) -> Path:
    """w1 at work (in its gated bash call: gate_worker) in a run that says it is running."""
    run_dir = cwd / ".legion" / "runs" / run_id
    wait_until(in_transcript(run_dir, "w1", '"bash"'), message="w1's bash call in its transcript", deadline=30.0)
    # run.json says running once the root's launch returned, which can come after its children are at work
    wait_until(lambda: orjson.loads((run_dir / "run.json").read_bytes()).get("status") == "running",
               message="run.json to say the run is running", deadline=30.0)
    return run_dir


def test_stop_all_pauses_then_resume_completes_in_the_same_run() -> None:
    with project() as cwd:
        release = gate_worker(cwd)  # w1's bash runs until the test lets it finish
        proc = start(cwd, "run", "--run-id", "p1", "--model", "scripted/root.yaml", "task")
        try:
            run_dir = _started(cwd, "p1")
            stopped = legion(cwd, "stop", "p1", "--all")
            assert stopped.returncode == 0, stopped.stderr
            assert "paused" in stopped.stdout
            assert proc.wait(30) == 130
        finally:
            stop_process(proc)
        for node in ("root", "w1"):
            retired = [d for t, d in _events(run_dir, node) if t == "node_retired"]
            assert retired and retired[-1]["reason"] == "session-shutdown"
        before = (run_dir / "w1.jsonl").read_text().count("\n")
        release.touch()  # w1's bash, run again on resume, finishes
        resumed = legion(cwd, "resume", "p1", "--all")
        assert resumed.returncode == 0, resumed.stderr + resumed.stdout
        assert "w1 (worker) retired" in resumed.stdout and "all done" in resumed.stdout
        assert sorted(p.name for p in (cwd / ".legion" / "runs").iterdir()) == ["p1"]  # one run
        assert (run_dir / "w1.jsonl").read_text().count("\n") > before  # the same transcript continues
        assert not list(run_dir.glob("w1.*.jsonl"))
        root_text = (run_dir / "root.jsonl").read_text()
        assert "do not resume yourself" in root_text and "w1 (worker)" in root_text  # the startup hint
        # a resume is a resume (issue 21, item 2): each paused session's first input after its cut turn is the
        # startup hint (root) or the resume note (w1) — no unprompted turn on a "worker restarted" note first
        for node, first in (("root", "do not resume yourself"), ("w1", "the operator resumed this run")):
            history = context_messages(read_transcript(run_dir / f"{node}.jsonl").leaf_path())
            cut = max(i for i, m in enumerate(history) if m.get("stopReason") == "aborted")
            assert first in text_of(history[cut + 1]) and history[cut + 1]["role"] == "user", history[cut:]
            assert not any(m.get("customType") == NOTE_TYPE_RESTART for m in history), node
        status = orjson.loads(legion(cwd, "status", "p1", "--json").stdout)
        assert {n["name"]: n["status"] for n in status["nodes"] if n["name"] != "pool"} == {"root": "settled",
                                                                                   "w1": "settled"}


def test_sigint_pause_then_resume_only_the_root_leaves_the_child_paused() -> None:
    with project() as cwd:
        gate_worker(cwd)  # w1's bash runs until the run is paused
        proc = start(cwd, "run", "--run-id", "p2", "--model", "scripted/root.yaml", "task")
        try:
            run_dir = _started(cwd, "p2")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
        finally:
            stop_process(proc)
        resumed = legion(cwd, "resume", "p2", "--timeout", "3")
        # the root waits on w1, which stays paused: the run times out (exit 1) and pauses again
        assert resumed.returncode == 1, resumed.stderr + resumed.stdout
        assert "w1" in resumed.stdout
        w1 = [t for t, _ in _events(run_dir, "w1")]
        assert w1.count("node_launched") == 1  # never revived


def test_sigkill_of_the_root_then_resume_converges_orphans_and_completes() -> None:
    with project() as cwd:
        release = gate_worker(cwd)  # w1's bash runs until the test lets it finish
        proc = start(cwd, "run", "--run-id", "k1", "--model", "scripted/root.yaml", "task")
        try:
            run_dir = _started(cwd, "k1")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            stop_process(proc)
        status = legion(cwd, "status", "k1")
        assert "DIED while the run was running" in status.stdout and "legion resume k1" in status.stdout
        release.touch()  # w1's bash, run again on resume, finishes
        resumed = legion(cwd, "resume", "k1", "--all")
        assert resumed.returncode == 0, resumed.stderr + resumed.stdout
        assert "converged to failed (node_abandoned)" in resumed.stdout
        for node in ("root", "w1"):
            types = [t for t, _ in _events(run_dir, node)]
            # the alarm, then the convergence (docs/spec-conformance.md §4.4, §4.5)
            assert "orphan_detected" in types and types.index("orphan_detected") + 1 == types.index("node_abandoned")
            alarm = dict(_events(run_dir, node))["orphan_detected"]
            assert alarm["reason"] == "owner_dead" and alarm["status"] in ("starting", "running"), alarm
        assert "all done" in resumed.stdout


# `legion run` whose root is SIGKILLed once w1's session is at work but before the root's `launch` of w1 returned
# (a window that lasts as long as the root's loop is slow to come back to it: under load, seconds)
_KILLED_MID_LAUNCH = """\
import asyncio, os, signal, sys
from pathlib import Path

from legion.supervision.node_ops import Nodes

real = Nodes.launch_session


async def launch_then_die(self, spec, **kw):
    status = await real(self, spec, **kw)
    if kw.get("name") == "w1":
        transcript = Path(sys.argv[1])
        while '"bash"' not in (transcript.read_text() if transcript.exists() else ""):
            await asyncio.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
    return status


Nodes.launch_session = launch_then_die
from legion.cli import main

sys.exit(main(sys.argv[2:]))
"""


def _waiting_on(release: Path) -> list[psutil.Process]:
    """The processes whose command line names `release` (gate_worker's bash loop)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(release) in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
    return found


def _tail(path: Path, chars: int = 4000) -> str:
    """The end of a run's log, for a failure message."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} absent)"


def test_a_root_killed_while_launching_a_child_leaves_that_child_resumable() -> None:
    with project() as cwd:
        release = gate_worker(cwd)  # w1's bash runs until the test lets it finish
        run_dir = cwd / ".legion" / "runs" / "k2"
        killed = subprocess.run([sys.executable, "-c", _KILLED_MID_LAUNCH, str(run_dir / "w1.jsonl"), "-C", str(cwd),
                                 "run", "--run-id", "k2", "--model", "scripted/root.yaml", "task"],
                                capture_output=True, text=True, timeout=90, env=env())
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        # The dead root's fork server retires w1's worker after a grace: were the release touched before, a slow
        # machine could let w1 finish its bash and answer in that grace, and resume would rightly record the
        # answer (settled, recovered) instead of reviving w1. The bash is swept with its worker.
        wait_until(lambda: not _waiting_on(release), 30, "w1's worker and its bash gone after the root's death")
        release.touch()  # w1's bash, run again on resume, finishes
        resumed = legion(cwd, "resume", "k2", "--all", "--timeout", "45", timeout=90)
        assert resumed.returncode == 0, resumed.stderr + resumed.stdout
        assert "w1 (worker) failed, phase - ← resuming" in resumed.stdout and "all done" in resumed.stdout, (
            resumed.stdout + resumed.stderr + _tail(run_dir / "legion.log"))


def test_resume_refusals_say_why_and_change_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with project(worker_sleep=0) as cwd:
        done = legion(cwd, "run", "--run-id", "f1", "--model", "scripted/root.yaml", "task")
        assert done.returncode == 0, done.stderr
        run_dir = cwd / ".legion" / "runs" / "f1"
        finished = legion(cwd, "resume", "f1")
        assert finished.returncode == 2 and "finished" in finished.stderr
        unknown = legion_here(cwd, capsys, "resume", "f1", "w2")
        assert unknown.returncode == 2
        # a ledger from a newer legion: every command says so (no traceback), nothing is changed
        import sqlite3

        with sqlite3.connect(run_dir / "legion.db") as db:
            db.execute("PRAGMA user_version = 99")
        for args, code in ((("status", "f1"), 3), (("summary", "f1"), 3), (("timing", "f1"), 3),
                           (("resume", "f1"), 2)):
            newer_db = legion_here(cwd, capsys, *args)
            assert newer_db.returncode == code and "newer legion" in newer_db.stderr, (args, newer_db.stderr)
            assert "Traceback" not in newer_db.stderr
        with sqlite3.connect(run_dir / "legion.db") as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == 99
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        # a newer run.json schema is refused, the file untouched
        data = orjson.loads((run_dir / "run.json").read_bytes())
        (run_dir / "run.json").write_bytes(orjson.dumps({**data, "schema": 99}))
        newer = legion_here(cwd, capsys, "resume", "f1")
        assert newer.returncode == 2 and "newer" in newer.stderr
        assert orjson.loads((run_dir / "run.json").read_bytes())["schema"] == 99
        # a corrupt run.json is set aside, never deleted
        (run_dir / "run.json").write_text("{not json")
        corrupt = legion_here(cwd, capsys, "resume", "f1")
        assert corrupt.returncode == 2 and "corrupt" in corrupt.stderr
        assert (run_dir / "run.json.corrupt").read_text() == "{not json"


def test_resume_of_a_live_run_and_terminal_or_unknown_names_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with project() as cwd:
        gate_worker(cwd)  # w1's bash runs until the run is paused
        proc = start(cwd, "run", "--run-id", "l1", "--model", "scripted/root.yaml", "task")
        try:
            _started(cwd, "l1")
            live = legion_here(cwd, capsys, "resume", "l1", "--all")
            assert live.returncode == 2 and "is live" in live.stderr
            unknown = legion_here(cwd, capsys, "stop", "l1", "w1x")
            assert unknown.returncode == 1 and "did you mean 'w1'" in unknown.stdout
            assert legion(cwd, "stop", "l1", "--all").returncode == 0
            assert proc.wait(30) == 130
        finally:
            stop_process(proc)
        typo = legion_here(cwd, capsys, "resume", "l1", "w1x")
        assert typo.returncode == 2 and "did you mean 'w1'" in typo.stderr
        ledger = open_ledger(cwd / ".legion" / "runs" / "l1" / "legion.db")
        try:
            ledger.update_node("w1", phase="done")  # as the phase machine leaves a finished member
        finally:
            ledger.close()
        terminal = legion_here(cwd, capsys, "resume", "l1", "w1")
        assert terminal.returncode == 2 and "terminal (phase 'done')" in terminal.stderr
