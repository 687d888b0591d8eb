"""The root's message-dispatch table: one handler per control-message type a worker may send.

`handle(root, worker_id, msg)` finds the sender's live incarnation, runs the handler for `msg.type` and
never raises: a malformed body is counted (`root.bad_bodies`) and answered with an error when a reply is
expected. Session events are relayed under their own name with the session's own node id (`node_id`) and
its host (`worker`), after the orchestrator's hook and the pool's bookkeeping saw them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from loguru import logger

from legion.bus.protocol import AGENT_SETTLED, TOOL_GROUPS, Message
from legion.codes import DISK_FULL
from legion.ledger.writer import fail_fast
from legion.supervision.child_spec import MAX_DETAIL
from legion.supervision.rpc_child import RpcChild

if TYPE_CHECKING:
    from legion.supervision.root import RootSupervisor

LOG_LEVELS = frozenset({"TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"})
Handler = Callable[["RootSupervisor", RpcChild, dict[str, Any], bool], Awaitable[dict[str, Any] | None]]


async def handle(root: RootSupervisor, worker_id: str, msg: Message) -> dict[str, Any] | None:
    """Handle one validated frame from a worker; never raises (bad bodies are counted)."""
    child = root.registry.handle(worker_id)
    if child is None:
        root.unknown_frames += 1
        return {"ok": False, "error": f"unknown worker {worker_id!r}"} if msg.corr else None
    handler = HANDLERS.get(msg.type)
    try:
        if handler is None:
            return {"ok": False, "error": f"unsupported request type {msg.type!r}"} if msg.corr is not None else None
        return await handler(root, child, msg.body, msg.corr is not None)
    except Exception as exc:
        root.bad_bodies += 1
        logger.warning("control message {!r} from {!r} rejected: {!r}", msg.type, worker_id, exc)
        return {"ok": False, "error": "rejected", "detail": repr(exc)[:MAX_DETAIL]} if msg.corr else None


async def heartbeat(root: RootSupervisor, child: RpcChild, body: dict[str, Any], _: bool) -> None:
    if "toolPgids" in body and not child.note_tool_groups(body["toolPgids"], replace=True):
        root.bad_bodies += 1


async def ready(root: RootSupervisor, child: RpcChild, body: dict[str, Any], _: bool) -> None:
    pid = body.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        raise ValueError(f"ready.pid must be an int, got {pid!r}")
    if not child.on_ready(body):
        root.bad_bodies += 1


async def event(root: RootSupervisor, child: RpcChild, body: dict[str, Any], _: bool) -> None:
    name = str(body["name"])
    if name == TOOL_GROUPS:
        if not child.note_tool_groups(body.get("pgids"), replace=False):
            root.bad_bodies += 1
        return
    for listener in root.nodes.session_listeners:  # first: the orchestrator notes a settle before its status lands
        listener(child.id, name, dict(body))
    pool = root.nodes.pool(child.id)
    if pool is not None:
        pool.on_event(name, dict(body))
    elif name == AGENT_SETTLED:
        child.settled = True  # an rpc session's run ended: its process now only caches finished work
    extra = {k: v for k, v in body.items() if k not in ("name", "nodeId") and isinstance(k, str)}
    node_id = body.get("nodeId") if isinstance(body.get("nodeId"), str) else child.id
    root.publish(name[:200], {"node_id": node_id, "worker": child.id, **extra})


async def log(root: RootSupervisor, child: RpcChild, body: dict[str, Any], _: bool) -> None:
    level = str(body["level"]).upper()
    logger.log(level if level in LOG_LEVELS else "INFO", "[{}] {}", child.id, str(body["msg"])[:MAX_DETAIL])


async def request(root: RootSupervisor, child: RpcChild, body: dict[str, Any], want_reply: bool) -> dict[str, Any] | None:
    """A worker's request to the root: today the legion tools of its sessions (`legion.tool`)."""
    op = body.get("op")
    if op == "legion.tool" and root.nodes.tool_handler is not None:
        node_id = body.get("nodeId") if isinstance(body.get("nodeId"), str) else child.id
        tool, args = body.get("tool"), body.get("args")
        if not isinstance(tool, str) or not isinstance(args, dict):
            return {"ok": False, "text": "legion.tool needs a tool name and an args object"}
        call = body.get("callId")
        full = root.writer.disk_full if root.writer is not None else None
        if full is not None:  # a tool call that needs the ledger would wait for free space: it fails now instead
            return {"ok": False, "code": DISK_FULL, "text": f"{tool}: not done, the run is pausing: {full}; free space, "
                                                            "then `legion resume` continues the run"}
        with fail_fast():  # its ledger writes fail with DiskFullError if the disk fills meanwhile
            return await root.nodes.tool_handler(str(node_id), tool,
                                           {**args, "_callId": call} if isinstance(call, str) else args)
    return {"ok": False, "error": f"unsupported op {op!r}"} if want_reply else None


HANDLERS: dict[str, Handler] = {"heartbeat": heartbeat, "ready": ready, "event": event, "log": log, "request": request}
