"""The spec language of the card field table and the settings table, checked by one JSON Schema validator.

A spec declares what one value may be (type, range, choices, pattern, default, docs; the generated references read
them). `Obj.check`/`check_each` compile a whole table once into JSON Schema and check a document with jsonschema-rs,
the validator that also checks tool-call arguments (`legion.workers.tools.schema`). Its errors come back as
`SchemaError(path, message)` in the texts the specs define (the dotted path, "did you mean", the legal keys); the
callers add file and line. Of several problems the first in document order counts, as a reader meets them.

Two steps the schema language cannot say sit before the validator: `prepare` normalises (strings stripped, a
comma-separated string read as a list, integral floats as ints) and runs the domain checks (`Str.validate`,
`Custom`: a model string, a phase machine); and a value JSON cannot hold (a YAML date, a set, NaN) reaches the
validator as null, so it fails the type check and the message names the real value.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from legion.docpath import Loc, document_order, value_at

# of several errors at one place, the one a reader should fix first (the old engine's check order)
_RANK = {name: n for n, name in enumerate(
    ("type", "falseSchema", "minLength", "minItems", "enum", "pattern", "minimum", "maximum", "uniqueItems"))}
_FIRST, _VALIDATOR, _LAST = 0, 10, 100  # a prepare problem before / after the validator's at the same place
# values one document may hold: far above any real card or settings file, far below what YAML aliases can expand to
MAX_VALUES = 100_000
MAX_DEPTH = 64  # nesting; a YAML alias inside its own anchor nests without end


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


def dotted(prefix: str, loc: Iterable[str | int]) -> str:
    """`prefix` extended by a location: `.key` per key, `[i]` per list index."""
    out = prefix
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else join(out, part)
    return out


@dataclass
class _Check:
    """One document's check: the problems found before the validator, the real values it was shown as null, and
    the domain checks' results to put in place of their raw values."""

    prefix: str
    problems: list[tuple[Loc, int, SchemaError]] = field(default_factory=list)
    originals: dict[Loc, Any] = field(default_factory=dict)
    results: dict[Loc, Any] = field(default_factory=dict)

    values: int = 0

    def count(self, n: int, loc: Loc) -> None:
        """Count `n` more values at `loc`; past `MAX_VALUES` values or `MAX_DEPTH` levels the check stops (YAML
        aliases can expand without end, or refer to themselves)."""
        self.values += n
        if self.values > MAX_VALUES:
            raise _TooLarge(f"holds more than {MAX_VALUES} values (YAML aliases that expand?); write the values "
                            "out, a real file is far smaller")
        if len(loc) > MAX_DEPTH:
            raise _TooLarge(f"nests more than {MAX_DEPTH} levels deep at {self.path(loc[:MAX_DEPTH])}… (a YAML "
                            "alias inside its own anchor?); write the values out")

    def problem(self, loc: Loc, message: str, *, rank: int = _FIRST, key: str | None = None) -> None:
        self.problems.append((loc, rank, SchemaError(dotted(self.prefix, loc), message, key=key)))

    def path(self, loc: Loc) -> str:
        return dotted(self.prefix, loc)


class _TooLarge(Exception):
    """A document holds more than `MAX_VALUES` values or nests deeper than `MAX_DEPTH` (the message says which)."""


def _json_safe(value: Any, loc: Loc, check: _Check) -> Any:
    """`value` as the validator can take it: non-JSON values become null (remembered), non-string keys problems."""
    if value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
    elif isinstance(value, list | tuple):
        check.count(len(value), loc)
        return [_json_safe(v, (*loc, i), check) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        check.count(len(value), loc)
        out: dict[str, Any] = {}
        for key, raw in value.items():
            if isinstance(key, str):
                out[key] = _json_safe(raw, (*loc, key), check)
            else:
                check.problem(loc, f"keys must be strings (got {describe(key)})", key=str(key))
        return out
    check.originals[loc] = value
    return None


class Spec:
    """Base spec: a JSON Schema fragment, the normalisation before the check, and the texts of its errors."""

    default: Any = None

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:  # pragma: no cover - abstract
        """This spec's JSON Schema; `specs` maps each fragment built (by id) to its spec, for the error texts."""
        raise NotImplementedError

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        """The value normalised for the validator (a fresh copy; the input is never changed)."""
        return _json_safe(value, loc, check)

    def errors(self, kind: Any, loc: Loc, value: Any, check: _Check, base: int = _VALIDATOR) -> None:
        """Record the validator's `kind` of error at `loc` (on `value`) as this spec's text."""
        check.problem(loc, self.message(value), rank=_rank(kind, base))

    def message(self, value: Any) -> str:  # pragma: no cover - every spec with a schema overrides it
        return f"is not valid (got {describe(value)})"

    def defaults(self) -> Any:
        return self.default


def _rank(kind: Any, base: int) -> int:
    return base + _RANK.get(kind.name, len(_RANK))


def _register(spec: Spec, fragment: dict[str, Any], specs: dict[int, Spec]) -> dict[str, Any]:
    specs[id(fragment)] = spec
    return fragment


@dataclass(frozen=True)
class Bool(Spec):
    default: bool | None = None

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        return _register(self, {"type": "boolean"}, specs)

    def message(self, value: Any) -> str:
        return f"must be true or false (got {describe(value)})"


@dataclass(frozen=True)
class Int(Spec):
    minimum: int | None = None
    maximum: int | None = None
    default: int | None = None
    unit: str = ""

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return _register(self, out, specs)

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        return _json_safe(value, loc, check)

    def message(self, value: Any) -> str:
        shown = value if isinstance(value, int) and not isinstance(value, bool) else describe(value)
        return f"must be an integer{self._range()} (got {shown})"

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

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "number"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        return _register(self, out, specs)

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            check.originals[loc] = value  # messages show the number as written
            return float(value)
        return _json_safe(value, loc, check)

    def errors(self, kind: Any, loc: Loc, value: Any, check: _Check, base: int = _VALIDATOR) -> None:
        if kind.name == "minimum":
            check.problem(loc, f"must be a number >= {self.minimum} (got {value})", rank=_VALIDATOR)
        else:
            super().errors(kind, loc, value, check, base)

    def message(self, value: Any) -> str:
        return f"must be a number (got {describe(value)})"


@dataclass(frozen=True)
class Str(Spec):
    choices: tuple[str, ...] | None = None
    pattern: re.Pattern[str] | None = None
    pattern_hint: str = ""
    nonempty: bool = True
    default: str | None = None
    validate: Callable[[str, str], str] | None = None

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string"}
        if self.nonempty:
            out["minLength"] = 1
        if self.choices is not None:
            out["enum"] = list(self.choices)
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern.pattern})$"
        return _register(self, out, specs)

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        if not isinstance(value, str):
            return _json_safe(value, loc, check)
        value = value.strip()
        if "\x00" in value:
            check.problem(loc, "must not contain U+0000")
        elif self.validate is not None and value:
            try:
                value = self.validate(value, check.path(loc))
            except SchemaError as exc:
                check.problems.append((loc, _LAST, exc))
        return value

    def errors(self, kind: Any, loc: Loc, value: Any, check: _Check, base: int = _VALIDATOR) -> None:
        rank = _rank(kind, base)
        if kind.name == "minLength":
            check.problem(loc, f"must be a non-empty string{self._what()}", rank=rank)
        elif kind.name == "enum":
            choices = self.choices or ()
            check.problem(loc, f"must be one of: {', '.join(choices)} (got {describe(value)})"
                               f"{did_you_mean(str(value), choices)}", rank=rank)
        elif kind.name == "pattern":
            hint = self.pattern_hint or (self.pattern.pattern if self.pattern else "")
            check.problem(loc, f"must match {hint} (got {describe(value)})", rank=rank)
        else:
            super().errors(kind, loc, value, check, base)

    def message(self, value: Any) -> str:
        return f"must be a string{self._what()} (got {describe(value)})"

    def _what(self) -> str:
        return f" (one of: {', '.join(self.choices)})" if self.choices else ""


@dataclass(frozen=True)
class ListOf(Spec):
    item: Spec
    unique: bool = False
    allow_csv: bool = False
    nonempty: bool = False
    default: Any = None

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": self.item.schema(specs)}
        if self.nonempty:
            out["minItems"] = 1
        if self.unique:
            out["uniqueItems"] = True
        return _register(self, out, specs)

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        if self.allow_csv and isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            check.count(len(value), loc)
            return [self.item.prepare(v, (*loc, i), check) for i, v in enumerate(value)]
        return _json_safe(value, loc, check)

    def errors(self, kind: Any, loc: Loc, value: Any, check: _Check, base: int = _VALIDATOR) -> None:
        if kind.name == "minItems":
            check.problem(loc, "must not be empty", rank=_VALIDATOR)
        elif kind.name == "uniqueItems":
            seen: set[str] = set()
            for i, v in enumerate(value):
                if repr(v) in seen:
                    check.problem((*loc, i), f"duplicate entry {describe(v)}", rank=_VALIDATOR)
                    return
                seen.add(repr(v))
        else:
            super().errors(kind, loc, value, check, base)

    def message(self, value: Any) -> str:
        csv = " or a comma-separated string" if self.allow_csv else ""
        return f"must be a list{csv} (got {describe(value)})"


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

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "additionalProperties": False,
                               "properties": {key: spec.schema(specs) for key, spec in self.fields.items()}}
        if self.required:
            out["required"] = list(self.required)
        return _register(self, out, specs)

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        if not isinstance(value, dict):
            return _json_safe(value, loc, check)
        check.count(len(value), loc)
        out: dict[str, Any] = {}
        for key, raw in value.items():
            if not isinstance(key, str):
                check.problem(loc, f"keys must be strings (got {describe(key)})", key=str(key))
            elif key in self.fields:
                out[key] = self.fields[key].prepare(raw, (*loc, key), check)
            else:
                out[key] = _json_safe(raw, (*loc, key), check)
        return out

    def errors(self, kind: Any, loc: Loc, value: Any, check: _Check, base: int = _VALIDATOR) -> None:
        if kind.name == "additionalProperties":
            for key in kind.unexpected:
                text = self.forbidden.get(key) or unknown_key_message(key, self.fields, self.what)
                check.problem((*loc, key), text, rank=_VALIDATOR, key=key)
        elif kind.name == "required":
            check.problem((*loc, kind.property), f"is required in {self.what}", rank=_VALIDATOR)
        else:
            super().errors(kind, loc, value, check, base)

    def message(self, value: Any) -> str:
        return f"must be an object/mapping (got {describe(value)})"

    def check(self, value: Any, path: str) -> dict[str, Any]:
        """The document normalised, or the first problem (in document order) raised."""
        out, problems = self.check_each(value, path)
        if problems:
            raise problems[0]
        return out

    def check_each(self, value: Any, path: str) -> tuple[dict[str, Any], list[SchemaError]]:
        """Check every key (not only up to the first bad one): the values that fit, and one error per key that
        does not (the first problem inside it), in the mapping's order."""
        return _compiled(self).check_each(value, path)

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

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "additionalProperties": self.value.schema(specs)}
        if self.key is not None:
            out["propertyNames"] = self.key.schema(specs)
        return _register(self, out, specs)

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        if not isinstance(value, dict):
            return _json_safe(value, loc, check)
        check.count(len(value), loc)
        out: dict[str, Any] = {}
        for key, raw in value.items():
            if not isinstance(key, str):
                check.problem(loc, f"keys must be strings (got {describe(key)})")
                continue
            name = key.strip() if self.key is not None else key
            out[name] = self.value.prepare(raw, (*loc, name), check)
        return out

    def errors(self, kind: Any, loc: Loc, value: Any, check: _Check, base: int = _VALIDATOR) -> None:
        if kind.name == "propertyNames" and self.key is not None:
            name = kind.error.instance
            self.key.errors(kind.error.kind, (*loc, name), name, check, _FIRST)  # a key before its value
        else:
            super().errors(kind, loc, value, check, base)

    def message(self, value: Any) -> str:
        return f"must be an object/mapping (got {describe(value)})"

    def defaults(self) -> Any:
        return self.default


_JSON_TYPES: Mapping[type[Spec], str] = {
    Bool: "boolean", Int: "integer", Num: "number", Str: "string", ListOf: "array", Obj: "object", MapOf: "object"}


@dataclass(frozen=True)
class Either(Spec):
    """The first spec whose type test accepts the value decides (e.g. string-or-object members); each option's
    test is its JSON type."""

    options: tuple[tuple[Callable[[Any], bool], Spec], ...]
    expected: str = ""

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        chain: Any = False
        for _, option in reversed(self.options):
            chain = {"if": {"type": _JSON_TYPES[type(option)]}, "then": option.schema(specs), "else": chain}
        return _register(self, chain, specs)

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        for accepts, option in self.options:
            if accepts(value):
                return option.prepare(value, loc, check)
        return _json_safe(value, loc, check)

    def message(self, value: Any) -> str:
        return f"must be {self.expected} (got {describe(value)})"


@dataclass(frozen=True)
class Custom(Spec):
    """A hand-written check (for shapes the schema language does not cover, e.g. a phase machine)."""

    fn: Callable[[Any, str], Any]
    default: Any = None

    def schema(self, specs: dict[int, Spec]) -> dict[str, Any]:
        return _register(self, {}, specs)

    def prepare(self, value: Any, loc: Loc, check: _Check) -> Any:
        try:
            check.results[loc] = self.fn(value, check.path(loc))
        except SchemaError as exc:
            check.problems.append((loc, _LAST, exc))
        return _json_safe(value, loc, check)


class _Compiled:
    """A table compiled once: its JSON Schema, the validator, and which spec each schema fragment came from."""

    def __init__(self, spec: Obj) -> None:
        self.spec = spec
        self.specs: dict[int, Spec] = {}
        self.schema = spec.schema(self.specs)
        import jsonschema_rs  # here, not at the top: a command that validates nothing does not pay its import

        self.validator = jsonschema_rs.validator_for(self.schema)

    def check_each(self, value: Any, path: str) -> tuple[dict[str, Any], list[SchemaError]]:
        check = _Check(path)
        try:
            doc = self.spec.prepare(value, (), check)
        except _TooLarge as exc:
            return {}, [SchemaError(path, str(exc))]
        if check.problems or not self._valid(doc):
            try:
                for error in self.validator.iter_errors(doc):
                    self._record(error, doc, check)
            except ValueError as exc:  # a number beyond what the validator holds
                check.problem((), f"holds a value JSON cannot represent ({exc})")
        first: dict[Any, tuple[Any, SchemaError]] = {}
        for loc, rank, problem in check.problems:
            group = loc[0] if loc else None
            order = (document_order(doc, loc), rank)
            if group not in first or order < first[group][0]:
                first[group] = (order, problem)
        problems = [problem for _, problem in sorted(first.values(), key=lambda item: item[0])]
        if not isinstance(doc, dict):
            return {}, problems
        for loc, result in check.results.items():
            if loc[0] not in first:
                _put(doc, loc, result)
        return {k: v for k, v in doc.items() if k not in first}, problems

    def _valid(self, doc: Any) -> bool:
        try:
            return bool(self.validator.is_valid(doc))
        except ValueError:  # a number beyond what the validator holds: let iter_errors name it
            return False

    def _record(self, error: Any, doc: Any, check: _Check) -> None:
        loc = tuple(error.instance_path)
        schema_path = list(error.schema_path)
        if error.kind.name == "propertyNames":  # the map's error (its key spec's inner one names the key)
            schema_path = schema_path[: len(schema_path) - schema_path[::-1].index("propertyNames") - 1]
        spec = self._spec_at(schema_path)
        value = check.originals.get(loc, value_at(doc, loc))
        spec.errors(error.kind, loc, value, check)

    def _spec_at(self, schema_path: Iterable[str | int]) -> Spec:
        """The spec of the innermost compiled fragment on the failing keyword's schema path."""
        node: Any = self.schema
        spec: Spec = self.spec
        for part in schema_path:
            if isinstance(node, dict) and id(node) in self.specs:
                spec = self.specs[id(node)]
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                break
        if isinstance(node, dict) and id(node) in self.specs:
            spec = self.specs[id(node)]
        return spec


_COMPILED: dict[int, _Compiled] = {}


def _compiled(spec: Obj) -> _Compiled:
    """The compiled form of a table (built on first use; the tables are module constants)."""
    hit = _COMPILED.get(id(spec))
    if hit is None or hit.spec is not spec:
        hit = _COMPILED[id(spec)] = _Compiled(spec)
    return hit


def _put(doc: Any, loc: Loc, value: Any) -> None:
    for part in loc[:-1]:
        doc = doc[part]
    doc[loc[-1]] = value


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
