"""pi's ``models.json``: a pi user's custom providers and models, read so they work in legion unchanged.

Found at ``$PI_CODING_AGENT_DIR/models.json``, else ``~/.pi/agent/models.json`` (pi's agent directory).
The file is only read, never written. A file that cannot be read or parsed is reported (``problems``)
and ignored; a provider block that is wrong (unknown keys, an unsupported ``api``) is reported under its
name (``broken``) while the file's other providers still load.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from legion.workers.providers.base import ProviderError
from legion.workers.providers.config import ProviderSettings, parse_entry

MAX_BYTES: Final = 4 * 1024 * 1024


@dataclass
class PiModels:
    path: Path | None = None
    providers: dict[str, ProviderSettings] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def pi_agent_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    configured = env.get("PI_CODING_AGENT_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".pi" / "agent"


def models_json_path(env: Mapping[str, str] | None = None) -> Path:
    return pi_agent_dir(env) / "models.json"


def load_pi_models(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> PiModels:
    """Read pi's models.json (absent is fine: nothing configured)."""
    file = Path(path) if path is not None else models_json_path(env)
    found = PiModels(path=file)
    try:
        if not file.is_file():
            return found
        if file.stat().st_size > MAX_BYTES:
            found.problems.append(f"{file} is larger than {MAX_BYTES} bytes; not read")
            return found
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        found.problems.append(f"{file} cannot be read: {exc}")
        return found
    except json.JSONDecodeError as exc:
        found.problems.append(f"{file} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                              "fix the file — pi will not read it either")
        return found
    providers = data.get("providers") if isinstance(data, dict) else None
    if not isinstance(providers, dict):
        found.problems.append(f"{file} must be an object with a 'providers' object (pi's models.json format)")
        return found
    for name, entry in providers.items():
        if name == "scripted":
            found.broken[name] = f"{file}: 'scripted' is reserved for legion's built-in scripted provider"
            continue
        try:
            found.providers[name] = parse_entry(name, entry, source=str(file), pi=True)
        except ProviderError as exc:
            found.broken[name] = str(exc)
    return found
