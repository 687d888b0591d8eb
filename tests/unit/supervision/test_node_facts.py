"""supervision/node_facts.py: the monitor snapshot's per-node figures, folded from the events the root publishes."""

from __future__ import annotations

from legion.supervision.node_facts import DEFAULTS, NodeFacts


def test_model_phase_turns_tokens_and_cost_follow_the_events() -> None:
    facts = NodeFacts()
    assert facts.of("w1") == DEFAULTS
    facts.apply("agent_launched", {"node_id": "w1", "parent_id": "root", "role": "worker", "model": "p/m"})
    facts.apply("usage", {"node_id": "w1", "turns": 2, "input": 100, "output": 7, "costUsd": 0, "unknownCostTokens": 0,
                          "model": "p/m2"})
    facts.apply("phase_change", {"node_id": "w1", "from": "plan", "to": "build"})
    facts.apply("phase_change", {"node_id": "w1", "from": "build", "to": "done", "rejected": True})
    assert facts.of("w1") == {"model": "p/m2", "phase": "build", "turns": 2, "tokens_in": 100, "tokens_out": 7,
                              "cost_usd": 0.0, "unknown_cost_tokens": 0}
    assert isinstance(facts.of("w1")["cost_usd"], float)


def test_bad_bodies_change_nothing() -> None:
    facts = NodeFacts()
    for body in ({"node_id": 3, "turns": 1}, {"turns": 1}, {"node_id": "w1", "turns": "2", "input": True,
                                                           "costUsd": "x", "model": ""}):
        facts.apply("usage", body)
    assert facts.of("w1") == DEFAULTS and facts.nodes == {}
