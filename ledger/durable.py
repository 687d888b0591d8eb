"""Durable file writes shared by run.json and artifacts: a synced temp file the caller then publishes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_synced_temp(directory: Path, prefix: str, data: bytes) -> Path:
    """Write data whole to a fresh uniquely named temp file in directory and fsync it; returns its path.

    Unique per call, so interleaved writers (threads, a signal-time rewrite) never share a temp file;
    short writes are completed. On failure the temp file is removed and OSError propagates.
    """
    fd, name = tempfile.mkstemp(prefix=prefix, dir=directory)
    tmp = Path(name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def fsync_dir(directory: Path) -> None:
    """Make a rename/link in directory durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
