"""cgroup v2 containment, as systemd's `KillMode=control-group` does it.

Where the machine allows it (a cgroup2 mount in /proc/self/mountinfo, our own cgroup writable: root,
or a delegated subtree), a run gets a cgroup under our own (`legion-<pid>.<start ticks>.<n>`, so a
dead run's leftovers are recognisable) and each worker its own cgroup under that, joined before the
worker runs any code. Nothing escapes a cgroup by `setsid`, double fork or a pure `fork()`, and pid
reuse does not matter: `cgroup.procs` is the snapshot, `cgroup.kill` kills every member at once, and
`populated 0` in `cgroup.events` verifies that nothing is left.

`LEGION_CGROUPS=0` forces containment off (the pid/pgid ladder of `legion.procs.ladder` is then the
path); `containment()` says which path a run will use and why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import time
from dataclasses import dataclass
from pathlib import Path

from legion.procs.lineage import own_children
from legion.procs.pidfd import poll_ms
from legion.procs.subreaper import reap
from legion.procs.table import DEAD_STATES, ProcRef, is_alive, proc_stat, start_ticks

__all__ = [
    "CGROUPS_ENV",
    "Cgroup",
    "Containment",
    "cgroup2_mount",
    "containment",
    "create_run_cgroup",
    "own_cgroup_dir",
    "pinned_members",
    "reap_members",
    "remove_dead_runs",
    "run_cgroup_name",
    "run_owner",
]

CGROUPS_ENV = "LEGION_CGROUPS"
RUN_PREFIX = "legion-"
_RUN_RE = re.compile(r"^legion-(\d+)\.(\d+)\.(\d+)$")
_EVENT_POLL_S = 0.05  # re-read cgroup.events at least this often (a missed notification costs no more)
_REAP_ROUND_S = 0.25  # how old a scan of the process table `reap_members` may reuse


@dataclass(frozen=True)
class Containment:
    """Which containment a run will use, and why."""

    cgroups: bool
    reason: str
    parent: Path | None = None  # the cgroup a run's cgroup is created under


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> tuple[Path, str] | None:
    """(mount point, root of the mount inside the hierarchy) of the cgroup2 filesystem, or None."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            fields = left.split(" ")
            return Path(fields[4].replace("\\040", " ")), fields[3]
    return None


def own_cgroup_dir(mount: tuple[Path, str] | None = None, pid: int | str = "self") -> Path | None:
    """The directory of `pid`'s cgroup v2 under the mount, or None when it is not reachable from it."""
    mount = mount if mount is not None else cgroup2_mount()
    if mount is None:
        return None
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    path = next((ln[3:] for ln in lines if ln.startswith("0::")), None)
    point, root = mount
    if path is None or not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    rel = path[len(root.rstrip("/")) :].strip("/")
    return point / rel if rel else point


def containment(environ: dict[str, str] | None = None) -> Containment:
    """Decide between cgroup containment and the pid/pgid ladder for a run started from this process."""
    env = os.environ if environ is None else environ
    if env.get(CGROUPS_ENV, "").strip().lower() in ("0", "no", "off", "false"):
        return Containment(False, f"{CGROUPS_ENV}={env[CGROUPS_ENV]} forces cgroups off")
    mount = cgroup2_mount()
    if mount is None:
        return Containment(False, "no cgroup2 filesystem in /proc/self/mountinfo")
    parent = own_cgroup_dir(mount)
    if parent is None:
        return Containment(False, f"our cgroup is not under the cgroup2 mount {mount[0]}")
    if not (os.access(parent, os.W_OK) and os.access(parent / "cgroup.procs", os.W_OK)):
        return Containment(False, f"{parent} is not writable for uid {os.geteuid()} (no delegation, not root)")
    return Containment(True, f"cgroup v2 at {mount[0]}; runs get a cgroup under {parent}", parent)


class Cgroup:
    """One cgroup directory: members, kill, emptiness, removal."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Cgroup({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cgroup) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def child(self, name: str) -> Cgroup:
        """Create (or reuse) the child cgroup `name`."""
        path = self.path / name
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        return Cgroup(path)

    def join(self, pid: int = 0) -> None:
        """Move `pid` (0 = the calling process) into this cgroup."""
        fd = os.open(self.path / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, str(pid).encode())
        finally:
            os.close(fd)

    def procs(self, recursive: bool = False) -> list[int]:
        """Pids of the member processes (zombies are not members); [] once removed."""
        pids: list[int] = []
        try:
            pids = [int(p) for p in (self.path / "cgroup.procs").read_bytes().split()]
        except (OSError, ValueError):
            return []
        if recursive:
            for sub in self._children():
                pids.extend(sub.procs(recursive=True))
        return pids

    def refs(self) -> list[ProcRef]:
        """The live members (this cgroup and its children) as ProcRefs."""
        refs = []
        for pid in self.procs(recursive=True):
            st = proc_stat(pid)
            if st is not None:
                refs.append(ProcRef(pid=pid, pgid=st.pgid, create_time=st.create_time))
        return [r for r in refs if is_alive(r)]

    def populated(self) -> bool:
        """Whether any process is in this cgroup or below it (False once removed)."""
        try:
            return b"populated 1" in (self.path / "cgroup.events").read_bytes()
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL every process in this cgroup and below, atomically (nothing can fork away)."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / "cgroup.kill").write_bytes(b"1")

    def wait_empty(self, timeout: float) -> bool:
        """Block until `populated 0` (True) or `timeout` passed (False); woken by cgroup.events."""
        deadline = time.monotonic() + timeout
        try:
            fd = os.open(self.path / "cgroup.events", os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            while True:
                os.lseek(fd, 0, os.SEEK_SET)
                if b"populated 0" in os.read(fd, 512):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                poller.poll(poll_ms(min(remaining, _EVENT_POLL_S)))
        finally:
            os.close(fd)

    def _children(self) -> list[Cgroup]:
        # the directory entries' types, not a stat of each: a cgroup holds a dozen or more control files, and a
        # stat on cgroupfs cost the root's loop ~70 µs each (4.5 ms per retired rpc worker, measured)
        try:
            with os.scandir(self.path) as entries:
                return [Cgroup(entry.path) for entry in entries if entry.is_dir(follow_symlinks=False)]
        except OSError:
            return []

    def remove(self) -> bool:
        """rmdir this cgroup and its (empty) children, deepest first; True once it is gone."""
        if self._rmdir():  # a worker's cgroup has no children: no listing
            return True
        children = self._children()
        for sub in children:
            sub.remove()
        return bool(children) and self._rmdir()

    def _rmdir(self) -> bool:
        """rmdir; False while it has members or children (EBUSY, ENOTEMPTY)."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            raise
        return True

    def kill_and_remove(self, timeout: float) -> bool:
        """cgroup.kill, wait for `populated 0`, rmdir; True when nothing is left."""
        if not self.path.exists():
            return True
        self.kill()
        return self.wait_empty(timeout) and self.remove()


def pinned_members(cgroup: Cgroup, exclude: set[int]) -> dict[int, int]:
    """pid -> pidfd for the members of `cgroup` (minus `exclude`), each verified to still be a member
    after its pidfd was opened (so a pid recycled between the read and the open is never signalled)."""
    fds: dict[int, int] = {}
    for pid in cgroup.procs(recursive=True):
        if pid in exclude:
            continue
        with contextlib.suppress(OSError):
            fds[pid] = os.pidfd_open(pid)
    still = set(cgroup.procs(recursive=True))
    for pid in [p for p in fds if p not in still]:
        os.close(fds.pop(pid))
    return fds


_WALL = 0x40000000  # __WALL: children of any exit signal (the os module does not name it)


def _has_exited_child() -> bool:
    """Whether any child of ours has exited and is not reaped yet; a peek (WNOWAIT): it reaps nothing."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT | _WALL) is not None
    except ChildProcessError:  # no children at all
        return False
    except OSError:  # a kernel that refuses the peek: look at every child, as without it
        return True


def reap_members(cgroup: Cgroup, exclude: set[int]) -> dict[int, int]:
    """Reap our exited children that died in `cgroup` (or below): what re-parented to us and was killed
    there without ever being seen in a snapshot. Other children's statuses are never touched."""
    # nothing of ours waits to be reaped: no look at our children, which is a whole-process-table scan on
    # kernels without /proc/PID/task/TID/children and made the shutdown of many workers quadratic
    if not _has_exited_child():
        return {}
    mount = cgroup2_mount()
    mine = []
    # one process-table scan per retire round (kernels without /proc/PID/task/TID/children): a zombie a stale
    # scan misses is reaped by a later call
    for pid in own_children(max_age=_REAP_ROUND_S):
        if pid in exclude:
            continue
        st = proc_stat(pid)
        if st is None or st.state not in DEAD_STATES:
            continue
        where = own_cgroup_dir(mount, pid)
        if where is not None and (where == cgroup.path or cgroup.path in where.parents):
            mine.append(pid)
    return reap(mine)


def run_cgroup_name(owner: ProcRef, seq: int) -> str:
    """`legion-<pid>.<start ticks>.<n>`: the run's owner process, named for good."""
    return f"{RUN_PREFIX}{owner.pid}.{start_ticks(owner.create_time)}.{seq}"


def run_owner(name: str) -> tuple[int, int] | None:
    """(pid, start ticks) of the process that created run cgroup `name`, or None for another name."""
    match = _RUN_RE.match(name)
    return (int(match[1]), int(match[2])) if match else None


_run_seq = [0]


def create_run_cgroup(parent: Path) -> Cgroup:
    """A new run cgroup under `parent` (raises OSError when it cannot be made or lacks cgroup.kill)."""
    me = ProcRef.from_pid(os.getpid())
    assert me is not None
    _run_seq[0] += 1
    run = Cgroup(parent / run_cgroup_name(me, _run_seq[0]))
    run.path.mkdir()
    if not (run.path / "cgroup.kill").exists():  # Linux < 5.14
        run.remove()
        raise OSError(errno.ENOTSUP, f"{run.path} has no cgroup.kill (Linux ≥ 5.14 is needed)")
    return run


def _owner_alive(pid: int, ticks: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st.state not in DEAD_STATES and start_ticks(st.create_time) == ticks


def remove_dead_runs(parent: Path | None = None, timeout: float = 1.0) -> list[str]:
    """Kill and remove the run cgroups under `parent` (default: our own cgroup) whose owner is dead."""
    if parent is None:
        parent = own_cgroup_dir()
    if parent is None:
        return []
    removed: list[str] = []
    try:
        names = sorted(p.name for p in parent.iterdir() if p.is_dir())
    except OSError:
        return []
    for name in names:
        owner = run_owner(name)
        if owner is None or _owner_alive(*owner):
            continue
        if Cgroup(parent / name).kill_and_remove(timeout):
            removed.append(str(parent / name))
    return removed
