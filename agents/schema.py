"""A tiny strict schema engine shared by the card field table and the settings table.

Each spec checks one value at a dotted path and returns the normalised value, or raises
`SchemaError(path, message)`; callers turn that into a `CardError`/`SettingsError` with file
and line. Object specs reject unknown keys with the closest legal key and the full list.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


class SchemaError(Exception):
    """A value at `path` does not fit its spec (internal; wrapped by the callers)."""

    def __init__(self, path: str, message: str, *, key: str | None = None) -> None:
        self.path = path
        self.message = message
        self.key = key
        super().__init__(f"{path}: {message}" if path else message)


def closest(word: str, legal: Iterable[str]) -> str | None:
    """The legal word closest to `word` (difflib), if any is reasonably close."""
    options = list(legal)
    lowered = {o.lower(): o for o in options}
    if word.lower() in lowered:
        return lowered[word.lower()]
    hits = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not hits:
        hits = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
        hits = [lowered[h] for h in hits]
    return hits[0] if hits else None


def did_you_mean(word: str, legal: Iterable[str]) -> str:
    """` — did you mean 'y'?` for the closest legal word, or "" when nothing is close."""
    near = closest(word, legal)
    return f" — did you mean '{near}'?" if near else ""


def unknown_key_message(key: str, legal: Iterable[str], what: str) -> str:
    """`unknown key 'x' in <what> — did you mean 'y'? Legal keys: …`."""
    options = sorted(legal)
    return f"unknown key '{key}' in {what}{did_you_mean(key, options)} Legal keys: {', '.join(options)}"


def describe(value: Any) -> str:
    """A short, safe rendering of a value for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return repr(text)
    if isinstance(value, int | float):
        return repr(value)
    return f"a {type(value).__name__}"


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Spec:
    """Base spec: `check(value, path)` returns the normalised value or raises SchemaError."""

    default: Any = None

    def check(self, value: Any, path: str) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def defaults(self) -> Any:
        return self.default


@dataclass(frozen=True)
class Bool(Spec):
    default: bool | None = None

    def check(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise SchemaError(path, f"must be true or false (got {describe(value)})")
        return value


@dataclass(frozen=True)
class Int(Spec):
    minimum: int | None = None
    maximum: int | None = None
    default: int | None = None
    unit: str = ""

    def check(self, value: Any, path: str) -> int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(path, f"must be an integer{self._range()} (got {describe(value)})")
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            raise SchemaError(path, f"must be an integer{self._range()} (got {value})")
        return value

    def _range(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if self.minimum is not None and self.maximum is not None:
            return f" between {self.minimum} and {self.maximum}{unit}"
        if self.minimum is not None:
            return f" >= {self.minimum}{unit}"
        if self.maximum is not None:
            return f" <= {self.maximum}{unit}"
        return unit


@dataclass(frozen=True)
class Num(Spec):
    """A finite number (int or float, never a bool)."""

    minimum: float | None = None
    default: float | None = None

    def check(self, value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise SchemaError(path, f"must be a number (got {describe(value)})")
        if self.minimum is not None and value < self.minimum:
            raise SchemaError(path, f"must be a number >= {self.minimum} (got {value})")
        return float(value)


@dataclass(frozen=True)
class Str(Spec):
    choices: tuple[str, ...] | None = None
    pattern: re.Pattern[str] | None = None
    pattern_hint: str = ""
    nonempty: bool = True
    default: str | None = None
    validate: Callable[[str, str], str] | None = None

    def check(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise SchemaError(path, f"must be a string{self._what()} (got {describe(value)})")
        value = value.strip()
        if self.nonempty and not value:
            raise SchemaError(path, f"must be a non-empty string{self._what()}")
        if "\x00" in value:
            raise SchemaError(path, "must not contain U+0000")
        if self.choices is not None and value not in self.choices:
            raise SchemaError(
                path,
                f"must be one of: {', '.join(self.choices)} (got {describe(value)})"
                f"{did_you_mean(value, self.choices)}",
            )
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise SchemaError(
                path, f"must match {self.pattern_hint or self.pattern.pattern} (got {describe(value)})"
            )
        if self.validate is not None:
            value = self.validate(value, path)
        return value

    def _what(self) -> str:
        return f" (one of: {', '.join(self.choices)})" if self.choices else ""


@dataclass(frozen=True)
class ListOf(Spec):
    item: Spec
    unique: bool = False
    allow_csv: bool = False
    nonempty: bool = False
    default: Any = None

    def check(self, value: Any, path: str) -> list[Any]:
        if self.allow_csv and isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            csv = " or a comma-separated string" if self.allow_csv else ""
            raise SchemaError(path, f"must be a list{csv} (got {describe(value)})")
        if self.nonempty and not value:
            raise SchemaError(path, "must not be empty")
        out = [self.item.check(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if self.unique:
            seen: set[Any] = set()
            for i, v in enumerate(out):
                marker = repr(v)
                if marker in seen:
                    raise SchemaError(f"{path}[{i}]", f"duplicate entry {describe(v)}")
                seen.add(marker)
        return out


@dataclass(frozen=True)
class Obj(Spec):
    fields: Mapping[str, Spec]
    what: str = "object"
    required: tuple[str, ...] = ()
    forbidden: Mapping[str, str] = field(default_factory=dict)
    docs: Mapping[str, str] = field(default_factory=dict)  # key -> what it does (the generated references)

    def __post_init__(self) -> None:
        stray = set(self.docs) - set(self.fields)
        if stray:
            raise ValueError(f"{self.what}: docs for keys it does not have: {', '.join(sorted(stray))}")

    def check(self, value: Any, path: str) -> dict[str, Any]:
        out, problems = self.check_each(value, path)
        if problems:
            raise problems[0]
        return out

    def check_each(self, value: Any, path: str) -> tuple[dict[str, Any], list[SchemaError]]:
        """Check every key (not only up to the first bad one): the values that fit, and one error per
        key that does not (the first problem inside it), in the mapping's order."""
        if not isinstance(value, dict):
            return {}, [SchemaError(path, f"must be an object/mapping (got {describe(value)})")]
        out: dict[str, Any] = {}
        problems: list[SchemaError] = []
        for key, raw in value.items():
            try:
                out[key] = self._check_key(key, raw, path)
            except SchemaError as exc:
                problems.append(exc)
        for key in self.required:
            if key not in out and not any(p.path == join(path, key) for p in problems):
                problems.append(SchemaError(join(path, key), f"is required in {self.what}"))
        return out, problems

    def _check_key(self, key: Any, raw: Any, path: str) -> Any:
        if not isinstance(key, str):
            raise SchemaError(path, f"keys must be strings (got {describe(key)})", key=str(key))
        sub = join(path, key)
        if key in self.forbidden:
            raise SchemaError(sub, self.forbidden[key], key=key)
        spec = self.fields.get(key)
        if spec is None:
            raise SchemaError(sub, unknown_key_message(key, self.fields, self.what), key=key)
        return spec.check(raw, sub)

    def defaults(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, spec in self.fields.items():
            value = spec.defaults()
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class MapOf(Spec):
    value: Spec
    key: Str | None = None
    default: Any = None

    def check(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise SchemaError(path, f"must be an object/mapping (got {describe(value)})")
        out: dict[str, Any] = {}
        for key, raw in value.items():
            if not isinstance(key, str):
                raise SchemaError(path, f"keys must be strings (got {describe(key)})")
            sub = join(path, key)
            if self.key is not None:
                key = self.key.check(key, sub)
            out[key] = self.value.check(raw, sub)
        return out

    def defaults(self) -> Any:
        return self.default


@dataclass(frozen=True)
class Either(Spec):
    """The first spec whose type test accepts the value decides (e.g. string-or-object members)."""

    options: tuple[tuple[Callable[[Any], bool], Spec], ...]
    expected: str = ""

    def check(self, value: Any, path: str) -> Any:
        for accepts, spec in self.options:
            if accepts(value):
                return spec.check(value, path)
        raise SchemaError(path, f"must be {self.expected} (got {describe(value)})")


@dataclass(frozen=True)
class Custom(Spec):
    """A hand-written check (for shapes the small engine does not cover)."""

    fn: Callable[[Any, str], Any]
    default: Any = None

    def check(self, value: Any, path: str) -> Any:
        return self.fn(value, path)


def type_name(spec: Spec) -> str:
    """A short human description of what a spec accepts."""
    if isinstance(spec, Bool):
        return "boolean"
    if isinstance(spec, Int):
        return f"integer{spec._range()}"
    if isinstance(spec, Num):
        return "number"
    if isinstance(spec, Str):
        if spec.choices:
            return " | ".join(spec.choices)
        return f"string ({spec.pattern_hint})" if spec.pattern_hint else "string"
    if isinstance(spec, ListOf):
        return f"list of {type_name(spec.item)}"
    if isinstance(spec, Obj):
        return f"object ({spec.what})"
    if isinstance(spec, MapOf):
        return f"map of {type_name(spec.value)}"
    if isinstance(spec, Either):
        return spec.expected
    return "value"


def keys(spec: Spec, prefix: str = "") -> Iterator[tuple[str, Spec, str]]:
    """(dotted path, spec, description) for every key a spec accepts; map keys shown as `<name>`, list items
    as `[]`."""
    if isinstance(spec, Obj):
        for key, sub in spec.fields.items():
            path = join(prefix, key)
            yield path, sub, spec.docs.get(key, "")
            yield from (row for row in keys(sub, path) if row[0] != path)
    elif isinstance(spec, MapOf):
        yield from keys(spec.value, join(prefix, "<name>"))
    elif isinstance(spec, ListOf):
        yield from keys(spec.item, f"{prefix}[]")
    elif isinstance(spec, Either):
        for _, option in spec.options:
            yield from keys(option, prefix)


def reference(spec: Spec, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted path, accepted type, default) for every key a spec accepts."""
    return [(path, type_name(sub), sub.defaults()) for path, sub, _ in keys(spec, prefix)]
