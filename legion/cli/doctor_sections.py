"""`legion doctor SECTION`: the sections of docs/spec-conformance.md §7 that apply headless, each problem with its fix.

`summary` (the worst status of every section), `machine` (the default: `doctor.run_checks`), `models`
(`doctor.model_checks`), `spawn` (fork, the session worker's import, an ipc socket in the runs folder),
`memory`, `tools` (git, bash, pi, the legion command list), `storage` (the runs folder: size, free space,
old and corrupt runs, WAL), `runtime` (a live run's root, workers, heartbeats and cgroup), `errors` (the
newest run's failures and log errors; both read a run's ledger wherever it is: its legion.db or its rows in a
PostgreSQL database) and `next` (the fixes of every problem found, in order). No check
raises: a crash is reported as a failed check.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from legion.bus.protocol import NODE_PROBLEM
from legion.cli import doctor
from legion.cli.doctor import Check
from legion.ledger.constants import BUDGET_REFUSED, LIVE_STATUSES, NODE_ABANDONED, NODE_FAILED
from legion.paths import runs_dir
from legion.procs.interpreter import python_command
from legion.runs import LEDGER_FILE, ledger_url

SECTIONS = ("summary", "machine", "models", "spawn", "memory", "tools", "storage", "runtime", "errors", "next")
MIN_AVAILABLE_MB = 1024
PER_SESSION_MB = 60  # a pool-hosted session's rough resident cost (model client, transcript, tool output)
HEARTBEAT_STALE_S = 15.0
ERROR_EVENTS = frozenset({NODE_FAILED, NODE_ABANDONED, NODE_PROBLEM, BUDGET_REFUSED})
GIT_MIN = (2, 17)


def _safe(fn: Callable[[], list[Check]], name: str) -> list[Check]:
    try:
        return fn()
    except Exception as exc:  # a doctor reports; it never crashes
        return [Check(name, "fail", f"check crashed: {type(exc).__name__}: {exc}")]


def spawn_checks(cwd: Path) -> list[Check]:
    out: list[Check] = []
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only exits
        os._exit(0)
    os.waitpid(pid, 0)
    out.append(Check("fork", "ok", f"fork + exit + reap in {(time.perf_counter() - t0) * 1000:.1f} ms"))
    # the same interpreter flags as the fork server, in the project: its files must not shadow legion
    proc = subprocess.run(python_command("-c", "import time; t=time.perf_counter(); import legion.workers.session_worker;"
                                         " print(round((time.perf_counter()-t)*1000))"),
                          capture_output=True, text=True, timeout=60, cwd=cwd)  # fmt: skip
    if proc.returncode != 0:
        out.append(Check("session worker", "fail", f"legion.workers.session_worker does not import: "
                         f"{proc.stderr.strip()[-300:]}", _import_fix(proc.stderr)))
    else:
        out.append(Check("session worker", "ok", f"imports in {proc.stdout.strip()} ms (paid once by the fork server)"))
    out.append(_fork_server_probe(cwd))
    out.append(_ipc_probe(cwd))
    out.append(doctor.check_socket_path(cwd))
    return out


def _import_fix(error: str) -> str:
    if "hides" in error or "PYTHONPATH" in os.environ:
        return ("rename the file named above, or take its folder off PYTHONPATH (legion's interpreters never "
                "import from the current directory)")
    return f"reinstall legion in this Python ({sys.executable} -m pip install --force-reinstall pylegion, or from its clone)"


def _fork_server_probe(cwd: Path) -> Check:
    """Start a real fork server in the project (as a run's root would) and stop it again."""
    from legion.supervision.spawn import SpawnError, WorkerSpawner

    here = os.getcwd()
    t0 = time.perf_counter()
    try:
        os.chdir(cwd)  # the root runs in the project; so does its fork server
        with WorkerSpawner(None, cgroups=False):
            pass
    except SpawnError as exc:
        return Check("fork server", "fail", str(exc), _import_fix(str(exc)))
    finally:
        os.chdir(here)
    return Check("fork server", "ok", f"starts (with its preloads) and stops in {time.perf_counter() - t0:.1f} s")


def _ipc_probe(cwd: Path) -> Check:
    import zmq

    base = runs_dir(cwd) if runs_dir(cwd).is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=base, prefix="dr") as tmp:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        try:
            sock.bind(f"ipc://{tmp}/p.sock")
        except zmq.ZMQError as exc:
            return Check("ipc", "fail", f"cannot bind an ipc socket under {base}: {exc}",
                         "run from a local filesystem that allows unix sockets (not a network mount)")
        finally:
            sock.close(0)
    return Check("ipc", "ok", f"an ipc socket binds under {base}")


def memory_checks(cwd: Path) -> list[Check]:
    import psutil

    vm = psutil.virtual_memory()
    avail = vm.available // 2**20
    sessions = max(1, avail // PER_SESSION_MB)
    detail = f"{avail} MiB available of {vm.total // 2**20} MiB; room for ≈ {sessions} in-pool sessions"
    if avail < MIN_AVAILABLE_MB:
        return [Check("memory", "warn", detail, "free memory or lower inprocess.maxActive in "
                                                ".legion/settings.json (docs/settings.md)")]
    swap = psutil.swap_memory()
    return [Check("memory", "ok", detail),
            Check("swap", "ok", f"{swap.used // 2**20} MiB used of {swap.total // 2**20} MiB")]


def tools_checks(cwd: Path, commands: list[str] | None = None) -> list[Check]:
    out: list[Check] = []
    git = shutil.which("git")
    if git is None:
        out.append(Check("git", "fail", "git is not on PATH", "install git (worktrees and delivery need it)"))
    else:
        version = subprocess.run([git, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        numbers = tuple(int(p) for p in version.split()[-1].split(".")[:2] if p.isdigit())
        ok = numbers >= GIT_MIN
        out.append(Check("git", "ok" if ok else "warn", version,
                         "" if ok else f"upgrade git to ≥ {'.'.join(map(str, GIT_MIN))} (worktree commands)"))
    bash = shutil.which("bash")
    out.append(Check("bash", "ok" if bash else "fail", bash or "bash is not on PATH",
                     "" if bash else "install bash: the agents' shell tool runs it"))
    pi = shutil.which("pi")
    out.append(Check("pi", "ok", pi or "pi is not on PATH (only cards of kind pi need it)"))
    if commands:
        out.append(Check("commands", "ok", "legion " + " | ".join(commands)))
    return out


def storage_checks(cwd: Path) -> list[Check]:
    root = runs_dir(cwd)
    out = [doctor.check_sqlite_wal(root)]
    where = root if root.is_dir() else doctor._nearest_existing(root)
    free = shutil.disk_usage(where).free // 2**20
    out.append(Check("disk", "ok" if free > 1024 else "warn", f"{free} MiB free under {where}",
                     "" if free > 1024 else "free disk space: transcripts and the ledger grow with every run"))
    if not root.is_dir():
        out.append(Check("runs", "ok", f"{root} does not exist yet"))
        return out
    runs = [p for p in root.iterdir() if p.is_dir()]
    size = sum(f.stat().st_size for p in runs for f in p.rglob("*") if f.is_file() and not f.is_symlink())
    out.append(Check("runs", "ok", f"{len(runs)} run(s), {size // 2**20} MiB under {root}"))
    corrupt = sorted(p.name for p in runs if list(p.glob("run.json.corrupt*")))
    if corrupt:
        out.append(Check("run.json", "warn", f"quarantined run.json in {', '.join(corrupt)}",
                         "inspect run.json.corrupt, restore run.json from it, or remove the run directory"))
    return out


def _newest_run(cwd: Path) -> Path | None:
    from legion.runs import list_runs

    runs = list_runs(cwd)
    return runs[-1] if runs else None


def runtime_checks(cwd: Path) -> list[Check]:
    import psutil

    from legion.ledger import owner_alive
    from legion.runs import list_runs

    live: list[tuple[Path, int]] = []
    for run_dir in list_runs(cwd):
        owner = _read_json(run_dir / "run.json").get("owner")
        if isinstance(owner, dict) and owner_alive(owner):
            live.append((run_dir, int(owner["pid"])))
    if not live:
        return [Check("runtime", "ok", "no live run in this project")]
    out: list[Check] = []
    now = time.time() * 1000
    for run_dir, pid in live:
        proc = psutil.Process(pid)
        workers = proc.children(recursive=True)
        rss = sum(_rss(p) for p in [proc, *workers]) // 2**20
        cgroup = _cgroup(pid)
        out.append(Check(f"run {run_dir.name}", "ok", f"root pid {pid}, {len(workers)} worker process(es), "
                                                        f"{rss} MiB resident, cgroup {cgroup}"))
        rows, problem = _ledger_rows(run_dir, _nodes)
        out += problem
        for row in rows:
            if row["status"] not in LIVE_STATUSES:
                continue
            age = (now - int(row["updated_at"])) / 1000
            if age > HEARTBEAT_STALE_S:
                out.append(Check(f"node {row['id']}", "warn", f"{row['status']}, no heartbeat for {age:.0f}s",
                                 f"`legion events {run_dir.name}` shows its last events; `legion stop "
                                 f"{run_dir.name} {row['id']}` retires it"))
            else:
                out.append(Check(f"node {row['id']}", "ok", f"{row['status']}, heartbeat {age:.1f}s ago"))
    return out


def _ledger_rows(run_dir: Path, read: Callable[[Path], list[dict[str, Any]]],
                 ) -> tuple[list[dict[str, Any]], list[Check]]:
    """`read(run_dir)`'s rows of the run's ledger wherever it is (its legion.db, or its rows in the PostgreSQL database
    its run.json names), or no rows and a check saying why they could not be read."""
    from legion.ledger.errors import LedgerError

    try:
        return read(run_dir), []
    except (LedgerError, OSError, sqlite3.Error) as exc:
        where = ledger_url(run_dir) or str(run_dir / LEDGER_FILE)
        fix = ("set LEGION_LEDGER_PASSWORD (or PGPASSWORD, ~/.pgpass) and check that the server is reachable"
               if ledger_url(run_dir) else f"`legion rebuild {run_dir.name}` repairs a damaged ledger file")
        return [], [Check(f"ledger {run_dir.name}", "warn", f"cannot read {where}: {exc}"[:400], fix)]


def _nodes(run_dir: Path) -> list[dict[str, Any]]:
    from legion.reports.views import read_nodes

    return read_nodes(run_dir)


def _events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's first 100,000 events as fastread's rows (type, node_id, data, ...), from either backend."""
    from dataclasses import asdict

    from legion.reports import fastread
    from legion.runs import open_run_ledger

    with fastread.connect_run(run_dir) as conn:
        if conn is not None:
            return fastread.events_after(conn, 0, 100_000)
    with contextlib.closing(open_run_ledger(run_dir)) as ledger:
        return [asdict(ev) for ev in ledger.events_after(0, limit=100_000)]


def _rss(proc: object) -> int:
    try:
        return int(proc.memory_info().rss)  # type: ignore[attr-defined]
    except Exception:
        return 0


def _cgroup(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text().strip().splitlines()[-1].split(":", 2)[-1]
    except (OSError, IndexError):
        return "?"


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def errors_checks(cwd: Path) -> list[Check]:
    run_dir = _newest_run(cwd)
    if run_dir is None:
        return [Check("errors", "ok", "no runs yet")]
    events, out = _ledger_rows(run_dir, _events)
    bad = [e for e in events if e["type"] in ERROR_EVENTS][-10:]
    for ev in bad:
        data = ev["data"] if isinstance(ev["data"], dict) else {}
        why = data.get("reason") or data.get("what") or data.get("message") or ""
        out.append(Check(f"{ev['type']}", "warn", f"{ev['node_id'] or '-'}: {str(why)[:200]}",
                         f"`legion summary {run_dir.name} {ev['node_id'] or ''}`".replace(" `", "`")))
    log = run_dir / "legion.log"
    lines = []
    if log.is_file():
        with log.open("rb") as fh:
            fh.seek(max(0, log.stat().st_size - 256_000))
            lines = [ln.decode(errors="replace") for ln in fh.read().splitlines() if b" | ERROR " in ln][-5:]
    out += [Check("log", "warn", ln[-300:], f"see {log}") for ln in lines]
    return out or [Check("errors", "ok", f"no failures or errors in run {run_dir.name}")]


def section(name: str, cwd: Path, commands: list[str] | None = None) -> list[Check]:
    """The checks of one section (`summary` and `next` are computed from all the others)."""
    if name == "summary":
        return [_worst(s, section(s, cwd, commands)) for s in SECTIONS if s not in ("summary", "next")]
    if name == "next":
        return next_steps(cwd, commands)
    table: dict[str, Callable[[], list[Check]]] = {
        "machine": lambda: doctor.run_checks(cwd),
        "models": lambda: doctor.model_checks(cwd),
        "spawn": lambda: spawn_checks(cwd),
        "memory": lambda: memory_checks(cwd),
        "tools": lambda: tools_checks(cwd, commands),
        "storage": lambda: storage_checks(cwd),
        "runtime": lambda: runtime_checks(cwd),
        "errors": lambda: errors_checks(cwd),
    }
    return _safe(table[name], name)


def _worst(name: str, checks: list[Check]) -> Check:
    order = {"ok": 0, "off": 0, "warn": 1, "fail": 2}
    worst = max(checks, key=lambda c: order.get(c.status, 2)) if checks else Check(name, "ok", "")
    problems = [c for c in checks if c.status not in ("ok", "off")]
    detail = f"{len(checks)} check(s), {len(problems)} problem(s)"
    if problems:
        detail += f"; first: {problems[0].name}: {problems[0].detail[:120]}"
    return Check(name, worst.status, detail, f"`legion doctor {name}`" if problems else "")


def next_steps(cwd: Path, commands: list[str] | None = None) -> list[Check]:
    steps = []
    for name in SECTIONS:
        if name in ("summary", "next"):
            continue
        for check in section(name, cwd, commands):
            if check.status not in ("ok", "off") and check.fix:
                steps.append(Check(f"{name}: {check.name}", check.status, check.detail[:160], check.fix))
    if not steps:
        return [Check("next", "ok", "nothing to fix: try `legion demo`, then `legion run \"your task\"`")]
    return steps
