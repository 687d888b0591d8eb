"""Structural checks of a card's or a launch's `phases:` declaration (docs/spec-conformance.md §5.1–5.3).

These are all the load-time checks: the runtime phase machine (`legion.orchestration.phase_machine`:
normalisation, conditions, evaluation) is built from the `PhaseDeclaration` returned here and adds no
check of its own that could refuse a declaration this module accepts.

Accepted grammar (card or launch): a phase array (ids, or phase objects), a machine object
`{start, maxRework, phases}`, a one-line JSON string, or an indented block (a multi-line string
holding YAML of one of the above). A bare list of ids is a linear chain ending in `done`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

import yaml

from legion.agents.schema import SchemaError, describe, unknown_key_message
from legion.ledger.constants import TERMINAL_PHASES

PHASE_CONDITIONS: Final = (
    "always",
    "contract_file",
    "children_settled",
    "children_present",
    "children_none_failed",
    "verdict_ok",
    "verdict_not_ok",
    "verification_passed",
    "verification_failed",
    "rework_available",
    "children_all_failed",
)
DEFAULT_MAX_REWORK: Final = 2
_PHASE_ID: Final = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_MACHINE_KEYS: Final = ("start", "phases", "maxRework", "description")
_PHASE_KEYS: Final = ("id", "next", "require", "timeoutMs", "terminal", "description")
_EDGE_KEYS: Final = ("to", "when", "rework", "actorRole", "description")


@dataclass(frozen=True)
class Edge:
    to: str
    when: tuple[str, ...] = ()
    rework: bool = False
    actor_role: str | None = None


@dataclass(frozen=True)
class Phase:
    id: str
    next: tuple[Edge, ...]
    require: tuple[str, ...] = ()
    timeout_ms: int | None = None
    terminal: bool = False


@dataclass(frozen=True)
class PhaseDeclaration:
    """A structurally valid declaration, as written (not normalised: no injected edges)."""

    start: str
    phases: tuple[Phase, ...]
    max_rework: int
    raw: Any

    def timeouts_ms(self) -> dict[str, int]:
        """Card-declared per-phase timeouts (`phases[].timeoutMs`)."""
        return {p.id: p.timeout_ms for p in self.phases if p.timeout_ms is not None}


def validate_phases(value: Any, path: str = "phases") -> PhaseDeclaration:
    """The structural checks of docs/spec-conformance.md §5.3; SchemaError names what is wrong and where."""
    return _structural(decode_declaration(value, path), path)


def decode_declaration(value: Any, path: str = "phases") -> Any:
    """The list/object a declaration stands for: one-line JSON, an indented YAML block and the
    `a -> b -> c` shorthand are decoded; lists and objects pass through."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        raise SchemaError(path, "is empty: declare at least one phase")
    if text[0] in "[{":
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise SchemaError(path, f"is not valid one-line JSON: {exc}") from exc
    if "\n" in text:
        try:
            return yaml.safe_load(text)
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            raise SchemaError(path, f"indented block is not valid YAML: {exc}") from exc
    return [p.strip() for p in re.split(r"\s*(?:->|,)\s*", text) if p.strip()]


def _structural(value: Any, path: str) -> PhaseDeclaration:
    start: Any = None
    max_rework: Any = DEFAULT_MAX_REWORK
    if isinstance(value, dict):
        for key in value:
            if key not in _MACHINE_KEYS:
                raise SchemaError(
                    f"{path}.{key}", unknown_key_message(str(key), _MACHINE_KEYS, "a phase machine")
                )
        if "phases" not in value:
            raise SchemaError(path, "a phase machine object needs a 'phases' list")
        start, max_rework, items = (
            value.get("start"),
            value.get("maxRework", DEFAULT_MAX_REWORK),
            value["phases"],
        )
        path_items = f"{path}.phases"
    else:
        items, path_items = value, path
    if isinstance(items, dict):
        items = [{"id": k, **(v if isinstance(v, dict) else {"next": v})} for k, v in items.items()]
    if not isinstance(items, list):
        raise SchemaError(path_items, f"must be a list of phases (got {describe(items)})")
    if not items:
        raise SchemaError(path_items, "is empty: declare at least one phase")
    if isinstance(max_rework, bool) or not isinstance(max_rework, int) or max_rework < 0:
        raise SchemaError(f"{path}.maxRework", f"must be a non-negative integer (got {describe(max_rework)})")
    phases = _phases(items, path_items)
    return _graph_checks(phases, start, max_rework, value, path)


def _phases(items: list[Any], path: str) -> list[Phase]:
    if all(isinstance(i, str) for i in items):
        ids = [_phase_id(i, f"{path}[{n}]") for n, i in enumerate(items)]
        chain = [*ids, "done"] if ids[-1] not in TERMINAL_PHASES else ids
        return [
            Phase(
                id=p,
                next=() if p in TERMINAL_PHASES else (Edge(chain[n + 1]),),
                terminal=p in TERMINAL_PHASES,
            )
            for n, p in enumerate(ids)
        ]
    return [_phase_obj(item, f"{path}[{n}]") for n, item in enumerate(items)]


def _phase_id(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _PHASE_ID.fullmatch(value):
        raise SchemaError(path, f"illegal phase id {describe(value)}: use [a-z][a-z0-9_-]{{0,31}}")
    return value


def _conditions(value: Any, path: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise SchemaError(path, f"must be a condition name or a list of them (got {describe(value)})")
    for n, cond in enumerate(items):
        if cond not in PHASE_CONDITIONS:
            raise SchemaError(
                f"{path}[{n}]", f"unknown condition {describe(cond)}; known: {', '.join(PHASE_CONDITIONS)}"
            )
    return tuple(items)


def _phase_obj(item: Any, path: str) -> Phase:
    if not isinstance(item, dict):
        raise SchemaError(path, f"must be a phase id or a phase object (got {describe(item)})")
    for key in item:
        if key not in _PHASE_KEYS:
            raise SchemaError(f"{path}.{key}", unknown_key_message(str(key), _PHASE_KEYS, "a phase"))
    pid = _phase_id(item.get("id"), f"{path}.id")
    terminal = item.get("terminal", pid in TERMINAL_PHASES)
    if not isinstance(terminal, bool):
        raise SchemaError(f"{path}.terminal", f"must be true or false (got {describe(terminal)})")
    raw_next = item.get("next", [])
    if not isinstance(raw_next, list):
        raise SchemaError(f"{path}.next", f"must be an array of edges (got {describe(raw_next)})")
    edges = tuple(_edge(e, f"{path}.next[{n}]") for n, e in enumerate(raw_next))
    timeout = item.get("timeoutMs")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0):
        raise SchemaError(
            f"{path}.timeoutMs", f"must be a non-negative integer of ms (got {describe(timeout)})"
        )
    require = _conditions(item.get("require", []), f"{path}.require")
    return Phase(id=pid, next=edges, require=require, timeout_ms=timeout, terminal=terminal)


def _edge(value: Any, path: str) -> Edge:
    if isinstance(value, str):
        return Edge(to=_phase_id(value, path))
    if not isinstance(value, dict):
        raise SchemaError(path, f"must be a target phase id or an edge object (got {describe(value)})")
    for key in value:
        if key not in _EDGE_KEYS:
            raise SchemaError(f"{path}.{key}", unknown_key_message(str(key), _EDGE_KEYS, "a phase edge"))
    rework = value.get("rework", False)
    if not isinstance(rework, bool):
        raise SchemaError(f"{path}.rework", f"must be true or false (got {describe(rework)})")
    actor = value.get("actorRole")
    if actor is not None and not isinstance(actor, str):
        raise SchemaError(f"{path}.actorRole", f"must be a role name (got {describe(actor)})")
    when = _conditions(value.get("when", []), f"{path}.when")
    return Edge(to=_phase_id(value.get("to"), f"{path}.to"), when=when, rework=rework, actor_role=actor)


def _graph_checks(phases: list[Phase], start: Any, max_rework: int, raw: Any, path: str) -> PhaseDeclaration:
    by_id: dict[str, Phase] = {}
    for phase in phases:
        if phase.id in by_id:
            raise SchemaError(path, f"duplicate phase id '{phase.id}'")
        by_id[phase.id] = phase
    known = set(by_id) | set(TERMINAL_PHASES)
    for phase in phases:
        if phase.terminal and phase.next:
            raise SchemaError(path, f"terminal phase '{phase.id}' must not declare out-edges")
        if not phase.terminal and not phase.next:
            raise SchemaError(path, f"non-terminal phase '{phase.id}' has no out-edges")
        for edge in phase.next:
            if edge.to == phase.id:
                raise SchemaError(path, f"phase '{phase.id}' has a self-loop")
            if edge.to not in known:
                raise SchemaError(path, f"phase '{phase.id}' points to unknown phase '{edge.to}'")
    first = phases[0].id
    start_id = first if start is None else _phase_id(start, f"{path}.start")
    if start_id not in by_id:
        raise SchemaError(f"{path}.start", f"start phase '{start_id}' is not declared")
    if by_id[start_id].terminal:
        raise SchemaError(f"{path}.start", f"start phase '{start_id}' is terminal")
    reached = _reachable(start_id, by_id)
    unreachable = [p.id for p in phases if p.id not in reached]
    if unreachable:
        raise SchemaError(path, f"phase(s) unreachable from '{start_id}': {', '.join(unreachable)}")
    if not any(p in TERMINAL_PHASES or (p in by_id and by_id[p].terminal) for p in reached):
        raise SchemaError(path, "the declared graph never reaches a terminal phase (done, failed or aborted)")
    return PhaseDeclaration(start=start_id, phases=tuple(phases), max_rework=max_rework, raw=raw)


def _reachable(start: str, by_id: dict[str, Phase]) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        phase = by_id.get(todo.pop())
        for edge in phase.next if phase else ():
            if edge.to not in seen:
                seen.add(edge.to)
                todo.append(edge.to)
    return seen


def phases_or_warning(value: Any, *, source: str = "phases") -> tuple[PhaseDeclaration | None, str | None]:
    """For consumers (context/env channels): a bad declaration degrades to no machine plus a warning."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, None
    try:
        return validate_phases(value, source), None
    except SchemaError as exc:
        return None, f"ignoring the phase declaration from {source} (running without a phase machine): {exc}"
