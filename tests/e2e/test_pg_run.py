"""A whole run recording into PostgreSQL (`legion run --ledger URL`): every process writes its rows there under the
run id, nothing lands in a legion.db, the password stays out of the run directory, two runs share one database,
a paused run resumes from it, and a ledger that cannot be used is refused before anything exists."""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import psycopg
import pytest

from legion.ledger import open_ledger
from tests.integration.cli_support import (
    gate_worker,
    in_transcript,
    legion,
    legion_here,
    project,
    start,
    stop_process,
)
from tests.pg_server import PASSWORD, PgServer
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)

FAN_OUT = """\
turns:
  - tool_calls:
      - name: subagent
        arguments:
          action: launch
          tasks:
            - {agent: worker, name: w1, task: "one", model: scripted/worker.yaml}
            - {agent: worker, name: w2, task: "two", model: scripted/worker.yaml}
rules:
  - match: "W1 RESULT"
    reply: {text: "all done"}
default:
  tool_calls:
    - name: subagent
      arguments: {action: wait, names: [w1, w2]}
"""


def _database(url: str) -> str:
    return urlsplit(url).path.strip("/")


def _rows(url: str, run_id: str) -> tuple[dict[str, str], set[str], dict[str, int], set[str]]:
    """(status per node, event types, tokens in per node, nodes with an artifact) of one run in the database."""
    with contextlib.closing(open_ledger(url, run_id=run_id)) as led:
        nodes = {str(n["id"]): str(n["status"]) for n in led.list_nodes()}
        events = {e.type for e in led.events_after(0, limit=10_000)}
        tokens = {node: int((led.get_usage(node) or {}).get("tokens_in") or 0) for node in nodes}
        artifacts = {str(a["node_id"]) for a in led.list_artifacts()}
    return nodes, events, tokens, artifacts


def _status(cwd: Path, run_id: str) -> dict[str, str]:
    out = legion(cwd, "status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return {n["name"]: n["status"] for n in orjson.loads(out.stdout)["nodes"]}


def test_a_fan_out_run_records_into_postgresql_and_keeps_the_password_out(pg_server: PgServer, pg_url: str) -> None:
    url = pg_server.url(_database(pg_url), password=PASSWORD)  # over tcp: the password is checked
    with project(worker_sleep=0.1) as cwd:
        (cwd / "fanout.yaml").write_text(FAN_OUT)
        done = legion(cwd, "run", "--run-id", "f1", "--ledger", url, "--model", "scripted/fanout.yaml", "task")
        assert done.returncode == 0, done.stderr
        run_dir = cwd / ".legion" / "runs" / "f1"
        assert not (run_dir / "legion.db").exists()
        recorded = orjson.loads((run_dir / "run.json").read_bytes())["ledger"]
        assert recorded == url.replace(f":{PASSWORD}@", "@")
        leaks = [p.name for p in run_dir.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
        assert leaks == [], f"the ledger's password is written in {leaks}"
        nodes, events, tokens, artifacts = _rows(url, "f1")
        assert {k: v for k, v in nodes.items() if k != "pool"} == {"root": "settled", "w1": "settled", "w2": "settled"}
        assert {"node_launched", "node_settled"} <= events
        assert tokens["w1"] > 0 and tokens["w2"] > 0  # written by the pool worker
        assert {"w1", "w2"} <= artifacts
        status = legion(cwd, "status", "f1")  # the password comes from the environment here: not set, so refused
        assert status.returncode == 3 and "password" in status.stderr and PASSWORD not in status.stderr
        summary = legion(cwd, "summary", "f1", "--json", env_extra={"LEGION_LEDGER_PASSWORD": PASSWORD})
        assert summary.returncode == 0, summary.stderr
        assert {n["name"] for n in orjson.loads(summary.stdout)["nodes"]} >= {"root", "w1", "w2"}


def test_two_runs_share_one_database_and_each_sees_its_own_rows(pg_url: str) -> None:
    with project(worker_sleep=0.1) as cwd:
        procs = [start(cwd, "run", "--run-id", rid, "--ledger", pg_url, "--model", "scripted/root.yaml", "task")
                 for rid in ("s1", "s2")]
        try:
            for proc in procs:
                assert proc.wait(90) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            for proc in procs:
                stop_process(proc)
        for rid in ("s1", "s2"):
            assert {k: v for k, v in _status(cwd, rid).items() if k != "pool"} == {"root": "settled", "w1": "settled"}
            assert not (cwd / ".legion" / "runs" / rid / "legion.db").exists()
        with psycopg.connect(pg_url) as conn:
            per_run = dict(conn.execute("SELECT run, count(*) FROM nodes GROUP BY run").fetchall())
        assert set(per_run) == {"s1", "s2"} and per_run["s1"] == per_run["s2"]
        events = legion(cwd, "events", "s2", "--json")
        assert events.returncode == 0 and all(orjson.loads(line)["run"] == "s2" for line in events.stdout.splitlines())
        with contextlib.closing(open_ledger(pg_url, run_id="s1")) as led:
            led.send_mail("w1", "root", "a note", "for s1 only", kind="report")
        listed = legion(cwd, "mail", "s1", "root", "--json")  # the listing reads the run's rows in PostgreSQL
        assert listed.returncode == 0, listed.stderr
        inbox = orjson.loads(listed.stdout)["inbox"]
        assert [(m["subject"], m["state"]) for m in inbox] == [("a note", "PENDING")]
        other = orjson.loads(legion(cwd, "mail", "s2", "root", "--json").stdout)
        assert other["inbox"] == []


def test_a_paused_run_on_postgresql_resumes_and_completes(pg_url: str) -> None:
    with project() as cwd:
        (cwd / ".legion").mkdir()
        (cwd / ".legion" / "settings.json").write_text('{"supervision": {"forceRpc": true}}')  # rpc workers too
        release = gate_worker(cwd)
        proc = start(cwd, "run", "--run-id", "p1", "--ledger", pg_url, "--model", "scripted/root.yaml", "task")
        try:
            run_dir = cwd / ".legion" / "runs" / "p1"
            wait_until(in_transcript(run_dir, "w1", '"bash"'), message="w1's bash call", deadline=60.0)
            stopped = legion(cwd, "stop", "p1", "--all")
            assert stopped.returncode == 0, stopped.stderr
            assert proc.wait(30) == 130
        finally:
            stop_process(proc)
        assert _status(cwd, "p1")["w1"] == "retired"
        release.touch()
        resumed = legion(cwd, "resume", "p1", "--all")
        assert resumed.returncode == 0, resumed.stderr + resumed.stdout
        assert "all done" in resumed.stdout
        assert not (run_dir / "legion.db").exists()
        nodes, events, tokens, _ = _rows(pg_url, "p1")
        assert nodes["root"] == "settled" and nodes["w1"] == "settled" and tokens["w1"] > 0
        assert "node_retired" in events


def _not_a_ledger(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
    return "is not a legion ledger"


@pytest.mark.parametrize("case", ["bad url", "wrong password", "not a ledger"])
def test_a_ledger_that_cannot_be_used_is_refused_before_anything_exists(
        case: str, pg_server: PgServer, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    name = _database(pg_url)
    if case == "bad url":
        url, says = f"postgresql://{urlsplit(pg_url).netloc}:notaport/{name}", "does not parse"
    elif case == "wrong password":
        url, says = pg_server.url(name, password="not-the-password"), "password authentication failed"
    else:
        url, says = pg_url, _not_a_ledger(pg_url)
    with project() as cwd:
        out = legion_here(cwd, capsys, "run", "--run-id", "x1", "--ledger", url, "--model", "scripted/root.yaml", "t")
        assert out.returncode == 2, out.stderr
        assert says in out.stderr and "not-the-password" not in out.stderr
        assert not (cwd / ".legion" / "runs" / "x1").exists()
