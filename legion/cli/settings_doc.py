"""The settings reference, docs/settings.md, generated from the settings schema (agents/settings_schema.py).

`python -m legion.cli.settings_doc > docs/settings.md` regenerates it; a test fails when the checked-in file
is stale. `legion init` writes the same text into a project."""

from __future__ import annotations

import sys
from typing import Any

import orjson

REGENERATE = "python -m legion.cli.settings_doc > docs/settings.md"

_INTRO = f"""\
# Settings reference

<!-- Generated from agents/settings_schema.py by `{REGENERATE}`; do not edit by hand. -->

legion reads two settings files, both optional: the user's `~/.config/legion/settings.json`
(`$XDG_CONFIG_HOME/legion/settings.json` when that is set) and the project's `.legion/settings.json`
(`legion init` writes a starting one). The project's deep-merges over the user's. JSON takes no comments,
so every key is described here. An unknown key or a value of the wrong type is an error that names the
file, the line, the key's dotted path and the closest known key.

In a key, `<name>` stands for a name you choose (a team, a role, a provider) and `[]` for each item of a
list. *unset* means the key has no default: its description says what leaving it out does. An object's
default is made of its keys' defaults. The environment variable `LEGION_TEAM` overrides `team`, and
`legion run --max-cost` overrides `legion.budget.maxCostUsd`.
"""


def render() -> str:
    """The whole reference as Markdown."""
    from legion.agents.settings_schema import settings_reference

    lines = [_INTRO, "| key | type | default | what it does |", "|---|---|---|---|"]
    for row in settings_reference():
        lines.append(f"| `{row.path}` | {_cell(row.kind)} | {_default(row.kind, row.default)} | "
                     f"{_cell(row.description)} |")
    return "\n".join(lines) + "\n"


def _default(kind: str, value: Any) -> str:
    """A default as JSON (`true`, `null`, `{...}`), never Python's spelling; an object's is its keys'."""
    if value is None:
        return "*unset*"
    if kind.startswith("object"):
        return "its keys' defaults"
    return f"`{orjson.dumps(value).decode()}`"


def _cell(text: str) -> str:
    """Text that cannot break a Markdown table row."""
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.stdout.write(render())
