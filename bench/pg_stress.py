"""The ledger stress gate on PostgreSQL, with legion's SQLite ledger beside it in the same run.

`bench/wal_stress.py --backend postgresql` runs this. A throwaway PostgreSQL cluster is started for the run,
durable (fsync on, as a server runs), on this machine's unix socket. The transaction is wal_stress's: one legion
write transaction of a supervisor — a heartbeat and an event, and a mail every `--mail-every` ticks — through the
real `Ledger` (`open_ledger(URL, run_id=…)`: the run's advisory lock, its row locks, psycopg's pool).

- Paced (the acceptance shape): `--processes` writers (60), each one transaction every `--interval` s (2,
  jittered ±25 %) for `--duration` s (60), after one untimed warm-up. Gated: no failed transaction, every writer
  reported, and every committed event is in the ledger exactly once, in each writer's order. Reported (gated with
  `--strict`): the commit latency's p99 against the 10 ms target.
- Saturated: the same writers as fast as they can for `--saturate-seconds` (20), first on PostgreSQL, then on
  SQLite (legion's ledger, a WAL file in a temp folder): committed transactions per second of each and their
  ratio (PostgreSQL over SQLite, reported: the machine's speed moves both). Gated: no failed transaction on either.

Prints one JSON object; exit 1 when a gated check misses or no PostgreSQL server can be started.
Quick run: `python bench/pg_stress.py --processes 10 --duration 10 --saturate-seconds 5`.
"""

from __future__ import annotations

import argparse
import array
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.pg_server

from legion.ledger import open_ledger
from tests.pg_server import running_server

TARGETS = {"paced_p99_ms_max": 10.0, "failed_tx_max": 0}
RUN_ID = "pg-stress"
BIG_RATE = 10**9  # the bench measures storage, not the per-sender mail quota
EVENT = "node_resumed"


def _node(index: int) -> str:
    return f"w{index}"


def prepare(target: str, run_id: str | None, processes: int) -> None:
    """The ledger with a root and one node per writer."""
    led = open_ledger(target, run_id=run_id)
    try:
        with led.transaction():
            led.insert_node(id="root", name="root", role="root", depth=0, status="running")
            for i in range(processes):
                led.insert_node(id=_node(i), name=_node(i), role="worker", depth=1, parent_id="root",
                                status="running")
    finally:
        led.close()


def transaction(led: Any, node: str, tick: int, mail_every: int) -> None:
    with led.transaction():
        led.heartbeat(node)
        led.append_event(node, EVENT, {"tick": tick})
        if mail_every and tick % mail_every == 0:
            led.send_mail(node, "root", f"tick {tick}", "status: still working on it", kind="report")


def writer(index: int, target: str, run_id: str | None, opts: dict[str, Any], start_at: Any, ready: Any,
           results: Any) -> None:
    """One simulated supervisor process: open, warm up, then paced or saturating transactions."""
    node = _node(index)
    out: dict[str, Any] = {"attempts": 0, "commits": 0, "failed": 0, "errors": []}
    lat = array.array("d")
    try:
        led = open_ledger(target, run_id=run_id, mail_rate_per_5_min=BIG_RATE)
        transaction(led, node, 0, opts["mail_every"])  # untimed warm-up, full shape (tick 0 sends mail)
    except Exception as exc:
        out["errors"].append(f"open: {exc!r}")
        out["failed"] += 1
        ready.release()
        results.put(out)
        return
    ready.release()
    while start_at.value == 0.0:
        time.sleep(0.005)
    rng = random.Random(index)
    deadline = start_at.value + opts["duration"]
    next_at = start_at.value + (0.0 if opts["saturate"] else rng.uniform(0, opts["interval"]))
    tick = 0
    while True:
        if not opts["saturate"]:
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            next_at += opts["interval"] * rng.uniform(0.75, 1.25)
        if time.time() >= deadline:
            break
        tick += 1
        out["attempts"] += 1
        began = time.perf_counter()
        try:
            transaction(led, node, tick, opts["mail_every"])
        except Exception as exc:
            out["failed"] += 1
            if len(out["errors"]) < 5:
                out["errors"].append(repr(exc))
            continue
        lat.append((time.perf_counter() - began) * 1000)
        out["commits"] += 1
    led.close()
    out["lat"] = lat.tobytes()
    results.put(out)


def run_writers(ctx: Any, target: str, run_id: str | None, processes: int, opts: dict[str, Any]) -> list[dict[str, Any]]:
    results, ready, start_at = ctx.Queue(), ctx.Semaphore(0), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=writer, args=(i, target, run_id, opts, start_at, ready, results))
             for i in range(processes)]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=120):
            raise RuntimeError("writers did not become ready within 120 s")
    start_at.value = time.time() + 0.2
    got = [results.get(timeout=opts["duration"] + 120) for _ in procs]
    for p in procs:
        p.join(10)
    return got


def _pct(ordered: list[float], q: float) -> float:
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else 0.0


def summary(got: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    lat = sorted(x for r in got for x in array.array("d", r.get("lat", b"")))
    commits = sum(r["commits"] for r in got)
    return {"attempts": sum(r["attempts"] for r in got), "commits": commits,
            "failed_tx": sum(r["failed"] for r in got), "tx_per_s": round(commits / seconds, 1),
            "latency_ms": {"p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99), "max": round(lat[-1], 3) if lat else 0.0},
            "writers_reported": len(got), "error_samples": sorted({e for r in got for e in r["errors"]})[:5]}


def events_in_order(target: str, run_id: str | None, processes: int) -> bool:
    """Every writer's events are in the ledger once each, its ticks in commit order (0 = the warm-up, 1, 2, …)."""
    led = open_ledger(target, run_id=run_id)
    try:
        ticks: dict[str, list[int]] = {_node(i): [] for i in range(processes)}
        cursor = 0
        while batch := led.events_after(cursor, limit=10_000):
            for event in batch:
                if event.type == EVENT and event.node_id in ticks:
                    ticks[event.node_id].append(int(event.data["tick"]))
            cursor = batch[-1].id
    finally:
        led.close()
    return all(seen == list(range(len(seen))) for seen in ticks.values())


def measure(ctx: Any, url: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    paced = {"duration": args.duration, "interval": args.interval, "saturate": False, "mail_every": args.mail_every}
    prepare(url, RUN_ID, args.processes)
    report: dict[str, Any] = {"paced": summary(run_writers(ctx, url, RUN_ID, args.processes, paced), args.duration)}
    report["paced"]["events_in_order"] = events_in_order(url, RUN_ID, args.processes)
    saturate = {**paced, "duration": args.saturate_seconds, "saturate": True}
    pg_run = f"{RUN_ID}-saturate"  # a second run in the same database: its rows apart from the paced run's
    prepare(url, pg_run, args.processes)
    report["saturate_postgresql"] = summary(run_writers(ctx, url, pg_run, args.processes, saturate),
                                            args.saturate_seconds)
    db = str(work / "legion.db")
    prepare(db, None, args.processes)
    report["saturate_sqlite"] = summary(run_writers(ctx, db, None, args.processes, saturate), args.saturate_seconds)
    sqlite_tps = report["saturate_sqlite"]["tx_per_s"]
    report["saturate_ratio_postgresql_over_sqlite"] = (
        round(report["saturate_postgresql"]["tx_per_s"] / sqlite_tps, 3) if sqlite_tps else None)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=60)
    parser.add_argument("--duration", type=float, default=60.0, help="the paced run's seconds")
    parser.add_argument("--interval", type=float, default=2.0, help="paced tick interval in seconds (jittered ±25%%)")
    parser.add_argument("--mail-every", type=int, default=5, help="a mail send every N ticks (0 = never)")
    parser.add_argument("--saturate-seconds", type=float, default=20.0)
    parser.add_argument("--strict", action="store_true", help="gate the paced p99 target too")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"bench": "pg_stress", "processes": args.processes, "targets": TARGETS,
                              "load_before": [round(x, 2) for x in os.getloadavg()]}
    work = Path(tempfile.mkdtemp(prefix="pg-stress-"))
    try:
        with running_server(durable=True) as server:
            server.admin("CREATE DATABASE legion_bench")
            report["server"] = f"PostgreSQL ({server.bindir.parent.name}), fsync on, unix socket"
            report.update(measure(mp.get_context("fork"), server.url("legion_bench"), work, args))
    except RuntimeError as exc:  # no server could be started: a gate that cannot run fails
        report.update({"ok": False, "error": str(exc)[-2000:]})
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    paced = report["paced"]
    checks = {
        "paced_failed_tx": paced["failed_tx"] <= TARGETS["failed_tx_max"],
        "paced_all_writers": paced["writers_reported"] == args.processes and paced["commits"] > 0,
        "paced_events_in_order": paced["events_in_order"],
        "saturate_failed_tx": (report["saturate_postgresql"]["failed_tx"] + report["saturate_sqlite"]["failed_tx"]
                               <= TARGETS["failed_tx_max"]),
        "paced_p99_ms": paced["latency_ms"]["p99"] <= TARGETS["paced_p99_ms_max"],
    }
    report["checks"] = checks
    report["gated"] = sorted(k for k in checks if args.strict or k != "paced_p99_ms")
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    report["ok"] = all(checks[k] for k in report["gated"])
    sys.stdout.write(orjson.dumps(report).decode() + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
