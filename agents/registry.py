"""Known model providers and their listed models, for resolution warnings and pin validation.

Known = the workers' built-ins, pi's own ``models.json`` (a pi user's custom providers work in legion
unchanged) and the settings' ``providers`` (which win per provider).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from legion.agents.locations import process_env
from legion.agents.modelspec import provider_of, split_thinking_suffix
from legion.agents.settings import Settings

# The workers' ProviderRegistry always has these (openai = api.openai.com, anthropic = the Messages API;
# any model id).
BUILTIN_PROVIDERS: Final[Mapping[str, frozenset[str] | None]] = {"scripted": None, "openai": None,
                                                                 "anthropic": None}
CUSTOM_MODEL_WARNING: Final = "Using custom model id."
PI_MODELS_MAX_BYTES: Final = 4 * 1024 * 1024


@dataclass(frozen=True)
class PiModelsFile:
    """pi's models.json as read: its ``providers`` object (empty when absent or unreadable) and why not."""

    path: Path
    providers: Mapping[str, Any] = field(default_factory=dict)
    problem: str | None = None

    @property
    def found(self) -> bool:
        return self.path.is_file()


def pi_models_path(env: Mapping[str, str] | None = None) -> Path:
    """``$PI_CODING_AGENT_DIR/models.json``, else pi's default agent directory ``~/.pi/agent``."""
    env = process_env() if env is None else env
    configured = env.get("PI_CODING_AGENT_DIR", "").strip()
    agent_dir = Path(configured).expanduser() if configured else Path(env.get("HOME") or Path.home()) / ".pi" / "agent"
    return agent_dir / "models.json"


def read_pi_models(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> PiModelsFile:
    """Read (never write) pi's models.json; a broken file is reported in ``problem``, not raised."""
    file = Path(path) if path is not None else pi_models_path(env)
    try:
        if not file.is_file():
            return PiModelsFile(file)
        if file.stat().st_size > PI_MODELS_MAX_BYTES:
            return PiModelsFile(file, problem=f"{file} is larger than {PI_MODELS_MAX_BYTES} bytes; not read")
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return PiModelsFile(file, problem=f"{file} cannot be read: {exc}")
    except json.JSONDecodeError as exc:
        return PiModelsFile(file, problem=f"{file} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                                          f"{exc.msg}); fix the file — pi will not read it either")
    providers = data.get("providers") if isinstance(data, dict) else None
    if not isinstance(providers, dict):
        return PiModelsFile(file, problem=f"{file} must be an object with a 'providers' object (pi's models.json format)")
    return PiModelsFile(file, providers)


def _listed(models: Any) -> frozenset[str] | None:
    ids = [m if isinstance(m, str) else m.get("id") for m in models or [] if isinstance(m, str | dict)]
    return frozenset(i for i in ids if isinstance(i, str)) or None


@dataclass(frozen=True)
class ModelRegistry:
    """Known providers → their listed model ids (None = any id is fine)."""

    providers: Mapping[str, frozenset[str] | None]

    @classmethod
    def from_settings(cls, settings: Settings, pi_models: PiModelsFile | None = None,
                      env: Mapping[str, str] | None = None) -> ModelRegistry:
        """Built-ins, then pi's models.json (read from where ``env`` says unless given), then settings."""
        found: dict[str, frozenset[str] | None] = dict(BUILTIN_PROVIDERS)
        pi = read_pi_models(env=env) if pi_models is None else pi_models
        for name, prov in pi.providers.items():
            if isinstance(prov, dict):
                found[name] = _listed(prov.get("models"))
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
