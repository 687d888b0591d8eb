"""What a run's fork server imports, and its start ahead of the run machinery (docs/architecture.md §2).

`run_preload(prepared)` is the fork server's preload for a prepared run: what every session worker needs, paid
once in the fork server instead of once per rpc worker after its fork, plus the provider SDKs unless the run's model
is a scripted one. `prestart(prepared)` starts that fork server at once: the CLI calls it as soon as a run is
prepared, so the fork server's imports run on another core while the CLI imports the run machinery
(`legion.orchestration.run`, SQLAlchemy among it), and hands it to `execute` or `resume`, whose root adopts it
when it starts (`WorkerSpawner`).

This module imports no more than `legion.prepare` and `legion.supervision.spawn`, so calling it costs the CLI
nothing it would not pay anyway.
"""

from __future__ import annotations

from legion.prepare import Prepared
from legion.run_ledger import apply_password
from legion.supervision.spawn import DEFAULT_PRELOAD, EarlyForkServer

__all__ = ["SDK_PRELOAD", "SESSION_PRELOAD", "prestart", "run_preload"]

SESSION_PRELOAD = (*DEFAULT_PRELOAD, "legion.workers.session_worker")
# the provider SDKs (`import anthropic` ~1 s): imported by the fork server after it is ready and idle (`~`, see
# supervision/zygote.py), so later workers inherit them; a run on scripted models only skips them
SDK_PRELOAD = ("~anthropic", "~openai")


def run_preload(prepared: Prepared) -> tuple[str, ...]:
    """What the fork server imports: the provider SDKs too unless the run's model is a scripted one."""
    model = prepared.options.model or prepared.settings.get("defaultModel") or ""
    return SESSION_PRELOAD if str(model).startswith("scripted/") else (*SESSION_PRELOAD, *SDK_PRELOAD)


def prestart(prepared: Prepared) -> EarlyForkServer:
    """Start the run's fork server now, in the environment its root will have (the ledger's password set); pass
    it to `execute` or `resume` (`fork_server`)."""
    apply_password(prepared.ledger)
    return EarlyForkServer.start(run_preload(prepared))
