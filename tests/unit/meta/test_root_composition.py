"""The root is a composition, not a mixin (docs/architecture.md §7): `RootSupervisor` derives from nothing, owns a
`Nodes` (supervision/node_ops.py) that it constructs with what it needs, and callers use `root.nodes` — the root
does not restate its nodes' methods. Read from the classes and the source, so a mixin coming back fails here."""

from __future__ import annotations

import inspect
from pathlib import Path

from legion.supervision.root import RootSupervisor

ROOT = Path(__file__).resolve().parents[3]


def test_the_root_supervisor_is_no_mixin() -> None:
    assert RootSupervisor.__bases__ == (object,), (
        f"RootSupervisor derives from {[b.__name__ for b in RootSupervisor.__bases__]}: compose what it needs as an "
        "attribute it constructs (as it owns `nodes`), do not mix it in")


def test_the_root_owns_its_nodes(tmp_path: Path) -> None:
    from legion.supervision.node_ops import Nodes

    root = RootSupervisor(tmp_path / "run")
    assert isinstance(root.nodes, Nodes)
    assert root.nodes.registry is root.registry


def test_nodes_declares_no_attribute_it_does_not_set() -> None:
    from legion.supervision.node_ops import Nodes

    assert not inspect.get_annotations(Nodes), f"Nodes declares {sorted(inspect.get_annotations(Nodes))} at class level"
    source = (ROOT / "supervision" / "node_ops.py").read_text(encoding="utf-8")
    assert "type: ignore" not in source


def test_the_root_does_not_restate_the_methods_of_its_nodes() -> None:
    from legion.supervision.node_ops import Nodes

    public = {name for name, _ in inspect.getmembers(Nodes, inspect.isfunction) if not name.startswith("_")}
    assert {"launch", "launch_team", "retire", "launch_pool", "launch_session", "session_request"} <= public
    restated = sorted(name for name in public if name != "publish" and hasattr(RootSupervisor, name))
    assert not restated, f"RootSupervisor restates {restated} of its nodes: callers use `root.nodes.<method>`"
