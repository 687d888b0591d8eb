"""A run's row in the ledger's `runs` table (ledger/fleet_runs.py), kept by its root: registered once the root is
up (host, pid, project, the operator socket, the tcp monitor and its CurveZMQ server key), its state following
run.json's status, and a heartbeat every `heartbeat_interval()` seconds so that the fleet view can tell a run whose
host or root died (docs/servers.md, "A fleet").

Writes go through the root's LedgerWriter (the event loop never waits on the database); once the root has closed
it (the run's last status, after the shutdown) the row is written on a connection of its own. A row that cannot be
written is logged, never a reason to fail the run."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any

from loguru import logger

from legion.fleet import host_name, project_key
from legion.ledger import Ledger, LedgerError, WriterClosedError, open_ledger
from legion.ledger.fleet_runs import HEARTBEAT_S, heartbeat_interval
from legion.ledger.location import ledger_scope

if TYPE_CHECKING:
    from pathlib import Path

    from legion.prepare import Prepared
    from legion.supervision.root import RootSupervisor

_HEARTBEAT_KEY = ("fleet", "run-heartbeat")


class FleetRow:
    """This run's row: `register` once the root is up, `state` at each status, `close` before the root stops."""

    def __init__(self, prepared: Prepared, target: str | Path) -> None:
        self.prepared = prepared
        self.target = target
        self.run_id = prepared.run_id
        self.root: RootSupervisor | None = None
        self._beat: asyncio.Task[None] | None = None
        self._project: str | None = None
        self._project_read = False

    async def project(self) -> str | None:
        """The run's project key (legion/fleet.py), read once (git runs on a thread, not on the event loop); the
        row and the fleet-wide budget share it."""
        if not self._project_read:
            try:
                self._project = await asyncio.to_thread(project_key, self.prepared.options.cwd, self.prepared.settings)
            except Exception as exc:  # a project whose name cannot be found still records its run
                logger.warning("the run's project key: {!r}", exc)
            self._project_read = True
        return self._project

    def register(self, root: RootSupervisor, state: str, *, operator: str | None, monitor: str | None,
                 server_key: str | None) -> None:
        """Upsert the row (a resumed run's new root takes it over) and start the heartbeat; `project()` first."""
        self.root = root
        fields: dict[str, Any] = {"state": state, "project": self._project, "host": host_name(), "pid": os.getpid(),
                                  "control_endpoint": operator, "monitor_endpoint": monitor, "server_key": server_key}
        self._submit(lambda led: led.register_run(self.run_id, **fields), "register the run")
        if self._beat is None:
            self._beat = asyncio.get_running_loop().create_task(self._heartbeat(), name="fleet-heartbeat")

    def state(self, status: str) -> None:
        """The row follows run.json's status (nothing before the root is up: the row is registered then)."""
        if self.root is not None:
            self._submit(lambda led: led.set_run_state(self.run_id, status), f"run state {status}")

    async def close(self) -> None:
        """Stop the heartbeat (the run is ending: its last state follows)."""
        beat, self._beat = self._beat, None
        if beat is not None:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    def _submit(self, fn: Any, what: str) -> None:
        writer = self.root.writer if self.root is not None else None
        if writer is not None:
            with contextlib.suppress(WriterClosedError):
                writer.submit(fn, what=what).add_done_callback(lambda f: _log_failure(f, what))
                return
        try:  # the root's writer is closed: the run's last status, on a connection of its own
            with contextlib.closing(self._open()) as led:
                fn(led)
        except Exception as exc:
            logger.warning("the run's row in the ledger not written ({}): {!r}", what, exc)

    def _open(self) -> Ledger:
        return open_ledger(self.target, run_id=ledger_scope(self.target, self.run_id))

    async def _heartbeat(self) -> None:
        try:
            interval = heartbeat_interval()
        except LedgerError as exc:
            logger.warning("{}; the heartbeat keeps {}s", exc, HEARTBEAT_S)
            interval = HEARTBEAT_S
        while True:
            await asyncio.sleep(interval)
            writer = self.root.writer if self.root is not None else None
            if writer is None:
                return
            try:
                writer.submit_latest(_HEARTBEAT_KEY, lambda led: led.run_heartbeat(self.run_id), "run heartbeat")
            except WriterClosedError:
                return


def _log_failure(future: Any, what: str) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        logger.warning("the run's row in the ledger not written ({}): {!r}", what, exc)
