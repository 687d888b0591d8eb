"""Child-subreaper marking (prctl) and reaping of known orphans only.

The root marks itself a child subreaper so orphaned descendants of any worker re-parent to it and stay
enumerable (docs/architecture.md §2); every worker does the same for its own tree. Orphans that die then
become our zombies; we reap only pids we know to be orphans (sweep lists), never `waitpid(-1)`, so exit
statuses owned by asyncio/subprocess are never stolen.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterable

__all__ = ["has_children", "is_child_subreaper", "reap", "set_child_subreaper"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37

_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL:
    """libc from the symbols already loaded into this process; `find_library` only as a fallback.

    Why: `find_library` runs `ldconfig -p` in a subprocess (~6 ms, more under load), and every freshly
    forked worker marks itself a subreaper on its way to `ready`."""
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "prctl"):
        return libc
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _prctl(option: int, arg: int | ctypes.c_void_p) -> int:
    global _libc
    if _libc is None:
        _libc = _load_libc()
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


def has_children() -> bool:
    """Whether this process has any child at all (running or zombie), from one waitid syscall."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def reap(pids: Iterable[int]) -> dict[int, int]:
    """Reap those of `pids` that are our exited children (WNOHANG); returns pid -> exit code.

    Only for pids known to be orphans/ours to collect (sweep lists): never `waitpid(-1)`, which would
    steal exit statuses owned by asyncio or subprocess.
    """
    reaped: dict[int, int] = {}
    for pid in pids:
        if pid <= 0 or pid == os.getpid():
            continue
        with contextlib.suppress(ChildProcessError, OSError):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                reaped[pid] = os.waitstatus_to_exitcode(status)
    return reaped
