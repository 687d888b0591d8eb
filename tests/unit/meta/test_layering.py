"""The dependency direction of docs/architecture.md §1 holds: procs, bus and ledger import nothing
else of legion, and so on.

`procs` (the process layer) sits at the bottom: every other component may import it."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.meta.source_tree import ROOT, parsed, python_files

ALLOWED: dict[str, set[str]] = {
    "procs": set(),
    "bus": {"procs"},
    "ledger": {"procs"},
    "agents": {"procs", "ledger"},
    "workers": {"procs", "bus", "ledger", "agents"},
    "supervision": {"procs", "bus", "ledger", "agents", "workers"},
    # orchestration -> supervision, never back: nothing in the table above may import legion.orchestration
    "orchestration": {"procs", "bus", "ledger", "agents", "workers", "supervision"},
}


def _legion_imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(parsed(path)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "legion" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


@pytest.mark.parametrize("component", sorted(ALLOWED))
def test_source_imports_follow_dependency_direction(component: str) -> None:
    bad = []
    for path in python_files(component):
        for lineno, target in _legion_imports(path):
            if target in ALLOWED and target != component and target not in ALLOWED[component]:
                bad.append(f"{path.relative_to(ROOT)}:{lineno} imports legion.{target}")
    assert not bad, "imports against docs/architecture.md §1:\n" + "\n".join(bad)


def _isolation_code(component: str) -> str:
    """A fresh interpreter's script: import every module of `component`, print the components then loaded."""
    modules = [
        "legion." + component + "." + ".".join(p.relative_to(ROOT / component).with_suffix("").parts)
        for p in python_files(component)
        if p.name != "__init__.py" and not p.name.startswith("_")
    ]
    return (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sorted({n.split('.')[1] for n in sys.modules if n.startswith('legion.') and n.count('.') >= 1}))\n"
    )


@pytest.fixture(scope="module")
def isolated_imports() -> Iterator[dict[str, subprocess.Popen[str]]]:
    """One fresh interpreter per component, all started at once (they run side by side on the cores)."""
    procs = {c: subprocess.Popen([sys.executable, "-c", _isolation_code(c)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for c in sorted(ALLOWED)}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize("component", sorted(ALLOWED))
def test_component_imports_in_isolation(component: str, isolated_imports: dict[str, subprocess.Popen[str]]) -> None:
    """Importing a component (all its modules) loads no forbidden sibling at run time either."""
    stdout, stderr = isolated_imports[component].communicate(timeout=60)
    out = subprocess.CompletedProcess(isolated_imports[component].args, isolated_imports[component].returncode,
                                      stdout, stderr)
    assert out.returncode == 0, out.stderr
    loaded = set(eval(out.stdout.strip()))  # a printed list of names
    forbidden = loaded - ALLOWED[component] - {component}
    forbidden &= set(ALLOWED)
    assert not forbidden, f"importing legion.{component} loaded {sorted(forbidden)}"


# The CLI wing: `legion.cli` holds the commands and sits on top of everything; `legion.reports` holds the read
# models the commands print. Only the CLI itself and `python -m legion` import `legion.cli`; the read models and
# the components import no command, and the components import no read model either.
WING = ROOT / "legion"


def _full_imports(path: Path) -> list[tuple[int, str]]:
    """Every `legion.…` module `path` imports, by its full name (`from legion import cli` is `legion.cli`)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "legion":
                found += [(node.lineno, f"legion.{a.name}") for a in node.names]
    return [(n, name) for n, name in found if name == "legion" or name.startswith("legion.")]


def _imports_of(paths: list[Path], packages: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{lineno} imports {name}" for path in paths
            for lineno, name in _full_imports(path)
            if any(name == p or name.startswith(p + ".") for p in packages)]


def test_only_the_cli_imports_the_cli() -> None:
    outside = [p for p in python_files("legion") if (WING / "cli") not in p.parents and p.name != "__main__.py"]
    outside += [p for comp in sorted(ALLOWED) for p in python_files(comp)]
    bad = _imports_of(outside, ("legion.cli",))
    assert not bad, "legion.cli (the commands) is imported only by itself and legion/__main__.py:\n" + "\n".join(bad)


def test_components_import_no_read_model() -> None:
    bad = _imports_of([p for comp in sorted(ALLOWED) for p in python_files(comp)],
                      ("legion.reports",))
    assert not bad, "the components do not import legion.reports (the operator's read models):\n" + "\n".join(bad)


def test_read_models_import_without_the_cli() -> None:
    """Importing every read model loads no command module at run time either."""
    modules = [f"legion.reports.{p.stem}" for p in sorted((WING / "reports").glob("*.py")) if p.name != "__init__.py"]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "print(sorted(n for n in sys.modules if n == 'legion.cli' or n.startswith('legion.cli.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"importing legion.reports loaded {out.stdout.strip()}"
