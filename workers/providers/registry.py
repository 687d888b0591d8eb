"""Resolve ``provider/model-id[:thinking]`` to a provider instance.

Built in: ``scripted`` and ``openai`` (api.openai.com, key in ``OPENAI_API_KEY``). Every entry of the
``providers`` configuration (pi ``models.json`` shape, ``api: "openai-completions"``) adds or overrides
an OpenAI-compatible provider under its own name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from legion.workers.providers.base import ModelRef, Provider, ProviderError, parse_model_ref
from legion.workers.providers.openai_compat import OpenAICompatProvider
from legion.workers.providers.scripted import Script, ScriptedProvider, load_script

SUPPORTED_APIS = ("openai-completions",)


class ProviderRegistry:
    """Provider instances by name, built once per process from configuration."""

    def __init__(self, config: Mapping[str, Any] | None = None,
                 scripts: Mapping[str, Script | Mapping[str, Any]] | None = None) -> None:
        parsed = {name: s if isinstance(s, Script) else load_script(s) for name, s in (scripts or {}).items()}
        self._providers: dict[str, Provider] = {"scripted": ScriptedProvider(scripts=parsed)}
        cfg = dict(config or {})
        cfg.setdefault("openai", {})
        for name, entry in cfg.items():
            if not isinstance(entry, Mapping):
                raise ProviderError(f"providers.{name} must be an object like pi's models.json entries")
            api = entry.get("api", "openai-completions")
            if api not in SUPPORTED_APIS:
                raise ProviderError(f"providers.{name}.api {api!r} is not supported; supported: "
                                    f"{', '.join(SUPPORTED_APIS)}")
            if name == "scripted":
                raise ProviderError("providers.scripted is reserved for the built-in scripted provider")
            self._providers[name] = OpenAICompatProvider.from_config(name, entry)

    @property
    def known(self) -> list[str]:
        return sorted(self._providers)

    async def aclose(self) -> None:
        """Close the providers' pooled HTTP clients (call once when the hosting process stops)."""
        for provider in self._providers.values():
            if isinstance(provider, OpenAICompatProvider):
                await provider.aclose()

    def resolve(self, model: str) -> tuple[Provider, ModelRef]:
        """Provider and parsed reference for ``model``; raise ProviderError listing known providers."""
        ref = parse_model_ref(model)
        provider = self._providers.get(ref.provider)
        if provider is None:
            raise ProviderError(f"unknown provider {ref.provider!r} in model {model!r}; known providers: "
                                f"{', '.join(self.known)} (add it under 'providers' in settings)")
        if isinstance(provider, OpenAICompatProvider):
            provider.check_model(ref.model_id)
        return provider, ref
