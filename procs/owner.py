"""Owner records: {pid, create_time} names a process for good, so a recycled pid is never its owner."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from legion.procs.table import DEAD_STATES, proc_stat

__all__ = ["owner_alive", "owner_record"]

# records are floats that went through JSON (older ones from psutil, which uses the same formula)
_CREATE_TIME_TOLERANCE_S = 0.05


def owner_record(pid: int | None = None) -> dict[str, Any]:
    """{'pid', 'create_time'} of a process (default: this one); raises ProcessLookupError if it is gone."""
    pid = pid if pid is not None else os.getpid()
    st = proc_stat(pid)
    if st is None:
        raise ProcessLookupError(f"no process {pid}")
    return {"pid": pid, "create_time": st.create_time}


def owner_alive(owner: Mapping[str, Any] | None) -> bool:
    """True only when the recorded process still runs (same pid *and* create time, not a zombie)."""
    if not isinstance(owner, Mapping):
        return False
    pid, created = owner.get("pid"), owner.get("create_time")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(created, int | float):
        return False
    st = proc_stat(pid)
    if st is None or abs(st.create_time - float(created)) > _CREATE_TIME_TOLERANCE_S:
        return False
    return st.state not in DEAD_STATES
