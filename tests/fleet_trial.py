"""One trial of issue 24 item 6, "hosts, simulated honestly": three hosts (network namespaces with host names
of their own) each run a tree into one PostgreSQL server on a fourth, one host's root is killed mid-run, and the
fleet is checked from another host — its view, its budget, and the killed run resumed on its own host.

- The view (`legion status|summary --ledger URL`, read on h1): every run with its own host name and the project;
  the killed run shown `lost` once its heartbeat stops (LEGION_FLEET_HEARTBEAT_S=1: lost after 3 s), the others
  ended; `--host` and `--state` select; after the resume every run has ended the same way.
- The budget (`legion.budget.fleetMaxCostUsd`, shared by the project's runs in the database): the three runs fit
  in it; then a probe run on h3 whose limit is what the fleet has spent plus less than one launch's reserve is
  refused at its root's launch (scope fleet-cost, exit 2), having counted every other host's spending.

Used by tests/e2e/test_fleet_hosts.py (one trial) and bench/fleet_hosts.py (trials in a row).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.netns import Lan, lan
from tests.pg_server import PASSWORD, PgServer, running_server
from tests.support import wait_until

HOSTS = ("h1", "h2", "h3")
VICTIM = "h2"
PROJECT = "fleet-trial"
TURN_COST = 0.01  # USD each scripted model call reports
LEGION = (sys.executable, "-m", "legion")

ROOT = """\
turns:
  - usage: {input: 100, output: 10, cost: %(cost)s}
    tool_calls:
      - name: subagent
        arguments:
          action: launch
          tasks:
            - {agent: worker, name: w1, task: "one", model: scripted/worker.yaml}
            - {agent: worker, name: w2, task: "two", model: scripted/worker.yaml}
rules:
  - match: "W RESULT"
    reply: {text: "all done", usage: {input: 100, output: 10, cost: %(cost)s}}
default:
  usage: {input: 100, output: 10, cost: %(cost)s}
  tool_calls:
    - name: subagent
      arguments: {action: wait, names: [w1, w2]}
"""

WORKER = """\
turns:
  - usage: {input: 100, output: 10, cost: %(cost)s}
    tool_calls:
      - name: bash
        arguments: {command: "until [ -e %(release)s ]; do sleep 0.05; done; echo hi"}
default: {text: "W RESULT ok", usage: {input: 100, output: 10, cost: %(cost)s}}
"""


@dataclass
class Host:
    name: str
    project: Path
    release: Path
    proc: subprocess.Popen[str] | None = None
    log: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.project / ".legion" / "runs" / self.name


FLEET_BUDGET_USD = 2.0  # the three runs' limit: ample (each spends about $0.1 and holds $0.1 at most)
RESERVE_USD = 0.05  # orchestration/launch.py DEFAULT_RESERVE_USD: what the probe's launch asks to hold

PROBE = """\
default: {text: "finished", usage: {input: 100, output: 10, cost: %(cost)s}}
"""


def _env() -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "LEGION_LOG_LEVEL": "ERROR", "LEGION_LEDGER_PASSWORD": PASSWORD,
            "LEGION_FLEET_HEARTBEAT_S": "1"}


def _project(root: Path, host: str, settings: dict[str, Any]) -> Host:
    project = root / host
    (project / ".legion").mkdir(parents=True)
    release = project / "release"
    (project / "root.yaml").write_text(ROOT % {"cost": TURN_COST})
    (project / "worker.yaml").write_text(WORKER % {"cost": TURN_COST, "release": release})
    (project / ".legion" / "settings.json").write_bytes(orjson.dumps(settings))
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    return Host(host, project, release)


def legion_on(net: Lan, host: Host, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`legion -C PROJECT ARGS` run on the host, to the end."""
    return subprocess.run(net.argv(host.name, [*LEGION, "-C", str(host.project), *args]), capture_output=True,
                          text=True, timeout=timeout, env=_env())


def _start_run(net: Lan, host: Host, url: str) -> None:
    argv = [*LEGION, "-C", str(host.project), "run", "--run-id", host.name, "--ledger", url,
            "--model", "scripted/root.yaml", "two workers"]
    host.proc = subprocess.Popen(net.argv(host.name, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=_env())


def _root_pid(host: Host) -> int:
    record = orjson.loads((host.run_dir / "run.json").read_bytes())
    return int(record["owner"]["pid"])


def _workers_waiting(host: Host) -> bool:
    for name in ("w1", "w2"):
        path = host.run_dir / f"{name}.jsonl"
        if not path.exists() or '"bash"' not in path.read_text(errors="replace"):
            return False
    return True


@contextlib.contextmanager
def fleet(budget_usd: float | None = None) -> Iterator[tuple[Lan, PgServer, str, dict[str, Host]]]:
    """The lan, the server on `db`, the ledger URL every host uses, and each host's project."""
    work = Path(tempfile.mkdtemp(prefix="lgf", dir="/tmp"))
    os.chmod(work, 0o755)
    settings: dict[str, Any] = {"legion": {"project": PROJECT}}
    if budget_usd is not None:
        settings["legion"]["budget"] = {"fleetMaxCostUsd": budget_usd}
    try:
        with lan([*HOSTS, "db"]) as net:
            db = net.addresses["db"]
            with running_server(listen=db, enter=tuple(net.enter("db")), allow=db.rsplit(".", 1)[0] + ".0/24") as srv:
                srv.admin("CREATE DATABASE fleet")
                url = f"postgresql://postgres@{db}:{srv.port}/fleet"
                hosts = {h: _project(work, h, settings) for h in HOSTS}
                yield net, srv, url, hosts
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_trial(budget_usd: float | None = FLEET_BUDGET_USD) -> dict[str, Any]:
    """One trial; raises AssertionError naming what did not hold; returns its figures."""
    started = time.monotonic()
    with fleet(budget_usd) as (net, _srv, url, hosts):
        try:
            for host in hosts.values():
                _start_run(net, host, url)
            for host in hosts.values():
                wait_until(lambda h=host: _workers_waiting(h), message=f"{host.name}'s workers at their bash call",
                           deadline=90.0)
            victim = hosts[VICTIM]
            os.kill(_root_pid(victim), signal.SIGKILL)
            assert victim.proc is not None
            victim.proc.wait(30)
            # the root's workers and their tools go with it: nothing of the run is left on its host
            wait_until(lambda: not net.pids(VICTIM), message=f"every process on {VICTIM} gone after its root's kill",
                       deadline=30.0)
            for name, host in hosts.items():
                if name != VICTIM:
                    host.release.touch()
            for name, host in hosts.items():
                if name != VICTIM:
                    assert host.proc is not None
                    code = host.proc.wait(90)
                    assert code == 0, f"{name}'s run exited {code}: {host.proc.stderr.read() if host.proc.stderr else ''}"
            figures: dict[str, Any] = {"killed": VICTIM}
            figures["view_after_kill"] = check_fleet_after_kill(net, hosts, url)
            victim.release.touch()
            resumed = legion_on(net, victim, "resume", VICTIM, "--all", timeout=120)
            assert resumed.returncode == 0, f"resume on {VICTIM} exited {resumed.returncode}: {resumed.stderr}"
            figures["view_after_resume"] = check_fleet_after_resume(net, hosts, url)
            if budget_usd is not None:
                figures["budget"] = check_fleet_budget(net, hosts["h3"], url, budget_usd)
        finally:
            for host in hosts.values():
                if host.proc is not None and host.proc.poll() is None:
                    host.proc.kill()
                    host.proc.wait(10)
    figures["seconds"] = round(time.monotonic() - started, 1)
    return figures


def _status(net: Lan, host: Host, run: str) -> dict[str, str]:
    out = legion_on(net, host, "status", run, "--json")
    assert out.returncode == 0, f"status {run} on {host.name}: {out.stderr}"
    return {n["name"]: n["status"] for n in orjson.loads(out.stdout)["nodes"] if n["name"] != "pool"}


def fleet_view(net: Lan, host: Host, url: str, *args: str) -> dict[str, dict[str, Any]]:
    """`legion status --ledger URL ARGS --json` run on `host`: each run's row by run id."""
    out = legion_on(net, host, "status", "--ledger", url, *args, "--json")
    assert out.returncode == 0, f"the fleet view on {host.name} exited {out.returncode}: {out.stderr}"
    return {row["run"]: row for row in orjson.loads(out.stdout)["runs"]}


def _shown(view: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {run: str(row["shown"]) for run, row in view.items()}


def check_fleet_after_kill(net: Lan, hosts: dict[str, Host], url: str) -> dict[str, Any]:
    """From h1: every run on its own host; the finished ones ended, each tree settled; the killed one lost."""
    watcher = hosts["h1"]
    for name, host in hosts.items():
        if name != VICTIM:
            nodes = _status(net, host, name)
            assert set(nodes.values()) == {"settled"}, f"{name}: {nodes}"
    wait_until(lambda: fleet_view(net, watcher, url)[VICTIM]["shown"] == "lost",
               message=f"{VICTIM} shown lost in the fleet view once its heartbeat stopped", deadline=30.0)
    view = fleet_view(net, watcher, url)
    assert set(view) == set(HOSTS), f"the fleet view's runs: {sorted(view)}"
    assert {run: row["host"] for run, row in view.items()} == {h: h for h in HOSTS}, view
    assert {row["project"] for row in view.values()} == {PROJECT}
    ended = {run: shown for run, shown in _shown(view).items() if run != VICTIM}
    assert all(shown not in ("starting", "running", "lost") for shown in ended.values()), ended
    assert set(fleet_view(net, watcher, url, "--host", VICTIM)) == {VICTIM}
    assert set(fleet_view(net, watcher, url, "--state", "lost")) == {VICTIM}
    return _shown(view)


def check_fleet_after_resume(net: Lan, hosts: dict[str, Host], url: str) -> dict[str, Any]:
    seen = _status(net, hosts[VICTIM], VICTIM)
    assert set(seen.values()) == {"settled"}, f"{VICTIM} after resume: {seen}"
    shown = _shown(fleet_view(net, hosts["h3"], url))
    assert len(set(shown.values())) == 1 and shown[VICTIM] not in ("lost", "running"), shown
    return shown


def check_fleet_budget(net: Lan, host: Host, url: str, budget_usd: float) -> dict[str, Any]:
    """The three runs fit in the budget; a probe run on `host` whose limit leaves less than one launch's reserve
    over what the other hosts' runs spent is refused at its root's own launch, for the fleet budget."""
    out = legion_on(net, host, "summary", "--ledger", url, "--json")
    assert out.returncode == 0, out.stderr
    spent = float(orjson.loads(out.stdout)["totals"]["cost_usd"])
    assert 0 < spent <= budget_usd, f"the fleet spent ${spent} against ${budget_usd}"
    limit = round(spent + RESERVE_USD / 2, 4)
    (host.project / "probe.yaml").write_text(PROBE % {"cost": TURN_COST})
    settings = orjson.loads((host.project / ".legion" / "settings.json").read_bytes())
    settings["legion"]["budget"] = {"fleetMaxCostUsd": limit}
    (host.project / ".legion" / "settings.json").write_bytes(orjson.dumps(settings))
    probe = legion_on(net, host, "run", "--run-id", "probe", "--ledger", url, "--model", "scripted/probe.yaml",
                      "one run too many", timeout=90)
    assert probe.returncode == 2 and "fleet-wide cost budget" in probe.stdout + probe.stderr, (
        f"the probe run exited {probe.returncode}: {probe.stdout}{probe.stderr}")
    events = legion_on(net, host, "events", "probe", "--json")
    assert events.returncode == 0, events.stderr
    refused = [e for e in map(orjson.loads, events.stdout.splitlines()) if e.get("type") == "budget_refused"]
    assert len(refused) == 1, events.stdout
    data = refused[0]  # the event's fields are flat in the public event
    assert data["scope"] == "fleet-cost" and data["limit"] == limit, data
    assert abs(float(data["spent_other_runs"]) - spent) < 1e-6, (data, spent)  # the other hosts' runs, all counted
    return {"spent_usd": spent, "probe_limit_usd": limit, "refused_spent_other_runs": data["spent_other_runs"]}
