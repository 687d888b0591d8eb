"""WorkerRuntime in-process: ready over a real ROUTER, lifeline EOF = graceful stop, handlers, entry loading."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from legion.bus.control import ControlServer, RemoteError
from legion.bus.protocol import Message
from legion.workers.runtime import EXIT_START_FAILED, EntryError, WorkerContext, WorkerRuntime, load_entry
from tests.support import poller

pytestmark = pytest.mark.timeout(20)


class Root:
    def __init__(self) -> None:
        self.messages: list[tuple[str, Message]] = []

    async def __call__(self, worker_id: str, msg: Message) -> dict[str, Any] | None:
        self.messages.append((worker_id, msg))
        return None

    def types(self) -> list[str]:
        return [m.type for _, m in self.messages]


@pytest.fixture
def lifeline() -> Iterator[tuple[int, list[int]]]:
    r, w = os.pipe()
    holder = [w]
    yield r, holder
    os.close(r)
    for fd in holder:
        os.close(fd)


@pytest.fixture
async def root(tmp_path: Path) -> AsyncIterator[tuple[Root, ControlServer]]:
    handler = Root()
    server = ControlServer(f"ipc://{tmp_path}/ctl.sock", on_message=handler)
    await server.start()
    yield handler, server
    await server.close()


_until = poller(5.0, 0.005)


def _runtime(lifeline_fd: int, server: ControlServer, **kw: Any) -> WorkerRuntime:
    return WorkerRuntime(WorkerContext(worker_id="w1", entry="x:y", lifeline_fd=lifeline_fd,
                                       control_endpoint=server.endpoint, heartbeat_interval=0.05, **kw))  # fmt: skip


async def test_main_result_is_the_exit_code_and_ready_comes_first(lifeline: tuple[int, list[int]],
                                                                   root: tuple[Root, ControlServer]) -> None:  # fmt: skip
    handler, server = root

    async def main(rt: WorkerRuntime) -> int:
        await _until(lambda: "ready" in handler.types())
        return 7

    assert await _runtime(lifeline[0], server).run(main) == 7
    assert handler.types()[0] == "ready"
    assert handler.messages[0][1].body["pid"] == os.getpid()


async def test_crash_is_exit_code_one(lifeline: tuple[int, list[int]], root: tuple[Root, ControlServer]) -> None:
    async def main(rt: WorkerRuntime) -> int:
        raise RuntimeError("boom")

    assert await _runtime(lifeline[0], root[1]).run(main) == 1


async def test_lifeline_eof_cancels_main_and_runs_shutdown_callbacks(lifeline: tuple[int, list[int]],
                                                                      root: tuple[Root, ControlServer]) -> None:  # fmt: skip
    handler, server = root
    order: list[str] = []
    rt = _runtime(lifeline[0], server)

    async def async_cb() -> None:
        order.append("async")

    rt.on_shutdown(lambda: order.append("sync"))
    rt.on_shutdown(async_cb)

    async def main(rt: WorkerRuntime) -> int:
        try:
            await asyncio.Event().wait()
        finally:
            order.append("main-cancelled")
        return 5

    rt.beat_with(lambda: {"tools": ["bash"]})
    task = asyncio.ensure_future(rt.run(main))
    await _until(lambda: handler.types().count("heartbeat") >= 2)  # app heartbeat from the loop
    beat = next(m for _, m in handler.messages if m.type == "heartbeat")
    assert beat.body == {"pid": os.getpid(), "tools": ["bash"]}
    os.close(lifeline[1].pop())
    assert await asyncio.wait_for(task, 5) == 0
    assert rt.lifeline_closed.is_set()
    assert order == ["main-cancelled", "async", "sync"]  # callbacks in reverse registration order


async def test_root_requests_reach_registered_handlers(lifeline: tuple[int, list[int]],
                                                       root: tuple[Root, ControlServer]) -> None:  # fmt: skip
    handler, server = root
    rt = _runtime(lifeline[0], server)

    async def echo(msg: Message) -> dict[str, Any]:
        return {"echo": msg.body.get("op")}

    rt.handlers["request"] = echo

    async def main(rt: WorkerRuntime) -> int:
        await asyncio.Event().wait()
        return 0

    task = asyncio.ensure_future(rt.run(main))
    await _until(lambda: "ready" in handler.types())
    reply = await server.request("w1", "request", {"op": "ping"}, timeout=5)
    assert reply.body == {"echo": "ping"}
    with pytest.raises(RemoteError):
        await server.request("w1", "event", {"name": "nobody-handles-this"}, timeout=5)
    await server.request("w1", "shutdown", {}, timeout=5)
    assert await asyncio.wait_for(task, 5) == 0


async def _not_async(rt: WorkerRuntime) -> int:
    return 0


def sync_entry(rt: WorkerRuntime) -> int:
    return 0


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("no_colon", "must look like"),
        ("legion.workers.no_such_module:main", "cannot import"),
        ("legion.workers.runtime:no_such_function", "no callable"),
        ("legion.workers.runtime:preconfigure_logging", "async def"),
    ],
)
def test_bad_entries_are_explained(entry: str, fragment: str) -> None:
    with pytest.raises(EntryError, match=fragment):
        load_entry(entry)


def test_fixture_entry_loads() -> None:
    assert load_entry("legion.workers.fixture_worker:main").__name__ == "main"


async def test_a_control_channel_that_cannot_start_is_a_clear_exit(lifeline: tuple[int, list[int]]) -> None:
    rt = WorkerRuntime(WorkerContext(worker_id="w1", entry="x:y", lifeline_fd=lifeline[0],
                                     control_endpoint="tcp://127.0.0.1:9"))  # fmt: skip  # tcp needs Curve

    async def main(rt: WorkerRuntime) -> int:
        raise AssertionError("main must not run")

    assert await rt.run(main) == EXIT_START_FAILED


async def test_a_lifeline_closed_before_start_never_connects_or_runs_main(lifeline: tuple[int, list[int]],
                                                                         root: tuple[Root, ControlServer]) -> None:  # fmt: skip
    handler, server = root
    os.close(lifeline[1].pop())  # the root abandoned this spawn before the worker got going
    ran: list[bool] = []

    async def main(rt: WorkerRuntime) -> int:
        ran.append(True)
        return 3

    rt = _runtime(lifeline[0], server)
    assert await rt.run(main) == 0
    assert ran == [] and rt.control is None and rt.lifeline_closed.is_set()
    await asyncio.sleep(0.05)
    assert handler.types() == []  # no ready, no heartbeat under this worker id


async def _quick(rt: WorkerRuntime) -> int:
    return 0


async def test_ready_waits_until_the_fork_server_s_intermediate_left_the_worker_s_cgroup(
    lifeline: tuple[int, list[int]], root: tuple[Root, ControlServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the standby that forked a contained worker is in its cgroup until it exits: a retire that counted the
    # cgroup's members right after `ready` counted it as a descendant (bench/retire.py, on a loaded machine)
    handler, server = root
    standby = subprocess.Popen(["sleep", "30"])
    monkeypatch.setattr(os, "getppid", lambda: standby.pid)
    try:
        run = asyncio.create_task(_runtime(lifeline[0], server, cgroup="/sys/fs/cgroup/x", standby_pid=standby.pid).run(_quick))
        await asyncio.sleep(0.1)
        assert not run.done() and "ready" not in handler.types()
        standby.kill()
        assert await run == 0
        await _until(lambda: "ready" in handler.types())
        assert handler.types()[0] == "ready"
    finally:
        standby.kill()
        standby.wait()


async def test_ready_does_not_wait_once_the_worker_was_re_parented(
    lifeline: tuple[int, list[int]], root: tuple[Root, ControlServer]
) -> None:
    handler, server = root
    other = subprocess.Popen(["sleep", "30"])  # alive, and not our parent: the standby has exited
    try:
        rt = _runtime(lifeline[0], server, cgroup="/sys/fs/cgroup/x", standby_pid=other.pid)
        assert await asyncio.wait_for(rt.run(_quick), 0.9) == 0  # < the 1 s a wait on it would take
        await _until(lambda: "ready" in handler.types())
    finally:
        other.kill()
        other.wait()
