"""Deep merge of settings layers: dicts recursively, lists and scalars replaced; provider sections
(`providers`) merge per provider and a provider's `models` per model `id`. Also the explicit-path
collector used for docs/spec-conformance.md §10 item 18.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_settings(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge `over` onto `base`; provider sections per provider, provider models per id."""
    out = deep_merge(dict(base), {k: v for k, v in over.items() if k != "providers"})
    if "providers" in over and isinstance(over["providers"], dict):
        providers = dict(out.get("providers") or {})
        for name, section in over["providers"].items():
            old = providers.get(name)
            if isinstance(old, dict) and isinstance(section, dict):
                merged = deep_merge(old, {k: v for k, v in section.items() if k != "models"})
                if "models" in section:
                    merged["models"] = _merge_models(old.get("models"), section["models"])
                providers[name] = merged
            else:
                providers[name] = copy.deepcopy(section)
        out["providers"] = providers
    return out


def _merge_models(old: Any, new: Any) -> Any:
    if not isinstance(old, list) or not isinstance(new, list):
        return copy.deepcopy(new)

    def key(m: Any) -> Any:
        return m if isinstance(m, str) else (m.get("id") if isinstance(m, dict) else repr(m))

    replaced = {key(m) for m in new}
    return [m for m in old if key(m) not in replaced] + copy.deepcopy(new)


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def explicit_paths(raw: Mapping[str, Any], prefix: str = "") -> set[str]:
    """Every dotted path present in a raw settings mapping (leaves and the sections above them)."""
    out: set[str] = set()
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        out.add(dotted)
        if isinstance(value, dict):
            out |= explicit_paths(value, dotted)
    return out
