"""Model-scope checks and the visible warning lines of model resolution (never fatal, docs/spec-conformance.md §10 item 38)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from legion.agents.models import ModelResolution, Origin


@dataclass(frozen=True)
class ScopeCheck:
    severity: Literal["ok", "warn", "error"]
    line: str | None = None


def classify_model_origin(origin: Origin) -> Literal["warn", "error"]:
    """An out-of-scope explicit model refuses the launch; an inherited one only warns."""
    return "error" if origin == "explicit" else "warn"


def check_model_scope(name: str, resolution: ModelResolution, scope: Iterable[str] | None) -> ScopeCheck:
    """Check the resolved model against allowed patterns (fnmatch); None/empty = no scope."""
    patterns = [p for p in (scope or ()) if p]
    if not patterns or any(
        fnmatch.fnmatchcase(m, p) for p in patterns for m in (resolution.model, resolution.label)
    ):
        return ScopeCheck("ok")
    severity = classify_model_origin(resolution.origin)
    text = (
        f"{name}: model {resolution.label} ({resolution.origin}, from {resolution.detail}) "
        f"is outside the model scope [{', '.join(patterns)}]"
    )
    if severity == "error":
        return ScopeCheck("error", f"✗ {text}")
    return ScopeCheck("warn", f"⚠ {text}; launching anyway")


def warning_lines(name: str, warnings: Iterable[str]) -> list[str]:
    """The visible, non-fatal warning lines printed after a `▶` launch or `Resumed …` line."""
    return [f"  ⚠ {name}: {w}" for w in warnings]
