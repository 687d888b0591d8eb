"""WorkerSpawner: fork server, own process group, lifeline, exit observation, ready over the control channel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legion.bus.control import ControlServer
from legion.bus.protocol import Message
from legion.procs import ProcRef, containment, is_child_subreaper, sweep
from legion.procs.cgroup import own_cgroup_dir
from legion.supervision.spawn import DEFAULT_PRELOAD, SpawnError, WorkerProcess, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY, find_marked
from tests.support import poller

pytestmark = pytest.mark.timeout(30)
PRELOAD = (*DEFAULT_PRELOAD, "legion.workers.fixture_worker")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spawn")


@pytest.fixture(scope="module")
def spawner(run_dir: Path) -> Iterator[WorkerSpawner]:
    sp = WorkerSpawner(f"ipc://{run_dir}/ctl.sock", preload=PRELOAD)
    sp.start()
    yield sp
    sp.close()


@pytest.fixture(scope="module")
def bare() -> Iterator[WorkerSpawner]:
    """Workers without a control channel (process mechanics only)."""
    sp = WorkerSpawner(None, preload=PRELOAD)
    sp.start()
    yield sp
    sp.close()


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.signal(signal.SIGKILL)
        w.wait_blocking(5)
        w.close()


_until = poller(10.0, 0.005)


async def _ready_file(path: Path, timeout: float = 10.0) -> dict[str, Any]:
    await _until(path.exists, timeout)
    body: dict[str, Any] = orjson.loads(path.read_bytes())
    return body


def test_root_is_a_child_subreaper(bare: WorkerSpawner) -> None:
    assert is_child_subreaper()
    assert bare.preload_failed == {}


def test_the_last_spawner_to_close_restores_the_subreaper_flag() -> None:
    code = (
        "from legion.supervision.spawn import WorkerSpawner\n"
        "from legion.procs import is_child_subreaper as s\n"
        "a, b = WorkerSpawner(None, preload=()), WorkerSpawner(None, preload=())\n"
        "a.start(); b.start(); r = [s()]; a.close(); r.append(s()); b.close(); r.append(s()); print(r)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[True, True, False]", out.stderr


async def test_worker_leads_its_own_group_and_is_our_child(bare: WorkerSpawner, tmp_path: Path,
                                                            workers: list[WorkerProcess]) -> None:  # fmt: skip
    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-group", ENTRY, {"ready_file": str(rf)}))
    workers.append(w)
    body = await _ready_file(rf)
    assert body["pid"] == w.pid
    assert os.getpgid(w.pid) == w.pid == w.pgid
    assert os.getsid(w.pid) == w.pid
    # double fork: the worker re-parents to us (the subreaper) when its intermediate exits, which it does
    # right after replying with the worker's pid, so not necessarily before the worker is ready
    await _until(lambda: psutil.Process(w.pid).ppid() == os.getpid(), 10, "the worker re-parented to the root")
    assert w.is_alive()


@pytest.mark.parametrize(
    ("args", "expected"),
    [({"mode": "exit"}, 0), ({"mode": "exit", "code": 3}, 3), ({"mode": "crash"}, 1)],
)
async def test_exit_code_is_observed(bare: WorkerSpawner, args: dict[str, Any], expected: int,
                                     workers: list[WorkerProcess]) -> None:  # fmt: skip
    w = bare.spawn(WorkerStart(f"w-exit-{expected}", ENTRY, args))
    workers.append(w)
    assert await w.wait(10) == expected
    assert not w.is_alive() and w.returncode == expected


async def test_signal_death_is_negative(bare: WorkerSpawner, tmp_path: Path, workers: list[WorkerProcess]) -> None:
    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-killed", ENTRY, {"ready_file": str(rf)}))
    workers.append(w)
    await _ready_file(rf)
    assert await w.wait(0.05) is None  # still running: a timeout, not an exit
    w.signal(signal.SIGKILL)
    assert await w.wait(5) == -signal.SIGKILL


async def test_lifeline_eof_stops_the_worker_gracefully(bare: WorkerSpawner, tmp_path: Path,
                                                        workers: list[WorkerProcess]) -> None:  # fmt: skip
    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-eof", ENTRY, {"ready_file": str(rf)}))
    workers.append(w)
    await _ready_file(rf)
    w.close_lifeline()
    assert await w.wait(5) == 0


def _pipe_inode(fd: int) -> int:
    return os.fstat(fd).st_ino


def _holders(inode: int, pid: int) -> list[int]:
    """Access modes (O_ACCMODE) of `pid`'s fds that refer to pipe `inode`."""
    modes = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") != f"pipe:[{inode}]":
                continue
            flags = next(line for line in Path(f"/proc/{pid}/fdinfo/{name}").read_text().splitlines()
                         if line.startswith("flags:"))  # fmt: skip
        except (FileNotFoundError, StopIteration):
            continue
        modes.append(int(flags.split()[1], 8) & os.O_ACCMODE)
    return modes


async def test_only_the_root_holds_the_lifeline_write_end(bare: WorkerSpawner, tmp_path: Path,
                                                          workers: list[WorkerProcess]) -> None:  # fmt: skip
    rfs = [tmp_path / f"ready{i}" for i in range(2)]
    ws = [bare.spawn(WorkerStart(f"w-lifeline-{i}", ENTRY, {"ready_file": str(rf)})) for i, rf in enumerate(rfs)]
    workers.extend(ws)
    for rf in rfs:
        await _ready_file(rf)
    assert bare.zygote_pid is not None
    for w in ws:
        assert w._lifeline_w is not None
        inode = _pipe_inode(w._lifeline_w)
        assert stat.S_ISFIFO(os.fstat(w._lifeline_w).st_mode)
        assert _holders(inode, w.pid) == [os.O_RDONLY]  # the worker: read end only
        assert _holders(inode, bare.zygote_pid) == []  # the fork server: nothing
        other = ws[1] if w is ws[0] else ws[0]
        assert _holders(inode, other.pid) == []  # no worker holds another's lifeline


async def test_env_and_cwd_apply_only_inside_the_child(bare: WorkerSpawner, tmp_path: Path,
                                                       workers: list[WorkerProcess]) -> None:  # fmt: skip
    rf = tmp_path / "ready"
    key = f"LEGION_TEST_{uuid.uuid4().hex[:8].upper()}"
    w = bare.spawn(WorkerStart("w-env", ENTRY, {"ready_file": str(rf), "report_env": [key]},
                               cwd=str(tmp_path), env={key: "inside"}))  # fmt: skip
    workers.append(w)
    body = await _ready_file(rf)
    assert body["env"] == {key: "inside"}
    assert body["cwd"] == str(tmp_path)
    assert key not in os.environ


@pytest.mark.parametrize(
    ("start", "fragment"),
    [
        (WorkerStart("", ENTRY, {}), "worker_id"),
        (WorkerStart("w", "no-colon", {}), "entry"),
        (WorkerStart("w", ENTRY, {"x": object()}), "JSON"),
        (WorkerStart("w", ENTRY, {}, cwd="/definitely/not/here"), "cwd"),
        (WorkerStart("w", ENTRY, {}, env={"A": 1}), "env"),
    ],
)
def test_bad_start_specs_are_refused_clearly(bare: WorkerSpawner, start: WorkerStart, fragment: str) -> None:
    with pytest.raises(SpawnError, match=fragment):
        bare.spawn(start)


async def test_unloadable_entry_exits_with_ex_config(bare: WorkerSpawner, workers: list[WorkerProcess]) -> None:
    w = bare.spawn(WorkerStart("w-bad-entry", "legion.workers.no_such_module:main", {}))
    workers.append(w)
    assert await w.wait(10) == 78


async def test_a_dead_fork_server_is_restarted_on_the_next_spawn(tmp_path: Path, workers: list[WorkerProcess]) -> None:
    with WorkerSpawner(None, preload=("orjson",)) as sp:
        first = sp.zygote_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        rf = tmp_path / "ready"
        w = sp.spawn(WorkerStart("w-restarted", ENTRY, {"ready_file": str(rf)}))
        workers.append(w)
        await _ready_file(rf)
        assert sp.zygote_pid not in (None, first)


CGROUPS = containment({})
CONTAINMENTS = [pytest.param(True, marks=pytest.mark.skipif(not CGROUPS.cgroups, reason=CGROUPS.reason), id="cgroup"),
                pytest.param(False, id="pgid")]  # fmt: skip


@pytest.mark.parametrize("cgroups", CONTAINMENTS)
async def test_closing_the_spawner_takes_live_workers_down(tmp_path: Path, workers: list[WorkerProcess],
                                                           cgroups: bool) -> None:  # fmt: skip
    marker = uuid.uuid4().hex
    rf = tmp_path / "ready"
    sp = WorkerSpawner(None, preload=PRELOAD, zygote_grace=0.2, zygote_signal_timeout=0.2, cgroups=cgroups)
    sp.start()
    run = sp.run_cgroup
    assert (run is not None) == cgroups
    w = sp.spawn(WorkerStart("w-orphaned", ENTRY, {"ready_file": str(rf), "mode": "busy", "ignore_term": True,
                                                    "children": 2, "marker": marker}))  # fmt: skip
    workers.append(w)
    await _ready_file(rf)
    # a grandchild carries the marker in its environ once it has exec'd (a loaded machine may not be there yet)
    await _until(lambda: len(find_marked(marker)) == 2, 5)
    t0 = time.monotonic()
    sp.close()
    assert await w.wait(3) == -signal.SIGKILL  # busy + TERM-ignoring: the fork server had to KILL it
    await _until(lambda: not find_marked(marker), 3)
    assert time.monotonic() - t0 < 2.0
    assert run is None or not run.path.exists()  # the run cgroup is removed with the spawner


@pytest.mark.skipif(not CGROUPS.cgroups, reason=CGROUPS.reason)
async def test_each_worker_is_born_in_its_own_cgroup_under_the_run_cgroup(tmp_path: Path,
                                                                          workers: list[WorkerProcess]) -> None:  # fmt: skip
    sp = WorkerSpawner(None, preload=PRELOAD, cgroups=True)
    sp.start()
    try:
        run = sp.run_cgroup
        assert run is not None and run.path.parent == CGROUPS.parent
        rf = tmp_path / "ready"
        w = sp.spawn(WorkerStart("w-cg", ENTRY, {"ready_file": str(rf), "children": 1}))
        workers.append(w)
        body = await _ready_file(rf)
        assert w.cgroup is not None and w.cgroup.path.parent == run.path
        tree = sorted([w.pid, *body["children"]])
        # the worker and its tree only: the fork server's intermediate joined first, and the worker said nothing
        # (its ready file comes after `ready`) before that intermediate, not the root or the fork server, exited
        assert body["standby"] not in (None, os.getpid(), sp.zygote_pid)
        assert sorted(w.cgroup.procs()) == tree
        assert own_cgroup_dir(pid=w.pid) == w.cgroup.path
        # born there: the fork server's intermediate joined it before forking the worker
        assert own_cgroup_dir(pid=sp.zygote_pid or 0) == own_cgroup_dir()
    finally:
        sp.close()
    assert not run.path.exists()


@pytest.mark.skipif(not CGROUPS.cgroups, reason=CGROUPS.reason)
async def test_a_spawn_whose_cgroup_cannot_be_made_fails_clearly() -> None:
    sp = WorkerSpawner(None, preload=PRELOAD, cgroups=True)
    sp.start()
    try:
        run = sp.run_cgroup
        assert run is not None
        # the standby intermediate, forked ahead of the first request, sits in its cgroup under the run's
        await _until(lambda: run.procs(recursive=True), 10)
        assert run.kill_and_remove(5.0)  # the run cgroup vanished under the fork server, standby and all
        with pytest.raises(SpawnError, match="No such file"):
            sp.spawn(WorkerStart("w-nocg", ENTRY, {}))
        run.path.mkdir()
    finally:
        sp.close()


def _standbys(sp: WorkerSpawner) -> list[psutil.Process]:
    """The fork server's children: its standby intermediate (and used ones not yet reaped)."""
    return psutil.Process(sp.zygote_pid or 0).children()


async def test_a_spawn_survives_a_lost_standby_and_closing_leaves_none(tmp_path: Path,
                                                                      workers: list[WorkerProcess]) -> None:  # fmt: skip
    """The fork server keeps one intermediate forked ahead of the next request; one killed meanwhile is
    replaced by a fresh one for that request, and none outlives the fork server's close."""
    sp = WorkerSpawner(None, preload=PRELOAD)
    sp.start()
    left: list[psutil.Process] = []
    try:
        standby = (await _until(lambda: _standbys(sp), 10))[0]
        standby.kill()
        rf = tmp_path / "ready"
        w = sp.spawn(WorkerStart("w-lost", ENTRY, {"ready_file": str(rf)}))
        workers.append(w)
        await _ready_file(rf)
        assert w.is_alive() and w.pid != standby.pid
        left = await _until(lambda: [p for p in _standbys(sp) if p.pid != standby.pid], 10)
        assert w.pid not in [p.pid for p in left]  # workers are the root's children, never the fork server's
    finally:
        zygote = psutil.Process(sp.zygote_pid or 0)
        sp.close()
    assert not zygote.is_running()
    assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


class _Ready:
    def __init__(self) -> None:
        self.seen: dict[str, Message] = {}
        self.heartbeats: dict[str, int] = {}

    async def __call__(self, worker_id: str, msg: Message) -> dict[str, Any] | None:
        if msg.type == "ready":
            self.seen[worker_id] = msg
        elif msg.type == "heartbeat":
            self.heartbeats[worker_id] = self.heartbeats.get(worker_id, 0) + 1
        return None


async def test_ready_and_heartbeats_arrive_over_the_control_channel(spawner: WorkerSpawner, run_dir: Path,
                                                                     workers: list[WorkerProcess]) -> None:  # fmt: skip
    handler = _Ready()
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=handler)
    await server.start()
    try:
        w = spawner.spawn(WorkerStart("w-bus", ENTRY, {}, heartbeat_interval=0.05))
        workers.append(w)
        await _until(lambda: "w-bus" in handler.seen)
        assert handler.seen["w-bus"].body["pid"] == w.pid
        await _until(lambda: handler.heartbeats.get("w-bus", 0) >= 3)
        assert server.last_seen("w-bus") is not None
        reply = await server.request("w-bus", "shutdown", {"reason": "test"}, timeout=5)
        assert reply.body == {"ok": True}
        assert await w.wait(5) == 0  # a "shutdown" message is a graceful stop, like lifeline EOF
    finally:
        await server.close()


async def test_burst_of_workers_all_report_ready(spawner: WorkerSpawner, run_dir: Path,
                                                 workers: list[WorkerProcess]) -> None:  # fmt: skip
    handler = _Ready()
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=handler)
    await server.start()
    try:
        ids = [f"w-burst-{i}" for i in range(10)]
        ws = [spawner.spawn(WorkerStart(i, ENTRY, {})) for i in ids]
        workers.extend(ws)
        await _until(lambda: set(handler.seen) == set(ids))
        assert {handler.seen[w.worker_id].body["pid"] for w in ws} == {w.pid for w in ws}
        for w in ws:
            w.close_lifeline()
        assert [await w.wait(5) for w in ws] == [0] * len(ws)
    finally:
        await server.close()
    assert sweep([ProcRef(w.pid, w.pgid, w.create_time) for w in ws]) == []


def test_fork_server_opens_no_zmq_context_or_threads(spawner: WorkerSpawner) -> None:
    """zmq contexts (an I/O thread each) and DB connections are opened only after the fork."""
    assert spawner.zygote_pid is not None
    zygote = psutil.Process(spawner.zygote_pid)
    assert zygote.num_threads() == 1
    assert not [f for f in zygote.open_files() if f.path.endswith((".db", "-wal"))]
    assert not [c for c in zygote.net_connections(kind="unix") if c.laddr and "ctl.sock" in c.laddr]


def test_fork_server_warm_up_leaves_nothing_open(spawner: WorkerSpawner) -> None:
    """It runs an event loop and opens an in-memory ledger once (so workers inherit SQLAlchemy's and
    asyncio's lazy setup done): no epoll, file or descriptor of theirs may stay behind to be forked."""
    assert not [k for k in spawner.preload_failed if k.startswith("warm:")], spawner.preload_failed
    fd_dir = Path(f"/proc/{spawner.zygote_pid}/fd")
    targets = {fd.name: os.readlink(fd) for fd in fd_dir.iterdir() if fd.name not in ("0", "1", "2")}
    allowed = ("socket:", "pipe:", "anon_inode:[pidfd]")  # the root's, a standby's, the lifelines; the root
    assert not {fd: t for fd, t in targets.items() if not t.startswith(allowed)}, targets


async def test_worker_logs_to_its_own_file(bare: WorkerSpawner, tmp_path: Path, workers: list[WorkerProcess]) -> None:
    log = tmp_path / "w.log"
    w = bare.spawn(WorkerStart("w-logged", ENTRY, {"mode": "crash"}, log_path=str(log)))
    workers.append(w)
    assert await w.wait(10) == 1
    text = log.read_text()
    assert "[w-logged]" in text and "main crashed" in text and "FixtureCrash" in text


@pytest.mark.parametrize(
    ("payload", "nfds", "fragment"),
    [
        (b"{not json", 1, "JSONDecodeError"),
        (b"[1, 2]", 1, "JSON object"),
        (b'{"op": "spawn", "entry": "a:b"}', 1, "worker_id"),
        (b'{"op": "spawn", "worker_id": "x", "entry": "a:b", "args": []}', 1, "args"),
        (b'{"op": "spawn", "worker_id": "x", "entry": "a:b"}', 0, "exactly one lifeline"),
        (b'{"op": "spawn", "worker_id": "x", "entry": "a:b"}', 2, "exactly one lifeline"),
    ],
)
async def test_fork_server_survives_malformed_requests(bare: WorkerSpawner, tmp_path: Path, payload: bytes, nfds: int,
                                                       fragment: str, workers: list[WorkerProcess]) -> None:  # fmt: skip
    fds = [os.pipe() for _ in range(nfds)]
    try:
        with bare._lock:
            assert bare._sock is not None
            socket.send_fds(bare._sock, [payload], [r for r, _ in fds])
            reply = orjson.loads(bare._sock.recv(65536))
    finally:
        for r, w in fds:
            os.close(r)
            os.close(w)
    assert reply["ok"] is False and fragment in reply["error"]
    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-after-garbage", ENTRY, {"ready_file": str(rf)}))
    workers.append(w)
    await _ready_file(rf)


def test_oversized_start_spec_is_refused_without_hurting_the_fork_server(bare: WorkerSpawner) -> None:
    zygote = bare.zygote_pid
    with pytest.raises(SpawnError, match="file path"):
        bare.spawn(WorkerStart("w-huge", ENTRY, {"blob": "x" * 300_000}))
    assert bare.zygote_pid == zygote


async def test_ready_of_a_worker_that_exits_at_once_is_not_lost(spawner: WorkerSpawner, run_dir: Path,
                                                                workers: list[WorkerProcess]) -> None:  # fmt: skip
    """The worker terms its zmq context before exiting, so queued frames are flushed, not dropped."""
    handler = _Ready()
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=handler)
    await server.start()
    try:
        ids = [f"w-brief-{i}" for i in range(8)]
        ws = [spawner.spawn(WorkerStart(i, ENTRY, {"mode": "exit"})) for i in ids]
        workers.extend(ws)
        assert [await w.wait(10) for w in ws] == [0] * len(ws)
        await _until(lambda: set(handler.seen) == set(ids), deadline=5)
    finally:
        await server.close()


async def test_a_replacement_fork_server_adopts_the_live_workers(tmp_path: Path, workers: list[WorkerProcess]) -> None:
    """Workers forked by a fork server that died still die with the root (its replacement sweeps them)."""
    sp = WorkerSpawner(None, preload=PRELOAD, zygote_grace=0.1, zygote_signal_timeout=0.2)
    sp.start()
    try:
        rf = tmp_path / "ready"
        orphan = sp.spawn(WorkerStart("w-adopted", ENTRY, {"ready_file": str(rf), "mode": "busy", "ignore_term": True}))
        workers.append(orphan)
        await _ready_file(rf)
        first = sp.zygote_pid
        assert first is not None
        assert sp.ensure_running() is False  # alive: nothing to do
        os.kill(first, signal.SIGKILL)
        # replaced (and adopting) at once by the spawner's watcher: no spawn, no ensure_running() tick
        await _until(lambda: sp.zygote_pid not in (None, first))
        assert sp.ensure_running() is False
        rf2 = tmp_path / "ready2"
        workers.append(sp.spawn(WorkerStart("w-after-restart", ENTRY, {"ready_file": str(rf2)})))
        await _ready_file(rf2)
        assert sp.zygote_pid != first
    finally:
        sp.close()
    assert await orphan.wait(3) == -signal.SIGKILL  # swept by the replacement, not left running


ROOT_STDOUT_SCRIPT = r"""
import os, sys, time
from legion.supervision.spawn import WorkerSpawner, WorkerStart
ready = sys.argv[1]
with WorkerSpawner(None, preload=("legion.workers.fixture_worker",)) as sp:
    w = sp.spawn(WorkerStart("w-stdout", "legion.workers.fixture_worker:main", {"ready_file": ready}))
    while not os.path.exists(ready):
        time.sleep(0.005)
    links = [os.readlink(f"/proc/{pid}/fd/{fd}") for pid in (os.getpid(), sp.zygote_pid, w.pid) for fd in (1, 2)]
    print(" ".join(links), flush=True)
    w.close_lifeline()
    w.wait_blocking(5)
"""


def test_only_the_root_holds_its_stdout(tmp_path: Path) -> None:
    """A reader of the root's stdout (a CLI pipe) sees EOF when the root exits, not when its helpers do."""
    out = subprocess.run([sys.executable, "-c", ROOT_STDOUT_SCRIPT, str(tmp_path / "ready")],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=60)  # fmt: skip
    root_out, root_err, zyg_out, zyg_err, w_out, w_err = out.stdout.split()
    assert root_out.startswith("pipe:") and root_err == "/dev/null"
    assert zyg_out == zyg_err == root_err  # the fork server's stdout is the root's stderr
    assert w_out == w_err == root_err  # so is every worker's


def _ignored_signals(pid: int) -> int:
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("SigIgn:"))
    return int(line.split()[1], 16)


async def test_worker_signal_dispositions(bare: WorkerSpawner, tmp_path: Path, workers: list[WorkerProcess]) -> None:
    """SIGPIPE stays ignored (BrokenPipeError, not death); the fork server's SIGINT-ignore is not inherited."""
    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-signals", ENTRY, {"ready_file": str(rf)}))
    workers.append(w)
    await _ready_file(rf)
    ignored = _ignored_signals(w.pid)
    assert ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGINT - 1))
    assert not ignored & (1 << (signal.SIGTERM - 1))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
_requests = st.one_of(
    _json,
    st.fixed_dictionaries({"op": st.sampled_from(["spawn", "adopt", "ping", "other"])}, optional={
        "worker_id": _json, "entry": _json, "args": _json, "env": _json, "workers": _json}),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_requests)
def test_fork_server_answers_any_request_without_a_lifeline(bare: WorkerSpawner, request: Any) -> None:
    """Fuzz: whatever arrives (without the one lifeline fd a spawn needs), the fork server answers and lives."""
    with bare._lock:
        assert bare._sock is not None
        bare._sock.send(orjson.dumps(request))
        reply = orjson.loads(bare._sock.recv(65536))
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
    if reply["ok"]:  # only ping/adopt can succeed without a lifeline
        assert isinstance(request, dict) and request.get("op") in ("ping", "adopt")
    else:
        assert isinstance(reply.get("error"), str) and reply["error"]
    assert bare._zygote is not None and bare._zygote.poll() is None


async def test_concurrent_waiters_all_see_the_exit(bare: WorkerSpawner, tmp_path: Path,
                                                  workers: list[WorkerProcess]) -> None:  # fmt: skip
    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-waiters", ENTRY, {"ready_file": str(rf)}))
    workers.append(w)
    await _ready_file(rf)
    waiters = [asyncio.ensure_future(w.wait()) for _ in range(3)]
    assert await w.wait(0.01) is None  # a timed-out waiter does not disturb the others
    w.close_lifeline()
    assert await asyncio.gather(*waiters) == [0, 0, 0]
    assert w.wait_blocking(0) == 0


async def test_wait_blocking_without_timeout(bare: WorkerSpawner, workers: list[WorkerProcess]) -> None:
    w = bare.spawn(WorkerStart("w-block-wait", ENTRY, {"mode": "exit", "exit_after": 0.1, "code": 4}))
    workers.append(w)
    assert await asyncio.to_thread(w.wait_blocking) == 4  # None = until it exits


async def test_a_forked_copy_of_the_root_does_not_hold_lifelines(bare: WorkerSpawner, tmp_path: Path,
                                                                 workers: list[WorkerProcess]) -> None:  # fmt: skip
    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-forked-root", ENTRY, {"ready_file": str(rf)}))
    workers.append(w)
    await _ready_file(rf)
    child = os.fork()
    if child == 0:  # a plain fork of the root that outlives the retire below
        time.sleep(10)
        os._exit(0)
    try:
        w.close_lifeline()
        assert await w.wait(5) == 0  # EOF arrived although a copy of the root is still alive
        assert bare._sock is not None and bare.zygote_pid is not None
        inode = os.fstat(bare._sock.fileno()).st_ino
        assert not [fd for fd in os.listdir(f"/proc/{child}/fd")
                    if os.readlink(f"/proc/{child}/fd/{fd}") == f"socket:[{inode}]"]  # fmt: skip
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


async def test_close_wakes_pending_waiters_with_the_exit_code(bare: WorkerSpawner, tmp_path: Path) -> None:
    """The ladder may see the exit and close() before the loop ran the shared pidfd callback."""
    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-close-waiters", ENTRY, {"ready_file": str(rf)}))
    await _ready_file(rf)
    waiters = [asyncio.ensure_future(w.wait()) for _ in range(2)]
    await asyncio.sleep(0)  # both are parked on the shared pidfd waiter
    w.signal(signal.SIGKILL)
    assert w.wait_blocking(5) == -signal.SIGKILL  # seen synchronously: the loop callback has not run
    w.close()
    assert await asyncio.gather(*waiters) == [-signal.SIGKILL, -signal.SIGKILL]
    assert await w.wait(0) == -signal.SIGKILL


async def test_closing_a_live_handle_wakes_waiters_with_none(bare: WorkerSpawner, tmp_path: Path) -> None:
    rf = tmp_path / "ready"
    # `block` stops its event loop right after the ready file: it cannot leave on the lifeline EOF that
    # close() sends, so it is certainly still alive when close() looks (a worker that does leave may exit
    # between the EOF and that look, and then its exit code is what the waiters rightly get)
    w = bare.spawn(WorkerStart("w-close-live", ENTRY, {"ready_file": str(rf), "mode": "block"}))
    await _ready_file(rf)
    waiter = asyncio.ensure_future(w.wait())
    await asyncio.sleep(0)
    w.close()
    assert await asyncio.wait_for(waiter, 5) is None
    assert await w.wait(0) is None and w.returncode is None  # the handle can no longer observe it
    # it is our child (subreaper) and unreaped, so its pid still names it: kill and reap it here
    os.kill(w.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:  # once its fork-server parent has exited
        try:
            _, status = await asyncio.to_thread(os.waitpid, w.pid, 0)
            break
        except ChildProcessError:
            assert time.monotonic() < deadline, "the worker never re-parented to us"
            await asyncio.sleep(0.005)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL


_DIE_AFTER_FORK = '''
import os
import orjson
from legion.supervision import zygote

_real = zygote._fork_worker


def _fork_then_die(standby, data, lifeline_fd):
    pid = _real(standby, data, lifeline_fd)
    flag = orjson.loads(data)["args"].get("die_flag")
    if flag and not os.path.exists(flag):  # only the first fork server dies, after forking
        open(flag, "w").close()
        os._exit(1)
    return pid


zygote._fork_worker = _fork_then_die
'''


async def test_a_fork_server_dying_mid_spawn_leaves_no_twin_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    workers: list[WorkerProcess]) -> None:  # fmt: skip
    """It forked a worker, then died before replying: the retry's worker is the only one left."""
    (tmp_path / "die_after_fork.py").write_text(_DIE_AFTER_FORK)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    marker = uuid.uuid4().hex
    with WorkerSpawner(None, preload=(*PRELOAD, "die_after_fork")) as sp:
        assert "die_after_fork" not in sp.preload_failed
        first = sp.zygote_pid
        w = sp.spawn(WorkerStart("w-twin", ENTRY, {"die_flag": str(tmp_path / "died"), "marker": marker,
                                                   "children": 1}))  # fmt: skip
        workers.append(w)
        assert (tmp_path / "died").exists() and sp.zygote_pid not in (None, first)

        def only_ours() -> bool:  # each worker has one marked child; the twin's goes when it leaves on EOF
            marked = find_marked(marker)
            return len(marked) == 1 and psutil.Process(marked[0]).ppid() == w.pid

        await _until(only_ours, 5)
        assert w.is_alive()
    for child in psutil.Process().children():  # reap the twin (it re-parented to us)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, os.WNOHANG)


async def test_the_worker_tree_carries_the_lineage_mark_the_root_computes(bare: WorkerSpawner, tmp_path: Path,
                                                                          workers: list[WorkerProcess]) -> None:  # fmt: skip
    from legion.procs import LINEAGE_ENV, lineage_mark

    rf = tmp_path / "ready"
    w = bare.spawn(WorkerStart("w-lineage", ENTRY, {"ready_file": str(rf), "report_env": [LINEAGE_ENV]}))
    workers.append(w)
    body = await _ready_file(rf)
    assert body["env"][LINEAGE_ENV] == lineage_mark(w.ref) == f"{w.pid}:{lineage_mark(w.ref).split(':')[1]}"


_LATE_MOD = '''
import inspect, os, sys
with open(os.environ["LATE_MARK"], "a") as fh:  # who imported me, and was it the fork server's late preload
    fh.write(f"{os.getpid()} {any(f.function == '_late_preload' for f in inspect.stack())}\\n")


async def main(rt):
    with open(os.environ["LATE_MARK"], "a") as fh:
        fh.write(f"worker {os.getpid()}\\n")
    return 0
'''


async def test_a_late_preload_runs_after_ready_and_later_workers_inherit_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: list[WorkerProcess]) -> None:
    """`~name` in the preload (the provider SDKs) is imported by the fork server only after it signalled ready
    (its start does not wait for it); a worker forked afterwards has the module without importing it again."""
    (tmp_path / "late_mod.py").write_text(_LATE_MOD)
    mark = tmp_path / "mark"
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("LATE_MARK", str(mark))
    with WorkerSpawner(None, preload=(*PRELOAD, "~late_mod")) as sp:
        assert "~late_mod" not in sp.preload_failed and "late_mod" not in sp.preload_failed
        await _until(lambda: mark.exists() and mark.read_text().endswith("\n"), 10)
        assert mark.read_text().split() == [str(sp.zygote_pid), "True"]  # in the fork server, after ready
        w = sp.spawn(WorkerStart("w-late", "late_mod:main", {}))
        workers.append(w)
        await _until(lambda: mark.read_text().endswith(f"worker {w.pid}\n"), 10)
    assert mark.read_text().splitlines()[1:] == [f"worker {w.pid}"]  # the worker did not import it again
