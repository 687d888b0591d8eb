"""SessionSpec: the wire description of one session (worker args / ``session.launch`` body), validated.

Keys (camelCase, as on the control channel)::

    nodeId*  cwd*  model*  transcript*       required strings (transcript = the pre-created JSONL path)
    fallbackModels[]                         models tried in order when ``model`` cannot be used at all (native
                                             engine; docs/spec-conformance.md §1.5)
    systemPrompt                             the full system prompt, used verbatim; otherwise it is built
    rolePrompt  systemPromptMode             from the role card body (append|replace) + the run context
    tools[]  role  team  phases  acceptanceRole  utility  parentId  depth
    budget {turnBudget, toolBudget, toolTimeoutMs, maxDepth, allowNested}
    env {NAME: value}                        the session's environment, over a snapshot of the worker's
    inheritEnv                               environment (minus identity/budget variables, context.IDENTITY_ENV)
                                             unless inheritEnv is false (default true); the
                                             session never reads or writes os.environ afterwards
    ledgerPath  runDir                       ledger (for the legion.db guard and usage) and run dir
    ledgerRun                                the run id that scopes a shared (postgresql://) ledger
    providers {name: models.json entry}      OpenAI-compatible providers
    scripts {name: script}                   inline scripted-provider scripts
    prompt                                   first prompt (ignored when the transcript already has turns)
    restarted                                default: true when the transcript already has entries
    continueRun                              default true; false: a deliberate resume with new input (after a
                                             stop or a pause) — a run the stop cut is not continued and gets
                                             no restart note: the caller's message is the first input (a run a
                                             crash left mid-turn still continues, with the note)
    treeBudget {maxCostUsd, maxTokens, unknownCostPerMTokUsd}    the run's tree-wide budget (checked each model call)
    fleetBudget {maxCostUsd, project, unknownCostPerMTokUsd}    the project's fleet-wide cost budget (likewise)
    config {emptyRetries, emptyBackoffMs, abortTimeoutMs, fsync}
    engine                                   native (default) | pi (a `pi --mode rpc` child,
                                             docs/architecture.md §9.2)
    piCommand [argv…]                        how to start pi (default ["pi"]); extra CLI args may follow

Unknown keys are errors naming the key and the legal set.
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from legion.workers.context import Budget, SessionContext, inherited_env
from legion.workers.engine import AgentSession
from legion.workers.fleet_gate import FleetLimit
from legion.workers.providers.registry import ProviderRegistry
from legion.workers.session import EventCallback, Session, SessionConfig
from legion.workers.system_prompt import SYSTEM_PROMPT_MODES, build_system_prompt
from legion.workers.tools.base import LegionRequester
from legion.workers.tools.catalog import BUILTIN_TOOLS
from legion.workers.transcript import FsyncPolicy
from legion.workers.tree_budget import UNKNOWN_COST_USD_PER_MTOK, TreeBudget

_KEYS = {"nodeId", "cwd", "model", "transcript", "systemPrompt", "tools", "role", "team", "phases",
         "acceptanceRole", "utility", "parentId", "depth", "budget", "env", "ledgerPath", "ledgerRun", "runDir", "providers",
         "scripts", "prompt", "restarted", "config", "inheritEnv", "engine", "piCommand", "rolePrompt",
         "systemPromptMode", "treeBudget", "fleetBudget", "continueRun", "fallbackModels"}
_BUDGET = {"turnBudget": "turn_budget", "toolBudget": "tool_budget", "toolTimeoutMs": "tool_timeout_ms",
           "maxDepth": "max_depth", "allowNested": "allow_nested"}
_CONFIG = {"emptyRetries", "emptyBackoffMs", "abortTimeoutMs", "fsync"}


class SpecError(ValueError):
    """A session spec is malformed; the message names the key and how to fix it."""


def _keys(obj: Any, legal: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, Mapping):
        raise SpecError(f"{where} must be an object, got {type(obj).__name__}")
    unknown = sorted(str(k) for k in set(obj) - legal)
    if unknown:
        raise SpecError(f"{where}: unknown key {unknown[0]!r}; legal keys: {', '.join(sorted(legal))}")
    return dict(obj)


def _opt(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str = "spec") -> Any:
    value = d.get(key)
    if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is int)):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SpecError(f"{where}.{key} must be {name}, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class SessionSpec:
    node_id: str
    cwd: str
    model: str
    transcript: str
    context: SessionContext
    system_prompt: str = ""
    tools: tuple[str, ...] | None = None
    providers: dict[str, Any] = field(default_factory=dict)
    scripts: dict[str, Any] = field(default_factory=dict)
    prompt: str | None = None
    restarted: bool | None = None
    continue_run: bool = True
    config: SessionConfig = field(default_factory=SessionConfig)
    engine: str = "native"
    pi_command: tuple[str, ...] = ("pi",)
    role_prompt: str = ""
    system_prompt_mode: str = "append"
    tree_budget: TreeBudget | None = None
    fleet_budget: FleetLimit | None = None
    fallback_models: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, raw: Any, *, process_env: bool = True) -> SessionSpec:
        """A checked spec; `process_env=False` leaves the hosting process's environment out of its env (a
        spec only being checked, not started)."""
        d = _keys(raw, _KEYS, "spec")
        for key in ("nodeId", "cwd", "model", "transcript"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise SpecError(f"spec.{key} is required and must be a non-empty string")
        tools = _opt(d, "tools", list)
        if tools is not None and not all(isinstance(t, str) for t in tools):
            raise SpecError("spec.tools must be a list of tool names")
        env = _opt(d, "env", dict) or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise SpecError("spec.env must map names to string values")
        if _opt(d, "inheritEnv", bool) is not False and process_env:
            env = {**inherited_env(os.environ), **env}  # identity comes from the spec, never the worker
        try:
            budget = Budget(**{_BUDGET[k]: v for k, v in _keys(d.get("budget") or {}, set(_BUDGET),
                                                              "spec.budget").items()})
            context = SessionContext(
                node_id=d["nodeId"], cwd=d["cwd"], role=_opt(d, "role", str), team=_opt(d, "team", str),
                phases=d.get("phases"), acceptance_role=_opt(d, "acceptanceRole", str),
                utility=bool(_opt(d, "utility", bool)), budget=budget, env=env,
                ledger_path=_opt(d, "ledgerPath", str), ledger_run=_opt(d, "ledgerRun", str),
                run_dir=_opt(d, "runDir", str),
                parent_id=_opt(d, "parentId", str), depth=_opt(d, "depth", int) or 0)
        except (TypeError, ValueError) as exc:
            raise SpecError(f"spec: {exc}") from exc
        engine = d.get("engine", "native")
        if engine not in ("native", "pi"):
            raise SpecError(f"spec.engine must be native or pi, got {engine!r}")
        pi_command = _opt(d, "piCommand", list) or ["pi"]
        if not pi_command or not all(isinstance(a, str) and a for a in pi_command):
            raise SpecError("spec.piCommand must be a non-empty list of non-empty strings (an argv)")
        mode = _opt(d, "systemPromptMode", str) or "append"
        if mode not in SYSTEM_PROMPT_MODES:
            raise SpecError(f"spec.systemPromptMode must be append or replace, got {mode!r}")
        tree_budget = _tree_budget(d.get("treeBudget"))
        fleet = _fleet_budget(d.get("fleetBudget"))
        fallbacks = _opt(d, "fallbackModels", list) or []
        if not all(isinstance(m, str) and m for m in fallbacks):
            raise SpecError("spec.fallbackModels must be a list of model strings ('provider/model-id')")
        return cls(node_id=d["nodeId"], cwd=d["cwd"], model=d["model"], transcript=d["transcript"],
                   context=context, system_prompt=_opt(d, "systemPrompt", str) or "",
                   tools=tuple(tools) if tools is not None else None, providers=_opt(d, "providers", dict) or {},
                   scripts=_opt(d, "scripts", dict) or {}, prompt=_opt(d, "prompt", str),
                   restarted=_opt(d, "restarted", bool), continue_run=_opt(d, "continueRun", bool) is not False,
                   config=_config(d.get("config")), engine=engine,
                   pi_command=tuple(pi_command), role_prompt=_opt(d, "rolePrompt", str) or "",
                   system_prompt_mode=mode, tree_budget=tree_budget, fleet_budget=fleet, fallback_models=tuple(fallbacks))

    def effective_system_prompt(self, tools: Sequence[str] | None) -> str:
        """``systemPrompt`` verbatim, else role card body + run context (pi adds its own base prompt)."""
        if self.system_prompt:
            return self.system_prompt
        mode = "replace" if self.engine == "pi" else self.system_prompt_mode
        return build_system_prompt(self.role_prompt, self.context, tools, mode=mode)


def _tree_budget(raw: Any) -> TreeBudget | None:
    if raw is None:
        return None
    d = _keys(raw, {"maxCostUsd", "maxTokens", "unknownCostPerMTokUsd"}, "spec.treeBudget")
    cost = _opt(d, "maxCostUsd", (int, float), "spec.treeBudget")
    tokens = _opt(d, "maxTokens", int, "spec.treeBudget")
    return TreeBudget(float(cost) if cost is not None else None, tokens, _unknown_rate(d, "spec.treeBudget"))


def _unknown_rate(d: dict[str, Any], where: str) -> float:
    """A budget's `unknownCostPerMTokUsd` (USD per million tokens of unknown price), the default when absent."""
    rate = _opt(d, "unknownCostPerMTokUsd", (int, float), where)
    if rate is not None and not (math.isfinite(rate) and rate >= 0):
        raise SpecError(f"{where}.unknownCostPerMTokUsd must be a finite number ≥ 0, got {rate!r}")
    return UNKNOWN_COST_USD_PER_MTOK if rate is None else float(rate)


def _fleet_budget(raw: Any) -> FleetLimit | None:
    if raw is None:
        return None
    d = _keys(raw, {"maxCostUsd", "project", "unknownCostPerMTokUsd"}, "spec.fleetBudget")
    cost = _opt(d, "maxCostUsd", (int, float), "spec.fleetBudget")
    project = _opt(d, "project", str, "spec.fleetBudget")
    if cost is None or not math.isfinite(cost) or cost < 0 or not project:
        raise SpecError("spec.fleetBudget needs maxCostUsd (a finite number ≥ 0) and project (a non-empty string)")
    return FleetLimit(float(cost), project, TreeBudget(unknown_usd_per_mtok=_unknown_rate(d, "spec.fleetBudget")))


def _config(raw: Any) -> SessionConfig:
    if raw is None:
        return SessionConfig()
    d = _keys(raw, _CONFIG, "spec.config")
    retries = _opt(d, "emptyRetries", int, "spec.config")
    backoff = _opt(d, "emptyBackoffMs", (int, float), "spec.config")
    abort = _opt(d, "abortTimeoutMs", (int, float), "spec.config")
    fsync = _opt(d, "fsync", str, "spec.config")
    if fsync is not None and fsync not in {p.value for p in FsyncPolicy}:
        raise SpecError(f"spec.config.fsync must be one of always, settle, never, got {fsync!r}")
    default = SessionConfig()
    return SessionConfig(
        empty_retries=default.empty_retries if retries is None else max(0, retries),
        empty_backoff_s=default.empty_backoff_s if backoff is None else max(0.0, backoff / 1000),
        abort_timeout_s=default.abort_timeout_s if abort is None else max(0.0, abort / 1000),
        fsync=FsyncPolicy(fsync) if fsync else default.fsync)


class RegistryCache:
    """One ProviderRegistry per distinct (providers, scripts) configuration in a process."""

    def __init__(self, limit: int = 64) -> None:
        self._cache: dict[bytes, ProviderRegistry] = {}
        self._limit = limit

    def get(self, providers: dict[str, Any], scripts: dict[str, Any]) -> ProviderRegistry:
        key = orjson.dumps([providers, scripts], option=orjson.OPT_SORT_KEYS)
        reg = self._cache.get(key)
        if reg is None:
            if len(self._cache) >= self._limit:
                self._cache.pop(next(iter(self._cache)))
            reg = self._cache[key] = ProviderRegistry(providers, scripts)
        return reg

    async def aclose(self) -> None:
        """Close the cached registries' pooled HTTP clients (when the hosting process stops). An evicted
        registry is not closed: sessions may still use it; its client closes when it is collected."""
        for reg in self._cache.values():
            await reg.aclose()


def build_session(spec: SessionSpec, registries: RegistryCache, *, requester: LegionRequester | None = None,
                  on_event: EventCallback | None = None,
                  on_usage: Callable[[dict[str, Any]], None] | None = None) -> AgentSession | Awaitable[AgentSession]:
    """Construct (or resume) the session a spec describes; the pi engine returns an awaitable."""
    path = Path(spec.transcript)
    restarted = spec.restarted if spec.restarted is not None else (path.exists() and path.stat().st_size > 0)
    if spec.engine == "pi":
        from legion.workers.pi_engine import PiSession

        return PiSession.create(context=spec.context, model=spec.model, transcript_path=path,
                                command=spec.pi_command, system_prompt=spec.effective_system_prompt(None),
                                on_event=on_event,
                                on_usage=on_usage, abort_timeout_s=spec.config.abort_timeout_s,
                                restarted=restarted and spec.continue_run)
    return Session(context=spec.context, model=spec.model, transcript_path=path,
                   registry=registries.get(spec.providers, spec.scripts),
                   system_prompt=spec.effective_system_prompt(spec.tools or BUILTIN_TOOLS),
                   tools=spec.tools, requester=requester, on_event=on_event, on_usage=on_usage,
                   config=spec.config, restarted=restarted, continue_cut=spec.continue_run,
                   fallback_models=spec.fallback_models)
