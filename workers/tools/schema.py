"""A compact JSON-schema validator for the subset tool parameters use.

Supported keywords: ``type`` (object, string, integer, number, boolean, array, null, or a list of
them), ``properties``, ``required``, ``additionalProperties`` (bool), ``enum``, ``minimum``,
``maximum``, ``minLength``, ``maxLength``, ``items``, ``minItems``, ``maxItems``, ``description``
(ignored). Errors name the JSON path of the offending value and what was expected, so a model can fix
its call.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "null": (type(None),),
}


def _type_name(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "array", "object", "null"):
        if _is(value, name):
            return name
    return type(value).__name__


def _is(value: Any, type_name: str) -> bool:
    if type_name in ("integer", "number") and isinstance(value, bool):
        return False
    if type_name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(type_name, (object,)))


def validate(value: Any, schema: Schema, path: str = "arguments") -> list[str]:
    """All violations of ``schema`` by ``value`` (empty list = valid)."""
    errors: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, t) for t in names):
            return [f"{path}: expected {' or '.join(names)}, got {_type_name(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: must be one of {', '.join(repr(v) for v in schema['enum'])}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: must be <= {schema['maximum']}, got {value}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path}: must be at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: must be at most {schema['maxLength']} characters")
    if isinstance(value, list):
        errors += _validate_array(value, schema, path)
    if isinstance(value, dict):
        errors += _validate_object(value, schema, path)
    return errors


def _validate_array(value: list[Any], schema: Schema, path: str) -> list[str]:
    errors: list[str] = []
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(f"{path}: needs at least {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{path}: takes at most {schema['maxItems']} items")
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            errors += validate(item, items, f"{path}[{i}]")
    return errors


def _validate_object(value: dict[str, Any], schema: Schema, path: str) -> list[str]:
    errors: list[str] = []
    props: dict[str, Schema] = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            errors.append(f"{path}.{key}: required parameter is missing")
    for key, item in value.items():
        if key in props:
            errors += validate(item, props[key], f"{path}.{key}")
        elif schema.get("additionalProperties") is False:
            errors.append(f"{path}.{key}: unknown parameter; allowed: {', '.join(sorted(props)) or '(none)'}")
    return errors
