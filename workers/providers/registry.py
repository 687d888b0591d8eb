"""Resolve ``provider/model-id[:thinking]`` to a provider instance.

Built in: ``scripted``, ``anthropic`` (Messages API, key in ``ANTHROPIC_API_KEY``) and ``openai``
(api.openai.com, key in ``OPENAI_API_KEY``). pi's ``models.json`` (``pi_models.py``) adds a pi user's
providers, and every entry of the ``providers`` configuration (same shape) adds or overrides one under
its own name; ``api`` picks ``openai-completions`` or ``anthropic-messages``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from legion.workers.providers.anthropic_messages import AnthropicProvider
from legion.workers.providers.base import ModelRef, Provider, ProviderError, parse_model_ref
from legion.workers.providers.config import ALWAYS_BUILTIN, SUPPORTED_APIS, ProviderSettings, parse_entry
from legion.workers.providers.openai_compat import OpenAICompatProvider
from legion.workers.providers.pi_models import PiModels, load_pi_models
from legion.workers.providers.scripted import Script, ScriptedProvider, load_script
from legion.workers.providers.sdk_provider import SdkProvider

__all__ = ["SUPPORTED_APIS", "ProviderRegistry", "build_provider"]


def build_provider(settings: ProviderSettings) -> SdkProvider:
    if settings.api == "anthropic-messages":
        return AnthropicProvider(settings)
    return OpenAICompatProvider(settings)


class ProviderRegistry:
    """Provider instances by name, built once per process from configuration.

    ``pi_models``: pi's models.json as loaded (default: found from ``PI_CODING_AGENT_DIR`` or pi's
    agent directory); a broken file never breaks the registry — its problem is reported when one of
    the providers it would have defined is used.
    """

    def __init__(self, config: Mapping[str, Any] | None = None,
                 scripts: Mapping[str, Script | Mapping[str, Any]] | None = None, *,
                 pi_models: PiModels | None = None, pi_models_path: str | Path | None = None) -> None:
        parsed = {name: s if isinstance(s, Script) else load_script(s) for name, s in (scripts or {}).items()}
        self._providers: dict[str, Provider] = {"scripted": ScriptedProvider(scripts=parsed)}
        self.pi = pi_models if pi_models is not None else load_pi_models(pi_models_path)
        self.settings: dict[str, ProviderSettings] = {n: parse_entry(n, {}, source="built in") for n in ALWAYS_BUILTIN}
        self.settings.update(self.pi.providers)
        for name, entry in (config or {}).items():
            if name == "scripted":
                raise ProviderError("providers.scripted is reserved for the built-in scripted provider")
            self.settings[name] = parse_entry(name, entry)
        for name, s in self.settings.items():
            self._providers[name] = build_provider(s)
        for problem in self.pi.problems:
            logger.warning("pi models.json: {}", problem)

    @property
    def known(self) -> list[str]:
        return sorted(self._providers)

    async def aclose(self) -> None:
        """Close the providers' pooled HTTP clients (call once when the hosting process stops)."""
        for provider in self._providers.values():
            if isinstance(provider, SdkProvider):
                await provider.aclose()

    def resolve(self, model: str) -> tuple[Provider, ModelRef]:
        """Provider and parsed reference for ``model``; raise ProviderError listing known providers."""
        ref = parse_model_ref(model)
        provider = self._providers.get(ref.provider)
        if provider is None:
            broken = self.pi.broken.get(ref.provider)
            if broken:
                raise ProviderError(f"provider {ref.provider!r} (from pi's models.json) is not usable: {broken}")
            note = f"; pi's models.json was not loaded: {self.pi.problems[0]}" if self.pi.problems else ""
            raise ProviderError(f"unknown provider {ref.provider!r} in model {model!r}; known providers: "
                                f"{', '.join(self.known)} (add it under 'providers' in settings){note}")
        if isinstance(provider, SdkProvider):
            provider.check_model(ref.model_id)
        return provider, ref
