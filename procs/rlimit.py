"""File-descriptor limits: every legion process raises its soft RLIMIT_NOFILE to the hard limit at start.

The common soft default (1024) is far below what the kernel allows the user (the hard limit); a run with
many workers, subscribers and a ledger should not fail at 1024 while the hard limit allows more. ZeroMQ
aborts the process on EMFILE in some paths (an ipc accept, a new mailbox), so headroom matters more than
usual: see docs/servers.md ("The tcp monitor") for why nothing network-facing runs in the root.
"""

from __future__ import annotations

import os
import resource


def raise_nofile(target: int | None = None) -> tuple[int, int]:
    """Set the soft RLIMIT_NOFILE to the hard limit (or to `target`, clamped to it); returns (soft, hard).

    Never lowers nor fails: a limit the kernel refuses leaves the current one in place."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if target is None else target
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if want == resource.RLIM_INFINITY:
        want = 1 << 20  # "unlimited" soft limits are refused by Linux (nr_open caps them): ask for a plenty
    if want > soft or soft == resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            return soft, hard
        return want, hard
    return soft, hard


def set_nofile(soft: int) -> tuple[int, int]:
    """Set the soft RLIMIT_NOFILE to `soft` (clamped to the hard limit), lower or higher; returns (soft, hard)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft, hard


def nofile_limit() -> int:
    """The current soft RLIMIT_NOFILE (a large number for "unlimited")."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def open_fds() -> int:
    """How many descriptors this process has open now (/proc/self/fd; -1 where that cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        return -1
