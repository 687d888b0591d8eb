"""WAL stress gate for legion.db (issue 2 item 6; docs/spec-conformance.md §8.1, §13).

Paced mode (default, the acceptance size): N processes (60), each with its own ledger connection,
each running one realistic short write transaction — heartbeat + event append, and every few ticks
a mail send — every interval (2 s, jittered) for the duration (300 s), after one untimed warm-up
transaction. Targets: busy rate < 0.1 %, p99 <= 5 ms, max <= 500 ms, at most 1 commit in 2,000 over 100 ms,
WAL never above 16 MiB, no other errors. Then the same paced load runs with bare `sqlite3` (busy_timeout,
BEGIN IMMEDIATE, no legion code) for `--paced-baseline-seconds` (60): the latency figures are gated against
that baseline of the same run (p99 within 2x, max within 3x, slow share within 2x — or within the absolute
target), the absolute targets reported (`--strict` gates them); the correctness figures always gate.

Saturate mode (`--saturate`, default 30 s): all processes write the same transaction shape as fast
as they can. Gated: >= 0.3 x a bare-`sqlite3` single-process baseline of the same shape (measured in the
same run), zero failed transactions, and a fair share (the fewest commits of one writer >= 0.25 x the mean:
no writer starved of the lock). Reported (gated with `--strict`): >= 2,000 committed tx/s, max latency <= 1 s.

Both modes end with a negative control that must fail: processes writing with bare `sqlite3`,
`busy_timeout=0` and a deferred `BEGIN` read-then-write, which must see SQLITE_BUSY. If the control
shows no busy errors the gate has no teeth and fails.

When only a same-run speed comparison misses (NOISE_CHECKS: a host I/O hiccup lands on one side of a comparison,
not both), the whole run is measured once more and the second attempt gated; the first is reported beside it
(`first_attempt`). A regression misses both attempts; a correctness check is never measured again.

Latency is one transaction from the call to the return of COMMIT; the timer's lateness (`lag`) is
recorded apart and never counted. `diagnosis` breaks every transaction into phases (gate wait,
BEGIN IMMEDIATE, statements, COMMIT = the WAL fsync), its CPU time, its run-queue wait (schedstat:
runnable but not running) and `blocked` (neither: fsync, flock), and profiles the slowest 1 % against
mail ticks, preemption, WAL growth and every background checkpoint run. Before the timed phase the
bench flushes dirty pages (`os.sync`, waits for writeback) and records CPU/IO pressure and the
busiest other processes, so a miss on a loaded machine is explainable.

Prints exactly one JSON object on stdout; exit status 0 only when every check named in `gated` passes: absolute
speed figures are reported and their comparison to the same run's bare-sqlite3 baseline gated (`--strict` gates
both).
Quick run: `python bench/wal_stress.py --processes 20 --duration 10 --paced-baseline-seconds 10`.
`--backend postgresql`: the same transaction on a PostgreSQL ledger (bench/pg_stress.py, its own JSON object).
"""

from __future__ import annotations

import argparse
import array
import bisect
import contextlib
import math
import multiprocessing as mp
import os
import random
import resource
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from legion.ledger import open_ledger
from legion.ledger.checkpointer import stagger

MiB = 1024 * 1024
# max_ms: a single commit may meet one host I/O hiccup (an fsync of ~120 ms on an idle VM, in no code of ours), so
# the slow tail is gated as a share (at most 1 commit in 2,000 over 100 ms) plus a hard ceiling that a real lock
# hand-over stall (seconds) would still break
PACED_TARGETS = {"busy_rate_max": 0.001, "p99_ms_max": 5.0, "max_ms_max": 500.0, "slow_ms": 100.0,
                 "slow_share_max": 0.0005, "wal_bytes_max": 16 * MiB}
# Without --strict the paced tail is gated against a bare-sqlite3 run of the same paced load measured right after
# (the machine's speed and I/O noise vary ±40 % between runs): legion may be at most this many times the bare tail,
# or within the absolute target, whichever is looser; the absolute figures are always reported.
PACED_BARE_RATIOS = {"p99": 2.0, "max": 3.0, "slow_share": 2.0}
# fair_share_min: the fewest commits of one writer over the mean of all (same run): a writer starved of the lock
# (the seconds-long hand-over stall the absolute max once stood for) shows here whatever the machine's speed
SATURATE_TARGETS = {"tx_per_s_min": 2000.0, "baseline_ratio_min": 0.3, "failed_tx_max": 0, "max_ms_max": 1000.0,
                    "fair_share_min": 0.25}
BIG_RATE = 10**9  # the bench measures storage, not the per-sender mail quota
# the same-run speed comparisons: a miss of these alone is measured once more (the pair again) and the second gated
NOISE_CHECKS = frozenset({"p99_vs_bare", "max_vs_bare", "slow_share_vs_bare", "baseline_ratio", "fair_share"})
FIRST_ATTEMPT_KEYS = ("latency_ms", "commits_over_slow_ms", "bare_paced", "baseline", "baseline_ratio", "fair_share",
                      "diagnosis", "machine", "checks")


def _is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def _node_id(index: int) -> str:
    return f"w{index}"


def prepare(db: Path, processes: int) -> None:
    """Create the ledger with a root and one node per writer process."""
    led = open_ledger(db)
    try:
        with led.transaction():
            led.insert_node(id="root", name="root", role="root", depth=0, status="running")
            for i in range(processes):
                led.insert_node(id=_node_id(i), name=f"w{i}", role="worker", depth=1, parent_id="root", status="running")
    finally:
        led.close()


def _ledger_tx(led: Any, node: str, tick: int, mail_every: int) -> None:
    with led.transaction():
        led.heartbeat(node)
        led.append_event(node, "node_resumed", {"tick": tick})
        if mail_every and tick % mail_every == 0:
            led.send_mail(node, "root", f"tick {tick}", "status: still working on it", kind="report")


class _TimedRaw:
    """Wraps the ledger's DBAPI connection to time BEGIN IMMEDIATE and COMMIT (the WAL fsync)."""

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw
        self.begin_s = 0.0
        self.commit_s = 0.0

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "BEGIN IMMEDIATE":
            t = time.perf_counter()
            try:
                return self._raw.execute(sql, *args)
            finally:
                self.begin_s = time.perf_counter() - t
        if sql == "COMMIT":
            t = time.perf_counter()
            try:
                return self._raw.execute(sql, *args)
            finally:
                self.commit_s = time.perf_counter() - t
        return self._raw.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _Probe:
    """Per-transaction phase timing for one writer: gate wait, BEGIN, COMMIT; the rest is statements."""

    def __init__(self, led: Any, track_wal: bool) -> None:
        db = led._db
        self.track_wal = track_wal  # a stat inside the gate: off under saturation (serialised throughput)
        self.raw = _TimedRaw(db.raw)
        db.raw = self.raw
        self.gate_s = 0.0
        self.wal = db.file + "-wal"
        self.wal_before = 0
        acquire = db.gate.acquire

        def timed_acquire() -> bool:
            t = time.perf_counter()
            try:
                return bool(acquire())
            finally:
                self.gate_s = time.perf_counter() - t
                if self.track_wal:
                    self.wal_before = self._wal_size()

        db.gate.acquire = timed_acquire
        self.checkpoints = array.array("d")  # (wall start, duration ms, wal frames, backfilled) per run
        if db.checkpointer is not None:
            db.checkpointer.checkpoint = self._timed_checkpoint(db.checkpointer.checkpoint)

    def _timed_checkpoint(self, run: Any) -> Any:
        def timed(con: sqlite3.Connection) -> tuple[int, int, int]:
            wall, t = time.time(), time.perf_counter()
            res: tuple[int, int, int] = run(con)
            self.checkpoints.extend((wall, (time.perf_counter() - t) * 1000, float(res[1]), float(res[2])))
            return res
        return timed

    def _wal_size(self) -> int:
        try:
            return os.stat(self.wal).st_size
        except OSError:
            return 0

    def wal_grew(self) -> float:
        """1.0 when this transaction extended the WAL file (its fsync then also commits metadata)."""
        return 1.0 if self.track_wal and self._wal_size() > self.wal_before else 0.0

    def reset(self) -> None:
        self.gate_s = self.raw.begin_s = self.raw.commit_s = 0.0


TRACE_FIELDS = ("start", "total", "gate", "begin", "stmts", "commit", "mail", "preempted", "cpu", "lag", "runq", "wal_grew")


def _runq_wait_ms(fd: int) -> float:
    """This thread's cumulative run-queue wait (schedstat field 2): runnable but not running."""
    try:
        return int(os.pread(fd, 128, 0).split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def writer(index: int, db: str, opts: dict[str, Any], start_at: Any, ready: Any, results: Any) -> None:
    """One simulated supervisor: open, warm up, then paced or saturating transactions."""
    node = _node_id(index)
    out: dict[str, Any] = {"attempts": 0, "commits": 0, "busy": 0, "other": 0, "errors": []}
    lat = array.array("d")
    try:
        t0 = time.perf_counter()
        led = open_ledger(db, mail_rate_per_5_min=BIG_RATE)
        t1 = time.perf_counter()
        probe = _Probe(led, track_wal=not opts["saturate"])
        if opts["checkpoint_every"] or opts["pid_mod_stagger"]:
            every = led._db.checkpoint_every = opts["checkpoint_every"] or led._db.checkpoint_every
            led._db._commits = os.getpid() % every if opts["pid_mod_stagger"] else stagger(os.getpid(), every)
        _ledger_tx(led, node, 0, opts["mail_every"])  # untimed warm-up, full shape (tick 0 sends mail)
        out["open_ms"] = (t1 - t0) * 1000
        out["first_tx_ms"] = (time.perf_counter() - t1) * 1000
    except Exception as exc:
        out["errors"].append(f"open: {exc!r}")
        out["other"] += 1
        ready.release()
        results.put(out)
        return
    ready.release()
    while start_at.value == 0.0:
        time.sleep(0.005)
    rng = random.Random(index)
    deadline = start_at.value + opts["duration"]
    interval = opts["interval"]
    saturate = opts["saturate"]
    next_at = start_at.value + (0.0 if saturate else rng.uniform(0, interval))
    tick = 0
    trace = array.array("d")
    mail_every = opts["mail_every"]
    sched_fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    while True:
        intended = next_at
        if not saturate:
            delay = next_at - time.time()
            if delay > 0:
                time.sleep(delay)
            next_at += interval * rng.uniform(0.75, 1.25)
        if time.time() >= deadline:
            break
        tick += 1
        out["attempts"] += 1
        probe.reset()
        # The timer's lateness (scheduling lag) is recorded apart and never counted as latency.
        wall = time.time()
        csw0 = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        runq0 = _runq_wait_ms(sched_fd)
        cpu_began = time.thread_time()
        began = time.perf_counter()
        try:
            _ledger_tx(led, node, tick, mail_every)
        except Exception as exc:
            if _is_busy(exc):
                out["busy"] += 1
            else:
                out["other"] += 1
            if len(out["errors"]) < 5:
                out["errors"].append(repr(exc))
            continue
        total = (time.perf_counter() - began) * 1000
        cpu = (time.thread_time() - cpu_began) * 1000
        runq = _runq_wait_ms(sched_fd) - runq0
        preempted = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw - csw0
        lat.append(total)
        gate, begin, commit = probe.gate_s * 1000, probe.raw.begin_s * 1000, probe.raw.commit_s * 1000
        mail = 1.0 if mail_every and tick % mail_every == 0 else 0.0
        lag = 0.0 if saturate else (wall - intended) * 1000
        trace.extend((wall, total, gate, begin, total - gate - begin - commit, commit, mail, preempted, cpu, lag,
                      runq, probe.wal_grew()))
        out["commits"] += 1
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_s"] = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    led.close()
    out["lat"] = lat.tobytes()
    os.close(sched_fd)
    out["trace"] = trace.tobytes()
    out["checkpoints"] = probe.checkpoints.tobytes()
    results.put(out)


def control_writer(index: int, db: str, seconds: float, results: Any) -> None:
    """Negative control: busy_timeout=0 and deferred read-then-write, bypassing the ledger. Must hit BUSY."""
    con = sqlite3.connect(db, timeout=0, isolation_level=None)
    con.execute("PRAGMA busy_timeout=0")
    attempts = busy = 0
    deadline = time.time() + seconds
    node = _node_id(index)
    while time.time() < deadline:
        attempts += 1
        try:
            con.execute("BEGIN")
            con.execute("SELECT updated_at FROM nodes WHERE id = ?", (node,)).fetchone()
            con.execute("UPDATE nodes SET updated_at = updated_at + 1 WHERE id = ?", (node,))
            con.execute("INSERT INTO events (node_id, type, data, ts) VALUES (?, 'node_resumed', NULL, 0)", (node,))
            con.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                busy += 1
            if con.in_transaction:
                con.execute("ROLLBACK")
    con.close()
    results.put({"attempts": attempts, "busy": busy})


def _bare_connect(db: str) -> sqlite3.Connection:
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA busy_timeout=5000")
    assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    con.execute("PRAGMA foreign_keys=ON")
    return con


def _bare_tx(con: sqlite3.Connection, node: str, tick: int, mail_every: int) -> None:
    """The ledger transaction's shape (heartbeat, event, every few ticks a mail) in bare SQL."""
    now = time.time_ns() // 1_000_000
    con.execute("BEGIN IMMEDIATE")
    con.execute("UPDATE nodes SET updated_at = ? WHERE id = ?", (now, node))
    con.execute("INSERT INTO events (node_id, type, data, ts) VALUES (?, ?, ?, ?)",
                (node, "node_resumed", orjson.dumps({"tick": tick}).decode(), now))
    if mail_every and tick % mail_every == 0:
        con.execute("SELECT count(*) FROM messages WHERE from_node = ? AND created_at > ?", (node, now - 300_000)).fetchone()
        cur = con.execute(
            "INSERT INTO messages (from_node, to_node, subject, body, kind, urgency, delivered, delivered_at, created_at) "
            "VALUES (?, 'root', ?, 'status: still working on it', 'report', 'info', 0, NULL, ?)",
            (node, f"tick {tick}", now),
        )
        con.execute("INSERT INTO events (node_id, type, data, ts) VALUES (?, 'mail_sent', ?, ?)",
                    (node, orjson.dumps({"message_id": cur.lastrowid}).decode(), now))
    con.execute("COMMIT")


def bare_baseline(db: Path, seconds: float, mail_every: int) -> dict[str, Any]:
    """The same transaction shape with the bare sqlite3 module, one process, no SQLAlchemy, no gate."""
    con = _bare_connect(str(db))
    commits = 0
    node = _node_id(0)
    deadline = time.perf_counter() + seconds
    began = time.perf_counter()
    while time.perf_counter() < deadline:
        commits += 1
        _bare_tx(con, node, commits, mail_every)
    elapsed = time.perf_counter() - began
    con.close()
    return {"seconds": round(elapsed, 3), "commits": commits, "tx_per_s": round(commits / elapsed, 1)}


def bare_paced_writer(index: int, db: str, opts: dict[str, Any], start_at: Any, ready: Any, results: Any) -> None:
    """The paced baseline: one process of the same paced load, bare sqlite3 (busy_timeout, BEGIN IMMEDIATE)."""
    node = _node_id(index)
    lat = array.array("d")
    out: dict[str, Any] = {"commits": 0, "errors": 0}
    con = _bare_connect(db)
    _bare_tx(con, node, 0, opts["mail_every"])
    ready.release()
    while start_at.value == 0.0:
        time.sleep(0.005)
    rng = random.Random(index)
    deadline = start_at.value + opts["duration"]
    next_at = start_at.value + rng.uniform(0, opts["interval"])
    tick = 0
    while True:
        delay = next_at - time.time()
        if delay > 0:
            time.sleep(delay)
        next_at += opts["interval"] * rng.uniform(0.75, 1.25)
        if time.time() >= deadline:
            break
        tick += 1
        began = time.perf_counter()
        try:
            _bare_tx(con, node, tick, opts["mail_every"])
        except sqlite3.Error:
            out["errors"] += 1
            if con.in_transaction:
                con.execute("ROLLBACK")
            continue
        lat.append((time.perf_counter() - began) * 1000)
        out["commits"] += 1
    con.close()
    out["lat"] = lat.tobytes()
    results.put(out)


def run_bare_paced(ctx: Any, db: Path, processes: int, seconds: float, interval: float, mail_every: int) -> dict[str, Any]:
    """The paced load with bare sqlite3, measured in this run: the tail the machine itself gives such a load."""
    results, ready = ctx.Queue(), ctx.Semaphore(0)
    start_at = ctx.Value("d", 0.0)
    opts = {"duration": seconds, "interval": interval, "mail_every": mail_every}
    procs = [ctx.Process(target=bare_paced_writer, args=(i, str(db), opts, start_at, ready, results))
             for i in range(processes)]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=120):
            raise RuntimeError("baseline writers did not become ready within 120 s")
    start_at.value = time.time() + 0.2
    got = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(10)
    lat = sorted(x for r in got for x in array.array("d", r["lat"]))
    return {"seconds": seconds, "commits": len(lat), "errors": sum(r["errors"] for r in got),
            "slow": sum(1 for x in lat if x > PACED_TARGETS["slow_ms"]),
            "latency_ms": {"p50": _pct(lat, 0.50), "p95": _pct(lat, 0.95), "p99": _pct(lat, 0.99),
                           "max": round(lat[-1], 3) if lat else 0.0}}


class WalWatcher(threading.Thread):
    """Polls the -wal file size; records the largest seen."""

    def __init__(self, wal: Path) -> None:
        super().__init__(daemon=True)
        self.wal = wal
        self.max_bytes = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                self.max_bytes = max(self.max_bytes, self.wal.stat().st_size)
            self.stop.wait(0.02)


def _pct(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    return round(sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))], 3)


def _dirty_kib() -> int:
    """Dirty + Writeback pages system-wide (KiB), -1 when /proc/meminfo is unreadable."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return -1
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return sum(int(fields.get(k, "0 kB").split()[0]) for k in ("Dirty", "Writeback"))


def settle_writeback(limit_kib: int = 4096, max_wait_s: float = 30.0) -> dict[str, Any]:
    """Flush dirty pages (e.g. a test suite's temp files) so their writeback does not land in the timed phase."""
    began = time.monotonic()
    before = _dirty_kib()
    os.sync()
    after = _dirty_kib()
    while after > limit_kib and time.monotonic() - began < max_wait_s:
        time.sleep(0.2)
        os.sync()
        after = _dirty_kib()
    return {"dirty_kib_before": before, "dirty_kib_after": after, "seconds": round(time.monotonic() - began, 2)}


def _pressure() -> dict[str, float]:
    """PSI some-avg10 for cpu and io (the share of time something waited), when the kernel has it."""
    out: dict[str, float] = {}
    for res in ("cpu", "io"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            first = Path(f"/proc/pressure/{res}").read_text().splitlines()[0]
            out[res + "_some_avg10"] = float(first.split()[1].split("=")[1])
    return out


def _cpu_hogs(sample_s: float = 0.5, top: int = 3) -> list[dict[str, Any]]:
    """The busiest other processes right now (a gate miss on a loaded machine is then explainable)."""
    import psutil

    procs = [p for p in psutil.process_iter(["pid", "name"]) if p.pid != os.getpid()]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
    time.sleep(sample_s)
    seen: list[dict[str, Any]] = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            seen.append({"pid": p.pid, "name": p.info["name"], "cpu_pct": p.cpu_percent(None)})
    return sorted(seen, key=lambda x: -x["cpu_pct"])[:top]


def _dist(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": _pct(ordered, 0.5), "p99": _pct(ordered, 0.99), "max": round(ordered[-1], 3) if ordered else 0.0}


def analyse(got: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-phase distributions and what the slowest 1 % of transactions coincide with."""
    width = len(TRACE_FIELDS)
    rows: list[tuple[float, ...]] = []
    for r in got:
        flat = array.array("d", r.get("trace", b""))
        rows.extend(tuple(flat[i:i + width]) for i in range(0, len(flat), width))
    ckpts: list[tuple[float, float, float, float]] = []
    for r in got:
        flat = array.array("d", r.get("checkpoints", b""))
        ckpts.extend((flat[i], flat[i + 1], flat[i + 2], flat[i + 3]) for i in range(0, len(flat), 4))
    if not rows:
        return {}
    col = {name: i for i, name in enumerate(TRACE_FIELDS)}
    # Blocked time: neither on a CPU nor waiting for one (fsync, the gate's flock, SQLite's busy sleep).
    rows = [(*x, max(0.0, x[col["total"]] - x[col["cpu"]] - x[col["runq"]])) for x in rows]
    col["blocked"] = len(TRACE_FIELDS)
    spans = sorted((c[0], c[0] + c[1] / 1000) for c in ckpts)
    starts = [a for a, _ in spans]
    longest = max((b - a for a, b in spans), default=0.0)

    def during_checkpoint(row: tuple[float, ...]) -> bool:
        start, end = row[0], row[0] + row[col["total"]] / 1000
        lo, hi = bisect.bisect_left(starts, start - longest), bisect.bisect_left(starts, end)
        return any(spans[j][1] > start for j in range(lo, hi))

    def profile(sample: list[tuple[float, ...]]) -> dict[str, Any]:
        n = len(sample)
        return {
            "n": n,
            "mail_share": round(sum(1 for x in sample if x[col["mail"]]) / n, 3),
            "preempted_share": round(sum(1 for x in sample if x[col["preempted"]] > 0) / n, 3),
            "runq_wait_over_1ms_share": round(sum(1 for x in sample if x[col["runq"]] > 1.0) / n, 3),
            "wal_grew_share": round(sum(1 for x in sample if x[col["wal_grew"]]) / n, 3),
            "during_checkpoint_share": round(sum(1 for x in sample if during_checkpoint(x)) / n, 3),
            "mean_ms": {k: round(sum(x[col[k]] for x in sample) / n, 3) for k in ("total", "gate", "begin", "stmts", "commit", "cpu", "runq", "blocked")},
        }

    slowest = sorted(rows, key=lambda x: x[col["total"]])[-max(1, len(rows) // 100):]
    return {
        "phases_ms": {k: _dist([x[col[k]] for x in rows]) for k in ("gate", "begin", "stmts", "commit", "cpu", "runq", "blocked", "lag")},
        "all": profile(rows),
        "slowest_1pct": profile(slowest),
        "checkpoints": {"runs": len(ckpts), "ms": _dist([c[1] for c in ckpts]), "wal_frames": _dist([c[2] for c in ckpts])},
    }


def run_control(ctx: Any, db: Path, processes: int, seconds: float) -> dict[str, Any]:
    results = ctx.Queue()
    procs = [ctx.Process(target=control_writer, args=(i, str(db), seconds, results)) for i in range(processes)]
    for p in procs:
        p.start()
    got = [results.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(10)
    busy = sum(r["busy"] for r in got)
    return {"processes": processes, "seconds": seconds, "attempts": sum(r["attempts"] for r in got),
            "busy": busy, "failed_as_expected": busy > 0}


def run_writers(ctx: Any, db: Path, args: argparse.Namespace) -> tuple[list[dict[str, Any]], float, int]:
    results, ready = ctx.Queue(), ctx.Semaphore(0)
    start_at = ctx.Value("d", 0.0)
    opts = {"duration": args.duration, "interval": args.interval, "saturate": args.saturate, "mail_every": args.mail_every,
            "checkpoint_every": args.checkpoint_every, "pid_mod_stagger": args.pid_mod_stagger}
    procs = [ctx.Process(target=writer, args=(i, str(db), opts, start_at, ready, results)) for i in range(args.processes)]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=120):
            raise RuntimeError("writers did not become ready within 120 s")
    watcher = WalWatcher(Path(str(db) + "-wal"))
    watcher.start()
    start_at.value = time.time() + 0.2
    got = [results.get(timeout=args.duration + 120) for _ in procs]
    for p in procs:
        p.join(10)
    watcher.stop.set()
    watcher.join()
    return got, start_at.value, watcher.max_bytes


def _fair_share(got: list[dict[str, Any]]) -> float:
    """The fewest commits of one writer over the mean commits per writer (1.0: all equal)."""
    counts = [r["commits"] for r in got]
    mean = sum(counts) / len(counts) if counts else 0.0
    return round(min(counts) / mean, 3) if mean else 0.0


def _upper_count(k: int) -> float:
    """The most events a window that saw `k` can be said to expect (Poisson, one-sided 95 %): 3.0 for 0 (the rule
    of three), 4.7 for 1, 10.4 for 5 (k + 1.645·√(k+1) + 1.35, within 2 % of the exact bound)."""
    return k + 1.645 * math.sqrt(k + 1) + 1.35


def _paced_vs_bare(report: dict[str, Any], bare: dict[str, Any], slow: int, commits: int) -> dict[str, bool]:
    """The paced tail within the absolute target or within PACED_BARE_RATIOS of the bare-sqlite3 tail.

    The bare run is 60 s against the paced run's 300 s, so its count of slow commits (host I/O hiccups, a few a
    run) is small and often 0: its slow share is taken at its upper bound (`_upper_count`), not at 0."""
    ours, theirs = report["latency_ms"], bare["latency_ms"]
    share = slow / commits if commits else 0.0
    bare_share = _upper_count(bare["slow"]) / bare["commits"] if bare["commits"] else 0.0
    return {
        "bare_ran_clean": bare["errors"] == 0 and bare["commits"] > 0,
        "p99_vs_bare": ours["p99"] <= max(PACED_TARGETS["p99_ms_max"], PACED_BARE_RATIOS["p99"] * theirs["p99"]),
        "max_vs_bare": ours["max"] <= max(PACED_TARGETS["max_ms_max"], PACED_BARE_RATIOS["max"] * theirs["max"]),
        "slow_share_vs_bare": share <= max(PACED_TARGETS["slow_share_max"], PACED_BARE_RATIOS["slow_share"] * bare_share)
                              or slow <= 1,
    }


def measure(ctx: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One whole measured run in `work`: the load, its same-run baseline, the negative control, the checks."""
    load_before = os.getloadavg()
    db = work / "legion.db"
    prepare(db, args.processes)
    report: dict[str, Any] = {"bench": "wal_stress", "mode": "saturate" if args.saturate else "paced",
                              "processes": args.processes, "duration_s": args.duration}
    if args.checkpoint_every or args.pid_mod_stagger:
        report["checkpoint_override"] = {"every": args.checkpoint_every, "pid_mod_stagger": args.pid_mod_stagger}
    if args.saturate:
        base_db = work / "baseline.db"
        prepare(base_db, 1)
        before = bare_baseline(base_db, args.baseline_seconds, args.mail_every)
    else:
        report["interval_s"] = args.interval
    report["writeback"] = settle_writeback()
    pressure_before = _pressure()
    hogs = _cpu_hogs()
    got, _started, wal_max = run_writers(ctx, db, args)
    if args.saturate:
        # Measured before and after the run; the ratio uses the faster one (the stricter test).
        after = bare_baseline(base_db, args.baseline_seconds, args.mail_every)
        report["baseline"] = max(before, after, key=lambda b: b["tx_per_s"])
        report["baseline"]["runs_tx_per_s"] = [before["tx_per_s"], after["tx_per_s"]]
    lat = sorted(x for r in got for x in array.array("d", r.get("lat", b"")))
    attempts = sum(r["attempts"] for r in got)
    commits = sum(r["commits"] for r in got)
    busy = sum(r["busy"] for r in got)
    other = sum(r["other"] for r in got)
    first = sorted(r["first_tx_ms"] for r in got if "first_tx_ms" in r)
    opened = sorted(r["open_ms"] for r in got if "open_ms" in r)
    report.update({
        "attempts": attempts, "commits": commits, "busy": busy, "other_errors": other,
        "busy_rate": round(busy / attempts, 6) if attempts else 0.0,
        "latency_ms": {"p50": _pct(lat, 0.50), "p95": _pct(lat, 0.95), "p99": _pct(lat, 0.99),
                       "max": round(lat[-1], 3) if lat else 0.0},
        "first_tx_ms": {"p50": _pct(first, 0.5), "max": round(first[-1], 3) if first else 0.0},
        "open_ms": {"p50": _pct(opened, 0.5), "max": round(opened[-1], 3) if opened else 0.0},
        "commits_per_process": {"min": min((r["commits"] for r in got), default=0),
                                "max": max((r["commits"] for r in got), default=0)},
        "cpu_us_per_commit": round(sum(r.get("cpu_s", 0.0) for r in got) / commits * 1e6, 1) if commits else 0.0,
        "wal_max_bytes": wal_max,
        "error_samples": sorted({e for r in got for e in r["errors"]})[:5],
        "diagnosis": analyse(got),
    })
    report["control"] = run_control(ctx, db, args.control_processes, args.control_seconds)
    checks: dict[str, bool] = {"control_failed_as_expected": report["control"]["failed_as_expected"],
                               "no_other_errors": other == 0, "all_writers_reported": len(got) == args.processes}
    if args.saturate:
        tps = commits / args.duration
        ratio = tps / report["baseline"]["tx_per_s"] if report["baseline"]["tx_per_s"] else 0.0
        report.update({"tx_per_s": round(tps, 1), "failed_tx": attempts - commits, "baseline_ratio": round(ratio, 3),
                       "fair_share": _fair_share(got), "targets": SATURATE_TARGETS})
        checks.update({
            "tx_per_s": tps >= SATURATE_TARGETS["tx_per_s_min"],
            "baseline_ratio": ratio >= SATURATE_TARGETS["baseline_ratio_min"],
            "failed_tx": attempts - commits <= SATURATE_TARGETS["failed_tx_max"],
            "max_ms": report["latency_ms"]["max"] <= SATURATE_TARGETS["max_ms_max"],
            "fair_share": _fair_share(got) >= SATURATE_TARGETS["fair_share_min"],
        })
    else:
        report["targets"] = PACED_TARGETS
        slow = sum(1 for x in lat if x > PACED_TARGETS["slow_ms"])
        report["commits_over_slow_ms"] = slow
        checks.update({
            "busy_rate": report["busy_rate"] < PACED_TARGETS["busy_rate_max"],
            "p99_ms": report["latency_ms"]["p99"] <= PACED_TARGETS["p99_ms_max"],
            "max_ms": report["latency_ms"]["max"] <= PACED_TARGETS["max_ms_max"],
            "slow_share": slow <= max(1.0, PACED_TARGETS["slow_share_max"] * commits),
            "wal_bytes": wal_max <= PACED_TARGETS["wal_bytes_max"],
            "commits": commits > 0,
        })
    if not args.saturate:
        base_db = work / "baseline.db"
        prepare(base_db, args.processes)
        bare = run_bare_paced(ctx, base_db, args.processes, args.paced_baseline_seconds, args.interval,
                              args.mail_every)
        report["bare_paced"] = bare
        report["bare_ratios_max"] = PACED_BARE_RATIOS
        checks.update(_paced_vs_bare(report, bare, slow, commits))
    report["checks"] = checks
    report["machine"] = {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                         "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                         "pressure_before": pressure_before, "pressure_after": _pressure(),
                         "busiest_processes_before": hogs}
    # the machine's speed varies ±40 % between runs: absolute speed figures are reported, their comparison to
    # the bare-sqlite3 baseline measured in the same run is what gates (unless --strict)
    absolute: tuple[str, ...] = ()
    if not args.strict:
        absolute = ("tx_per_s", "max_ms") if args.saturate else ("p99_ms", "max_ms", "slow_share")
    report["gated"] = sorted(k for k in checks if k not in absolute)
    report["ok"] = all(checks[k] for k in report["gated"])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=60)
    parser.add_argument("--duration", type=float, default=None, help="seconds (default 300, or 30 with --saturate)")
    parser.add_argument("--interval", type=float, default=2.0, help="paced tick interval in seconds (jittered ±25%%)")
    parser.add_argument("--mail-every", type=int, default=5, help="a mail send every N ticks (0 = never)")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="diagnostics: override the ledger's background-checkpoint period in commits (0 = product default)")
    parser.add_argument("--pid-mod-stagger", action="store_true",
                        help="diagnostics: the old checkpoint offsets (pid %% period), for A/B against the spread ones")
    parser.add_argument("--saturate", action="store_true", help="every process writes as fast as it can")
    parser.add_argument("--strict", action="store_true",
                        help="gate the absolute targets too (by default the figures relative to the bare-sqlite3 "
                             "baseline of the same run are gated, the absolute ones reported)")
    parser.add_argument("--baseline-seconds", type=float, default=5.0,
                        help="the bare-sqlite3 single-process baseline's length with --saturate")
    parser.add_argument("--paced-baseline-seconds", type=float, default=60.0,
                        help="the bare-sqlite3 paced baseline's length (paced mode)")
    parser.add_argument("--control-processes", type=int, default=8)
    parser.add_argument("--control-seconds", type=float, default=3.0)
    parser.add_argument("--dir", default=None, help="where to put the databases (default: a fresh temp dir)")
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite",
                        help="postgresql: the same transaction shape on a PostgreSQL ledger, paced then saturated, "
                             "with legion's SQLite ledger saturated beside it (bench/pg_stress.py)")
    args = parser.parse_args(argv)
    if args.backend == "postgresql":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import pg_stress

        passed = ["--processes", str(args.processes), "--interval", str(args.interval),
                  "--mail-every", str(args.mail_every), *(["--duration", str(args.duration)] if args.duration else []),
                  *(["--strict"] if args.strict else [])]
        return int(pg_stress.main(passed))
    if args.duration is None:
        args.duration = 30.0 if args.saturate else 300.0
    work = Path(tempfile.mkdtemp(prefix="wal-stress-", dir=args.dir))
    ctx = mp.get_context("fork")
    try:
        (work / "1").mkdir()
        report = measure(ctx, work / "1", args)
        missed = {k for k in report["gated"] if not report["checks"][k]}
        if missed and missed <= NOISE_CHECKS:
            # a speed comparison missed and nothing else: measure the whole pair again (a host I/O hiccup hits one
            # side of a comparison, a regression hits both attempts) and gate the second; both are reported
            (work / "2").mkdir()
            first = report
            shutil.rmtree(work / "1", ignore_errors=True)
            report = measure(ctx, work / "2", args)
            report["first_attempt"] = {k: first.get(k) for k in FIRST_ATTEMPT_KEYS} | {"missed": sorted(missed)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(orjson.dumps(report).decode() + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
