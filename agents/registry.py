"""Known model providers and their listed models, for resolution warnings and pin validation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from legion.agents.modelspec import provider_of, split_thinking_suffix
from legion.agents.settings import Settings

# The workers' ProviderRegistry always has these (openai = api.openai.com, anthropic = the Messages API;
# any model id).
BUILTIN_PROVIDERS: Final[Mapping[str, frozenset[str] | None]] = {"scripted": None, "openai": None,
                                                                 "anthropic": None}
CUSTOM_MODEL_WARNING: Final = "Using custom model id."


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
