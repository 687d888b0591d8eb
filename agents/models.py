"""Model resolution: the 8-level precedence chain of docs/spec-conformance.md §1.5 with source, origin and thinking.

Strongest first: (1) per-call model, (2) the chosen preset's model, (3) the team member's model,
(4) `agentOverridesByProvider.<parent provider>.<role>.model`, (5) `agentOverrides.<role>.model`,
(6) the card's `model`, (7) `defaultModel`, (8) the dispatching parent's current model.
Levels 1–6 are `explicit`, 7–8 `inherited`. A candidate equal to `inherit` takes the parent's
model (origin `inherited`); with no parent model the launch is refused, naming the role and both
ways out. It never falls back to `defaultModel`: `inherit` is a deliberate choice to skip the
weaker levels (a card that wants `defaultModel` leaves `model` out), and which model runs must not
depend on whether the parent happens to have one. Warnings are returned, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from legion.agents.card import AgentConfig
from legion.agents.errors import ModelResolutionError
from legion.agents.modelspec import (
    INHERIT,
    THINKING_LEVELS,
    Thinking,
    blank,
    check_model_string,
    check_thinking,
    model_label,
    provider_of,
    split_thinking_suffix,
    suspicious_suffix,
)
from legion.agents.presets import require_preset
from legion.agents.registry import ModelRegistry
from legion.agents.schema import SchemaError
from legion.agents.settings import Preset, Settings, TeamMember

Origin = Literal["explicit", "inherited"]


@dataclass(frozen=True)
class ModelCandidate:
    level: int
    type: str  # dispatch | preset | team | agentOverrides | frontmatter | defaultModel
    origin: Origin
    model: str
    detail: str


@dataclass(frozen=True)
class ModelRequest:
    """What a launch (or continue/resume) asks for, per call."""

    model: str | None = None
    thinking: Thinking = None
    preset: str | None = None


@dataclass(frozen=True)
class ModelResolution:
    role: str
    model: str  # concrete model without a known thinking suffix
    thinking: str | None  # effective level recorded for the child (None = no level)
    thinking_disabled: bool  # `thinking: false` stripped any level
    label: str  # model_label(model, thinking): the one form used to spawn and display
    source: str
    origin: Origin
    level: int
    detail: str
    provider: str | None
    kind: str
    via_inherit: bool = False
    preset: str | None = None
    fallbacks: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    @property
    def candidates(self) -> tuple[str, ...]:
        """Candidate 0 (the resolved label) then the fallbacks (`inherit` never among them)."""
        return (self.label, *self.fallbacks)


def validate_request(request: ModelRequest) -> ModelRequest:
    """Per-call values are checked like card values (trimmed; blank = absent); bad ones refuse the launch."""
    try:
        model = None if blank(request.model) else check_model_string(str(request.model).strip(), "model")
        thinking = None if request.thinking is None else check_thinking(request.thinking, "thinking")
    except SchemaError as exc:
        raise ModelResolutionError(f"launch {exc}") from None
    except AttributeError:
        raise ModelResolutionError(
            f"launch model: must be a string (got {type(request.model).__name__})"
        ) from None
    preset = None if blank(request.preset) else str(request.preset).strip()
    return ModelRequest(model=model, thinking=thinking, preset=preset)


def step_request(
    *,
    step_model: str | None = None,
    step_preset: str | None = None,
    step_thinking: Thinking = None,
    model: str | None = None,
    preset: str | None = None,
    thinking: Thinking = None,
) -> ModelRequest:
    """One task of a multi-task launch: a blank step value yields to the top-level one (trimmed)."""
    return validate_request(
        ModelRequest(
            model=model if blank(step_model) else step_model,
            preset=preset if blank(step_preset) else step_preset,
            thinking=thinking if step_thinking is None else step_thinking,
        )
    )


def applicable_member(agent: AgentConfig, member: TeamMember | None) -> TeamMember | None:
    """A team member's overrides apply only to its own role: a stale tag (another role's member) is ignored.

    A blank member model is ignored by the chain itself, so the card's model stays in charge.
    """
    if member is None or member.role in (agent.name, *agent.aliases):
        return member
    return None


def choose_preset(
    agent: AgentConfig, settings: Settings, request: ModelRequest, member: TeamMember | None
) -> Preset | None:
    """The one preset that applies: per-call > team member > agentOverrides > card (missing = error)."""
    override = settings.agent_overrides.get(agent.name, {})
    for name, by in (
        (request.preset, "this launch"),
        (member.preset if member else None, f"team member '{agent.name}'"),
        (override.get("preset"), f"agentOverrides.{agent.name}.preset"),
        (agent.preset, agent.where("preset")),
    ):
        if not blank(name):
            return require_preset(settings, str(name), referenced_by=by)
    return None


def model_chain(
    agent: AgentConfig,
    settings: Settings,
    *,
    request: ModelRequest = ModelRequest(),
    preset: Preset | None = None,
    member: TeamMember | None = None,
    team: str | None = None,
    parent_model: str | None = None,
) -> list[ModelCandidate]:
    """Every present candidate, strongest first (level 1..8)."""
    role = agent.name
    out: list[ModelCandidate] = []

    def add(level: int, type_: str, origin: Origin, model: str | None, detail: str) -> None:
        if not blank(model):
            out.append(ModelCandidate(level, type_, origin, str(model).strip(), detail))

    add(1, "dispatch", "explicit", request.model, "the launch's model")
    add(
        2,
        "preset",
        "explicit",
        preset.model if preset else None,
        f"presets.{preset.name if preset else ''}.model",
    )
    add(3, "team", "explicit", member.model if member else None, f"teams.{team or '?'}.members[{role}].model")
    parent_provider = provider_of(parent_model) if parent_model else None
    if parent_provider:
        by_provider = settings.agent_overrides_by_provider.get(parent_provider, {})
        add(
            4,
            "agentOverrides",
            "explicit",
            by_provider.get(role),
            f"agentOverridesByProvider.{parent_provider}.{role}.model",
        )
    add(
        5,
        "agentOverrides",
        "explicit",
        settings.agent_overrides.get(role, {}).get("model"),
        f"agentOverrides.{role}.model",
    )
    add(6, "frontmatter", "explicit", agent.model, f"card {agent.where('model')}")
    add(7, "defaultModel", "inherited", settings.default_model, "defaultModel")
    add(8, "dispatch", "inherited", parent_model, "the parent session's model")
    return out


def refusal_message(role: str, detail: str, *, inherit: bool) -> str:
    """The refusal text: names the role and both ways out (`defaultModel`, an explicit model)."""
    if inherit:
        return (
            f"cannot launch '{role}': its model is \"inherit\" (from {detail}), which means the dispatching "
            'session\'s model, and the dispatching session has no model. Either replace "inherit" there '
            'with a concrete model (or remove it so "defaultModel" in .legion/settings.json applies), '
            'or pass an explicit model for this launch (e.g. model: "provider/model-id")'
        )
    return (
        f"cannot launch '{role}': no model is configured for it and the dispatching session has none "
        'to inherit. Either set "defaultModel" in .legion/settings.json, or pass an explicit model '
        'for this launch (e.g. model: "provider/model-id")'
    )


def resolve_model(
    agent: AgentConfig,
    settings: Settings,
    *,
    request: ModelRequest = ModelRequest(),
    member: TeamMember | None = None,
    team: str | None = None,
    parent_model: str | None = None,
    registry: ModelRegistry | None = None,
) -> ModelResolution:
    """Resolve the model, thinking and kind for one launch; raises `ModelResolutionError` to refuse."""
    request = validate_request(request)
    if blank(parent_model) or str(parent_model).strip() == INHERIT:
        parent_model = None  # a parent "model" of `inherit` is no model: never spawn `--model inherit`
    member = applicable_member(agent, member)
    preset = choose_preset(agent, settings, request, member)
    chain = model_chain(
        agent, settings, request=request, preset=preset, member=member, team=team, parent_model=parent_model
    )
    if not chain:
        raise ModelResolutionError(refusal_message(agent.name, "", inherit=False))
    top = chain[0]
    chosen, origin, detail, via_inherit = top.model, top.origin, top.detail, False
    if chosen == INHERIT:
        via_inherit, origin = True, "inherited"
        if parent_model is None:
            raise ModelResolutionError(refusal_message(agent.name, top.detail, inherit=True))
        chosen, detail = str(parent_model).strip(), f"{top.detail} = inherit → the parent session's model"
    thinking_value = _thinking_value(agent, settings, request, preset, member, preset_model=top.level == 2)
    model, effective, disabled = apply_thinking(
        chosen, thinking_value, per_call=top.level == 1 and not via_inherit
    )
    warnings = [w for w in (suspicious_suffix(chosen),) if w]
    if registry is not None:
        warnings += registry.warnings_for(model)
    return ModelResolution(
        role=agent.name,
        model=model,
        thinking=effective,
        thinking_disabled=disabled,
        label=model_label(model, effective),
        source=top.type,
        origin=origin,
        level=top.level,
        detail=detail,
        provider=provider_of(model),
        kind=(preset.kind if preset and preset.kind else agent.kind),
        via_inherit=via_inherit,
        preset=preset.name if preset else None,
        fallbacks=_fallbacks(agent, settings),
        warnings=tuple(warnings),
    )


def _thinking_value(
    agent: AgentConfig,
    settings: Settings,
    request: ModelRequest,
    preset: Preset | None,
    member: TeamMember | None,
    *,
    preset_model: bool,
) -> Thinking:
    """The thinking value: per call > preset > team member > agentOverrides > card.

    A preset is atomic (docs/spec-conformance.md §1.4): when it supplies the model, the thinking comes from the same
    preset (or the per-call value) and never from a weaker source, so its model is never paired
    with someone else's level.
    """
    if preset_model and preset is not None:
        return request.thinking if request.thinking is not None else preset.thinking
    override = settings.agent_overrides.get(agent.name, {})
    for value in (
        request.thinking,
        preset.thinking if preset else None,
        member.thinking if member else None,
        override.get("thinking"),
        agent.thinking,
    ):
        if value is not None:
            return value
    return None


def apply_thinking(model: str, thinking: Thinking, *, per_call: bool) -> tuple[str, str | None, bool]:
    """(model without a known suffix, effective level, level stripped by `thinking: false`).

    `thinking` beats a known `:level` suffix, except on a per-call model, whose suffix wins.
    Unknown suffixes are part of the model id and never stripped.
    """
    base, suffix = split_thinking_suffix(model)
    if per_call and suffix is not None:
        return base, suffix, False
    if thinking is False:
        return base, None, True
    if isinstance(thinking, str) and thinking in THINKING_LEVELS:
        return base, thinking, False
    return base, suffix, False


def _fallbacks(agent: AgentConfig, settings: Settings) -> tuple[str, ...]:
    override = settings.agent_overrides.get(agent.name, {})
    raw = override.get("fallbackModels", agent.fallback_models)
    return tuple(m for m in raw if m != INHERIT)
