"""Where a value sits in a parsed document (JSON, YAML): read it, and order locations as the document does.

Both schema validators (`legion.agents.schema` for cards and settings, `legion.workers.tools.schema` for tool
arguments) list their errors in document order with these. A leaf module, like `legion.codes`: it imports nothing,
so every component may import it."""

from __future__ import annotations

from typing import Any

Loc = tuple[str | int, ...]  # where a value sits in a document: keys and list indexes


def value_at(doc: Any, loc: Loc) -> Any:
    """The value at `loc`, None when there is none."""
    for part in loc:
        try:
            doc = doc[part]
        except (KeyError, IndexError, TypeError):
            return None
    return doc


def document_order(doc: Any, loc: Loc) -> tuple[int, ...]:
    """`loc` as a sort key in document order: each key's index in its mapping (a key not in it after all of them),
    each list index. A negative index sorts before everything at its level (a tool's missing parameter: -1)."""
    out: list[int] = []
    for part in loc:
        if isinstance(doc, dict) and (part in doc or isinstance(part, str)):
            keys = list(doc)
            out.append(keys.index(part) if part in doc else len(keys))
            doc = doc.get(part)
        else:
            out.append(part if isinstance(part, int) else 0)
            doc = doc[part] if isinstance(doc, list) and isinstance(part, int) and 0 <= part < len(doc) else None
    return tuple(out)
