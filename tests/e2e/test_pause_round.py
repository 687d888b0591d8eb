"""A pause is not a round (docs/spec-conformance.md §2.9, §6.7): the run a pause cut continues on `legion resume`,
so the pause writes no result artifact ("(no final output; outcome aborted)") and its parent is never told of one;
the child's one real result is r1 and is what the notice carries."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.harness import NOTICE_FIRST_LINE, kill_tree, launch, project, subagent, user_texts
from tests.support import wait_until

pytestmark = pytest.mark.timeout(150)


@pytest.mark.slow
@pytest.mark.parametrize("pause", ["stop --all", "SIGINT"])
def test_a_pause_writes_no_round_and_announces_none(pause: str) -> None:
    with project() as proj:
        gate = proj.dir / "gate"
        w1 = proj.script("w1", {"tool_calls": [{"name": "bash", "arguments": {
            "command": f"while [ ! -e {gate} ]; do sleep 0.05; done"}}]}, default={"text": "w1 REAL RESULT"})
        root = proj.script(
            "root",
            launch({"name": "w1", "agent": "worker", "task": "work", "model": w1}),
            subagent("wait", names=["w1"], timeoutMs=120_000),
            default={"text": "noted"})
        proc, run_dir = proj.start("pause", "--model", root, "--timeout", "120")
        try:
            wait_until(lambda: '"bash"' in _read(run_dir / "w1.jsonl"), deadline=60, message="w1 in its bash call")
            if pause == "SIGINT":
                proc.send_signal(signal.SIGINT)
            else:
                paused = proj.cli("stop", run_dir.name, "--all")
                assert paused.returncode == 0, paused.stdout + paused.stderr
            assert proc.wait(60) == 130, proc.stderr.read() if proc.stderr else ""
        finally:
            kill_tree(proc)
        assert not (run_dir / "artifacts" / "w1").exists() or not list((run_dir / "artifacts" / "w1").iterdir())
        gate.touch()
        resumed = proj.cli("resume", run_dir.name, "--all", timeout=120)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        rounds = sorted(p.name for p in (run_dir / "artifacts" / "w1").iterdir())
        assert rounds == ["r1.md"], rounds
        assert (run_dir / "artifacts" / "w1" / "r1.md").read_text() == "w1 REAL RESULT"
        notices = [t for t in user_texts(run_dir / "root.jsonl") if t.startswith(NOTICE_FIRST_LINE)]
        assert notices and all("no final output" not in t for t in notices), notices
        assert any("w1 REAL RESULT" in t and "artifacts/w1/r1.md" in t for t in notices), notices
        with proj.ledger(run_dir) as led:
            assert [a["round"] for a in led.list_artifacts(node_id="w1")] == [1]
            assert not led.undelivered("root")
            # the paused run's tree was not final; the resumed run's is (docs/spec-conformance.md §4.4)
            finals = [e.data["status"] for e in led.events_after(0, limit=10_000) if e.type == "tree_finalized"]
        assert finals == ["settled"], finals


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # not created yet
        return ""
