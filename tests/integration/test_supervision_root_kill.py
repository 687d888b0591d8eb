"""Parent death = child death: SIGKILL a RootSupervisor process; every worker and grandchild goes within 2 s."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from legion.workers.fixture_worker import find_marked

pytestmark = pytest.mark.timeout(60)

def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


ROOT_SCRIPT = """
import asyncio, sys
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcNode
from legion.workers.fixture_worker import ENTRY

async def main(run_dir, marker, args):
    root = RootSupervisor(run_dir)
    await root.start()
    await root.nodes.launch_team("team", members=[RpcNode("t1", ENTRY, {"marker": marker, **args})])
    for i in range(3):
        await root.nodes.launch(RpcNode(f"w{i}", ENTRY, {"marker": marker, **args}))
    pids = [root.nodes.worker(i).pid for i in ("t1", "w0", "w1", "w2")]
    print("READY", *pids, root.spawner.zygote_pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1], sys.argv[2], eval(sys.argv[3])))
"""


@pytest.mark.parametrize("args", [{"children": 2}, {"mode": "busy", "children": 1, "ignore_term": True}])
def test_sigkill_of_the_root_takes_every_worker_down(args: dict[str, object]) -> None:
    base = Path(tempfile.mkdtemp(prefix="lgk", dir="/tmp"))
    marker = f"rootkill-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen([sys.executable, "-c", ROOT_SCRIPT, str(base / "run"), marker, repr(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == [b"READY"], line
        workers = [int(p) for p in line[1:]]  # 4 workers and the fork server
        expected = 4 * int(str(args["children"]))  # grandchildren carry the marker in their environ
        deadline = time.monotonic() + 10
        while len(find_marked(marker)) < expected:
            assert time.monotonic() < deadline, f"only {len(find_marked(marker))} of {expected} grandchildren up"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        killed_at = time.monotonic()
        while find_marked(marker) or [p for p in workers if alive(p)]:
            assert time.monotonic() - killed_at < 2.0, (
                f"2 s after the root died: grandchildren {find_marked(marker)}, "
                f"workers/fork server {[p for p in workers if alive(p)]}"
            )
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in find_marked(marker):  # never leak into other tests, even on failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
