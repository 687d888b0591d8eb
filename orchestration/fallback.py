"""Model fallback: a session whose model could not be used switched to its next fallback model; record it.

docs/spec-conformance.md §1.5. The session itself decides and switches (`workers/session.py`, `model_fallback`
event); here the run learns of it: the node's model becomes the fallback (shown by status, wait, collect and
notices), its provider pin is dropped (a fallback candidate records none), its spec and launch record name the
model it now runs on (a restart or a resume continues there, with the candidates still untried), and the ledger
gets the switch as a `node_launched` event whose data carries `fallback` {from, error, remaining} — the
original re-spawns the child on the next candidate; the stored event set stays closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loguru import logger

from legion.agents.modelspec import split_thinking_suffix
from legion.ledger import Ledger
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.orchestrator import Orchestrator

FALLBACK_EVENT = "model_fallback"  # the session event (workers/session.py)


class ModelFallbacks:
    """Keeps a run's nodes and ledger in step with the model switches of their sessions."""

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> ModelFallbacks:
        self.orch.root.subscribe_sessions(self._on_session_event)
        return self

    async def close(self) -> None:
        """Let the switches already seen reach the ledger."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_session_event(self, worker_id: str, name: str, body: dict[str, Any]) -> None:
        if name != FALLBACK_EVENT:
            return
        node = self.orch.tree.get(str(body.get("nodeId") or worker_id))
        model, failed = body.get("model"), body.get("from")
        if node is None or not isinstance(model, str) or not isinstance(failed, str):
            return
        remaining = [m for m in body.get("remaining") or [] if isinstance(m, str)]
        error = str(body.get("error") or "")
        switch(node, failed, model, error, remaining)
        task = asyncio.ensure_future(self._record(node, failed, model, error, remaining))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, node: AgentNode, failed: str, model: str, error: str, remaining: list[str]) -> None:
        ctx = self.orch.ctx
        data = {"status": node.status, "model": model,
                "fallback": {"from": failed, "error": error[:2000], "remaining": remaining}}

        def write(led: Ledger) -> None:
            with led.transaction():
                led.update_node(node.id, model=model)
                led.append_event(node.id, "node_launched", data)
            if ctx.on_reserve is not None:  # the launch record: a later root resumes it on this model
                ctx.on_reserve(node)

        try:
            await ctx.write(write)
        except Exception as exc:  # bookkeeping: the session runs on regardless
            logger.warning("model fallback of {} ({} → {}) not recorded: {!r}", node.id, failed, model, exc)


def switch(node: AgentNode, failed: str, model: str, error: str, remaining: list[str]) -> None:
    """The node now runs on `model` (a fallback candidate: no provider pin; the thinking level its string names),
    with `remaining` still untried."""
    node.model, node.provider_pin = model, None
    node.thinking = split_thinking_suffix(model)[1]
    node.spec = {**node.spec, "model": model}
    if remaining:
        node.spec["fallbackModels"] = remaining
    else:
        node.spec.pop("fallbackModels", None)
    node.model_switches = (*node.model_switches, f"model {failed} could not be used ({error}); switched to its "
                                                 f"fallback model {model}")
