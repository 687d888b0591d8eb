"""Presets (docs/spec-conformance.md §1.4): atomic `kind`/`model`/`thinking` objects; a missing preset is an error."""

from __future__ import annotations

from legion.agents.errors import PresetError
from legion.agents.schema import did_you_mean
from legion.agents.settings import Preset, Settings


def require_preset(settings: Settings, name: str, *, referenced_by: str = "") -> Preset:
    """The named preset, whole; never a fallback to another model when it is missing."""
    key = name.strip()
    preset = settings.presets.get(key)
    if preset is not None:
        return preset
    hint = did_you_mean(key, settings.presets)
    by = f" (referenced by {referenced_by})" if referenced_by else ""
    known = (
        ", ".join(sorted(settings.presets)) or "none (define one under 'presets' in .legion/settings.json)"
    )
    raise PresetError(f"unknown preset '{key}'{by}{hint} Known presets: {known}")
