"""The launch pipeline: one path for `subagent`, `vexillatio`, the operator and the run.

docs/architecture.md §7.

card → guards (the working directory among them: `legion.agents.cwd_admission`) → team → model → depth budget →
the pool's admission queue → (one BEGIN IMMEDIATE: children, live nodes, tree cost, fleet cost, the node row) → backend →
transcript pre-created → session spec. A refusal raises `ActionRefused` with the spec's code before anything
exists (and writes `budget_refused` for a budget); `plan()` is pure apart from that transaction, so the caller
starts the session only from a returned `LaunchPlan`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from loguru import logger

from legion.agents import (
    AgentConfig,
    AgentDefinitionError,
    Catalog,
    LaunchRefused,
    ModelRegistry,
    ModelRequest,
    Settings,
    WarnOnce,
    admit_cwd,
    backend_for_launch,
    check_centurion_dispatch,
    check_launch_enabled,
    child_budget,
    compose_system_prompt,
    depth_cap,
    phases_for_launch,
    require_team,
    resolve_model,
    team_column,
    team_env,
    team_for_launch,
    worktree_for_launch,
)
from legion.agents.registry import pi_models_path
from legion.ledger import Ledger
from legion.ledger.constants import BUDGET_REFUSED, LIVE_STATUSES
from legion.ledger.errors import InvalidNodeError
from legion.ledger.nodes import validate_slug
from legion.ledger.writer import LedgerWriter
from legion.orchestration.admission import AdmissionGate
from legion.orchestration.agent_tree import AgentNode, AgentTree, Backend
from legion.orchestration.fleet_budget import FleetBudget
from legion.orchestration.phase_machine import describe as describe_machine
from legion.orchestration.phase_machine import machine_for, resolve_declaration
from legion.orchestration.refusals import (
    BUDGET_EXCEEDED,
    INVALID_PARAMS,
    NAME_TAKEN,
    START_FAILED,
    UNKNOWN_AGENT,
    WORKTREE_REFUSED,
    ActionRefused,
)
from legion.orchestration.verify import run_command
from legion.orchestration.worktree import (
    WORKTREES,
    WorktreeError,
    WorktreePlan,
    create_worktree,
    plan_worktree,
    remove_worktree,
    team_worktree,
)
from legion.workers.tree_budget import TreeBudget

T = TypeVar("T")
DEFAULT_RESERVE_USD = 0.05  # a launch's tree-cost reservation when its card names none
NESTING_TOOLS = ("subagent", "vexillatio")
LIVE_ROWS = LIVE_STATUSES


@dataclass(frozen=True)
class LaunchRequest:
    """What one launch asks for (a `subagent launch`, one `tasks[]` step, vexillatio, the operator)."""

    agent: str
    task: str
    name: str | None = None
    model: str | None = None
    preset: str | None = None
    team: str | None = None
    worktree: bool | None = None
    phases: Any = None
    start: str | None = None
    cwd: str | None = None  # where the child works (absolute; admitted against its caller's set); None: the caller's
    utility_only: bool = False  # vexillatio: the card must be `utility: true`
    tool_call: str | None = None


@dataclass
class RunContext:
    """What every launch of one run shares."""

    run_dir: Path
    run_id: str
    cwd: Path
    settings: Settings
    catalog: Catalog
    ledger: Ledger
    env: Mapping[str, str]
    budget: TreeBudget | None = None  # the tree-wide cost/token budget (absent = unlimited)
    writer: LedgerWriter | None = None  # the root's ledger writer thread (reads stay on `ledger`)
    fleet: FleetBudget | None = None  # the project's fleet-wide cost budget (absent = unlimited)
    launching: set[str] = field(default_factory=set)  # names of launches being planned (not yet in the tree)
    _reservations: dict[str, float] = field(default_factory=dict)  # cost held per live node (tree and fleet budgets)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # the writer thread and the loop share them
    warn_once: WarnOnce = field(default_factory=WarnOnce)
    extra_spec: dict[str, Any] = field(default_factory=dict)  # e.g. scripts for scripted models
    # the pool's admission queue (set by the orchestrator): a launch it has no place for is refused before the
    # node is reserved, so the refusal creates nothing (`legion.orchestration.admission`)
    admission: AdmissionGate | None = None
    # called in the writer thread inside the transaction that reserves a node's row, before it commits: what a
    # later root needs to rebuild the node exists before the row does (`legion.orchestration.run.save_launch_record`)
    on_reserve: Callable[[AgentNode], None] | None = None

    def hold(self, node_id: str, usd: float) -> None:
        with self._lock:
            self._reservations[node_id] = usd

    def release(self, node_id: str) -> None:
        """A node settled: its reservation gives way to its actual usage."""
        with self._lock:
            held = self._reservations.pop(node_id, None)
        if held and self.fleet is not None:  # the run's runs.reserved_usd follows what it holds
            self.fleet.publish(self.writer, self.ledger, self.reserved)

    def reserved(self) -> float:
        with self._lock:
            return sum(self._reservations.values())

    async def write(self, fn: Callable[[Ledger], T]) -> T:
        """Run a ledger write off the event loop (the writer thread) when there is a writer."""
        if self.writer is None:
            return fn(self.ledger)
        return await self.writer.run(fn)

    _registry: tuple[tuple[int, int, int] | None, ModelRegistry] | None = None
    _models_path: str | None = None

    @property
    def registry(self) -> ModelRegistry:
        """Built from the settings and pi's models.json, again only when that file changes (a stat per launch)."""
        if self._models_path is None:  # where it is follows the process's environment, fixed for the run
            self._models_path = str(pi_models_path())
        key = _file_key(self._models_path)
        if self._registry is None or self._registry[0] != key:
            self._registry = (key, ModelRegistry.from_settings(self.settings))
        return self._registry[1]


def _file_key(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@dataclass
class LaunchPlan:
    node: AgentNode
    restart: str
    warnings: list[str]


def _card(ctx: RunContext, request: LaunchRequest) -> AgentConfig:
    try:
        card = ctx.catalog.require_utility(request.agent) if request.utility_only else ctx.catalog.require(request.agent)
    except AgentDefinitionError as exc:
        raise ActionRefused(str(exc), UNKNOWN_AGENT if "unknown agent" in str(exc) else INVALID_PARAMS) from None
    return card


def _free_name(tree: AgentTree, role: str, launching: set[str]) -> str:
    """`<role>-N`, N continuing after the run's existing nodes (and launches in flight) of that pattern."""
    pattern = re.compile(rf"^{re.escape(role)}-(\d+)$")
    used = [int(m.group(1)) for name in [*(n.id for n in tree), *launching] if (m := pattern.match(name))]
    return f"{role}-{max(used, default=0) + 1}"


def _name(ctx: RunContext, tree: AgentTree, request: LaunchRequest, card: AgentConfig,
          parent: AgentNode | None) -> str:
    name = request.name or _free_name(tree, card.name, ctx.launching)
    if name in ctx.launching:
        raise ActionRefused(f"name '{name}' is being launched right now; pick another name", NAME_TAKEN)
    try:
        validate_slug(name)
    except (InvalidNodeError, ValueError) as exc:
        raise ActionRefused(f"invalid name {name!r}: {exc}", INVALID_PARAMS) from None
    existing = tree.get(name)
    if existing is not None:
        if existing.live:
            raise ActionRefused(f"name '{name}' is taken by a {existing.status} node (role {existing.role}); pick another "
                              f"name, or steer/continue the existing one", NAME_TAKEN)
        if existing.parent != (parent.id if parent else None):
            raise ActionRefused(f"name '{name}' belongs to another subtree (parent {existing.parent}); pick another name",
                              NAME_TAKEN)
    return name


def _tools(card: AgentConfig, generations: int, allow_nested: bool, machine: Any) -> list[str] | None:
    """The card's tools minus what this node may not use (no nesting tools for a leaf, no phase tool
    without a declared machine — docs/spec-conformance.md §5.7)."""
    if card.tools is None:
        return None
    tools = [t for t in card.tools if not (t in NESTING_TOOLS and (generations <= 1 or not allow_nested))]
    if machine is None:
        tools = [t for t in tools if t != "legion_phase"]
    return tools


def _check_budgets(ctx: RunContext, led: Ledger, parent: AgentNode | None, reserve: float) -> None:
    """maxChildrenPerNode, maxActiveNodes, the tree cost and the fleet cost (`legion.orchestration.fleet_budget`),
    counted inside the reserving transaction on the writer thread: the ledger rows there include every launch
    reserved before this one (concurrent launches of one `tasks[]` call are serialised by the writer, so the limit
    holds exactly). The counts come from the ledger's indexes (`live_counts`): no row is read, so a launch costs
    the same in a tree of 1,000 nodes."""
    limits = ctx.settings.legion
    live, children = led.live_counts(parent.id if parent is not None else None)
    if parent is not None and children + 1 > limits.max_children_per_node:
        raise ActionRefused(
            f"'{parent.id}' already has {children} live children (legion.maxChildrenPerNode "
            f"{limits.max_children_per_node}); wait for or retire one first, or raise legion.maxChildrenPerNode",
            BUDGET_EXCEEDED, scope="children", limit=limits.max_children_per_node, current=children)
    if live + 1 > limits.max_active_nodes:
        raise ActionRefused(
            f"the run already has {live} live nodes (legion.maxActiveNodes {limits.max_active_nodes}); wait for "
            "some to settle, or raise legion.maxActiveNodes", BUDGET_EXCEEDED, scope="active",
            limit=limits.max_active_nodes, current=live)
    if ctx.budget is not None:
        _check_tree_budget(ctx.budget, led, ctx.reserved(), reserve)
    if ctx.fleet is not None:  # the project's fleets row stays locked until this transaction commits
        ctx.fleet.check(led, ctx.reserved(), reserve)


def _check_tree_budget(budget: TreeBudget, led: Ledger, held: float, reserve: float) -> None:
    """legion.budget.maxCostUsd (spent + reserved + this launch's reserve) and maxTokens."""
    totals = led.usage_totals()
    if budget.max_cost_usd is not None:
        spent = budget.charged_usd(totals)
        if spent + held + reserve > budget.max_cost_usd:
            raise ActionRefused(
                f"the tree-wide cost budget would be exceeded: spent ${spent:.4f} + reserved ${held:.4f} + this "
                f"launch's ${reserve:.4f} > ${budget.max_cost_usd:.4f} (legion.budget.maxCostUsd / --max-cost"
                f"{budget.unknown_note(totals)})", BUDGET_EXCEEDED, scope="tree-cost", limit=budget.max_cost_usd,
                spent=spent, reserved=held, unknown_cost_tokens=int(totals.get("unknown_cost_tokens") or 0))
    if budget.max_tokens is not None:
        used = int(totals.get("tokens_in") or 0) + int(totals.get("tokens_out") or 0)
        if used >= budget.max_tokens:
            raise ActionRefused(f"the tree-wide token budget is spent ({used} ≥ {budget.max_tokens}, "
                              "legion.budget.maxTokens)", BUDGET_EXCEEDED, scope="tree-tokens",
                              limit=budget.max_tokens, used=used)


def _pre_create(path: Path) -> None:
    """The transcript exists (empty) before the child starts: it is the resume credential (§10 item 44).

    Made in the transaction that reserves the row, on the writer thread: a file that cannot be made refuses the
    launch with nothing recorded. Not O_EXCL: the writer retries a batch whose commit failed, and the path was
    free when it was picked (its name is the launch's own until the row lands); never truncated."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ActionRefused(f"'{path.stem}' could not be started: its transcript {path} cannot be created "
                            f"({exc.strerror or exc}); check that the run directory is writable and has space",
                            START_FAILED) from None
    os.close(fd)


def _transcript_path(run_dir: Path, name: str) -> Path:
    path, n = f"{run_dir}/{name}.jsonl", 1
    while os.path.exists(path):  # a relaunch under a reused name starts a fresh conversation
        n += 1
        path = f"{run_dir}/{name}.{n}.jsonl"
    return Path(path)


async def plan_launch(ctx: RunContext, tree: AgentTree, parent: AgentNode | None,
                      request: LaunchRequest) -> LaunchPlan:
    """Check everything and reserve the node (ledger row `starting`); raise ActionRefused to refuse."""
    if parent is not None:
        try:
            check_launch_enabled(ctx.settings)
        except LaunchRefused as exc:
            raise ActionRefused(str(exc), exc.code) from None
    card = _card(ctx, request)
    name = _name(ctx, tree, request, card, parent)
    ctx.launching.add(name)  # claimed before the first await: a concurrent launch sees it
    try:
        return await _plan(ctx, tree, parent, request, card, name)
    except BaseException:
        if ctx.admission is not None:
            ctx.admission.done(name)  # admitted, then refused: it will not be sent to the pool
        raise
    finally:
        ctx.launching.discard(name)


async def _plan(ctx: RunContext, tree: AgentTree, parent: AgentNode | None, request: LaunchRequest,
                card: AgentConfig, name: str) -> LaunchPlan:
    depth = parent.depth + 1 if parent is not None else 0
    warnings: list[str] = list(card.warnings)
    _, capped = depth_cap(ctx.settings)
    if capped and ctx.warn_once.first("maxDepth-ceiling"):  # once per run, on its first launch
        logger.warning("{}", capped)
        warnings.append(capped)
    try:
        if parent is not None:
            check_centurion_dispatch(card, parent=parent.role, node=parent.id, parent_is_root=parent.depth == 0)
        cwd = _child_cwd(ctx, parent, request)
        machine = phases_for_launch(card, resolve_declaration(request.phases),
                                    from_root=parent is None or parent.depth == 0, start=request.start)
        worktree, warning = worktree_for_launch(card, request.worktree, warn_once=ctx.warn_once)
        if warning:
            warnings.append(warning)
        if worktree and request.cwd is not None:
            raise ActionRefused(f"/cwd: '{card.name}' works in its own git worktree of the project {ctx.cwd}; launch "
                                "it without 'cwd'", INVALID_PARAMS)
        wt_plan = await _worktree_plan(ctx, name) if worktree else None  # teams: refusal checks only
        selection = team_for_launch(ctx.settings, ctx.env if parent is None else {},
                                    launch_team=request.team, card_team=card.team)
        team = require_team(ctx.settings, selection.name)
        resolution = resolve_model(card, ctx.settings, request=ModelRequest(request.model, None, request.preset),
                                   member=team.member_for(card.name), team=selection.name,
                                   parent_model=parent.model if parent else None, registry=ctx.registry)
        budget = child_budget(card, ctx.settings, child_depth=depth,
                              parent_max_depth=parent.generations if parent else None,
                              parent=parent.id if parent else "the run")
    except ActionRefused:
        raise
    except LaunchRefused as exc:
        await _refused(ctx, parent, exc.code, str(exc), agent=card.name, **exc.details)
    except AgentDefinitionError as exc:
        raise ActionRefused(str(exc), INVALID_PARAMS) from None
    warnings += list(resolution.warnings)
    backend: Backend = backend_for_launch(worktree, ctx.settings)
    if backend == "inprocess" and ctx.admission is not None:
        await ctx.admission.admit(name)  # QUEUE_FULL before anything exists (`plan_launch` undoes it on a refusal)
    costed = ctx.fleet is not None or (ctx.budget is not None and ctx.budget.max_cost_usd is not None)
    reserve = _reserve_usd(card) if costed else 0.0
    transcript = _transcript_path(ctx.run_dir, name)
    node = AgentNode(id=name, parent=parent.id if parent else None, depth=depth, role=card.name, backend=backend,
                     model=resolution.label, model_origin=resolution.origin, transcript=transcript, spec={},
                     task=request.task, generations=budget.max_depth, team=team_column(selection.name),
                     provider_pin=resolution.provider, thinking=resolution.thinking, utility=card.utility,
                     reserved_usd=reserve, tool_call=request.tool_call, warnings=tuple(warnings))
    node.spec = _spec(ctx, node, card, cwd=cwd, budget_dict=asdict(budget), machine=machine,
                      team_name=selection.name, fallbacks=resolution.fallbacks)
    _team_spec(ctx, node, parent, wt_plan, machine, inherit=request.cwd is None)
    if wt_plan is not None:  # teams: every refusal check passed; the worktree is the first thing created
        await _make_worktree(ctx, wt_plan)
    try:
        await _reserve(ctx, tree, parent, node, card, machine)
    except BaseException:
        if wt_plan is not None:  # a refused launch leaves no worktree
            await asyncio.to_thread(remove_worktree, wt_plan)
        raise
    return LaunchPlan(node, card.restart, warnings)


def _child_cwd(ctx: RunContext, parent: AgentNode | None, request: LaunchRequest) -> Path:
    """Where the child works: the caller's own cwd (its session's: a team's worktree, an external directory; the
    run's for the root), or the launch's `cwd` once admitted against the caller's set (docs/spec-conformance.md §11:
    exactly the caller's cwd, one of the settings' `externalDirectories` or one of the run's team worktrees;
    raises `LaunchRefused`)."""
    caller = Path(parent.spec.get("cwd") or ctx.cwd) if parent is not None else ctx.cwd
    if request.cwd is None:
        return caller
    worktrees = ctx.run_dir / WORKTREES
    made = sorted(p for p in worktrees.iterdir() if p.is_dir()) if worktrees.is_dir() else []
    return admit_cwd(request.cwd, caller, ctx.settings.external_directories, ctx.env, made)


# ----- teams: worktrees and the phase machine (owned by the teams work; docs/spec-conformance.md §2.7, §5) -----------

async def _worktree_plan(ctx: RunContext, name: str) -> WorktreePlan:
    try:
        return await asyncio.to_thread(plan_worktree, ctx.cwd, ctx.run_dir, ctx.run_id, name)
    except WorktreeError as exc:
        raise ActionRefused(f"'{name}' needs a git worktree: {exc}", WORKTREE_REFUSED) from None


async def _make_worktree(ctx: RunContext, plan: WorktreePlan) -> None:
    """`git worktree add`, then the optional `worktreeBootstrap` (its own timeout); a failure undoes both."""
    try:
        await asyncio.to_thread(create_worktree, plan)
    except WorktreeError as exc:
        raise ActionRefused(f"'{plan.path.name}': {exc}", WORKTREE_REFUSED) from None
    command = ctx.settings.legion.worktree_bootstrap.strip()
    if not command:
        return
    command = "npm install" if command == "npm-install" else command
    limits = ctx.settings.legion
    log = ctx.run_dir / WORKTREES / f"{plan.path.name}.bootstrap.log"
    result = await run_command(command, plan.path, limits.worktree_bootstrap_timeout_ms / 1000, log)
    if not result.ok:
        await asyncio.to_thread(remove_worktree, plan)
        what = "timed out (process tree killed)" if result.timed_out else f"exited {result.exit_code}"
        raise ActionRefused(f"'{plan.path.name}': worktreeBootstrap `{command}` {what}; output in {log}:\n"
                          f"{result.tail[-800:]}", WORKTREE_REFUSED)


def _team_spec(ctx: RunContext, node: AgentNode, parent: AgentNode | None, plan: WorktreePlan | None,
               machine: Any, *, inherit: bool = True) -> None:
    """A centurion works in its worktree, its members inherit it as cwd (unless their launch named an admitted
    `cwd`); a machine is described in its prompt."""
    inherited = team_worktree(ctx.run_dir, parent.id) if parent is not None and plan is None and inherit else None
    if plan is not None or inherited is not None:
        node.spec["cwd"] = str((plan or inherited).path)  # type: ignore[union-attr]
    if machine is not None:
        runtime = machine_for(node.spec.get("phases"))
        if runtime is not None:
            node.spec["rolePrompt"] = f"{node.spec.get('rolePrompt', '')}\n\n{describe_machine(runtime)}".strip()


async def _reserve(ctx: RunContext, tree: AgentTree, parent: AgentNode | None, node: AgentNode, card: AgentConfig,
                   machine: Any) -> None:
    """Budgets and the node row in one BEGIN IMMEDIATE: a refusal creates nothing."""
    fields: dict[str, Any] = {"session_file": str(node.transcript), "model": node.model, "team": node.team,
                              "task_summary": node.task[:500], "run_id": ctx.run_id}
    if Path(node.spec["cwd"]).parent == ctx.run_dir / WORKTREES:  # teams: a centurion's worktree (or its member's)
        fields["worktree_path"] = node.spec["cwd"]
    if machine is not None:
        fields.update(phase=machine.start, phase_since=_now_ms())

    def reserve(led: Ledger) -> None:
        with led.transaction():
            _check_budgets(ctx, led, parent, node.reserved_usd)
            row = led.get_node(node.id)
            if row is not None and row["status"] in LIVE_ROWS:
                raise ActionRefused(f"name '{node.id}' is taken by a {row['status']} node; pick another name",
                                  NAME_TAKEN)
            if row is None:
                insert = {k: v for k, v in fields.items() if k != "phase_since"}  # insert_node stamps it
                led.insert_node(id=node.id, name=node.id, role=card.name, kind=_kind(card), depth=node.depth,
                                parent_id=node.parent, status="starting", **insert)
            else:
                led.update_node(node.id, status="starting", **fields)
            _pre_create(node.transcript)
            ctx.hold(node.id, node.reserved_usd)
            if ctx.fleet is not None:
                ctx.fleet.record(led, ctx.reserved())
            if ctx.on_reserve is not None:
                ctx.on_reserve(node)

    try:
        await ctx.write(reserve)
    except ActionRefused as exc:
        if exc.code == BUDGET_EXCEEDED:
            await _refused(ctx, parent, exc.code, str(exc), agent=card.name, **exc.details)
        raise


async def _refused(ctx: RunContext, parent: AgentNode | None, code: str, message: str, **data: Any) -> NoReturn:
    """Record `budget_refused` for a budget refusal (creates nothing else), then raise."""
    if code == BUDGET_EXCEEDED:
        event = {"message": message, **data}
        with contextlib.suppress(Exception):  # the refusal stands even if its record cannot be written
            await ctx.write(lambda led: led.append_event(parent.id if parent else None, BUDGET_REFUSED, event))
    raise ActionRefused(message, code, **data)


def _reserve_usd(card: AgentConfig) -> float:
    """The card's `budget.reserveUsd`, else the default share a launch holds of the tree-wide cost budget."""
    value = (card.budget or {}).get("reserveUsd")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else DEFAULT_RESERVE_USD


def _kind(card: AgentConfig) -> str:
    return "pi" if card.kind == "pi" else "native"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _spec(ctx: RunContext, node: AgentNode, card: AgentConfig, *, cwd: Path, budget_dict: dict[str, Any],
          machine: Any, team_name: str, fallbacks: tuple[str, ...] = ()) -> dict[str, Any]:
    """The SessionSpec dict the worker starts (and restarts) this node from."""
    role_prompt = compose_system_prompt(card, cwd=ctx.cwd, base="").text
    spec: dict[str, Any] = {
        "nodeId": node.id, "cwd": str(cwd), "model": node.model, "transcript": str(node.transcript),
        "rolePrompt": role_prompt, "systemPromptMode": card.system_prompt_mode, "role": card.name,
        "acceptanceRole": card.acceptance.role if card.acceptance else None, "utility": card.utility,
        "depth": node.depth, "budget": {k: v for k, v in {
            "turnBudget": budget_dict["turn_budget"], "toolBudget": budget_dict["tool_budget"],
            "toolTimeoutMs": budget_dict["tool_timeout_ms"], "maxDepth": budget_dict["max_depth"],
            "allowNested": budget_dict["allow_nested"]}.items() if v is not None},
        "ledgerPath": str(ctx.ledger.path), "runDir": str(ctx.run_dir), "prompt": node.task,
        "env": team_env(team_name), "engine": "pi" if card.kind == "pi" else "native",
    }
    if ctx.ledger.backend == "postgresql":  # a shared database: the worker's rows are this run's
        spec["ledgerRun"] = ctx.run_id
    if node.parent is not None:
        spec["parentId"] = node.parent
    if fallbacks:  # the card's (or agentOverrides') fallbackModels: tried when the model cannot be used at all
        spec["fallbackModels"] = list(fallbacks)
    if node.team:
        spec["team"] = node.team
    tools = _tools(card, budget_dict["max_depth"], budget_dict["allow_nested"], machine)
    if tools is not None:
        spec["tools"] = tools
    if machine is not None:
        spec["phases"] = machine.raw if hasattr(machine, "raw") else None
    providers = ctx.settings.get("providers")
    if isinstance(providers, Mapping) and providers:
        spec["providers"] = _providers_for_spec(providers)
    if ctx.budget is not None:
        spec["treeBudget"] = ctx.budget.spec()
    if ctx.fleet is not None:
        spec["fleetBudget"] = ctx.fleet.spec()
    spec.update(ctx.extra_spec)
    return {k: v for k, v in spec.items() if v is not None}


def _providers_for_spec(providers: Mapping[str, Any]) -> dict[str, Any]:
    return {name: dict(entry) for name, entry in providers.items() if isinstance(entry, Mapping)}
