"""`legion monitor` on a live `legion run` (scripted models): the human view by default (the plain lines of `legion
run`: the tree as it stands at the attach, then a line per lifecycle event), JSON lines with `--json`; both end by
themselves, exit 0, after the root's `supervisor_exited`, while `--follow` stays attached."""

from __future__ import annotations

import contextlib
import signal
import subprocess

import orjson
import pytest

from tests.events_schema import check_events
from tests.integration.cli_support import LEGION, env, gate_worker, live_run, project, start, stop_process

pytestmark = pytest.mark.timeout(180)


def _monitor(cwd: object, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*LEGION, "-C", str(cwd), "monitor", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env())


def _rest(proc: subprocess.Popen[str]) -> str:
    """The rest of a monitor's stdout once it has exited by itself, exit 0 (read through the same buffer as the
    first line: `communicate` would skip what that buffer already holds)."""
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    assert proc.stdout is not None
    return proc.stdout.read()


def test_monitor_shows_the_run_and_exits_after_the_root_supervisor() -> None:
    with project() as cwd:
        release = gate_worker(cwd)  # w1 works until every monitor is attached
        run = start(cwd, "run", "--run-id", "mon", "--model", "scripted/root.yaml", "task")
        monitors: list[subprocess.Popen[str]] = []
        try:
            live_run(cwd)
            human, as_json, follow = (_monitor(cwd, "mon"), _monitor(cwd, "mon", "--json"),
                                      _monitor(cwd, "mon", "--json", "--follow"))
            monitors += [human, as_json, follow]
            firsts = []
            for proc in monitors:  # attached: the first line is out (the snapshot)
                assert proc.stdout is not None
                firsts.append(proc.stdout.readline())
            release.touch()
            assert run.wait(60) == 0
            out, json_out = _rest(human), _rest(as_json)
            with pytest.raises(subprocess.TimeoutExpired):  # --follow: still attached after the run's end
                follow.wait(3)
        finally:
            stop_process(run)
            for proc in monitors:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.communicate(timeout=10)

    assert "attached" in firsts[0] and "2 nodes, 2 live" in firsts[0], firsts
    snapshot = orjson.loads(firsts[1])
    assert snapshot["type"] == "snapshot" and snapshot["run"] == "mon" and snapshot["node"] is None, snapshot
    w1 = snapshot["nodes"]["w1"]
    assert w1["model"] == "scripted/worker.yaml" and w1["turns"] >= 1 and w1["tokens_in"] > 0, w1
    assert {"phase", "tokens_out", "cost_usd", "status", "role"} <= set(w1), w1
    lines = out.splitlines()  # the snapshot's first line was read above: the node rows follow
    assert "▶ root [root] running · scripted/root.yaml" in lines[0] and " tok · $0.0000" in lines[0], lines
    assert "  ▶ w1 [worker] running · scripted/worker.yaml" in lines[1], lines
    for expected in ("node_settled     w1 settled normal", "node_settled     root settled normal",
                     "supervisor_exited root shutdown"):
        assert any(expected in line for line in lines), (expected, lines)
    assert "text_delta" not in out and not any(line.lstrip().startswith("{") for line in lines), out

    records = [orjson.loads(line) for line in json_out.splitlines()]
    check_events([snapshot, *records], "legion monitor --json")
    assert records[-1]["type"] == "supervisor_exited" or any(r.get("type") == "supervisor_exited" for r in records)
    seqs = [r["seq"] for r in records]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # no gap after the snapshot
    assert any(r["type"] == "usage" and r["node"] == "w1" and r["run"] == "mon" for r in records)


def test_monitor_of_a_root_that_dies_says_so_and_exits_1() -> None:
    """SIGKILL on the root (no supervisor_exited ever comes): the monitor notices that run.json's owner is gone."""
    with project() as cwd:
        gate_worker(cwd)  # never released: only the kill ends the run
        run = start(cwd, "run", "--run-id", "died", "--model", "scripted/root.yaml", "task")
        monitor: subprocess.Popen[str] | None = None
        try:
            live_run(cwd)
            monitor = _monitor(cwd, "died")
            assert monitor.stdout is not None and "attached" in monitor.stdout.readline()
            run.send_signal(signal.SIGKILL)
            run.wait(30)
            _, err = monitor.communicate(timeout=60)
        finally:
            stop_process(run)
            if monitor is not None and monitor.poll() is None:
                monitor.kill()
                monitor.communicate(timeout=10)
    assert monitor.returncode == 1, err
    assert "the run's root has exited" in err and "run.json status running" in err and "legion resume died" in err, err
