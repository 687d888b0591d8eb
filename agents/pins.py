"""Provider pin replay (docs/spec-conformance.md §1.5 and §10 item 33).

The provider computed for candidate 0 on first start is recorded with the child and replayed on
continue/resume: kept for the same model, recomputed for a different per-call model, skipped when
the current registry no longer knows the provider, and never recorded for a fallback candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from legion.agents.errors import ModelResolutionError
from legion.agents.models import ModelRequest, validate_request
from legion.agents.modelspec import INHERIT, blank, provider_of
from legion.agents.registry import ModelRegistry


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
    parent_model: str | None = None,
    role: str = "the child",
) -> PinDecision:
    """continue/resume: per-call model or the recorded one; keep the pin only for the same model.

    A per-call `inherit` means the parent's current model (refused when there is none), and a
    per-call model is checked like a launch's, so nothing malformed is replayed.
    """
    provider: str | None
    call = validate_request(ModelRequest(model=call_model)).model
    if call == INHERIT:
        if blank(parent_model) or str(parent_model).strip() == INHERIT:
            raise ModelResolutionError(
                f"cannot continue '{role}' with model \"inherit\": the dispatching session has no model. "
                f"Either leave the model out to keep the recorded one ({recorded_model}), or pass an "
                'explicit model (e.g. model: "provider/model-id"); set "defaultModel" in '
                ".legion/settings.json for new launches"
            )
        call = str(parent_model).strip()
    if call is not None and call != recorded_model:
        model = call
        provider = provider_for_model(model, registry)
        return PinDecision(model, provider, "different model: provider pin recomputed")
    model, provider = recorded_model, recorded_provider
    if provider is not None and registry is not None and not registry.knows_provider(provider):
        return PinDecision(model, None, f"skipped provider pin '{provider}': not a known provider")
    return PinDecision(model, provider)
