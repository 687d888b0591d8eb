"""Root supervisor, OTP strategies and child specs, spawning and the retire ladder.

The OTP layer's public names are exported lazily (PEP 562), so importing one submodule (the fork
server preloads a few) never drags in the whole supervision tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from legion import lazy_exports

_EXPORTS: dict[str, str] = {
    # child_spec
    "BRUTAL_KILL": "child_spec",
    "ChildHandle": "child_spec",
    "ChildSpec": "child_spec",
    "ChildSpecError": "child_spec",
    "ExitKind": "child_spec",
    "ExitReason": "child_spec",
    "RetireTimeouts": "child_spec",
    "should_restart": "child_spec",
    # supervisor
    "Backoff": "supervisor",
    "ChildAlreadyPresent": "supervisor",
    "ChildInfo": "supervisor",
    "ChildNotFound": "supervisor",
    "ChildRunning": "supervisor",
    "RESTART_INTENSITY": "supervisor",
    "ShutdownTimeout": "supervisor",
    "StartFailed": "supervisor",
    "Supervisor": "supervisor",
    "SupervisorError": "supervisor",
    "SupervisorNotRunning": "supervisor",
    "SupervisorObserver": "supervisor",
    "supervisor_spec": "supervisor",
    # hang, lifecycle, rpc children, root
    "HangDetector": "hang",
    "Lifecycle": "lifecycle",
    "LifecycleObserver": "lifecycle",
    "SESSION_SHUTDOWN": "lifecycle",
    "RpcChild": "rpc_child",
    "RpcNode": "rpc_child",
    "rpc_child_spec": "rpc_child",
    "RootSupervisor": "root",
    "RunDirBusy": "run_lock",
}

__all__ = [
    "BRUTAL_KILL",
    "RESTART_INTENSITY",
    "SESSION_SHUTDOWN",
    "Backoff",
    "ChildAlreadyPresent",
    "ChildHandle",
    "ChildInfo",
    "ChildNotFound",
    "ChildRunning",
    "ChildSpec",
    "ChildSpecError",
    "ExitKind",
    "ExitReason",
    "HangDetector",
    "Lifecycle",
    "LifecycleObserver",
    "RetireTimeouts",
    "RootSupervisor",
    "RpcChild",
    "RpcNode",
    "RunDirBusy",
    "ShutdownTimeout",
    "StartFailed",
    "Supervisor",
    "SupervisorError",
    "SupervisorNotRunning",
    "SupervisorObserver",
    "rpc_child_spec",
    "should_restart",
    "supervisor_spec",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from legion.supervision.child_spec import (
        BRUTAL_KILL,
        ChildHandle,
        ChildSpec,
        ChildSpecError,
        ExitKind,
        ExitReason,
        RetireTimeouts,
        should_restart,
    )
    from legion.supervision.hang import HangDetector
    from legion.supervision.lifecycle import SESSION_SHUTDOWN, Lifecycle, LifecycleObserver
    from legion.supervision.root import RootSupervisor
    from legion.supervision.rpc_child import RpcChild, RpcNode, rpc_child_spec
    from legion.supervision.run_lock import RunDirBusy
    from legion.supervision.supervisor import (
        RESTART_INTENSITY,
        Backoff,
        ChildAlreadyPresent,
        ChildInfo,
        ChildNotFound,
        ChildRunning,
        ShutdownTimeout,
        StartFailed,
        Supervisor,
        SupervisorError,
        SupervisorNotRunning,
        SupervisorObserver,
        supervisor_spec,
    )
