"""The tcp monitor relay as a supervised child of the root (docs/servers.md, docs/design-departures.md).

The root never listens on tcp. With `legion run --monitor tcp://HOST:PORT`, it starts the relay
(`legion.bus.relay`, entry `relay_main` below) as an ordinary worker through the fork server — its own
process, its own cgroup where cgroups are in use, killed and swept by the retire ladder, watched by the
application heartbeat — under a supervisor of its own (`MonitorRelayChild`), not under the run's tree:

- one-for-one, `permanent`: a crash, a hang or a descriptor exhaustion of the relay is restarted (with
  backoff). Its restarts never count toward the tree's restart intensity: the monitor is not the run, and a
  flood of the monitor port must never end the run. If the relay fails more than `max_restarts` times in
  `restart_period`, its supervisor gives up and `MonitorRelayChild` starts a new one after `cooldown`
  seconds — for as long as the run lives. Each step is logged and published as a `monitor_relay` event.
- It is not a node: nothing about it is written to the ledger.
- Restarts keep the endpoints: the first incarnation's bound ports (a `:0` asks for any) are passed to the
  next ones, so run.json's `monitor` entry stays true.
- `LEGION_RELAY_NOFILE` sets the relay's soft descriptor limit (tests flood a small one); otherwise it
  raises it to the hard limit, as every legion process does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from legion.bus.monitor import monitor_endpoints
from legion.bus.protocol import MONITOR_RELAY
from legion.bus.relay import MonitorRelay, RelayLimits
from legion.bus.security import CurveServerConfig
from legion.procs import raise_nofile, set_nofile
from legion.supervision.child_spec import ChildHandle, ChildSpec, ExitReason, RetireTimeouts
from legion.supervision.rpc_child import RpcChild, RpcHost, RpcNode
from legion.supervision.supervisor import Backoff, Supervisor, SupervisorObserver

if TYPE_CHECKING:
    from legion.workers.runtime import WorkerRuntime

RELAY_ID = "monitor.relay"
RELAY_ENTRY = "legion.supervision.relay_child:relay_main"
NOFILE_ENV = "LEGION_RELAY_NOFILE"
EXIT_BIND = 3  # the relay could not listen (port taken, bad address): its ready body says why


class RelayStartError(RuntimeError):
    """The tcp monitor relay could not start (its message says why: a port in use, an address)."""


def _curve_args(curve: CurveServerConfig) -> dict[str, Any]:
    return {"public": curve.public_key.decode(), "secret": curve.secret_key.decode(),
            "clients": sorted(k.decode() for k in curve.allowed_clients), "ips": list(curve.allowed_ips)}


def _curve_from(args: dict[str, Any]) -> CurveServerConfig:
    return CurveServerConfig(args["public"].encode(), args["secret"].encode(),
                             frozenset(k.encode() for k in args["clients"]), tuple(args["ips"]))


async def relay_main(rt: WorkerRuntime) -> int:
    """Worker entry: serve the relay until the root stops it; exits EXIT_BIND when it cannot listen."""
    args = rt.args
    wanted = os.environ.get(NOFILE_ENV, "").strip()
    soft, _ = set_nofile(int(wanted)) if wanted.isdigit() else raise_nofile()
    limits = RelayLimits(**args.get("limits", {}))
    relay = MonitorRelay((args["upstreamPub"], args["upstreamSnapshot"]), (args["pub"], args["snapshot"]),
                         args["privateDir"], _curve_from(args["curve"]), limits=limits)
    try:
        pub, snap = await relay.start()
    except (OSError, ValueError) as exc:
        logger.error("monitor relay: {}", exc)
        await rt.ready({"error": str(exc)})
        return EXIT_BIND
    logger.info("monitor relay up: pid {} pub {} snapshot {} (RLIMIT_NOFILE {}, {} connections per peer, "
                "{} in total)", os.getpid(), pub, snap, soft, limits.per_peer, relay.budget.total)
    await rt.ready({"pub": pub, "snapshot": snap})
    try:
        await rt.stop_requested.wait()
    finally:
        relay.budget.report()
        await relay.close()
    return 0


relay_main.auto_ready = False  # type: ignore[attr-defined]  # ready once listening, with the bound endpoints


class _RelayObserver(SupervisorObserver):
    def __init__(self, publish: Callable[[str, dict[str, Any]], None]) -> None:
        self.publish = publish

    def child_started(self, sup: Supervisor, child_id: str, handle: ChildHandle, *, restart: bool) -> None:
        if restart:
            logger.warning("monitor relay restarted (pid {})", getattr(handle, "pid", None))
            self.publish(MONITOR_RELAY, {"state": "restarted", "pid": getattr(handle, "pid", None)})

    def child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason, *, restarting: bool) -> None:
        logger.warning("monitor relay exited: {} ({})", reason, "restarting" if restarting else "not restarted")
        self.publish(MONITOR_RELAY, {"state": "exited", "reason": str(reason), "restarting": restarting})


class MonitorRelayChild:
    """Runs the relay under its own supervisor, outside the run's tree; `start()` returns the tcp endpoints."""

    def __init__(self, host: RpcHost, run_dir: str | os.PathLike[str], listen: tuple[str, str],
                 curve: CurveServerConfig, *, publish: Callable[[str, dict[str, Any]], None] | None = None,
                 limits: dict[str, Any] | None = None, max_restarts: int = 5, restart_period: float = 60.0,
                 cooldown: float = 30.0, start_timeout: float = 15.0) -> None:  # fmt: skip
        self.host = host
        self.run_dir = Path(run_dir)
        self.listen = listen
        self.curve = curve
        self.publish = publish or (lambda type, body: None)
        self.limits = dict(limits or {})
        self.max_restarts = max_restarts
        self.restart_period = restart_period
        self.cooldown = cooldown
        self.start_timeout = start_timeout
        self.endpoints: tuple[str, str] | None = None
        self.supervisor: Supervisor | None = None
        self.incarnations = 0
        self._watch: asyncio.Task[None] | None = None
        self._closing = False

    def _node(self) -> RpcNode:
        pub, snap = monitor_endpoints(self.run_dir)
        listen = self.endpoints or self.listen  # a restart binds the ports the first incarnation got
        args = {"upstreamPub": pub, "upstreamSnapshot": snap, "pub": listen[0], "snapshot": listen[1],
                "privateDir": str(self.run_dir), "curve": _curve_args(self.curve), "limits": self.limits}
        return RpcNode(RELAY_ID, RELAY_ENTRY, args, restart="permanent", role="relay",
                       shutdown=RetireTimeouts(retire=2.0, signal=1.0, kill=1.0), start_timeout=self.start_timeout,
                       log_path=str(self.run_dir / "monitor-relay.log"))

    def _spec(self) -> ChildSpec:
        async def start() -> ChildHandle:
            self.incarnations += 1
            child = await RpcChild(self._node(), self.host, attempt=self.incarnations).start()
            body = child.ready_body or {}
            if "error" in body:
                with contextlib.suppress(Exception):
                    await child.shutdown(RetireTimeouts(retire=0.5, signal=0.5, kill=0.5))
                raise RelayStartError(f"the tcp monitor could not start: {body['error']}")
            return child

        return ChildSpec(id=RELAY_ID, start=start, restart="permanent", shutdown=self._node().shutdown)

    async def _new_supervisor(self) -> RpcChild:
        sup = Supervisor("monitor-relay", strategy="one_for_one", max_restarts=self.max_restarts,
                         restart_period=self.restart_period, backoff=Backoff(base=0.5, cap=10.0),
                         observer=_RelayObserver(self.publish))  # fmt: skip
        await sup.start()
        self.supervisor = sup
        handle = await sup.start_child(self._spec())
        assert isinstance(handle, RpcChild)
        return handle

    async def start(self) -> tuple[str, str]:
        """Start the first relay; raises RelayStartError (with the relay's reason) when it cannot listen."""
        try:
            handle = await self._new_supervisor()
        except Exception as exc:
            await self.close()
            cause = getattr(exc, "cause", exc)
            raise RelayStartError(str(cause) if isinstance(cause, RelayStartError) else
                                  f"the tcp monitor relay did not start: {cause}") from None
        body = handle.ready_body or {}
        self.endpoints = (str(body["pub"]), str(body["snapshot"]))
        self._watch = asyncio.create_task(self._watch_supervisor(), name="monitor-relay")
        return self.endpoints

    async def _watch_supervisor(self) -> None:
        """A relay supervisor past its intensity is replaced after `cooldown`: the monitor comes back."""
        while not self._closing:
            assert self.supervisor is not None
            reason = await self.supervisor.wait_exit()
            if self._closing:
                return
            logger.error("the tcp monitor relay failed too often ({}); starting it again in {:g}s",
                         reason, self.cooldown)
            self.publish(MONITOR_RELAY, {"state": "down", "reason": str(reason), "retry_in": self.cooldown})
            await asyncio.sleep(self.cooldown)
            if self._closing:
                return
            try:
                await self._new_supervisor()
            except Exception as exc:
                logger.error("the tcp monitor relay did not start again: {!r}", exc)

    async def close(self) -> None:
        """Stop the relay (retire ladder) and its supervisor; safe to call twice."""
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
        if self.supervisor is not None:
            with contextlib.suppress(Exception):
                await self.supervisor.stop()
