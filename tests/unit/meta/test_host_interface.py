"""The orchestration layer talks to the supervision layer through one narrow interface, `Host`
(`orchestration/host.py`, docs/architecture.md §7): it never reaches into the root's registry, lifecycle or
supervisor, nor takes a worker handle by `.worker(`. Found by reading the source (ast), so a new reach fails here."""

from __future__ import annotations

import ast
import inspect

from legion.orchestration.host import Host
from legion.supervision.root import RootSupervisor
from tests.unit.meta.source_tree import ROOT, parsed, python_files

REACHES = ("registry", "lifecycle", "supervisor", "worker")  # the root's internals (`worker`: its handles)
KNOWN: dict[tuple[str, str], int] = {}  # (file, attribute) -> reaches allowed there (none)


def _host_expr(node: ast.expr) -> bool:
    """`root`, `self.root`, `orch.root`, `self.orch.root`, …: the run's root as orchestration holds it."""
    text = ast.unparse(node)
    return text == "root" or text.endswith(".root")


def _reaches() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path in python_files("orchestration"):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Attribute) and node.attr in REACHES and _host_expr(node.value):
                found.setdefault((path.relative_to(ROOT).as_posix(), node.attr), []).append(node.lineno)
    return found


def test_orchestration_reaches_no_internals_of_the_root() -> None:
    found = _reaches()
    extra = {key: lines for key, lines in found.items() if len(lines) > KNOWN.get(key, 0)}
    assert not extra, ("orchestration reaches into the root (use a method of `Host`, orchestration/host.py): "
                       + "; ".join(f"{path}:{','.join(map(str, lines))} .{attr}" for (path, attr), lines in extra.items()))


def test_the_orchestrator_holds_the_root_as_a_host() -> None:
    source = (ROOT / "orchestration" / "orchestrator.py").read_text(encoding="utf-8")
    init = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "__init__"
                and any(a.arg == "root" for a in n.args.args))
    (root_arg,) = [a for a in init.args.args if a.arg == "root"]
    assert root_arg.annotation is not None and ast.unparse(root_arg.annotation) == "Host"


def test_the_root_supervisor_offers_every_method_of_the_host() -> None:
    from legion.supervision.node_ops import Nodes  # the root's nodes are the Host the Run hands over

    declared = [name for name, _ in inspect.getmembers(Host, inspect.isfunction) if not name.startswith("_")]
    assert {"launch_session", "retire", "session_request", "publish", "subscribe_sessions", "subscribe_status"} <= set(
        declared)
    for name in declared:
        offered = getattr(Nodes, name, None)
        assert callable(offered), f"RootSupervisor.nodes has no {name}"
        wanted = [p for p in inspect.signature(getattr(Host, name)).parameters if p != "self"]
        params = inspect.signature(offered).parameters
        assert all(p in params for p in wanted if p != "body"), f"RootSupervisor.nodes.{name} lacks {wanted}"
    for name in ("running", "exit_reason", "retire_failures"):  # what the Run asks of the root it composes
        assert isinstance(getattr(RootSupervisor, name), property)
