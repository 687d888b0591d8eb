"""Finding a run directory from what an operator types: nothing (the newest run), a run id, or a path; and the
names of the files legion keeps in one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from legion.ledger.location import LEDGER_FILE, RUN_JSON_KEY
from legion.paths import runs_dir

if TYPE_CHECKING:
    from legion.ledger import Ledger

__all__ = ["DAEMON_FILES", "LEDGER_FILE", "RunNotFound", "ledger_url", "list_runs", "open_run_ledger", "resolve_run"]
# `legion run --detach`: the daemon's output, its pid and its task (a daemon has no stdin)
DAEMON_LOG, DAEMON_PID, DAEMON_TASK = "daemon.log", "daemon.pid", "daemon.task"
DAEMON_FILES = frozenset({DAEMON_LOG, DAEMON_PID, DAEMON_TASK})


class RunNotFound(LookupError):
    """No run matches; the message says where legion looked and what to pass instead."""


def _run_json(run_dir: Path) -> dict[str, Any]:
    """run.json as it stands (never repaired here), {} when missing or unreadable."""
    try:
        data = orjson.loads((run_dir / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def ledger_url(run_dir: Path) -> str | None:
    """The PostgreSQL URL (no password) that the run's run.json names, None for a run on its own legion.db."""
    url = _run_json(run_dir).get(RUN_JSON_KEY)
    return url if isinstance(url, str) and url else None


def _ledger_mark(run_dir: Path) -> Path | None:
    """The file that says `run_dir` is a run: its legion.db, or the run.json of a run on a PostgreSQL ledger."""
    if (run_dir / LEDGER_FILE).is_file():
        return run_dir / LEDGER_FILE
    if ledger_url(run_dir) is not None:
        return run_dir / "run.json"
    return None


def open_run_ledger(run_dir: Path) -> Ledger:
    """The run's ledger: its legion.db, or its rows in the PostgreSQL database its run.json names (the password
    comes from the environment: LEGION_LEDGER_PASSWORD, PGPASSWORD or ~/.pgpass)."""
    from legion.ledger import open_ledger

    url = ledger_url(run_dir)
    if url is None:
        return open_ledger(run_dir / LEDGER_FILE)
    return open_ledger(url, run_id=str(_run_json(run_dir).get("runId") or run_dir.name))


def list_runs(cwd: Path) -> list[Path]:
    """Run directories of the project that hold a ledger (or name one), oldest first (by that file's mtime)."""
    root = runs_dir(cwd)
    if not root.is_dir():
        return []
    marked = [(p, mark) for p in root.iterdir() if (mark := _ledger_mark(p)) is not None]
    return [p for p, _ in sorted(marked, key=lambda pm: (pm[1].stat().st_mtime, pm[0].name))]


def resolve_run(cwd: Path, run: str | None) -> Path:
    """The run directory named by `run` (a path or a run id), or the newest run when `run` is None."""
    if run is not None:
        candidate = Path(run)
        for path in (candidate, runs_dir(cwd) / run):
            if _ledger_mark(path) is not None:
                return path.resolve()
        raise RunNotFound(
            f"no run '{run}': neither {candidate} nor {runs_dir(cwd) / run} holds a {LEDGER_FILE} or a run.json "
            f"naming its ledger; `legion status` with no argument picks the newest run under {runs_dir(cwd)}"
        )
    runs = list_runs(cwd)
    if not runs:
        raise RunNotFound(
            f"no runs under {runs_dir(cwd)}: pass a run directory (one that holds {LEDGER_FILE}, or a run.json "
            "naming its ledger)"
        )
    return runs[-1].resolve()
