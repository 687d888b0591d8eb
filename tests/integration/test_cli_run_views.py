"""`legion monitor | status | tree | events` as a process: attached to a live publisher, on a dead run, on a damaged ledger."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from legion.ledger import open_ledger


def _make_run(cwd: Path, run_id: str = "run-1") -> Path:
    run_dir = cwd / ".legion" / "runs" / run_id
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o700)  # as a real run directory: the bus refuses ipc sockets in an open folder
    ledger = open_ledger(run_dir / "legion.db")
    try:
        ledger.insert_node(id="root", name="root", role="root", depth=0, status="running")
        ledger.insert_node(id="lead", name="lead", role="centurion", depth=1, parent_id="root",
                           status="running", phase="planning", model="scripted/lead")
        ledger.insert_node(id="w1", name="w1", role="worker", depth=2, parent_id="lead", status="settled")
        ledger.append_event("lead", "node_launched", {"role": "centurion"})
        ledger.append_event("w1", "node_settled", None)
    finally:
        ledger.close()
    return run_dir


def _damage(db: Path, start_fraction: float) -> None:
    """Overwrite the ledger file from ``start_fraction`` of its size to the end with junk bytes."""
    data = bytearray(db.read_bytes())
    start = max(100, int(len(data) * start_fraction))  # keep the 100-byte SQLite header's start
    data[start:] = b"\x5a" * (len(data) - start)
    db.write_bytes(bytes(data))


@pytest.mark.timeout(60)
def test_monitor_attaches_to_a_live_publisher(tmp_path: Path) -> None:
    """A real MonitorPublisher in this process; `legion monitor` in another gets snapshot then events."""
    from legion.bus.monitor import MonitorPublisher

    run_dir = _make_run(tmp_path)

    async def scenario() -> list[dict[str, object]]:
        publisher = MonitorPublisher(run_dir, provider=lambda: {"nodes": ["root"]})
        await publisher.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "legion", "-C", str(tmp_path), "monitor", str(run_dir),
                "--json", "--count", "3", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            assert proc.stdout is not None
            first = await asyncio.wait_for(proc.stdout.readline(), 30)  # the snapshot: attached
            for i in range(3):
                publisher.publish("node_launched", {"i": i})
            publisher.flush()
            rest, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, err
            return [orjson.loads(x) for x in [first, *rest.splitlines()]]
        finally:
            await publisher.close()

    records = asyncio.run(scenario())
    assert records[0]["type"] == "snapshot" and records[0]["nodes"] == ["root"] and records[0]["run"] == run_dir.name
    assert [(r["type"], r["seq"], r["i"]) for r in records[1:]] == [("node_launched", n + 1, n) for n in range(3)]


def test_monitor_on_a_dead_run_explains(tmp_path: Path) -> None:
    run_dir = _make_run(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "legion", "-C", str(tmp_path), "monitor", str(run_dir)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert "is the run still live" in out.stderr


@pytest.mark.parametrize(("command", "start_fraction"),  # 0.5: the header opens, the event pages are junk
                         [("status", 0.0), ("tree", 0.0), ("events", 0.0), ("events", 0.5)])
def test_a_damaged_ledger_is_one_clear_line(tmp_path: Path, command: str, start_fraction: float) -> None:
    """No traceback: one line naming the file, the reason and what to do; a non-zero exit."""
    run_dir = _make_run(tmp_path)
    with open_ledger(run_dir / "legion.db") as ledger:  # enough pages that half the file holds rows
        for n in range(200):
            ledger.append_event("w1", "node_launched", {"pad": "x" * 300, "n": n})
    _damage(run_dir / "legion.db", start_fraction)
    out = subprocess.run([sys.executable, "-m", "legion", "-C", str(tmp_path), command, "run-1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"legion {command}: cannot read the ledger {run_dir.resolve() / 'legion.db'}" in out.stderr
    assert "PRAGMA integrity_check" in out.stderr and ".recover" in out.stderr
