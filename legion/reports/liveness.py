"""Whether a run's root is alive, read from its run directory: run.json's owner, a detached daemon's pid file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from legion.runs import DAEMON_LOG, DAEMON_PID


def root_alive(run_dir: Path) -> bool:
    """The run's root process (run.json's owner: pid + start time) is alive."""
    from legion.ledger import read_run_json
    from legion.ledger.owner import owner_alive

    data = read_run_json(run_dir) or {}
    owner = data.get("owner")
    return isinstance(owner, dict) and owner_alive(owner)


def run_condition(run_dir: Path) -> tuple[str | None, bool]:
    """(how the run's root stands when that is news — a detached daemon's state, or a root that died mid-run —
    or None; whether the root — a detached daemon or a foreground `legion run` — died mid-run)."""
    data = _peek_run_json(run_dir)
    status = data.get("status", "?")
    raw_owner = data.get("owner")
    owner: dict[str, Any] = raw_owner if isinstance(raw_owner, dict) else {}
    pid_file = run_dir / DAEMON_PID
    if pid_file.exists():
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return f"detached, but {pid_file} is unreadable", False
        if _alive(pid):
            return f"detached daemon pid {pid} running (run status {status}); log {run_dir / DAEMON_LOG}", False
        if status in ("starting", "running"):
            return (f"detached daemon pid {pid} DIED while the run was {status} (killed or crashed): see "
                    f"{run_dir / DAEMON_LOG}; `legion resume {run_dir.name}` continues it"), True
        return f"detached daemon pid {pid} exited (run status {status}); log {run_dir / DAEMON_LOG}", False
    root_pid = owner.get("pid")
    if status in ("starting", "running") and isinstance(root_pid, int) and not _alive(root_pid):
        return (f"the run's root (pid {root_pid}) DIED while the run was {status}; `legion resume {run_dir.name}` "
                "converges its nodes and continues it"), True
    return None, False


def _peek_run_json(run_dir: Path) -> dict[str, Any]:
    """run.json without importing the ledger (a status must start fast); {} when unreadable."""
    import orjson

    try:
        data = orjson.loads((run_dir / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
