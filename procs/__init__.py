"""The process layer (imports nothing else of legion but the leaf `legion.codes`; every other component may import it).

- `table`: the process table from /proc — `ProcRef` (pid + start time), descendant/group snapshots,
  `alive`, `orphans_of`.
- `lineage`: `LINEAGE_ENV`, `lineage_mark`, `strays_of` (orphans of a worker's tree that re-parented to us).
- `pidfd`: `pidfd_exited`, `ProcessHandle` (a process we own the exit status of).
- `subreaper`: `set_child_subreaper`, `reap` (known orphans only), `has_children`.
- `sweeper`: `sweep` / `sweep_async` / `sweep_groups_async` (TERM then KILL via pidfds), `freeze_tree`.
- `cgroup`: cgroup v2 containment — `containment()`, `Cgroup`, run cgroups and their hygiene.
- `ladder`: the verified retire ladder — `retire_worker`, `RetireTimeouts`, `RetireFailed`, `RETIRE_FAILED`.
- `owner`: `owner_record` / `owner_alive` (a process named by pid + start time).
- `rlimit`: `raise_nofile` (soft RLIMIT_NOFILE up to the hard limit, at every process's start), `set_nofile`,
  `nofile_limit`, `open_fds`.
- `interpreter`: `python_command` / `boot_command` (`python -P`: legion's own interpreters never import the cwd).
- `durable`: `replace_file` (atomic, optionally fsynced whole-file writes), `write_synced_temp`, `fsync_dir`, `sync_paths` (many files, one syncfs).
"""

from legion.procs.cgroup import CGROUPS_ENV, Cgroup, Containment, containment, remove_dead_runs
from legion.procs.ladder import RETIRE_FAILED, RetireFailed, RetireReport, RetireTimeouts, retire_worker
from legion.procs.lineage import LINEAGE_ENV, lineage_mark, strays_of
from legion.procs.owner import owner_alive, owner_record
from legion.procs.pidfd import UNKNOWN_EXIT, ProcessHandle, pidfd_exited
from legion.procs.rlimit import nofile_limit, open_fds, raise_nofile, set_nofile
from legion.procs.subreaper import has_children, is_child_subreaper, reap, set_child_subreaper
from legion.procs.sweeper import (
    freeze_tree,
    group_exists,
    run_to_completion,
    sweep,
    sweep_async,
    sweep_groups_async,
)
from legion.procs.table import (
    ProcRef,
    alive,
    orphans_of,
    snapshot_descendants,
    snapshot_groups,
    snapshot_tree,
)

__all__ = [
    "CGROUPS_ENV",
    "LINEAGE_ENV",
    "RETIRE_FAILED",
    "UNKNOWN_EXIT",
    "Cgroup",
    "Containment",
    "ProcRef",
    "ProcessHandle",
    "RetireFailed",
    "RetireReport",
    "RetireTimeouts",
    "alive",
    "containment",
    "freeze_tree",
    "group_exists",
    "has_children",
    "is_child_subreaper",
    "lineage_mark",
    "nofile_limit",
    "open_fds",
    "orphans_of",
    "owner_alive",
    "owner_record",
    "pidfd_exited",
    "raise_nofile",
    "reap",
    "remove_dead_runs",
    "retire_worker",
    "run_to_completion",
    "set_child_subreaper",
    "set_nofile",
    "snapshot_descendants",
    "snapshot_groups",
    "snapshot_tree",
    "strays_of",
    "sweep",
    "sweep_async",
    "sweep_groups_async",
]
