"""Process ownership records (pid + create time) so hygiene never touches a live owner's rows or files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import psutil

OWNER_FILE = ".owner.json"
_CREATE_TIME_TOLERANCE_S = 0.05


def owner_record(pid: int | None = None) -> dict[str, Any]:
    """{'pid', 'create_time'} of a process (default: this one); create_time guards against pid reuse."""
    proc = psutil.Process(pid if pid is not None else os.getpid())
    return {"pid": proc.pid, "create_time": proc.create_time()}


def owner_alive(owner: Mapping[str, Any] | None) -> bool:
    """True only when the recorded process still runs (same pid *and* create time, not a zombie)."""
    if not isinstance(owner, Mapping):
        return False
    pid, created = owner.get("pid"), owner.get("create_time")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(created, int | float):
        return False
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - float(created)) > _CREATE_TIME_TOLERANCE_S:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return False


def write_owner_file(directory: str | Path, pid: int | None = None) -> Path:
    """Mark a directory (e.g. an rpc-child-* temp dir) as owned by a process."""
    path = Path(directory) / OWNER_FILE
    path.write_bytes(orjson.dumps(owner_record(pid)))
    return path


def read_owner_file(directory: str | Path) -> dict[str, Any] | None:
    """The owner record of a directory, or None when missing/unreadable."""
    try:
        data = orjson.loads((Path(directory) / OWNER_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
