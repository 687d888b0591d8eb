"""One vocabulary, in code: every error code is defined in `legion.codes` and restated nowhere else in the source.

Tests may keep literals (an assertion on the wire value is the point of a test)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import legion.codes

ROOT = Path(__file__).resolve().parents[3]
SOURCE_DIRS = ("legion", "procs", "bus", "ledger", "agents", "workers", "supervision", "orchestration")
CODES_MODULE = ROOT / "legion" / "codes.py"
CODES = {name: value for name, value in vars(legion.codes).items() if name.isupper() and isinstance(value, str)}
# Literals equal to a code that are not that code: "ERROR" is also a loguru level name.
NOT_A_CODE = {("supervision/dispatch.py", "ERROR")}


def _source_files() -> Iterator[Path]:
    for folder in SOURCE_DIRS:
        yield from (p for p in sorted((ROOT / folder).rglob("*.py")) if p != CODES_MODULE)


def _name_lists(tree: ast.Module) -> set[int]:
    """ids of the string constants that are names, not values: `__all__` entries and the keys of lazy-export tables."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if "__all__" in names or any(n.endswith("EXPORTS") for n in names):
                skip |= {id(c) for c in ast.walk(node) if isinstance(c, ast.Constant)}
    return skip


def _restated(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _name_lists(tree)
    rel = path.relative_to(root).as_posix()
    values = set(CODES.values())
    return [f"{rel}:{node.lineno}: {node.value!r} (import it from legion.codes)" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values
            and id(node) not in skip and (rel, node.value) not in NOT_A_CODE]


def test_no_code_literal_outside_the_codes_module() -> None:
    bad = [line for path in _source_files() for line in _restated(path)]
    assert not bad, "error codes are defined once, in legion/codes.py:\n" + "\n".join(bad)


def test_the_check_sees_a_restated_code(tmp_path: Path) -> None:
    """The scan flags a code written as a literal, and not one imported by name or listed in `__all__`."""
    sample = tmp_path / "legion" / "sample.py"
    sample.parent.mkdir()
    sample.write_text('from legion.codes import QUEUE_FULL\n__all__ = ["QUEUE_FULL"]\n'
                      'def f() -> dict:\n    return {"code": "QUEUE_FULL", "also": QUEUE_FULL}\n', encoding="utf-8")
    assert _restated(sample, tmp_path) == ["legion/sample.py:4: 'QUEUE_FULL' (import it from legion.codes)"]


def test_codes_are_their_own_names() -> None:
    assert CODES and all(name == value for name, value in CODES.items())


def test_the_codes_module_imports_nothing_of_legion() -> None:
    """Every component imports it, the process layer too, so it must stay a leaf."""
    tree = ast.parse(CODES_MODULE.read_text(encoding="utf-8"))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert set(imported) <= {"__future__", "typing"}, imported
