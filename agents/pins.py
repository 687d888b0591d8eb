"""Provider pin replay (SEED-SPEC §1.5, #123, §10 item 33).

The provider computed for candidate 0 on first start is recorded with the child and replayed on
continue/resume: kept for the same model, recomputed for a different per-call model, skipped when
the current registry no longer knows the provider, and never recorded for a fallback candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from legion.agents.modelspec import blank, provider_of
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
) -> PinDecision:
    """continue/resume: per-call model or the recorded one; keep the pin only for the same model."""
    provider: str | None
    if not blank(call_model) and str(call_model).strip() != recorded_model:
        model = str(call_model).strip()
        provider = provider_for_model(model, registry)
        return PinDecision(model, provider, "different model: provider pin recomputed")
    model, provider = recorded_model, recorded_provider
    if provider is not None and registry is not None and not registry.knows_provider(provider):
        return PinDecision(model, None, f"skipped provider pin '{provider}': not a known provider")
    return PinDecision(model, provider)
