"""Rows for `legion agents [user|project|both]`: every card, its layer, effective model and origin.

The scope picks which layers are loaded over the built-ins: `user` (built-in + user),
`project` (built-in + project) or `both` (all three). The listing has no parent session, so
a card whose winning model is `inherit` shows the refusal line a launch without a parent model hits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from legion.agents.card import AgentConfig
from legion.agents.catalog import Catalog, load_catalog
from legion.agents.errors import AgentDefinitionError
from legion.agents.locations import process_env
from legion.agents.models import ModelRequest, choose_preset, model_chain, resolve_model
from legion.agents.modelspec import INHERIT
from legion.agents.registry import ModelRegistry
from legion.agents.settings import Settings, load_settings

NEEDS_PARENT_MODEL: Final = "needs a parent session model — a launch would refuse this"
INHERITS_PARENT_MODEL: Final = "the parent session's model"
SCOPES: Final = {
    "user": ("builtin", "user"),
    "project": ("builtin", "project"),
    "both": ("builtin", "user", "project"),
}


@dataclass(frozen=True)
class AgentRow:
    name: str
    source: str
    path: str
    model: str
    origin: str
    description: str
    note: str = ""
    disabled: bool = False


def list_agents(
    cwd: str | Path,
    scope: str = "both",
    *,
    env: Mapping[str, str] | None = None,
    settings: Settings | None = None,
    catalog: Catalog | None = None,
    include_disabled: bool = False,
    layer_only: bool = False,
) -> list[AgentRow]:
    """One row per card of the chosen layers, sorted by name, then one `error` row per broken card
    file and one `warning` row per catalog warning that no card row already shows. `layer_only`: only the
    cards the scope's own layers define (`legion agents project`: the project's cards, a built-in it replaces
    included), still resolved over the built-ins and settings."""
    if scope not in SCOPES:
        raise AgentDefinitionError(f"unknown scope '{scope}': use one of {', '.join(SCOPES)}")
    env = process_env() if env is None else env
    settings = settings or load_settings(cwd, env=env)
    catalog = catalog or load_catalog(cwd, env=env, settings=settings, layers=SCOPES[scope], strict=False)
    registry = ModelRegistry.from_settings(settings, env=env)
    cards = list(catalog.cards.values()) + (list(catalog.hidden.values()) if include_disabled else [])
    if layer_only:
        cards = [card for card in cards if card.source in SCOPES[scope][1:]]
    rows = [_row(card, settings, registry) for card in sorted(cards, key=lambda c: c.name)]
    shown = {w for card in cards for w in card.warnings}
    others = [w for w in catalog.warnings if w not in shown]  # settings references, aliases, …
    return rows + [_error_row(err) for err in catalog.errors] + [_warning_row(w) for w in others]


def _error_row(err: AgentDefinitionError) -> AgentRow:
    """A card that failed to load still shows up, with the reason (a listing never hides breakage)."""
    name = Path(err.path).stem if err.path else "?"
    return AgentRow(
        name=name, source="error", path=err.path or "", model="-", origin="-", description="", note=str(err)
    )


def _warning_row(warning: str) -> AgentRow:
    """A catalog warning that belongs to no single card (e.g. settings naming an unknown role)."""
    return AgentRow(name="-", source="warning", path="", model="-", origin="-", description="", note=warning)


def _row(card: AgentConfig, settings: Settings, registry: ModelRegistry) -> AgentRow:
    """The card's effective model and origin; its own warnings always ride along in the note."""
    model, origin, notes = "?", "-", []
    try:
        chain = model_chain(card, settings, preset=choose_preset(card, settings, ModelRequest(), None))
        if not chain:
            model, origin = INHERITS_PARENT_MODEL, "inherited"
        elif chain[0].model == INHERIT:
            model, origin, notes = INHERIT, "inherited", [NEEDS_PARENT_MODEL]
        else:
            res = resolve_model(card, settings, registry=registry)
            model, origin, notes = res.label, res.origin, list(res.warnings)
    except AgentDefinitionError as exc:
        notes = [exc.message]
    return AgentRow(
        name=card.name,
        source=card.source,
        path=card.path,
        model=model,
        origin=origin,
        description=card.description,
        note="; ".join([*notes, *card.warnings]),
        disabled=card.disabled,
    )


def format_rows(rows: list[AgentRow]) -> list[str]:
    """Plain text lines: name, layer, model (origin), description, and an indented note line."""
    lines: list[str] = []
    width = max((len(r.name) for r in rows), default=4)
    for r in rows:
        flag = " [disabled]" if r.disabled else ""
        lines.append(f"{r.name:<{width}}  {r.source:<8}  {r.model} ({r.origin}){flag}  {r.description}")
        if r.note:
            lines.append(f"{'':<{width}}  ⚠ {r.note}")
    return lines
