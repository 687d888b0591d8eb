"""Model resolution: the 8-level precedence chain of SEED-SPEC §1.5 with source, origin and thinking.

Strongest first: (1) per-call model, (2) the chosen preset's model, (3) the team member's model,
(4) `agentOverridesByProvider.<parent provider>.<role>.model`, (5) `agentOverrides.<role>.model`,
(6) the card's `model`, (7) `defaultModel`, (8) the dispatching parent's current model.
Levels 1–6 are `explicit`, 7–8 `inherited`. A candidate equal to `inherit` takes the parent's
model (origin `inherited`); with no parent model it takes `defaultModel`, and with neither the
launch is refused, naming the role and both ways out. Warnings are returned, never raised.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from legion.agents.card import AgentConfig
from legion.agents.errors import ModelResolutionError
from legion.agents.modelspec import (
    INHERIT,
    THINKING_LEVELS,
    Thinking,
    check_model_string,
    check_thinking,
    model_label,
    provider_of,
    split_thinking_suffix,
    suspicious_suffix,
)
from legion.agents.presets import require_preset
from legion.agents.schema import SchemaError
from legion.agents.settings import Preset, Settings, TeamMember

Origin = Literal["explicit", "inherited"]
# The workers' ProviderRegistry always has these two (openai = api.openai.com, any model id).
BUILTIN_PROVIDERS: Final[Mapping[str, frozenset[str] | None]] = {"scripted": None, "openai": None}
CUSTOM_MODEL_WARNING: Final = "Using custom model id."


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


@dataclass(frozen=True)
class ModelRegistry:
    """Known providers → their listed model ids (None = any id is fine)."""

    providers: Mapping[str, frozenset[str] | None]

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelRegistry:
        found: dict[str, frozenset[str] | None] = dict(BUILTIN_PROVIDERS)
        for name, prov in settings.providers.items():
            found[name] = frozenset(prov.models) if prov.models else None
        return cls(found)

    def knows_provider(self, provider: str | None) -> bool:
        return provider is not None and provider in self.providers

    def warnings_for(self, model: str) -> list[str]:
        provider = provider_of(model)
        if not self.knows_provider(provider):
            known = ", ".join(sorted(self.providers))
            return [f"Unknown provider '{provider}' for model '{model}' (known: {known})"]
        listed = self.providers[provider or ""]
        base, _ = split_thinking_suffix(model)
        model_id = base.partition("/")[2]
        if listed is not None and model_id not in listed:
            return [f"{CUSTOM_MODEL_WARNING} ('{model_id}' is not listed for provider '{provider}')"]
        return []


def _blank(value: str | None) -> bool:
    return value is None or not value.strip()


def validate_request(request: ModelRequest) -> ModelRequest:
    """Per-call values are checked like card values (trimmed; blank = absent); bad ones refuse the launch."""
    try:
        model = None if _blank(request.model) else check_model_string(str(request.model).strip(), "model")
        thinking = None if request.thinking is None else check_thinking(request.thinking, "thinking")
    except SchemaError as exc:
        raise ModelResolutionError(f"launch {exc}") from None
    except AttributeError:
        raise ModelResolutionError(
            f"launch model: must be a string (got {type(request.model).__name__})"
        ) from None
    preset = None if _blank(request.preset) else str(request.preset).strip()
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
            model=model if _blank(step_model) else step_model,
            preset=preset if _blank(step_preset) else step_preset,
            thinking=thinking if step_thinking is None else step_thinking,
        )
    )


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
        if not _blank(name):
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
        if not _blank(model):
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
    """The refusal text: names the role and both ways out."""
    why = (
        f'its model is "inherit" (from {detail}) but the dispatching session has no model to inherit'
        if inherit
        else "no model is configured for it and the dispatching session has none to inherit"
    )
    return (
        f"cannot launch '{role}': {why}. Either set \"defaultModel\" in .legion/settings.json, "
        f'or pass an explicit model for this launch (e.g. model: "provider/model-id")'
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
        if not _blank(parent_model):
            chosen, detail = str(parent_model).strip(), f"{top.detail} = inherit → the parent session's model"
        elif settings.default_model:
            chosen, detail = settings.default_model, f"{top.detail} = inherit, no parent model → defaultModel"
        else:
            raise ModelResolutionError(refusal_message(agent.name, top.detail, inherit=True))
    thinking_value = _thinking_value(agent, settings, request, preset, member)
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
) -> Thinking:
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


# --- provider pin (#123) -------------------------------------------------------------------------


@dataclass(frozen=True)
class PinDecision:
    model: str
    provider: str | None
    note: str | None = None


def provider_for_model(model: str, registry: ModelRegistry | None = None) -> str | None:
    """The provider to pin for a model (known thinking suffix ignored); None if the registry lacks it."""
    provider = provider_of(model)
    if registry is not None and not registry.knows_provider(provider):
        return None
    return provider


def pin_for_candidate(index: int, model: str, registry: ModelRegistry | None = None) -> str | None:
    """Only candidate 0 records a pin; a fallback candidate spawns with none and records none."""
    return provider_for_model(model, registry) if index == 0 else None


def replay_pin(
    *,
    recorded_model: str,
    recorded_provider: str | None,
    call_model: str | None = None,
    registry: ModelRegistry | None = None,
) -> PinDecision:
    """continue/resume: per-call model or the recorded one; keep the pin only for the same model."""
    provider: str | None
    if not _blank(call_model) and str(call_model).strip() != recorded_model:
        model = str(call_model).strip()
        provider = provider_for_model(model, registry)
        return PinDecision(model, provider, "different model: provider pin recomputed")
    model, provider = recorded_model, recorded_provider
    if provider is not None and registry is not None and not registry.knows_provider(provider):
        return PinDecision(model, None, f"skipped provider pin '{provider}': not a known provider")
    return PinDecision(model, provider)


# --- model scope and display lines ---------------------------------------------------------------


@dataclass(frozen=True)
class ScopeCheck:
    severity: Literal["ok", "warn", "error"]
    line: str | None = None


def classify_model_origin(origin: Origin) -> Literal["warn", "error"]:
    """An out-of-scope explicit model refuses the launch; an inherited one only warns."""
    return "error" if origin == "explicit" else "warn"


def check_model_scope(name: str, resolution: ModelResolution, scope: Iterable[str] | None) -> ScopeCheck:
    """Check the resolved model against allowed patterns (fnmatch); None/empty = no scope."""
    patterns = [p for p in (scope or ()) if p]
    if not patterns or any(
        fnmatch.fnmatchcase(m, p) for p in patterns for m in (resolution.model, resolution.label)
    ):
        return ScopeCheck("ok")
    severity = classify_model_origin(resolution.origin)
    text = (
        f"{name}: model {resolution.label} ({resolution.origin}, from {resolution.detail}) "
        f"is outside the model scope [{', '.join(patterns)}]"
    )
    if severity == "error":
        return ScopeCheck("error", f"✗ {text}")
    return ScopeCheck("warn", f"⚠ {text}; launching anyway")


def warning_lines(name: str, warnings: Iterable[str]) -> list[str]:
    """The visible, non-fatal warning lines printed after a `▶` launch or `Resumed …` line."""
    return [f"  ⚠ {name}: {w}" for w in warnings]
