"""Model strings `provider/model-id[:thinking]`: syntax, thinking suffixes and the one display label.

Only *known* thinking levels are treated as a suffix; `ollama/llama3:8b` keeps `:8b` as part of
the model id (a variant), so nothing ever chops a real model name (docs/spec-conformance.md §1.5, R8).
"""

from __future__ import annotations

import difflib
import re
from typing import Final

from legion.agents.schema import SchemaError, describe

INHERIT: Final = "inherit"
THINKING_LEVELS: Final = ("off", "minimal", "low", "medium", "high", "xhigh")
# `thinking` as written on a card/preset/override: a level, or `false` = "strip any level, append none".
Thinking = str | bool | None

_MODEL_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[^\s:][^\s]*")
MODEL_SYNTAX: Final = "provider/model-id[:thinking] (or 'inherit')"


def blank(value: str | None) -> bool:
    """None or only whitespace: a value that yields to the next source."""
    return value is None or not value.strip()


def split_thinking_suffix(model: str) -> tuple[str, str | None]:
    """(`base`, `level`) when the string ends in `:<known level>`, else (`model`, None)."""
    head, sep, tail = model.rpartition(":")
    if sep and head and tail in THINKING_LEVELS:
        return head, tail
    return model, None


def suspicious_suffix(model: str) -> str | None:
    """A warning when the suffix looks like a misspelt thinking level (kept, never fatal)."""
    head, sep, tail = model.rpartition(":")
    if not sep or not head or tail in THINKING_LEVELS or not tail.isalpha():
        return None
    near = difflib.get_close_matches(tail.lower(), THINKING_LEVELS, n=1, cutoff=0.7)
    if not near:
        return None
    return (
        f"model {model!r}: suffix ':{tail}' is not a thinking level (did you mean ':{near[0]}'?); "
        f"it is kept as part of the model id. Known levels: {', '.join(THINKING_LEVELS)}"
    )


def provider_of(model: str) -> str | None:
    """The provider prefix of a model string (known thinking suffix ignored), or None."""
    base, _ = split_thinking_suffix(model)
    provider, sep, rest = base.partition("/")
    return provider if sep and provider and rest else None


def model_label(model: str | None, thinking: Thinking = None) -> str:
    """The one display/spawn form: a known suffix in the string wins, else a known level is appended."""
    if not model:
        return ""
    _, level = split_thinking_suffix(model)
    if level is not None or thinking is None or thinking is False or thinking is True:
        return model
    return f"{model}:{thinking}" if thinking in THINKING_LEVELS else model


def check_model_string(value: str, path: str, *, allow_inherit: bool = True) -> str:
    """Schema validator for a model string; `inherit` only where allowed."""
    if value == INHERIT:
        if allow_inherit:
            return value
        raise SchemaError(
            path,
            "'inherit' is not allowed here: it means \"use the parent session's model\" and only makes "
            "sense on a card, an override or a launch. Set a concrete provider/model-id",
        )
    if not _MODEL_RE.fullmatch(value) or value.endswith(":"):
        raise SchemaError(path, f"must be a model of the form {MODEL_SYNTAX} (got {describe(value)})")
    return value


def check_thinking(value: object, path: str) -> str | bool:
    """A thinking value: a known level or `false`."""
    if value is False:
        return False
    if isinstance(value, str) and value.strip() in THINKING_LEVELS:
        return value.strip()
    levels = ", ".join(THINKING_LEVELS)
    raise SchemaError(path, f"must be one of: {levels}, or false to strip any level (got {describe(value)})")
