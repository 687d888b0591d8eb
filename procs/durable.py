"""Whole-file writes, the one implementation for every layer: run.json, artifacts, transcript repairs,
launch records, caches and ready files. A reader sees the old file or the new one, never a torn one; a
durable write also survives a crash of the machine. In `procs` because every layer may import it (a
worker's preloaded modules import `procs` already, and not the ledger's SQLAlchemy)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_synced_temp(directory: Path, prefix: str, data: bytes, *, sync: bool = True, mode: int = 0o600) -> Path:
    """Write data whole to a fresh uniquely named temp file in directory (fsynced when `sync`); returns its path.

    Unique per call, so interleaved writers (threads, a signal-time rewrite) never share a temp file;
    short writes are completed. On failure the temp file is removed and OSError propagates.
    """
    fd, name = tempfile.mkstemp(prefix=prefix, dir=directory)
    tmp = Path(name)
    try:
        try:
            if mode != 0o600:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def replace_file(
    target: str | os.PathLike[str], data: bytes, *, durable: bool = True, prefix: str | None = None, mode: int = 0o600
) -> None:
    """Replace `target` by `data` atomically: a temp file beside it (with `mode`), renamed over it.

    `durable`: the file and the rename are fsynced before this returns; without it (caches, records that a
    later write replaces anyway) no disk flush is paid. `prefix` names the temp file (default
    `.<name>.tmp.`). On failure nothing is left behind and OSError propagates.
    """
    path = Path(target)
    tmp = write_synced_temp(path.parent, prefix or f".{path.name}.tmp.", data, sync=durable, mode=mode)
    try:
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def fsync_dir(directory: Path) -> None:
    """Make a rename/link in directory durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
