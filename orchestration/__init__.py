"""The agent layer on top of supervision: the run's composition, the orchestrator, launch, actions, mail and
teams (docs/architecture.md §1).

It imports `legion.supervision` and the layers below; nothing below imports it (tests/unit/meta/test_layering.py).
Modules are imported by their full path (`legion.orchestration.run`, `legion.orchestration.orchestrator`, …), so
importing one does not load the rest.
"""

from __future__ import annotations

__all__: list[str] = []
