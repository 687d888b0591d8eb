"""A whole `legion run` whose PostgreSQL ledger server goes away (docs/servers.md, "A shared PostgreSQL ledger"): a
restart mid-run is ridden out and every row lands once; a server that stays down past
`legion.ledger.unreachablePauseMs` pauses the run (exit 130, saying so), and `legion resume` finishes it once the
server is back, waiting for it if it is not yet."""

from __future__ import annotations

import contextlib
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest

from legion.ledger import open_ledger
from tests.integration.cli_support import (
    LEGION,
    env,
    gate_worker,
    in_transcript,
    project,
    start,
    stop_process,
)
from tests.pg_server import PgServer
from tests.support import wait_until

pytestmark = pytest.mark.timeout(180)


def _url(server: PgServer) -> str:
    server.admin("CREATE DATABASE faults")
    return server.url("faults")


def _settings(cwd: Path, pause_ms: int | None = None) -> None:
    data: dict[str, object] = {"supervision": {"forceRpc": True}}  # rpc workers write too
    if pause_ms is not None:
        data["legion"] = {"ledger": {"unreachablePauseMs": pause_ms}}
    (cwd / ".legion").mkdir(exist_ok=True)
    (cwd / ".legion" / "settings.json").write_bytes(orjson.dumps(data))


def _rows(url: str, run_id: str) -> tuple[dict[str, str], Counter[tuple[str | None, str]], dict[str, int]]:
    """(status per node, count of each (node, event type), tokens in per node) of the run in the database."""
    with contextlib.closing(open_ledger(url, run_id=run_id)) as led:
        nodes = {str(n["id"]): str(n["status"]) for n in led.list_nodes()}
        events = Counter((e.node_id, e.type) for e in led.events_after(0, limit=10_000))
        tokens = {node: int((led.get_usage(node) or {}).get("tokens_in") or 0) for node in nodes}
    return nodes, events, tokens


def test_a_run_rides_out_a_server_restart_and_records_every_row_once(own_pg_server: PgServer) -> None:
    url = _url(own_pg_server)
    with project() as cwd:
        _settings(cwd)
        release = gate_worker(cwd)
        proc = start(cwd, "run", "--run-id", "r1", "--ledger", url, "--model", "scripted/root.yaml", "task")
        try:
            run_dir = cwd / ".legion" / "runs" / "r1"
            wait_until(in_transcript(run_dir, "w1", '"bash"'), message="w1's bash call", deadline=60.0)
            own_pg_server.restart("fast")  # every process's connections are dropped
            own_pg_server.terminate("faults")  # and the new ones once more
            release.touch()
            assert proc.wait(90) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            stop_process(proc)
    nodes, events, tokens = _rows(url, "r1")
    assert nodes["root"] == "settled" and nodes["w1"] == "settled" and tokens["w1"] > 0
    assert events[("w1", "node_launched")] == 1 and events[("w1", "node_settled")] == 1  # once each, no duplicate
    assert events[("root", "node_launched")] == 1


def test_a_server_down_past_the_bound_pauses_the_run_and_resume_finishes_it(own_pg_server: PgServer) -> None:
    url = _url(own_pg_server)
    with project() as cwd:
        _settings(cwd, pause_ms=1500)
        release = gate_worker(cwd)
        run_dir = cwd / ".legion" / "runs" / "d1"
        err_path = cwd / "run.err"  # a file, not a pipe: an outage logs a lot, and a full pipe would block the run
        with err_path.open("w") as err_file:
            proc = subprocess.Popen([*LEGION, "-C", str(cwd), "run", "--run-id", "d1", "--ledger", url, "--model",
                                     "scripted/root.yaml", "task"], stdout=subprocess.DEVNULL, stderr=err_file,
                                    text=True, env=env())
            try:
                wait_until(in_transcript(run_dir, "w1", '"bash"'), message="w1's bash call", deadline=60.0)
                own_pg_server.halt()
                assert proc.wait(60) == 130
            finally:
                stop_process(proc)
        stderr = err_path.read_text()
        assert "unreachable for" in stderr and own_pg_server.home.name in stderr and "legion resume d1" in stderr
        data = orjson.loads((run_dir / "run.json").read_bytes())
        assert data["status"] == "paused" and "unreachable for" in data["detail"]
        release.touch()
        log = run_dir.parent / "resume.err"
        with log.open("w") as err:  # the server is still down: resume waits for it, saying so
            resume = subprocess.Popen([*LEGION, "-C", str(cwd), "resume", "d1", "--all"], stdout=subprocess.PIPE,
                                      stderr=err, text=True, env=env())
            try:
                wait_until(lambda: "waiting up to" in log.read_text(), message="resume waiting", deadline=30.0)
                own_pg_server.boot()
                out, _ = resume.communicate(timeout=120)
            finally:
                if resume.poll() is None:
                    resume.kill()
        assert resume.returncode == 0, log.read_text() + out
        assert "all done" in out
    nodes, events, tokens = _rows(url, "d1")
    assert nodes["root"] == "settled" and nodes["w1"] == "settled" and tokens["w1"] > 0
    assert events[("w1", "node_settled")] == 1
