"""The repository's source as the meta tests read it: each component's files, each parsed once per test session.

Every meta test walks the same ~180 files; parsing them once instead of once per test keeps `tests/unit` fast."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# the component folders (the `legion` wing first), each a subpackage of legion
COMPONENTS = ("legion", "procs", "bus", "ledger", "agents", "workers", "supervision", "orchestration")


@functools.cache
def python_files(folder: str) -> tuple[Path, ...]:
    """The .py files under `folder` (relative to the repository), sorted."""
    return tuple(sorted((ROOT / folder).rglob("*.py")))


def source_files() -> tuple[Path, ...]:
    """Every .py file of every component."""
    return tuple(p for folder in COMPONENTS for p in python_files(folder))


@functools.cache
def parsed(path: Path) -> ast.Module:
    """`path`'s syntax tree, parsed once (callers must not change it)."""
    return ast.parse(path.read_text(encoding="utf-8"))
