"""One root per run directory: an exclusive flock on `root.lock`, which also names the owner's pid.

A second root on the same directory would silently take over the first one's ipc sockets."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

ROOT_LOCK = "root.lock"


class RunDirBusy(RuntimeError):
    """Another root supervisor owns this run directory."""


def lock_run_dir(run_dir: Path) -> int:
    """Take the run directory's lock and write our pid into it; the fd holds the lock until it is closed."""
    path = run_dir / ROOT_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirBusy(
            f"run directory {run_dir} is owned by another root supervisor (pid {owner}); "
            "stop it first (`legion stop`) or use another run directory"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
