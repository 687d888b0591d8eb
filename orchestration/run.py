"""`legion run`: compose one run — run directory, root supervisor, pool, orchestrator, Teams runtime, Postman,
operator socket, root session — as one `Run` (docs/architecture.md §7, "The Run").

`prepare_run(options)` (legion/prepare.py) loads settings and cards, resolves the root session's model and
checks the arguments without starting anything (a configuration error raises `RunConfigError`: exit 2,
nothing created). `execute(prepared)` builds a `Run`, which
creates `.legion/runs/<run-id>/` (0700) with `run.json` and its owner record, runs startup hygiene over
dead owners' runs, starts the `RootSupervisor` (an agent-tree run: the root session is the node at depth
0, the pool is infrastructure), launches the root session and waits until it has settled with nothing
live under it, the timeout, or a pause (SIGINT/SIGTERM, `legion stop --all`, or a full disk). Exit statuses
(docs/architecture.md §7): 0 the root settled successfully; 1 it failed, was aborted or timed out;
2 usage/configuration; 3 infrastructure; 130 paused.

A full disk under the ledger (ENOSPC, EDQUOT, SQLite's "database or disk is full") pauses the run like
SIGINT, with a message naming the filesystem and its free space. Each run directory holds a small space
reserve (`SPACE_RESERVE`, made at start, allocated for real) that the pause gives back, so that the
pause's own records (every node `retired`, run.json `paused`) can still land; what cannot be written is
said on stderr. `legion resume` continues the run once space is freed.

A PostgreSQL ledger server that stays unreachable longer than `legion.ledger.unreachablePauseMs` pauses the run
the same way, with a log line and a stderr line naming the server and how long it was unreachable (until then
the writers keep every write and retry it: ledger/writer.py). The pause's own records that need the server
cannot land: run.json (`paused`, with the reason) and the launch records are the run directory's, and `legion
resume`, once the server answers, converges the rows the pause could not retire (the orphan scan) and continues.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from legion.agents import Settings
from legion.agents.settings_schema import UNREACHABLE_PAUSE_MS
from legion.agents.spawn_hints import append_hint
from legion.bus.control import control_endpoint
from legion.bus.monitor import monitor_endpoints
from legion.bus.protocol import AGENT_LAUNCHED
from legion.bus.security import InsecureEndpointError, ensure_private_dir, ipc_endpoint
from legion.codes import RETIRE_FAILED
from legion.ledger import Ledger, RunFileError, open_ledger, run_hygiene, write_run_json
from legion.ledger.location import LEDGER_FILE, RUN_JSON_KEY, ledger_scope
from legion.ledger.owner import owner_record
from legion.ledger.runfile import LAUNCHES_DIR, OPERATOR_SOCKET
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.commands import Reply, action
from legion.orchestration.fallback import ModelFallbacks
from legion.orchestration.fleet_budget import FleetBudget, fleet_budget
from legion.orchestration.fleet_row import FleetRow
from legion.orchestration.host import Host
from legion.orchestration.launch import LaunchRequest, RunContext
from legion.orchestration.orchestrator import POOL, Orchestrator
from legion.orchestration.postman import Postman
from legion.orchestration.preload import run_preload
from legion.orchestration.refusals import INVALID_PARAMS, ActionRefused
from legion.orchestration.retries import log_retries
from legion.orchestration.teams import Teams, delivered_branches
from legion.paths import ensure_ignored, runs_dir
from legion.prepare import Prepared, RunOptions, new_run_id, prepare_run
from legion.procs.durable import replace_file
from legion.run_errors import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_PAUSED, EXIT_USAGE, RunConfigError
from legion.run_ledger import apply_password
from legion.supervision.relay_child import RelayStartError
from legion.supervision.root import RootSupervisor
from legion.supervision.run_lock import RunDirBusy
from legion.supervision.spawn import EarlyForkServer
from legion.supervision.supervisor import RESTART_INTENSITY
from legion.workers.tree_budget import UNKNOWN_COST_USD_PER_MTOK, TreeBudget

__all__ = ["EXIT_FAILED", "EXIT_INFRA", "EXIT_OK", "EXIT_PAUSED", "EXIT_USAGE", "Prepared", "RunConfigError",
           "RunOptions", "new_run_id", "prepare_run"]
PAUSE = "pause"  # the operator action of `legion stop RUN --all`
PAUSE_REPLY_GRACE_S = 0.1  # the pause reply leaves before the run's shutdown closes the operator socket
SPACE_RESERVE = ".space-reserve"  # in a live run's directory: given back when the disk is full (see the module doc)
SPACE_RESERVE_BYTES = 512 * 1024
RUN_SCHEMA = 1  # run.json layout this version writes; a newer one is refused by `legion resume`


@dataclass
class RunResult:
    exit_code: int
    status: str  # settled | failed | retired | timeout | paused | infrastructure
    run_dir: Path
    run_id: str
    final_text: str
    nodes: list[dict[str, Any]]
    detail: str = ""
    wall_s: float = 0.0
    branches: list[dict[str, Any]] = field(default_factory=list)  # teams: each team's branch + HEAD sha (git)


async def execute(prepared: Prepared, *, on_root: Callable[[RootSupervisor], None] | None = None,
                  install_signals: bool = True, fork_server: EarlyForkServer | None = None) -> RunResult:
    """Run the task to its end; never raises for a run-time failure (it becomes the exit status). `fork_server`:
    the run's fork server started ahead (`legion.orchestration.preload.prestart`)."""
    opts = prepared.options

    async def begin(run: Run) -> None:
        node, _ = await run.orchestrator.launch(None, LaunchRequest(
            agent=opts.agent, task=opts.task, name="root", model=opts.model, preset=opts.preset, team=opts.team))
        run.record("running", session_file=str(node.transcript))

    return await Run(prepared, on_root=on_root, install_signals=install_signals, fork_server=fork_server).execute(begin)


class Run:
    """One run's composition (circus's Arbiter; docs/architecture.md §7): `legion run`, `legion resume` and
    `legion demo` each build one.

    `start()` brings up, in this order, the root supervisor, the pool, the orchestrator, the Teams runtime, the
    Postman and the operator socket; `stop()` takes them down in reverse. `execute(begin)` is a whole run: start,
    `begin(run)` (launch the root session, or restore and revive the tree), wait until the root settles with
    nothing live, the timeout or a pause, stop. `fresh=False` reopens an existing run (`legion resume`)."""

    def __init__(self, prepared: Prepared, *, fresh: bool = True, install_signals: bool = True,
                 on_root: Callable[[RootSupervisor], None] | None = None,
                 fork_server: EarlyForkServer | None = None) -> None:
        self.prepared = prepared
        self.fork_server = fork_server  # started ahead; handed to the root, whose spawner adopts it if it fits
        self.fresh = fresh
        self.install_signals = install_signals
        self.on_root = on_root
        self.paused = asyncio.Event()  # SIGINT/SIGTERM, `legion stop RUN --all`, a full disk
        self.disk_full: list[str] = []
        self.unreachable: list[str] = []  # the ledger server stayed unreachable past its bound: why the run paused
        self.root: RootSupervisor | None = None
        self.orch: RunOrchestrator | None = None
        self.teams: Teams | None = None
        self.postman: Postman | None = None
        self.fallbacks: ModelFallbacks | None = None
        self.fleet = FleetRow(prepared, ledger_target(prepared))  # the run's row in the ledger's runs table
        self._signals = False

    async def _fleet_budget(self, ledger: Ledger) -> FleetBudget | None:
        """The project's fleet-wide budget (`legion.budget.fleetMaxCostUsd`), under the key the run's row has."""
        settings = self.prepared.settings
        if settings.get("legion.budget.fleetMaxCostUsd") is None:
            return None
        project = await self.fleet.project() or self.prepared.options.cwd.resolve().name
        return fleet_budget(settings, project, self.prepared.run_id, ledger.backend)

    @property
    def orchestrator(self) -> RunOrchestrator:
        if self.orch is None:
            raise RuntimeError("Run.start() has not started the orchestrator")
        return self.orch

    # ----- records ------------------------------------------------------------------------------
    def record(self, status: str, *, session_file: str | None = None, extra: dict[str, Any] | None = None) -> None:
        """run.json with the run's status (merged into what it holds), and the run's row in the ledger."""
        _write_run_json(self.prepared, status=status, session_file=session_file, extra=extra)
        self.fleet.state(status)

    def announce(self, node: AgentNode, *, restored: bool = False) -> None:
        """`agent_launched` on the monitor stream: the one place it is published, for a launch and for a node
        that `legion resume` restored."""
        if self.root is None:
            return
        body: dict[str, Any] = {"node_id": node.id, "parent_id": node.parent, "role": node.role, "model": node.model,
                                "depth": node.depth, "backend": node.backend}
        if restored:
            body["restored"] = True
        self.root.publish(AGENT_LAUNCHED, body)

    def _on_disk_full(self, message: str) -> None:
        if not self.disk_full:
            logger.error("{}: pausing the run; free space, then `legion resume {}` continues it", message,
                         self.prepared.run_id)
            self.disk_full.append(message)
            _release_space_reserve(self.prepared.run_dir)  # for the pause's own records
        self.paused.set()

    def _on_unreachable(self, detail: str) -> None:
        if not self.unreachable:
            message = f"{detail}; pausing the run; once the server is back, `legion resume {self.prepared.run_id}` continues it"
            logger.error("{}", message)
            print(f"legion run: {message}", file=sys.stderr, flush=True)
            self.unreachable.append(detail)
        self.paused.set()

    # ----- start and stop -----------------------------------------------------------------------
    async def start(self) -> None:
        """Root, pool, orchestrator, Teams, Postman, operator socket. A root that cannot start raises
        RunConfigError with nothing else started."""
        await self._start_root()
        await self._start_parts()

    async def _start_root(self) -> None:
        prepared, opts = self.prepared, self.prepared.options
        sup = prepared.settings.supervision
        apply_password(prepared.ledger)
        root = RootSupervisor(prepared.run_dir, ledger_target(prepared), run_id=prepared.run_id, root_node=False,
                              preload=run_preload(prepared), early_fork_server=self.fork_server,
                              max_restarts=sup.max_restarts, restart_period=sup.restart_period_ms / 1000,
                              idle_grace=sup.rpc_idle_grace, monitor_tcp=opts.monitor_tcp, curve=opts.curve, on_disk_full=self._on_disk_full,
                              on_ledger_unreachable=self._on_unreachable,
                              ledger_unreachable_s=unreachable_pause_s(prepared.settings))
        try:
            await root.start()
        except RunDirBusy as exc:
            raise RunConfigError(str(exc)) from None
        except RelayStartError as exc:  # --monitor: the relay could not listen (a port in use, an address)
            if self.fresh:
                self.record("refused")
            raise RunConfigError(f"{exc}; choose another --monitor port") from None
        self.root = root
        tcp = root.relay.endpoints if root.relay is not None else None
        await self.fleet.project()
        self.fleet.register(root, "starting", operator=ipc_endpoints(prepared.run_dir).get("operator"),
                            monitor=tcp[0] if tcp else None,
                            server_key=opts.curve.public_key.decode() if tcp and opts.curve else None)
        if not self.fresh:
            self.record("starting")  # the new owner, once the run directory's lock is ours
        if root.relay is not None and root.relay.endpoints is not None:  # the tcp monitor: a relay process
            self.record("starting", extra={"monitor": {
                "pub": root.relay.endpoints[0], "snapshot": root.relay.endpoints[1],
                "serverKey": opts.curve.public_key.decode() if opts.curve else None}})
        if self.on_root is not None:
            self.on_root(root)
        if prepared.ledger is None:  # a database server's disk is not the run directory's
            _make_space_reserve(prepared.run_dir)
        if self.install_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.paused.set)
            self._signals = True

    async def _start_parts(self) -> None:
        prepared, opts, settings = self.prepared, self.prepared.options, self.prepared.settings
        root = self.root
        assert root is not None and root.ledger is not None
        await root.nodes.launch_pool(POOL, inprocess=dict(settings.data.get("inprocess") or {}),
                               log_path=str(prepared.run_dir / "pool.log"))
        # each node's launch record is saved with its ledger row (a root killed before the session started must not
        # leave a row that no later root can rebuild: `legion resume` restores nodes from these records); nothing it
        # holds changes once the row is reserved, but a switch to a fallback model saves it again
        ctx = RunContext(run_dir=prepared.run_dir, run_id=prepared.run_id, cwd=opts.cwd, settings=settings,
                         catalog=prepared.catalog, ledger=root.ledger, writer=root.writer, env=opts.env,
                         budget=tree_budget(settings, opts.max_cost), fleet=await self._fleet_budget(root.ledger),
                         on_reserve=lambda node: save_launch_record(prepared.run_dir, node))
        if ctx.fleet is not None:
            ctx.fleet.start(ctx.writer, ctx.ledger, ctx.reserved)
        self.orch = orch = RunOrchestrator(root.nodes, ctx, self.paused)
        orch.subscribe("planned", self.announce)  # before the session's first event, even for a session that settles fast
        self.teams = Teams(orch)  # phase machine, verification, phase-timeout notices (orchestration/teams.py)
        self.postman = Postman(orch).start()  # mail delivery, confirmation, stall notices (orchestration/postman.py)
        self.fallbacks = ModelFallbacks(orch).start()  # sessions' switches to fallback models (orchestration/fallback.py)
        log_retries(orch)  # model-request retries in legion.log (orchestration/retries.py)
        await orch.serve_operator()

    async def stop(self, status: str = "paused", code: int = EXIT_PAUSED, detail: str = "") -> tuple[int, str]:
        """In reverse: the operator socket, the Postman, the orchestrator (with the Teams runtime's task), then the
        pool and the root, paused (session-shutdown: resumable). Returns the exit code and detail, which a failed
        shutdown (exit 3) overrides."""
        if self._signals:
            self._signals = False
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(Exception):
                    asyncio.get_running_loop().remove_signal_handler(sig)
        orch = self.orch
        if orch is not None:
            await orch.close_operator()
        if self.postman is not None:
            await self.postman.close()
        if self.fallbacks is not None:
            await self.fallbacks.close()
        if orch is not None:
            await orch.close()  # its tasks, the Teams runtime's phase-timeout task among them
        await self.fleet.close()
        if self.root is None:
            return code, detail
        return await _shutdown(self.root, status, code, detail, force=orch.force_pause if orch else False)

    # ----- a whole run ----------------------------------------------------------------------------
    async def execute(self, begin: Callable[[Run], Awaitable[None]]) -> RunResult:
        """Start, `begin`, wait for the end, the timeout or a pause, stop; never raises for a run-time failure."""
        started = time.monotonic()
        prepared, opts = self.prepared, self.prepared.options
        try:
            ensure_ignored(opts.cwd)  # .legion/.gitignore: the project's git never sees legion's state
            ensure_private_dir(prepared.run_dir)
        except OSError as exc:  # (`prepare_run` checked the folders; this is what it cannot foresee: a read-only or
            # full filesystem, a race) — exit 2 naming the path, never a traceback
            where = exc.filename or prepared.run_dir
            raise RunConfigError(f"cannot create the run directory {prepared.run_dir}: {where}: "
                                 f"{exc.strerror or exc}; make {runs_dir(opts.cwd)} a folder you can write, or run "
                                 "legion from another directory") from None
        run_log = RunLog(prepared.run_dir / "legion.log")
        sink = logger.add(run_log, level="DEBUG", enqueue=False, colorize=False)  # the root's own log
        try:
            return await self._execute(begin, started)
        finally:
            logger.remove(sink)
            run_log.close()

    async def _execute(self, begin: Callable[[Run], Awaitable[None]], started: float) -> RunResult:
        prepared, opts = self.prepared, self.prepared.options
        if self.fresh:
            self.record("starting")
        _hygiene(prepared)
        await self._start_root()  # RunConfigError: nothing started, nothing to stop
        status, detail, code = "failed", "", EXIT_FAILED
        collector: tuple[int, ...] | None = None
        try:
            await self._start_parts()
            collector = _freeze_composed()
            await begin(self)
            orch, root = self.orchestrator, self.root
            assert root is not None
            if orch.done.is_set() and any(n.live for n in orch.tree):
                orch.done.clear()  # set by a transient idle moment while `begin` was still reviving the tree
            status, code = await _wait(orch, root, self.paused, opts.timeout)
            if orch.done.is_set() and status not in ("paused", "timeout", "infrastructure"):
                await orch.finalize(status)
            if self.disk_full and status == "paused":
                detail = f"{self.disk_full[0]}; free space, then `legion resume {prepared.run_id}` continues the run"
            elif self.unreachable and status == "paused":
                detail = (f"{self.unreachable[0]}; once the server is back, `legion resume {prepared.run_id}` "
                          "continues the run")
            ended = orch.tree.get(orch.root_id or "root")
            if code == EXIT_FAILED and ended is not None and ended.error:
                detail = append_hint(f"the root session's run ended: {ended.error}")
        except ActionRefused as exc:
            status, detail, code = "refused", append_hint(f"{exc.code}: {exc}", exc.code), EXIT_USAGE
        except Exception as exc:
            logger.exception("the run failed")
            status, detail, code = "infrastructure", f"{type(exc).__name__}: {exc}", EXIT_INFRA
        finally:
            code, detail = await self.stop(status, code, detail)
            if self.orch is not None and self.orch.ctx.fleet is not None:  # the run holds nothing any more
                await self.orch.ctx.fleet.ended(lambda: open_run_ledger(prepared))
            if collector is not None:
                _thaw(collector)
        _release_space_reserve(prepared.run_dir)  # a finished run keeps no reserve; a resume makes a new one
        nodes = _node_rows(prepared)
        ran = self.orch
        branches = delivered_branches(ran, nodes) if ran is not None else []  # teams
        root_node = ran.tree.get(ran.root_id or "root") if ran is not None else None
        final = root_node.final_text if root_node is not None else ""
        try:
            self.record(status, extra={"detail": detail} if self.disk_full or self.unreachable else None)
        except (OSError, RunFileError) as exc:  # e.g. the disk is still full: say what the run's true state is
            logger.error("run.json not written: {}", exc)
            print(f"legion run: {exc}; run.json is stale: the run ended {status} (exit {code})"
                  f"{' — ' + detail if detail else ''}", file=sys.stderr)
        return RunResult(code, status, prepared.run_dir, prepared.run_id, final, nodes, detail,
                         time.monotonic() - started, branches)


class RunOrchestrator(Orchestrator):
    """The orchestrator of `legion run`: adds the operator's whole-run pause (`legion stop RUN --all`)."""

    def __init__(self, root: Host, ctx: RunContext, paused: asyncio.Event) -> None:
        super().__init__(root, ctx)
        self.paused = paused
        self.force_pause = False

    def pause(self, *, force: bool = False) -> dict[str, Any]:
        """Pause the whole run like SIGINT: every node `retired` (session-shutdown), phases untouched, exit 130.
        The run ends just after this reply has left."""
        live = [n.id for n in self.tree if n.live]
        self.force_pause = self.force_pause or force
        asyncio.get_running_loop().call_later(PAUSE_REPLY_GRACE_S, self.paused.set)
        return {"ok": True, "text": f"pausing the run ({len(live)} live node(s): {', '.join(live) or 'none'})"
                                    f"{' (forced)' if force else ''}; `legion resume` continues it", "live": live}


@action(PAUSE)
async def pause(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    """The operator's `legion stop RUN --all`: only a run's own orchestrator can pause it."""
    if not isinstance(orch, RunOrchestrator):
        raise ActionRefused("this orchestrator is not a run's: it cannot be paused", INVALID_PARAMS)
    return orch.pause(force=bool(args.get("force")))


def _freeze_composed() -> tuple[int, ...]:
    """What is alive once the run is composed (modules, the run's parts) lives as long as the run: out of the cyclic
    collector's reach, a full collection walks what the tree made, not every object of every import; the young
    generation is collected every 10,000 allocations. Returns the thresholds `_thaw` puts back."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(10_000, *thresholds[1:])
    return thresholds


def _thaw(thresholds: tuple[int, ...]) -> None:
    """The run is over: its frozen objects are the collector's again (a process may run another run)."""
    gc.set_threshold(*thresholds)
    gc.unfreeze()


def save_launch_record(run_dir: Path, node: AgentNode) -> None:
    """What `legion resume` needs to rebuild a node that the ledger row does not hold: <run>/launches/<id>.json."""
    record = {"id": node.id, "role": node.role, "backend": node.backend, "model": node.model,
              "model_origin": node.model_origin, "transcript": str(node.transcript), "task": node.task,
              "generations": node.generations, "provider_pin": node.provider_pin, "thinking": node.thinking,
              "utility": node.utility, "spec": node.spec, "tool_call": node.tool_call}
    folder = run_dir / LAUNCHES_DIR
    data = orjson.dumps(record, default=str)
    try:
        try:
            replace_file(folder / f"{node.id}.json", data, durable=False)
        except FileNotFoundError:  # the run's first record: made here, not checked on every launch
            folder.mkdir(mode=0o700, exist_ok=True)
            replace_file(folder / f"{node.id}.json", data, durable=False)
    except OSError as exc:
        logger.error("launch record of {} not written ({}): this node cannot be resumed by a later root", node.id, exc)


def load_launch_records(run_dir: Path) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    for path in sorted((run_dir / LAUNCHES_DIR).glob("*.json")):
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            logger.warning("launch record {} unreadable ({}); that node is not restored", path, exc)
            continue
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            records[data["id"]] = data
    return records


async def _wait(orch: Orchestrator, root: RootSupervisor, paused: asyncio.Event,
                timeout: float | None) -> tuple[str, int]:
    done = asyncio.ensure_future(orch.done.wait())
    pause = asyncio.ensure_future(paused.wait())
    gone = asyncio.ensure_future(root.wait_exit())
    try:
        await asyncio.wait({done, pause, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in (done, pause, gone):
            f.cancel()
    if gone.done() and not gone.cancelled():
        return "infrastructure", EXIT_INFRA
    if paused.is_set():
        return "paused", EXIT_PAUSED
    if not orch.done.is_set():
        return "timeout", EXIT_FAILED
    root_node = orch.tree.get("root")
    if root_node is not None and root_node.status == "settled":
        return "settled", EXIT_OK
    return (root_node.status if root_node else "failed"), EXIT_FAILED


async def _shutdown(root: RootSupervisor, status: str, code: int, detail: str, *,
                    force: bool = False) -> tuple[int, str]:
    """Pause the tree (session-shutdown: resumable) and close; RETIRE_FAILED or an escalation is exit 3."""
    try:
        if root.running:
            await root.stop(force=force)
        else:
            await root.wait_exit()
    except Exception as exc:
        return EXIT_INFRA, f"{detail}; shutdown failed: {exc}".strip("; ")
    reason = root.exit_reason
    if reason is not None and reason.detail == RESTART_INTENSITY:
        return EXIT_INFRA, "restart intensity exceeded: a worker kept crashing (see the run log)"
    if failures := root.retire_failures:
        return EXIT_INFRA, f"{RETIRE_FAILED}: {', '.join(failures)} survived the retire ladder"
    return code, detail


def unreachable_pause_s(settings: Settings) -> float:
    """`legion.ledger.unreachablePauseMs` in seconds: how long a PostgreSQL ledger server may stay unreachable."""
    value = settings.get("legion.ledger.unreachablePauseMs", UNREACHABLE_PAUSE_MS)
    ms = value if isinstance(value, int | float) and not isinstance(value, bool) else UNREACHABLE_PAUSE_MS
    return float(ms) / 1000


def ledger_target(prepared: Prepared) -> str | Path:
    """The run's ledger: its PostgreSQL URL (no password), else the run directory's SQLite file."""
    return prepared.ledger.url if prepared.ledger is not None else prepared.run_dir / LEDGER_FILE


def open_run_ledger(prepared: Prepared) -> Ledger:
    target = ledger_target(prepared)
    return open_ledger(target, run_id=ledger_scope(target, prepared.run_id))


def _node_rows(prepared: Prepared) -> list[dict[str, Any]]:
    try:
        with contextlib.closing(open_run_ledger(prepared)) as ledger:
            rows = ledger.list_nodes()
            for row in rows:
                usage = ledger.get_usage(row["id"]) or {}
                row["tokens_in"] = int(usage.get("tokens_in") or 0)
                row["tokens_out"] = int(usage.get("tokens_out") or 0)
                row["cost_usd"] = float(usage.get("cost_usd") or 0.0)
                row["unknown_cost_tokens"] = int(usage.get("unknown_cost_tokens") or 0)
            return rows
    except Exception as exc:
        logger.warning("reading the run's nodes failed: {!r}", exc)
        return []


def tree_budget(settings: Settings, max_cost: float | None) -> TreeBudget | None:
    """The run's tree-wide budget from `legion.budget` (`--max-cost` overrides maxCostUsd); None = unlimited."""
    def number(key: str) -> Any:
        value = settings.get(f"legion.budget.{key}")
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    cost = max_cost if max_cost is not None else number("maxCostUsd")
    tokens = number("maxTokens")
    if cost is None and tokens is None:
        return None
    rate = number("unknownCostPerMTokUsd")
    return TreeBudget(None if cost is None else float(cost), None if tokens is None else int(tokens),
                      UNKNOWN_COST_USD_PER_MTOK if rate is None else float(rate))


def _hygiene(prepared: Prepared) -> None:
    """Startup housekeeping; removing old run directories is said in the run's log and on stderr."""
    days = prepared.settings.retention.retention_days
    try:
        report = run_hygiene(None, runs_dir(prepared.options.cwd), current_run=prepared.run_dir,
                             retention_days=days if days > 0 else math.inf,  # 0: keep every run
                             keep_shared_rows=bool(prepared.settings.get("legion.ledger.keepRows")))
    except Exception as exc:  # best effort, never fatal
        logger.warning("startup hygiene failed: {!r}", exc)
        return
    removed = [Path(p).name for p in report.run_dirs_removed]
    if removed:
        what = (f"housekeeping removed {len(removed)} run director{'y' if len(removed) == 1 else 'ies'} idle for "
                f"more than {days} days (retentionDays in .legion/settings.json; 0 keeps every run): "
                f"{', '.join(removed)}")  # fmt: skip
        logger.info(what)
        print(f"legion: {what}", file=sys.stderr, flush=True)


class RunLog:
    """The run's legion.log as a loguru sink that a full disk cannot break: what cannot be written is counted
    (and said once on stderr), never a logging-error traceback or a crash of the run's ending."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lost = 0
        self._fh = self._open()

    def write(self, message: str) -> None:
        try:
            self._fh.write(message)
            self._fh.flush()
        except (OSError, ValueError) as exc:  # ValueError: the file could not be reopened after a failure
            self.lost += 1
            if self.lost == 1:
                print(f"legion run: log lines not written to {self.path}: {exc}", file=sys.stderr)
            with contextlib.suppress(OSError):  # drop what is buffered: it would fail the next write too
                self._fh = self._reopen()

    def _reopen(self) -> Any:
        with contextlib.suppress(OSError):
            self._fh.close()
        return self._open()

    def _open(self) -> Any:
        """Append, created 0600 like everything in a run directory."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._fh.close()


def _make_space_reserve(run_dir: Path) -> None:
    """Set aside SPACE_RESERVE_BYTES in the run directory (allocated blocks, not a sparse file)."""
    path = run_dir / SPACE_RESERVE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, SPACE_RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:  # a filesystem without fallocate, or already full: the pause may not record everything
        logger.warning("no space reserve in {}: {}", run_dir, exc)
        with contextlib.suppress(OSError):
            path.unlink()


def _release_space_reserve(run_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (run_dir / SPACE_RESERVE).unlink()


def ipc_endpoints(run_dir: Path) -> dict[str, str]:
    """run.json's `ipc`: the run's sockets (docs/protocol.md §1); empty when the path is too long to bind."""
    try:
        pub, snapshot = monitor_endpoints(run_dir)
        return {"pub": pub, "snapshot": snapshot, "operator": ipc_endpoint(run_dir, OPERATOR_SOCKET),
                "control": control_endpoint(run_dir)}
    except InsecureEndpointError:
        return {}


def _write_run_json(prepared: Prepared, *, status: str, session_file: str | None = None,
                    extra: dict[str, Any] | None = None) -> None:
    opts = prepared.options
    data: dict[str, Any] = {"runId": prepared.run_id, "cwd": str(opts.cwd), "agent": opts.agent, "task": opts.task[:2000],
                            "status": status, "owner": owner_record(), "updatedAt": int(time.time() * 1000),
                            "infra": {"pools": [POOL]}, "schema": RUN_SCHEMA, "ipc": ipc_endpoints(prepared.run_dir),
                            "options": {"model": opts.model, "team": opts.team, "preset": opts.preset,
                                        "maxCostUsd": opts.max_cost}}
    path = prepared.run_dir / "run.json"
    if path.exists():
        from legion.ledger import read_run_json

        old = read_run_json(prepared.run_dir) or {}
        data = {**old, **data}
    if session_file:
        data["sessionFile"] = session_file
    if prepared.ledger is not None:
        data[RUN_JSON_KEY] = prepared.ledger.url
    data.update(extra or {})
    data.setdefault("createdAt", data["updatedAt"])
    write_run_json(prepared.run_dir, data)
