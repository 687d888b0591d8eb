"""Child-subreaper marking (prctl) and reaping of known orphans only.

The root marks itself a child subreaper so orphaned descendants of any worker re-parent to it and stay
enumerable (DESIGN §2). Orphans that die then become our zombies; we reap only pids we know to be
orphans (sweep lists), never `waitpid(-1)`, so exit statuses owned by asyncio/subprocess/multiprocess
are never stolen.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from legion.workers.proc_sweep import reap

__all__ = ["is_child_subreaper", "reap", "set_child_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37

_libc: ctypes.CDLL | None = None


def _prctl(option: int, arg: int | ctypes.c_void_p) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    rc = int(_libc.prctl(option, arg, 0, 0, 0))
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")
    return rc


def set_child_subreaper(enabled: bool = True) -> None:
    """Make orphaned descendants re-parent to this process instead of init."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1 if enabled else 0)


def is_child_subreaper() -> bool:
    """Whether this process is currently a child subreaper."""
    value = ctypes.c_int(0)
    _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.cast(ctypes.pointer(value), ctypes.c_void_p))
    return bool(value.value)
