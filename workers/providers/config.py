"""A provider entry (pi ``models.json`` shape) parsed and checked once, plus key resolution.

Entry keys::

    {"baseUrl": "http://127.0.0.1:8000/v1",   # default: the built-in's (and OPENAI_BASE_URL / ANTHROPIC_BASE_URL)
     "api": "openai-completions",           # or "anthropic-messages"
     "apiKey": "VLLM_API_KEY",              # the environment variable holding the key (or apiKeyEnv)
     "apiKeyLiteral": "sk-…",               # the key itself (prefer a variable)
     "headers": {"X-Extra": "1"},
     "timeoutMs": 120000,                   # read timeout per chunk
     "maxRetries": 2,                       # retries of 429/5xx/529/connection errors (retry.py)
     "models": ["llama3:8b", {"id": "qwen", "cost": {"input": 0.5, "output": 1.5,
                                                    "cacheRead": 0.05, "cacheWrite": 0.6},
                              "maxTokens": 8192, "reasoning": true}]}

Keys are looked up in the *session's* environment mapping, never ``os.environ`` directly. Entries read
from pi's own ``models.json`` follow pi's rule for ``apiKey`` (a variable name, else the key itself).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from legion.workers.providers.base import ProviderError

ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PI_ENV_NAME: Final = re.compile(r"^[A-Z][A-Z0-9_]*$")
SUPPORTED_APIS: Final = ("openai-completions", "anthropic-messages")
PROVIDER_KEYS: Final = frozenset({"baseUrl", "api", "apiKey", "apiKeyEnv", "apiKeyLiteral", "headers", "timeoutMs",
                                  "maxRetries", "models"})
PI_ONLY_KEYS: Final = frozenset({"authHeader", "compat", "modelOverrides", "name"})  # accepted, not used


@dataclass(frozen=True)
class Builtin:
    api: str
    base_url: str
    key_env: str
    base_url_env: str | None = None


# pi's environment-variable names for its built-in providers (packages/ai env-api-keys); anthropic and
# openai are always available, the others supply defaults when an entry of that name is configured.
BUILTINS: Final[Mapping[str, Builtin]] = {
    "anthropic": Builtin("anthropic-messages", "https://api.anthropic.com", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    "openai": Builtin("openai-completions", "https://api.openai.com/v1", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "openrouter": Builtin("openai-completions", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "groq": Builtin("openai-completions", "https://api.groq.com/openai/v1", "GROQ_API_KEY"),
    "xai": Builtin("openai-completions", "https://api.x.ai/v1", "XAI_API_KEY"),
    "cerebras": Builtin("openai-completions", "https://api.cerebras.ai/v1", "CEREBRAS_API_KEY"),
    "mistral": Builtin("openai-completions", "https://api.mistral.ai/v1", "MISTRAL_API_KEY"),
}
ALWAYS_BUILTIN: Final = ("anthropic", "openai")


@dataclass(frozen=True)
class ProviderSettings:
    name: str
    api: str
    base_url: str | None  # None: the built-in default (after the base-URL variable)
    base_url_env: str | None = None
    key_env: str | None = None
    key_literal: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    timeout_ms: int = 120_000
    max_retries: int = 2
    source: str = "settings"

    def url(self, env: Mapping[str, str]) -> str:
        """The base URL for a call: configured, else the base-URL variable, else the built-in's."""
        if self.base_url:
            return self.base_url
        from_env = env.get(self.base_url_env) if self.base_url_env else None
        builtin = BUILTINS.get(self.name)
        return (from_env or (builtin.base_url if builtin else "")).rstrip("/")

    def model(self, model_id: str) -> Mapping[str, Any]:
        return self.models.get(model_id, {})

    def key(self, env: Mapping[str, str]) -> tuple[str | None, str | None]:
        """(key, error); no key configured at all is (None, None): a local server without auth."""
        if self.key_literal:
            return self.key_literal, None
        if not self.key_env:
            return None, None
        value = env.get(self.key_env)
        fix = f"set it, or change providers.{self.name}.apiKey ({self.source})"
        if value is None:
            return None, (f"provider {self.name!r}: API key missing — environment variable {self.key_env} is "
                          f"not set for this session ({fix})")
        if not value.strip():
            return None, (f"provider {self.name!r}: API key missing — environment variable {self.key_env} is "
                          f"set but empty ({fix})")
        return value.strip(), None

    def check_model(self, model_id: str) -> None:
        if self.models and model_id not in self.models:
            from legion.workers.providers.pricing import closest

            near = closest(model_id, sorted(self.models))
            hint = f"; closest: {', '.join(near)}" if near else ""
            raise ProviderError(f"provider {self.name!r} has no model {model_id!r}{hint}; configured models: "
                                f"{', '.join(sorted(self.models))}")


def parse_entry(name: str, cfg: Mapping[str, Any], *, source: str = "settings", pi: bool = False) -> ProviderSettings:
    """Check one entry; raise ProviderError naming the bad key, where it came from and the fix."""
    where = f"providers.{name} ({source})"
    if not isinstance(cfg, Mapping):
        raise ProviderError(f"{where} must be an object like pi's models.json entries")
    allowed = PROVIDER_KEYS | (PI_ONLY_KEYS if pi else frozenset())
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ProviderError(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    builtin = BUILTINS.get(name)
    api = cfg.get("api", builtin.api if builtin else "openai-completions")
    if api not in SUPPORTED_APIS:
        raise ProviderError(f"{where}.api {api!r} is not supported; supported: {', '.join(SUPPORTED_APIS)}")
    base = cfg.get("baseUrl")
    if base is None and builtin is None:
        raise ProviderError(f"{where}.baseUrl is required for a provider that is not built in "
                            f"(built in: {', '.join(sorted(BUILTINS))})")
    if base is not None and (not isinstance(base, str) or not base.startswith(("http://", "https://"))):
        raise ProviderError(f"{where}.baseUrl must be an http(s) URL, got {base!r}")
    key_env, key_literal = _key(where, cfg, builtin, pi)
    return ProviderSettings(
        name=name, api=api, base_url=base.rstrip("/") if isinstance(base, str) else None,
        base_url_env=builtin.base_url_env if builtin else None, key_env=key_env, key_literal=key_literal,
        headers=_headers(where, cfg.get("headers", {})), models=_models(where, cfg.get("models", [])),
        timeout_ms=_positive(where, "timeoutMs", cfg.get("timeoutMs", 120_000)),
        max_retries=_positive(where, "maxRetries", cfg.get("maxRetries", 2), zero=True), source=source)


def _key(where: str, cfg: Mapping[str, Any], builtin: Builtin | None, pi: bool) -> tuple[str | None, str | None]:
    literal = cfg.get("apiKeyLiteral")
    if literal is not None and (not isinstance(literal, str) or not literal.strip()):
        raise ProviderError(f"{where}.apiKeyLiteral must be a non-empty string")
    key = cfg.get("apiKeyEnv", cfg.get("apiKey", builtin.key_env if builtin else None))
    if key is None or literal:
        return None, literal
    if not isinstance(key, str) or not key:
        raise ProviderError(f"{where}.apiKey must be a string naming an environment variable")
    if pi:
        if key.startswith("!"):
            raise ProviderError(f"{where}.apiKey runs a shell command ({key[:20]}…), which legion does not do; "
                                "export the key in an environment variable and name it in apiKey")
        return (key, None) if PI_ENV_NAME.match(key) else (None, key)  # pi: a variable name, else the key
    if not ENV_NAME.match(key):
        raise ProviderError(f"{where}.apiKey must name an environment variable (e.g. OPENAI_API_KEY); "
                            "put a literal key in apiKeyLiteral instead")
    return key, None


def _headers(where: str, headers: Any) -> dict[str, str]:
    if not isinstance(headers, Mapping) or not all(isinstance(v, str) for v in headers.values()):
        raise ProviderError(f"{where}.headers must map header names to strings")
    return dict(headers)


def _models(where: str, raw: Any) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for m in raw if isinstance(raw, list) else [None]:
        entry = {"id": m} if isinstance(m, str) else m
        if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), str):
            raise ProviderError(f"{where}.models must be a list of model ids or objects with an 'id' string")
        cost = entry.get("cost")
        if cost is not None and (not isinstance(cost, Mapping) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in cost.values())):
            raise ProviderError(f"{where}.models[{entry['id']!r}].cost must map input/output/cacheRead/cacheWrite "
                                "to non-negative $ per million tokens")
        out[entry["id"]] = entry
    return out


def _positive(where: str, key: str, value: Any, *, zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise ProviderError(f"{where}.{key} must be a {'non-negative' if zero else 'positive'} integer")
    return value
