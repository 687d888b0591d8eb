"""The layered card catalog: built-in → user → project (docs/architecture.md §9.11).

A later layer replaces a same-named card completely; `disabled: true` (on the card or in
`agentOverrides.<role>`) hides it. In strict mode every card error of every file is collected
and raised together as one `CatalogError`; otherwise they are kept on `Catalog.errors`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

from legion.agents.card import LAYERS, MAX_CARD_BYTES, AgentConfig, attr_name, parse_card
from legion.agents.errors import AgentDefinitionError, CardError, CatalogError
from legion.agents.locations import process_env, project_agents_dir, read_head, user_agents_dir
from legion.agents.schema import did_you_mean
from legion.agents.settings import DEFAULT_TEAM, PHASE_TIMEOUTS_MS, Settings

BUILTIN_PACKAGE: Final = "legion.agents.cards"
# agentOverrides keys that replace the card's own value (model/thinking/preset/fallbackModels feed
# model resolution instead)
_OVERRIDE_KEYS: Final = (
    "tools",
    "timeoutMs",
    "toolTimeoutMs",
    "loopNoticeMs",
    "toolBudget",
    "turnBudget",
    "restart",
    "maxRestarts",
    "restartPeriodMs",
    "disabled",
)


@dataclass
class Catalog:
    cards: dict[str, AgentConfig] = field(default_factory=dict)
    hidden: dict[str, AgentConfig] = field(default_factory=dict)
    shadowed: list[AgentConfig] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    errors: list[AgentDefinitionError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[AgentConfig]:
        return iter(self.cards.values())

    def __len__(self) -> int:
        return len(self.cards)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def names(self) -> list[str]:
        return sorted(self.cards)

    def get(self, name: str) -> AgentConfig | None:
        """A visible card by name or alias."""
        card = self.cards.get(name)
        if card is None and name in self.aliases:
            card = self.cards.get(self.aliases[name])
        return card

    def require(self, name: str) -> AgentConfig:
        """A visible card, or a `CardError` naming the closest role and the full list."""
        card = self.get(name)
        if card is not None:
            return card
        if name in self.hidden:
            raise CardError(
                f"agent '{name}' is disabled ({self.hidden[name].path}); remove 'disabled: true' to use it"
            )
        hint = did_you_mean(name, [*self.cards, *self.aliases])
        raise CardError(f"unknown agent '{name}'{hint} Available: {', '.join(self.names()) or 'none'}")

    def require_utility(self, name: str) -> AgentConfig:
        """A card that `vexillatio` may dispatch (`utility: true`)."""
        card = self.require(name)
        if not card.utility:
            raise CardError(f"not a utility agent: {name} (mark it with 'utility: true')")
        return card


def builtin_card_files() -> list[tuple[str, bytes]]:
    """(path, bytes) of every packaged built-in card."""
    root = resources.files(BUILTIN_PACKAGE)
    found = []
    for entry in root.iterdir():
        if entry.name.endswith(".md") and entry.is_file():
            found.append((f"<builtin>/{entry.name}", entry.read_bytes()))
    return sorted(found)


def _dir_files(directory: Path) -> tuple[list[tuple[str, bytes]], list[AgentDefinitionError]]:
    files: list[tuple[str, bytes]] = []
    errors: list[AgentDefinitionError] = []
    try:
        entries = sorted(p for p in directory.iterdir() if p.suffix == ".md")
    except FileNotFoundError:
        return files, errors
    except OSError as exc:
        return files, [CardError(f"cannot list the agents directory: {exc.strerror or exc}", path=directory)]
    for path in entries:
        try:
            if not path.is_dir():
                files.append((str(path), read_head(path, MAX_CARD_BYTES)))
        except OSError as exc:
            errors.append(CardError(f"cannot read card: {exc.strerror or exc}", path=path))
    return files, errors


def load_catalog(
    cwd: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    settings: Settings | None = None,
    layers: Sequence[str] = LAYERS,
    strict: bool = True,
    layer_dirs: Mapping[str, Path] | None = None,
) -> Catalog:
    """Load every layer's cards, later layers replacing same-named cards; apply settings overrides."""
    env = process_env() if env is None else env
    dirs = {"user": user_agents_dir(env), "project": project_agents_dir(cwd), **(layer_dirs or {})}
    catalog = Catalog()
    merged: dict[str, AgentConfig] = {}
    for layer in LAYERS:
        errors: list[AgentDefinitionError] = []
        if layer not in layers:
            continue
        if layer == "builtin" and "builtin" not in dirs:
            files, errors = builtin_card_files(), []
        else:
            files, errors = _dir_files(Path(dirs[layer]))
        catalog.errors.extend(errors)
        _load_layer(layer, files, merged, catalog)
    for name, card in merged.items():
        card = _apply_overrides(card, settings)
        catalog.warnings.extend(card.warnings)
        (catalog.hidden if card.disabled else catalog.cards)[name] = card
    _index_aliases(catalog)
    if settings is not None:
        _check_card_references(catalog, settings)
        _check_role_references(catalog, settings, merged)
        _check_phase_timeout_names(catalog, settings, merged)
    if strict and catalog.errors:
        raise CatalogError(catalog.errors)
    return catalog


def _load_layer(
    layer: str, files: list[tuple[str, bytes]], merged: dict[str, AgentConfig], catalog: Catalog
) -> None:
    seen: dict[str, str] = {}
    for path, data in files:
        try:
            card = parse_card(data, path=path, source=layer)
        except AgentDefinitionError as exc:
            catalog.errors.append(exc)
            continue
        if card.name in seen:
            catalog.errors.append(
                CardError(
                    f"role '{card.name}' is also defined by {seen[card.name]} in the same layer", path=path
                )
            )
            continue
        seen[card.name] = path
        if card.name in merged:
            catalog.shadowed.append(merged[card.name])
        merged[card.name] = card


def _apply_overrides(card: AgentConfig, settings: Settings | None) -> AgentConfig:
    override: Mapping[str, Any] = settings.agent_overrides.get(card.name, {}) if settings else {}
    changes = {attr_name(key): override[key] for key in _OVERRIDE_KEYS if key in override}
    if "tools" in changes:
        changes["tools"] = tuple(changes["tools"])
    return dataclasses.replace(card, **changes) if changes else card


def _index_aliases(catalog: Catalog) -> None:
    for card in sorted(catalog.cards.values(), key=lambda c: (LAYERS.index(c.source), c.name)):
        for alias in card.aliases:
            if alias in catalog.cards:
                catalog.warnings.append(f"{card.path}: alias '{alias}' is also a role name; the role wins")
            elif alias in catalog.aliases and catalog.aliases[alias] != card.name:
                catalog.warnings.append(
                    f"{card.path}: alias '{alias}' also names '{catalog.aliases[alias]}'; using '{card.name}'"
                )
                catalog.aliases[alias] = card.name
            else:
                catalog.aliases[alias] = card.name


def _check_card_references(catalog: Catalog, settings: Settings) -> None:
    """A card's `team` and `preset` must name entries of the settings (with a suggestion if not)."""
    for card in list(catalog.cards.values()):
        if card.team is not None and card.team != DEFAULT_TEAM and card.team not in settings.teams:
            catalog.errors.append(_reference_error(card, "team", card.team, settings.teams))
        if card.preset is not None and card.preset not in settings.presets:
            catalog.errors.append(_reference_error(card, "preset", card.preset, settings.presets))


def _reference_error(card: AgentConfig, what: str, name: str, known: Mapping[str, Any]) -> CardError:
    hint = did_you_mean(name, known)
    listing = ", ".join(sorted(known)) or f"none defined under '{what}s' in settings"
    return CardError(
        f"{what} '{name}' is not a {what} in settings{hint} Known {what}s: {listing}",
        path=card.path,
        line=card.lines.get(what),
    )


def _check_role_references(catalog: Catalog, settings: Settings, known: Mapping[str, AgentConfig]) -> None:
    """Warn (with a suggestion) about settings entries naming a role no loaded layer defines."""
    refs = [(f"agentOverrides.{role}", role) for role in settings.agent_overrides]
    refs += [
        (f"agentOverridesByProvider.{provider}.{role}", role)
        for provider, roles in settings.agent_overrides_by_provider.items()
        for role in roles
    ]
    refs += [
        (f"teams.{team.name}.members[{n}].role", member.role)
        for team in settings.teams.values()
        for n, member in enumerate(team.members)
    ]
    for ref, role in refs:
        if role in known or role in catalog.aliases:
            continue
        hint = did_you_mean(role, known)
        catalog.warnings.append(f"settings {ref}: no role named '{role}' in the loaded cards{hint}")


def _check_phase_timeout_names(
    catalog: Catalog, settings: Settings, known: Mapping[str, AgentConfig]
) -> None:
    """Warn about an operator-written `legion.phaseTimeouts.<phase>` that no machine can use (a typo?).

    A warning, not an error: a launch may still declare that phase inline.
    """
    declared = set(PHASE_TIMEOUTS_MS) | {
        phase.id for card in known.values() if card.phases for phase in card.phases.phases
    }
    for phase in sorted(settings.get("legion.phaseTimeouts", {})):
        if phase in declared or not settings.is_explicit(f"legion.phaseTimeouts.{phase}"):
            continue
        catalog.warnings.append(
            f"settings legion.phaseTimeouts.{phase}: no built-in phase and no loaded card declares "
            f"'{phase}'{did_you_mean(phase, declared)} It applies only to a launch that declares it"
        )
