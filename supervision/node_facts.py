"""The per-node figures of a monitor snapshot — model, phase, turns, tokens, cost — folded from the events the root
publishes (docs/protocol.md §3.2), so that a client attaching late sees what one attached from the start saw."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from legion.bus.protocol import AGENT_LAUNCHED, USAGE
from legion.ledger.constants import PHASE_CHANGE

# every node of a snapshot carries these keys; the values until the events say otherwise
DEFAULTS: dict[str, Any] = {"model": None, "phase": None, "turns": 0, "tokens_in": 0, "tokens_out": 0,
                            "cost_usd": 0.0, "unknown_cost_tokens": 0}
_USAGE = {"turns": "turns", "input": "tokens_in", "output": "tokens_out", "unknownCostTokens": "unknown_cost_tokens"}


class NodeFacts:
    """Folds `agent_launched` (model), `usage` (turns, tokens, cost, model) and `phase_change` (phase) per node.

    Apply each event before it is published (the root does, in `publish`): a snapshot taken at seq S then holds
    exactly the effects of events 1..S, as docs/protocol.md §3.2 promises."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}

    def apply(self, type_: str, body: dict[str, Any]) -> None:
        node = body.get("node_id")
        if not isinstance(node, str):
            return
        if type_ == AGENT_LAUNCHED:
            self._set(node, "model", body.get("model"), str)
        elif type_ == USAGE:
            for key, name in _USAGE.items():
                self._set(node, name, body.get(key), int)
            self._set(node, "cost_usd", body.get("costUsd"), float)
            self._set(node, "model", body.get("model"), str)
        elif type_ == PHASE_CHANGE and not body.get("rejected"):
            self._set(node, "phase", body.get("to"), str)

    def _set(self, node: str, name: str, value: Any, kind: type) -> None:
        if isinstance(value, bool) or value is None or value == "":
            return
        if kind is float and isinstance(value, int | float):
            self.nodes.setdefault(node, {})[name] = float(value)
        elif isinstance(value, kind):
            self.nodes.setdefault(node, {})[name] = value

    def of(self, node: str) -> dict[str, Any]:
        """The node's figures, every key of DEFAULTS present."""
        return {**DEFAULTS, **self.nodes.get(node, {})}

    def snapshot(self, root_id: str, tree: Mapping[str, Mapping[str, Any]], infra: Set[str]) -> dict[str, Any]:
        """The monitor snapshot (docs/protocol.md §3.2): per node of the lifecycle's `tree` its status, parent and
        role, these figures, and `infra` for a pool or team supervisor."""
        nodes = {k: {**self.of(k), **v, **({"infra": True} if k in infra else {})} for k, v in tree.items()}
        return {"root": root_id, "nodes": nodes}
