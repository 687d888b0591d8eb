"""Owner files: a directory (e.g. an rpc-child-* temp dir) marked with the process that owns it.

The records and their liveness check are the process layer's (`legion.procs.owner`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from legion.procs.owner import owner_alive, owner_record

__all__ = ["OWNER_FILE", "owner_alive", "owner_record", "read_owner_file", "write_owner_file"]

OWNER_FILE = ".owner.json"


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
