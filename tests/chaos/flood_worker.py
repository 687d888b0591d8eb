"""TEST FIXTURE — an rpc worker that offers the root `bytes` of large `event` frames (issue 13 item 5 probe).

Entry `tests.chaos.flood_worker:main` (importable when the root runs from the repository root). Args:
`go_file` (start once it exists), `done_file` (written with {"sent", "failed"} when all was offered),
`bytes` (total offered), `frame_bytes` (payload per event).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from legion.bus.control import BusError

if TYPE_CHECKING:
    from legion.workers.runtime import WorkerRuntime


async def main(rt: WorkerRuntime) -> int:
    args = rt.args
    go, done = Path(args["go_file"]), Path(args["done_file"])
    total, size = int(args["bytes"]), int(args["frame_bytes"])
    while not go.exists():
        await asyncio.sleep(0.02)
    assert rt.control is not None
    blob = "x" * size
    sent = failed = offered = 0
    while offered < total:
        try:
            await rt.control.send("event", {"name": "blob", "i": sent, "data": blob})
            sent += 1
        except BusError:
            failed += 1
        offered += size
    done.write_bytes(orjson.dumps({"sent": sent, "failed": failed}))
    await rt.stop_requested.wait()
    return 0
