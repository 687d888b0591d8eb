"""Model-request retries in the run's log: each `retry_scheduled`, `retry_succeeded` and `retry_gave_up` a session
sends becomes a line in `legion.log` (docs/events.md, "Retries"); the views print it on stderr."""

from __future__ import annotations

from typing import Any

from loguru import logger

from legion.bus.protocol import RETRY_EVENTS
from legion.orchestration.orchestrator import Orchestrator
from legion.workers.providers.retry import describe_retry


def log_retries(orch: Orchestrator) -> None:
    """Log every retry event of the run's sessions at INFO: legion.log has it, stderr gets the view's line."""

    def on_event(worker_id: str, name: str, body: dict[str, Any]) -> None:
        if name in RETRY_EVENTS:
            node = body.get("nodeId") or worker_id
            logger.info("{}: {}", node, describe_retry(name, body))

    orch.root.subscribe_sessions(on_event)
