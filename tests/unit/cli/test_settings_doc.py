"""docs/settings.md is generated from the settings schema: checked in, never stale, a description per key."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from legion.agents.schema import Int, Obj
from legion.agents.settings_schema import settings_reference
from legion.cli.settings_doc import REGENERATE, render

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "settings.md"


def test_the_checked_in_reference_is_the_generated_one() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        f"docs/settings.md is stale (the settings schema changed): regenerate it with `{REGENERATE}`")


def test_the_regenerate_command_prints_the_reference() -> None:
    out = subprocess.run([sys.executable, "-m", "legion.cli.settings_doc"], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout == render()


def test_every_key_has_a_description_type_and_a_json_default() -> None:
    rows = settings_reference()
    assert len(rows) > 50
    for row in rows:
        assert len(row.description) >= 15 and row.description.endswith("."), row
        assert row.kind, row
    lines = {line.split(" | ")[0].removeprefix("| "): line for line in render().splitlines() if line.startswith("| `")}
    assert len(lines) == len(rows)
    assert lines["`supervision.forceRpc`"].split(" | ")[2] == "`false`"
    assert lines["`enabled`"].split(" | ")[2] == "`true`"
    assert lines["`legion.worktreeBootstrap`"].split(" | ")[2] == '`""`'
    assert lines["`legion.budget.maxCostUsd`"].split(" | ")[2] == "*unset*"
    assert lines["`inprocess.maxActive`"].split(" | ")[2] == "`30`"


def test_the_reference_has_no_python_spellings_nor_empty_backticks() -> None:
    text = render()
    assert "``" not in text
    assert not re.search(r"\b(True|False|None)\b", text)
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = re.split(r"(?<!\\)\|", line)[1:-1]
            assert len(cells) == 4 and all(cell.strip() for cell in cells), line


def test_a_description_for_a_key_the_object_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="docs for keys it does not have: maxDeph"):
        Obj({"maxDepth": Int()}, what="legion", docs={"maxDeph": "typo"})


def test_every_settings_key_the_code_and_docs_name_exists() -> None:
    """A message or a doc that names a settings key (`legion.maxDepth`, `inprocess.maxActive`) names a real one."""
    known = {row.path for row in settings_reference()}
    files = [p for package in ("legion", "bus", "ledger", "agents", "workers", "supervision", "orchestration", "procs")
             for p in (ROOT / package).rglob("*.py")]
    files += [ROOT / "README.md", *(p for p in (ROOT / "docs").glob("*.md") if p != DOC)]
    named = {(m, path.name) for path in files for m in re.findall(
        r"\b(?:legion|inprocess|supervision)(?:\.[a-z]+)*\.[a-z]+[A-Z][A-Za-z0-9]*", path.read_text(encoding="utf-8"))}
    assert len(named) > 20
    assert {(key, where) for key, where in named if key not in known} == set()
