"""Tool-call arguments checked against the tool's JSON Schema by jsonschema-rs, compiled once per schema.

The same validator checks role cards and settings (`legion.agents.schema`). A valid call costs one `is_valid`
(no error objects are built); only a failing one asks for the errors, which come back in the texts a model can act
on: the JSON path of the offending value and what was expected, all problems at once, in document order.
"""

from __future__ import annotations

import math
from typing import Any

import jsonschema_rs

from legion.agents.schema import closest
from legion.docpath import Loc, document_order, value_at

Schema = dict[str, Any]

_COMPILED: dict[int, tuple[Schema, Any]] = {}


def _validator(schema: Schema) -> Any:
    """The compiled validator of a schema (the tools' schemas are module or instance constants)."""
    hit = _COMPILED.get(id(schema))
    if hit is None or hit[0] is not schema:
        hit = _COMPILED[id(schema)] = (schema, jsonschema_rs.validator_for(schema))
    return hit[1]


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return ("integer" if value.is_integer() else "number") if math.isfinite(value) else repr(value)
    for name, kind in (("string", str), ("array", list), ("object", dict)):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def _path(base: str, loc: Loc) -> str:
    return base + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def validate(value: Any, schema: Schema, path: str = "arguments") -> list[str]:
    """All violations of ``schema`` by ``value`` (empty list = valid)."""
    validator = _validator(schema)
    try:
        if validator.is_valid(value):
            return []
        errors = list(validator.iter_errors(value))
    except ValueError as exc:  # not a JSON value (tool arguments are parsed JSON, so only a direct caller)
        return [f"{path}: not a JSON value ({exc})"]
    found: list[tuple[Loc, str]] = []
    typed = {tuple(e.instance_path) for e in errors if e.kind.name == "type"}
    for error in errors:
        loc = tuple(error.instance_path)
        if error.kind.name != "type" and any(loc[: len(t)] == t for t in typed):
            continue  # the wrong type says it all
        found += _texts(error, loc, path, schema, value_at(value, loc))
    order = {loc: document_order(value, loc) for loc, _ in found}
    return [text for _, text in sorted(found, key=lambda item: order[item[0]])]


def _texts(error: Any, loc: Loc, base: str, schema: Schema, value: Any) -> list[tuple[Loc, str]]:
    """(where, text) for one validator error on `value`; a required or unknown key is named at its own path."""
    kind, at = error.kind, _path(base, loc)
    name = kind.name
    if name == "type":
        return [(loc, f"{at}: expected {' or '.join(kind.types)}, got {_type_name(value)}")]
    if name == "required":
        # before the object's keys: a missing parameter is the first thing to fix
        return [((*loc, -1), f"{at}.{kind.property}: required parameter is missing")]
    if name == "additionalProperties":
        holder = value_at(schema, tuple(error.schema_path)[:-1])  # the schema object holding the keyword
        legal = sorted(holder.get("properties", {})) if isinstance(holder, dict) else []
        out = []
        for key in kind.unexpected:
            near = closest(key, legal)
            hint = f"; did you mean '{near}'?" if near else ""
            out.append(((*loc, key), f"{at}.{key}: unknown parameter; allowed: {', '.join(legal) or '(none)'}{hint}"))
        return out
    texts = {
        "enum": lambda: f"must be one of {', '.join(repr(v) for v in kind.options)}, got {value!r}",
        "minimum": lambda: f"must be >= {kind.limit}, got {value}",
        "maximum": lambda: f"must be <= {kind.limit}, got {value}",
        "minLength": lambda: f"must be at least {kind.limit} characters",
        "maxLength": lambda: f"must be at most {kind.limit} characters",
        "minItems": lambda: f"needs at least {kind.limit} items",
        "maxItems": lambda: f"takes at most {kind.limit} items",
    }
    text = texts.get(name, lambda: error.message)()
    return [(loc, f"{at}: {text}")]
