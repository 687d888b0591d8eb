"""docs/events.md's JSON Schemas, read from the page itself, and the check of one public event against them
(import as `from tests.events_schema import check_events`). The page is the contract: a schema is every ```json
block whose `$id` is `legion:event` (the envelope) or `legion:event/<type>`. Checked with jsonschema-rs, legion's
own validator."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema_rs
from jsonschema_rs import Draft202012Validator

DOC = Path(__file__).resolve().parents[1] / "docs" / "events.md"
ENVELOPE_ID = "legion:event"
_BLOCK = re.compile(r"^```json\n(.*?)^```", re.S | re.M)


@functools.cache
def schemas() -> dict[str, Draft202012Validator]:
    """The envelope's validator under "", each type's under its name."""
    out: dict[str, Draft202012Validator] = {}
    for block in _BLOCK.findall(DOC.read_text(encoding="utf-8")):
        data = json.loads(block)
        ident = data.get("$id", "") if isinstance(data, dict) else ""
        if ident == ENVELOPE_ID or ident.startswith(ENVELOPE_ID + "/"):
            jsonschema_rs.meta.validate(data)  # a schema the page got wrong fails here, not as a passing check
            out[ident.removeprefix(ENVELOPE_ID).removeprefix("/")] = Draft202012Validator(data)
    return out


def problems(event: Any) -> list[str]:
    """What is wrong with one event (empty: it validates), each naming the event's type and the path."""
    found = schemas()
    errors = [f"envelope: {_path(e)}: {e.message}" for e in found[""].iter_errors(event)]
    if errors or not isinstance(event, dict):
        return errors
    type_ = event["type"]
    own = found.get(type_)
    if own is None:
        return [f"{type_}: not documented in docs/events.md"]
    return [f"{type_}: {_path(e)}: {e.message}" for e in own.iter_errors(event)]


def _path(error: Any) -> str:
    """The failing value's place, `$.nodes[0].turns`."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.instance_path)


def check_events(events: Iterable[Any], where: str = "") -> None:
    """Assert that every event validates against docs/events.md (all the problems in one message)."""
    bad = [f"{p}\n    in {json.dumps(e)[:400]}" for e in events for p in problems(e)]
    assert not bad, f"events that break docs/events.md{' (' + where + ')' if where else ''}:\n" + "\n".join(bad[:20])


def json_lines(text: str) -> list[Any]:
    """Every non-empty line of `text` parsed as JSON (a line that is not JSON fails: a stream is JSON only)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
