"""The fleet view through real runs (docs/servers.md, "A fleet"): three runs of two projects record into one
PostgreSQL database — one with a tcp monitor — and `legion status|summary|events|monitor --ledger URL` show them
all, filtered; `monitor --ledger --run` attaches to the recorded tcp endpoint with the recorded server key; a root
killed with SIGKILL stops its heartbeat and the view shows its run `lost`; a SQLite run's file shows its one run."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
import zmq.auth

from tests.integration.cli_support import (
    LEGION,
    env,
    gate_worker,
    in_transcript,
    legion,
    project,
    stop_process,
)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(180)

BEAT = {"LEGION_FLEET_HEARTBEAT_S": "2"}  # lost after 6 s without a heartbeat, for the runs and the view alike


def _start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*LEGION, "-C", str(cwd), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**env(), **BEAT})


def _fleet(cwd: Path, command: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return legion(cwd, command, "--ledger", url, *args, env_extra=BEAT)


def _runs(cwd: Path, url: str, *args: str) -> dict[str, dict[str, Any]]:
    out = _fleet(cwd, "status", url, "--json", *args)
    assert out.returncode == 0, out.stderr
    return {r["run"]: r for r in orjson.loads(out.stdout)["runs"]}


def _free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise AssertionError("no two adjacent free ports")


def _kill_tree(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    """SIGKILL the run's root (its process tree's members are returned, for the cleanup)."""
    members = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    return members


def test_the_fleet_view_of_three_runs_in_one_database(pg_url: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    with project() as cwd, project(worker_sleep=0.1) as other:
        (other / ".legion").mkdir()
        (other / ".legion" / "settings.json").write_text('{"legion": {"project": "other-project"}}')
        for name in ("server", "alice"):
            assert legion(cwd, "keys", name, "--dir", str(keys)).returncode == 0
        (cwd / "allow.txt").write_text(f"{keys / 'alice.key'}\n")
        release = gate_worker(cwd)
        endpoint = f"tcp://127.0.0.1:{_free_port_pair()}"
        watched = _start(cwd, "run", "--run-id", "a1", "--ledger", pg_url, "--monitor", endpoint, "--monitor-key",
                         str(keys / "server.key_secret"), "--monitor-allow", str(cwd / "allow.txt"),
                         "--model", "scripted/root.yaml", "task")
        doomed = _start(cwd, "run", "--run-id", "a2", "--ledger", pg_url, "--model", "scripted/root.yaml", "task")
        orphans: list[psutil.Process] = []
        try:
            quick = legion(other, "run", "--run-id", "b1", "--ledger", pg_url, "--model", "scripted/root.yaml", "t",
                           env_extra=BEAT, timeout=90)
            assert quick.returncode == 0, quick.stderr
            for rid in ("a1", "a2"):
                wait_until(in_transcript(cwd / ".legion" / "runs" / rid, "w1", '"bash"'), deadline=60,
                           message=f"{rid}'s w1 in its bash call")
            runs = _runs(cwd, pg_url)
            assert {r: runs[r]["shown"] for r in runs} == {"a1": "running", "a2": "running", "b1": "settled"}
            a1, b1 = runs["a1"], runs["b1"]
            assert a1["host"] == socket.gethostname() and a1["pid"] == watched.pid
            assert a1["monitor_endpoint"] == endpoint and runs["a2"]["monitor_endpoint"] is None
            assert a1["server_key"] == zmq.auth.load_certificate(keys / "server.key")[0].decode()
            assert a1["control_endpoint"].startswith("ipc://") and a1["ended_at"] is None
            assert a1["project"] == cwd.name and b1["project"] == "other-project"
            assert a1["live"] == 2 and a1["nodes"] >= 2  # root and w1 live
            assert b1["ended_at"] is not None and b1["live"] == 0 and b1["cost_usd"] >= 0
            _filters(cwd, pg_url)
            _monitor(cwd, pg_url, keys)
            _summary_and_events(cwd, pg_url)

            orphans = _kill_tree(doomed)  # the host of a2 "dies": no end recorded, no more heartbeats
            wait_until(lambda: _runs(cwd, pg_url, "--run", "a2")["a2"]["shown"] == "lost", deadline=30,
                       message="a2 shown lost")
            lost = _runs(cwd, pg_url, "--state", "lost")
            assert set(lost) == {"a2"} and lost["a2"]["state"] == "running"  # derived, never written
            assert _runs(cwd, pg_url, "--run", "a1")["a1"]["shown"] == "running"  # a1 still beats
            text = _fleet(cwd, "status", pg_url)
            assert text.returncode == 0 and any(line.split()[:1] == ["a2"] and " lost " in line
                                                for line in text.stdout.splitlines()), text.stdout

            release.touch()
            assert watched.wait(60) == 0, watched.stderr.read() if watched.stderr else ""
            ended = _runs(cwd, pg_url, "--run", "a1")["a1"]
            assert ended["shown"] == "settled" and ended["ended_at"] is not None
        finally:
            release.touch()
            for proc in (watched, doomed):
                stop_process(proc)
            for member in orphans:
                with contextlib.suppress(psutil.Error):
                    member.kill()


def _filters(cwd: Path, url: str) -> None:
    assert set(_runs(cwd, url, "--state", "running")) == {"a1", "a2"}
    assert set(_runs(cwd, url, "--state", "settled,failed")) == {"b1"}
    assert set(_runs(cwd, url, "--project", "other-project")) == {"b1"}
    assert set(_runs(cwd, url, "--host", socket.gethostname(), "--run", "a2")) == {"a2"}
    assert _runs(cwd, url, "--host", "no-such-host") == {}
    unknown = _fleet(cwd, "status", url, "--run", "zz")
    assert unknown.returncode == 2 and "no run 'zz'" in unknown.stderr and "a1" in unknown.stderr
    text = _fleet(cwd, "status", url)
    assert text.returncode == 0 and text.stdout.splitlines()[1].split()[:4] == ["RUN", "PROJECT", "HOST", "STATE"]


def _monitor(cwd: Path, url: str, keys: Path) -> None:
    listed = _fleet(cwd, "monitor", url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["run"] for r in orjson.loads(listed.stdout)["runs"]] == ["a1"]
    none = _fleet(cwd, "monitor", url, "--run", "a2", "--key", str(keys / "alice.key_secret"))
    assert none.returncode == 2 and "no tcp monitor" in none.stderr
    keyless = _fleet(cwd, "monitor", url, "--run", "a1")
    assert keyless.returncode == 2 and "--key" in keyless.stderr
    attached = _fleet(cwd, "monitor", url, "--run", "a1", "--key", str(keys / "alice.key_secret"), "--json",
                      "--idle", "1")
    assert attached.returncode == 0, attached.stderr
    first = orjson.loads(attached.stdout.splitlines()[0])
    assert first["type"] == "snapshot" and first["run"] == "a1"
    assert '"w1"' in orjson.dumps(first["nodes"]).decode()  # the live tree of run a1, from its host


def _summary_and_events(cwd: Path, url: str) -> None:
    summary = _fleet(cwd, "summary", url, "--json")
    assert summary.returncode == 0, summary.stderr
    data = orjson.loads(summary.stdout)
    assert data["totals"]["runs"] == 3 and data["totals"]["nodes"] == sum(r["nodes"] for r in data["runs"])
    assert data["totals"]["states"] == {"running": 2, "settled": 1}
    text = _fleet(cwd, "summary", url, "--project", "other-project")
    assert text.returncode == 0 and text.stdout.splitlines()[-1].startswith("total")
    events = _fleet(cwd, "events", url, "--json")
    assert events.returncode == 0, events.stderr
    assert {orjson.loads(line)["run"] for line in events.stdout.splitlines()} == {"a1", "a2", "b1"}
    only = _fleet(cwd, "events", url, "--json", "--run", "b1")
    assert {orjson.loads(line)["run"] for line in only.stdout.splitlines()} == {"b1"}
    assert "node_settled" in {orjson.loads(line)["type"] for line in only.stdout.splitlines()}


def test_a_sqlite_runs_file_shows_its_one_run() -> None:
    with project(worker_sleep=0.1) as cwd:
        done = legion(cwd, "run", "--run-id", "s1", "--model", "scripted/root.yaml", "task")
        assert done.returncode == 0, done.stderr
        db = cwd / ".legion" / "runs" / "s1" / "legion.db"
        runs = _runs(cwd, str(db))
        assert list(runs) == ["s1"] and runs["s1"]["shown"] == "settled" and runs["s1"]["nodes"] >= 2
        assert runs["s1"]["pid"] != os.getpid() and runs["s1"]["ended_at"] is not None
        missing = _fleet(cwd, "status", str(cwd / "nope.db"))
        assert missing.returncode == 2 and "no ledger at" in missing.stderr
        assert not (cwd / "nope.db").exists()
