"""Issue 19 item 8: a full disk under the run pauses the tree, fails ledger-bound tool calls fast, keeps
`--timeout`, leaves run.json truthful, prints no traceback, and `legion resume` continues once space is freed.

The project (and so the run directory and its ledger) lives on a 5 MiB tmpfs made for the test (root only:
skipped elsewhere). The root session launches a child that waits on a gate file, fills the filesystem with
`dd` in a bash call and waits for the child. (That a tool call needing the ledger fails fast on a full disk is
tested in tests/integration/test_ledger_disk_full.py, where the moment is not a race with the pause.)
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.harness import Project, call, kill_tree, launch, node_rows, subagent, tools
from tests.support import small_filesystem

pytestmark = pytest.mark.timeout(240)
TIMEOUT_S = 60


def _no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text and "never retrieved" not in text, text[-4000:]


def test_a_full_disk_pauses_the_run_and_resume_continues_it() -> None:
    with small_filesystem() as fs:
        proj = Project(fs / "p", env={"LEGION_LOG_LEVEL": "WARNING"})
        proj.dir.mkdir()
        kid = proj.script("k", tools(call("bash", {"command": "until [ -f GO ]; do sleep 0.05; done; echo go"})),
                          default={"text": "k done"})
        root = proj.script(
            "root",
            launch({"name": "k", "agent": "worker", "task": "wait for the gate", "model": kid}),
            tools(call("bash", {"command": "dd if=/dev/zero of=fill bs=64k 2>&1 | tail -1; true"})),
            subagent("wait"),
            default={"text": "root done"})
        started = time.monotonic()
        proc, run = proj.start("fill the disk", "--model", root, "--timeout", str(TIMEOUT_S))
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S + 60)
        finally:
            kill_tree(proc)
        wall = time.monotonic() - started
        log = (run / "legion.log").read_text(errors="replace")
        explain = f"exit {proc.returncode} in {wall:.1f}s\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}\nlog:\n{log[-3000:]}"
        assert proc.returncode == 130, explain
        assert wall < TIMEOUT_S, explain  # the pause, not the timeout, ended it (and nothing overran)
        _no_traceback(out, err, log, (run / "pool.log").read_text(errors="replace"))
        assert f"the filesystem at {fs}" in err and "free" in err and "legion resume" in err, explain
        assert "locked" not in log, explain  # a full disk is not a lock
        meta = json.loads((run / "run.json").read_text())
        assert meta["status"] == "paused" and f"the filesystem at {fs}" in meta["detail"], meta
        rows = node_rows(run)
        assert {n: rows[n]["status"] for n in ("root", "k")} == {"root": "retired", "k": "retired"}, rows

        (proj.dir / "fill").unlink()  # free the space; the child may go on
        (proj.dir / "GO").touch()
        resumed = proj.cli("resume", run.name, "--all", "--timeout", str(TIMEOUT_S), timeout=TIMEOUT_S + 60)
        log = (run / "legion.log").read_text(errors="replace")
        assert resumed.returncode == 0, f"{resumed.stdout[-2000:]}\n{resumed.stderr[-3000:]}\n{log[-3000:]}"
        _no_traceback(resumed.stdout, resumed.stderr, log)
        assert json.loads((run / "run.json").read_text())["status"] == "settled"
        assert not (run / ".space-reserve").exists()  # an ended run keeps no reserve
        rows = node_rows(run)
        assert {n: rows[n]["status"] for n in ("root", "k")} == {"root": "settled", "k": "settled"}, rows
