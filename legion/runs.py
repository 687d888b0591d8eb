"""Finding a run directory from what an operator types: nothing (the newest run), a run id, or a path; and the
names of the files legion keeps in one."""

from __future__ import annotations

from pathlib import Path

from legion.paths import runs_dir

LEDGER_FILE = "legion.db"
# `legion run --detach`: the daemon's output, its pid and its task (a daemon has no stdin)
DAEMON_LOG, DAEMON_PID, DAEMON_TASK = "daemon.log", "daemon.pid", "daemon.task"
DAEMON_FILES = frozenset({DAEMON_LOG, DAEMON_PID, DAEMON_TASK})


class RunNotFound(LookupError):
    """No run matches; the message says where legion looked and what to pass instead."""


def list_runs(cwd: Path) -> list[Path]:
    """Run directories of the project that hold a ledger, oldest first (by ledger mtime)."""
    root = runs_dir(cwd)
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if (p / LEDGER_FILE).is_file()]
    return sorted(runs, key=lambda p: ((p / LEDGER_FILE).stat().st_mtime, p.name))


def resolve_run(cwd: Path, run: str | None) -> Path:
    """The run directory named by `run` (a path or a run id), or the newest run when `run` is None."""
    if run is not None:
        candidate = Path(run)
        for path in (candidate, runs_dir(cwd) / run):
            if (path / LEDGER_FILE).is_file():
                return path.resolve()
        raise RunNotFound(
            f"no run '{run}': neither {candidate} nor {runs_dir(cwd) / run} holds a {LEDGER_FILE}; "
            f"`legion status` with no argument picks the newest run under {runs_dir(cwd)}"
        )
    runs = list_runs(cwd)
    if not runs:
        raise RunNotFound(
            f"no runs under {runs_dir(cwd)}: pass a run directory (one that holds {LEDGER_FILE})"
        )
    return runs[-1].resolve()
