"""run.json: written atomically (tmp + fsync + rename), read with quarantine of a corrupt file (docs/spec-conformance.md §4.7).

The shape other components write (all keys optional except where noted; rebuild reads these):
    {"run_id": str, "owner": {"pid": int, "create_time": float},
     "root": {"id": str, "name": str, "role": str, "session_file": str|null, ...},
     "children": [{"id", "name", "role", "parent_id", "depth", "kind", "model", "team",
                   "session_file", "worktree_path", "run_id", "status", "created_at"}, ...],
     "budgets": {...}, ...}
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from legion.ledger.errors import RunFileError
from legion.procs.durable import replace_file

RUN_JSON = "run.json"
LAUNCHES_DIR = "launches"  # <run>/launches/<node id>.json: what a later root needs to rebuild each node
WORKTREES_DIR = "worktrees"  # <run>/worktrees/<team>: the git worktree of each centurion of the run
CORRUPT_SUFFIX = ".corrupt"
OPERATOR_SOCKET = "op.sock"  # ipc://<run>/op.sock: the operator verbs (same-user only: 0600 socket, 0700 directory)


def write_run_json(run_dir: str | Path, data: dict[str, Any]) -> Path:
    """Replace run.json atomically: a reader sees the old or the new file, never a torn one."""
    if not isinstance(data, dict):
        raise RunFileError(f"run.json content must be a dict, got {type(data).__name__}")
    directory = Path(run_dir)
    target = directory / RUN_JSON
    try:
        payload = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise RunFileError(f"run.json content for {directory} is not JSON-serialisable: {exc}") from exc
    try:
        replace_file(target, payload, prefix=f"{RUN_JSON}.tmp.")
    except OSError as exc:
        raise RunFileError(f"cannot write {target}: {exc}") from exc
    return target


def read_run_json(run_dir: str | Path) -> dict[str, Any] | None:
    """The parsed run.json, or None when missing; a corrupt file is moved to run.json.corrupt (never raises)."""
    target = Path(run_dir) / RUN_JSON
    try:
        raw = target.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("run.json at {} unreadable: {}", target, exc)
        return None
    try:
        data = orjson.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"top level is {type(data).__name__}, not an object")
    except (orjson.JSONDecodeError, ValueError) as exc:
        _quarantine(target, str(exc))
        return None
    return data


def _quarantine(target: Path, why: str) -> None:
    quarantined = target.with_name(RUN_JSON + CORRUPT_SUFFIX)
    if quarantined.exists():  # keep the earlier evidence too: nothing is ever lost
        quarantined = target.with_name(f"{RUN_JSON}{CORRUPT_SUFFIX}.{time.time_ns()}")
    try:
        os.replace(target, quarantined)
        logger.warning("run.json at {} is corrupt ({}); quarantined as {}", target, why, quarantined)
    except OSError as exc:
        logger.warning("run.json at {} is corrupt ({}) and could not be quarantined: {}", target, why, exc)


def lock_held(path: Path) -> bool:
    """Some process holds an flock on `path` (a run's root.lock: its root is alive even when run.json is gone)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def recovered_run_json(run_dir: str | Path, root: dict[str, Any]) -> dict[str, Any]:
    """A run.json for a run whose own is missing or torn, from its root session's launch record (launches/<root>.json):
    what `legion resume` reads (runId, cwd, agent, task, sessionFile, the explicit model), marked `recovered`.
    No owner: the caller checks that no root holds the run (its root.lock) before writing it."""
    directory = Path(run_dir)
    raw_spec = root.get("spec")
    spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    cwd = spec.get("cwd")
    if not isinstance(cwd, str) or not cwd:
        # <project>/.legion/runs/<id>: the project is three levels up
        cwd = str(directory.resolve().parent.parent.parent)
    explicit = root.get("model_origin") == "explicit"
    return {
        "runId": directory.name,
        "cwd": cwd,
        "agent": str(root.get("role") or "root"),
        "task": str(root.get("task") or ""),
        "sessionFile": str(root.get("transcript") or directory / f"{root.get('id', 'root')}.jsonl"),
        "options": {"model": root.get("model") if explicit else None, "team": spec.get("team"), "preset": None,
                    "maxCostUsd": None},
        "updatedAt": int(time.time() * 1000),
        "recovered": {"from": f"launches/{root.get('id')}.json", "reason": "run.json was missing or torn"},
    }
