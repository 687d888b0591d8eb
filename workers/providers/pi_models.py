"""pi's ``models.json``: a pi user's custom providers and models, read so they work in legion unchanged.

Found at ``$PI_CODING_AGENT_DIR/models.json``, else ``~/.pi/agent/models.json`` (pi's agent directory).
The file is only read, never written. A file that cannot be read or parsed is reported (``problems``)
and ignored; a provider block that is wrong (unknown keys, an unsupported ``api``) is reported under its
name (``broken``) while the file's other providers still load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from legion.agents.registry import read_pi_models
from legion.workers.providers.base import ProviderError
from legion.workers.providers.config import ProviderSettings, parse_entry


@dataclass
class PiModels:
    path: Path | None = None
    providers: dict[str, ProviderSettings] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def load_pi_models(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> PiModels:
    """Read pi's models.json (absent is fine: nothing configured) and check each provider block."""
    raw = read_pi_models(path, env)
    found = PiModels(path=raw.path, problems=[raw.problem] if raw.problem else [])
    for name, entry in raw.providers.items():
        if name == "scripted":
            found.broken[name] = f"{raw.path}: 'scripted' is reserved for legion's built-in scripted provider"
            continue
        try:
            found.providers[name] = parse_entry(name, entry, source=str(raw.path), pi=True)
        except ProviderError as exc:
            found.broken[name] = str(exc)
    return found
