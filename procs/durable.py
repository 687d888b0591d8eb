"""Whole-file writes, the one implementation for every layer: run.json, artifacts, transcript repairs,
launch records, caches and ready files. A reader sees the old file or the new one, never a torn one; a
durable write also survives a crash of the machine. `sync_paths` makes many written files durable at once
(one syncfs per filesystem): a ledger writer's group commit uses it (docs/architecture.md §5, "Durability"). In `procs` because every layer may import it (a
worker's preloaded modules import `procs` already, and not the ledger's SQLAlchemy)."""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import cast


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


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs(2) (Linux), or None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return cast("Callable[[int], int]", fn)


_syncfs = _load_syncfs()


def _syncfs_dir(directory: Path) -> None:
    """One syncfs(2) of the filesystem holding `directory` (OSError on its failure)."""
    assert _syncfs is not None
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of the filesystem holding {directory}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_paths(paths: Iterable[str | os.PathLike[str]]) -> int:
    """Make written files durable, their data and their directory entries, in as few syncs as possible.

    With syncfs(2) (Linux): one call per filesystem the files live on, however many files (a group commit's
    artifacts and transcripts are all in one run directory: one call). Without it: an fsync of each file and
    of each directory, as `replace_file` does. A file that no longer exists is skipped (nothing of it is
    left to keep). Returns the number of sync calls made; OSError when one fails (the data may not be on disk).
    """
    folders: dict[int, Path] = {}
    files: list[Path] = []
    for raw in dict.fromkeys(Path(p) for p in paths):
        try:
            dev = os.stat(raw.parent).st_dev
        except FileNotFoundError:
            continue
        folders.setdefault(dev, raw.parent)
        files.append(raw)
    if _syncfs is not None:
        for folder in folders.values():
            _syncfs_dir(folder)
        return len(folders)
    calls = 0
    for path in files:
        try:
            _fsync_file(path)
        except FileNotFoundError:
            continue
        calls += 1
    for folder in dict.fromkeys(p.parent for p in files):
        fsync_dir(folder)
        calls += 1
    return calls
