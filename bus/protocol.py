"""Wire protocol of the control channel: one orjson frame per message, validated on the way in.

Frame layout (a JSON object, one ZeroMQ frame):
    {"v": 1, "t": <type>, "s": <sender>, "c": <corr id or null>, "b": <body object>}

Every message type is registered with the fields its body must carry (`register_type`); the bus
registers its core types below and other components register theirs at import time. `decode`
turns anything malformed into `ProtocolError(reason)` where `reason` is one of `REASONS`; callers
count those with a `DropCounter` and drop the frame — bad input is never fatal.

A field may accept a tuple of types; `"error"` is a core type (a failed request's answer); `encode`
and `decode` take an optional `max_bytes`. `wire_safe(value)` returns a value `encode` accepts,
repairing what operator or model text may carry (lone surrogates) the way the transcript writer does
(`valid_unicode`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20  # 1 MiB: generous for control traffic, small enough to refuse floods

# Drop reasons (stable short codes; counters and logs use them).
REASONS = (
    "oversized",  # frame larger than the limit (checked before parsing)
    "not_json",  # not valid UTF-8 JSON
    "not_object",  # valid JSON but not an object
    "bad_version",  # "v" missing or not PROTOCOL_VERSION
    "bad_envelope",  # "t"/"s"/"c"/"b" missing or of the wrong JSON type
    "unknown_type",  # "t" not registered
    "missing_field",  # body lacks a field the type requires
    "bad_field",  # body field of the wrong type
    "unencodable",  # (encode only) body not serialisable by orjson
    "multipart",  # (transport) wrong number of frames
    "sender_mismatch",  # (transport) sender field differs from the peer the socket identity names
    "unknown_peer",  # (transport) identity that is no admitted worker incarnation (refused)
    "late_reply",  # (transport) reply whose request already timed out or never existed
    "overload",  # (transport) one-way handler queue full
    "peer_gone",  # (transport) request read after its connection closed (nobody left to answer)
    "internal",  # (transport) unexpected error while handling a frame (logged with traceback)
)

_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_.:-]{0,63}$")
FieldSpec = type | tuple[type, ...]


class ProtocolError(ValueError):
    """A frame or message that breaks the protocol; `reason` is one of `REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Message:
    """One control-channel message; `corr` links a request to its reply."""

    type: str
    sender: str
    body: dict[str, Any] = field(default_factory=dict)
    corr: str | None = None


_registry: dict[str, dict[str, FieldSpec]] = {}
_registry_lock = threading.Lock()


def register_type(name: str, required: Mapping[str, FieldSpec] | None = None) -> None:
    """Register a message type and the body fields (name -> type) it must carry.

    Registering the same name again with the same fields is a no-op; with different fields it
    raises ValueError, because two components would then disagree about the wire format.
    """
    if not isinstance(name, str) or not _TYPE_NAME.match(name):
        raise ValueError(f"message type {name!r} is not a valid name (pattern {_TYPE_NAME.pattern})")
    spec = dict(required or {})
    for key, kind in spec.items():
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(key, str) or not all(isinstance(k, type) for k in kinds):
            raise ValueError(f"message type {name!r}: field {key!r} must map a str to a type or tuple of types")
    with _registry_lock:
        existing = _registry.get(name)
        if existing is not None and existing != spec:
            raise ValueError(
                f"message type {name!r} is already registered with fields {existing!r}; "
                f"refusing conflicting fields {spec!r}"
            )
        _registry[name] = spec


def registered_types() -> dict[str, dict[str, FieldSpec]]:
    """A copy of the registry (type name -> required fields)."""
    with _registry_lock:
        return {name: dict(spec) for name, spec in _registry.items()}


def is_registered(name: str) -> bool:
    return name in _registry


# Core types. Bodies may carry more fields than required.
CORE_TYPES: dict[str, dict[str, FieldSpec]] = {
    "ready": {},  # worker -> root once connected; body free-form (pid, versions, …)
    "heartbeat": {},  # worker -> root every interval; body = payload() (tool stack, last activity)
    "event": {"name": str},  # one-way process-domain event (docs/spec-conformance.md §4.4), extra fields in body
    "request": {"op": str},  # generic request (corr set) when no dedicated type exists
    "reply": {},  # answer to any request; same corr
    "error": {"reason": str},  # failed request's answer; same corr; "detail" optional
    "shutdown": {},  # root -> worker: stop gracefully; "reason" optional
    "log": {"level": str, "msg": str},
}
for _name, _spec in CORE_TYPES.items():
    register_type(_name, _spec)

RESPONSE_TYPES = frozenset({"reply", "error"})

# Process-domain events (docs/spec-conformance.md §4.4): never persisted, carry "nodeId"; they travel as "event"
# messages ({"name": <one of these>, "nodeId": …}) and on the monitor stream. The ledger owns the
# 16 persisted tree-event types. Workers may send other event names (e.g. "usage"); these are the
# names the monitor and the supervisor interpret.
# Code sends and reads them through these names, never as literals (tests/unit/meta/test_vocabulary.py checks it);
# "node_launched" and "node_retired" are the ledger's stored event names (`legion.ledger.constants`), published as
# they are recorded.
NODE_STEERED = "node_steered"  # a steer reached a child ({name, disposition, by}); the orchestrator publishes it
NODE_ABORTED = "node_aborted"  # an abort was sent to a child's turn ({name, outcome, by}); likewise
UI_REQUEST = "ui_request"
TEXT_DELTA = "text_delta"  # a session's streamed text ({delta})
TOOL_CALL = "tool_call"  # a tool call starts or ends ({phase: start|end, id, tool, …})
TURN_START = "turn_start"
AGENT_SETTLED = "agent_settled"  # a session's run ended ({stopReason, error, outcome, …})
LAUNCH_QUEUED = "launch_queued"  # the pool queued a launch ({nodeId, position, …})
LAUNCH_ADMITTED = "launch_admitted"
PROCESS_EVENT_TYPES = frozenset(
    {
        "node_launched",
        NODE_STEERED,
        "node_retired",
        NODE_ABORTED,
        UI_REQUEST,
        TEXT_DELTA,
        TOOL_CALL,
        TURN_START,
        AGENT_SETTLED,
        LAUNCH_QUEUED,
        LAUNCH_ADMITTED,
    }
)

# Other process events with a fixed name that one process (or layer) sends and another reads; the monitor passes
# them on as they are. The same rule holds: code uses these names, never literals.
SESSION_STARTED = "session_started"  # a pool's session is up ({nodeId, …})
LAUNCH_FAILED = "launch_failed"  # a pool could not start a session ({nodeId, code, error})
USAGE = "usage"  # a session's token and cost totals after a model call
TOOL_GROUPS = "tool_groups"  # a worker's live tool process groups ({nodeId, pgids})
MODEL_FALLBACK = "model_fallback"  # a session switched to a fallback model ({from, model, error, …})
NODE_STATUS = "node_status"  # the root's lifecycle publishes a node's status change
NODE_PROBLEM = "node_problem"  # the root saw a node misbehave ({node_id, what, detail})
AGENT_LAUNCHED = "agent_launched"  # the root session's launch, for the live view
SUPERVISOR_EXITED = "supervisor_exited"  # an OTP supervisor (a team's, the top one) ended ({supervisor, reason})
CHILD_EXITED = "child_exited"  # a supervised worker process exited ({node_id, supervisor, reason, restarting})
NODE_PAUSED = "node_paused"  # a session shutdown left a node paused for the run's resume ({node_id, status})
LIFECYCLE_ERROR = "lifecycle_error"  # the root's lifecycle bookkeeping failed for a node ({node_id, what, error})
MONITOR_RELAY = "monitor_relay"  # the tcp monitor relay restarted, exited or is down ({state, …})
LEDGER_STALL = "ledger_stall"  # the root's ledger writes stalled ({seconds, detail})
LEDGER_DISK_FULL = "ledger_disk_full"  # the root's ledger writes hit a full disk ({detail})
TRANSCRIPT_REPAIRED = "transcript_repaired"  # a session's transcript had damaged lines ({transcript, badLines})
EMPTY_RETRY = "empty_retry"  # a model call answered nothing and is retried ({attempt, backoffMs})
# a model request failed with a retryable error (429, 5xx, a lost connection) and is sent again
# ({attempt, max_retries, delay_ms, status_code, error, provider, model}; docs/events.md)
RETRY_SCHEDULED = "retry_scheduled"
RETRY_SUCCEEDED = "retry_succeeded"  # a retried model request was answered ({attempts, …})
RETRY_GAVE_UP = "retry_gave_up"  # a model request still failed when its retries ran out ({attempts, …})
RETRY_EVENTS = (RETRY_SCHEDULED, RETRY_SUCCEEDED, RETRY_GAVE_UP)
OTHER_PROCESS_EVENTS = frozenset({SESSION_STARTED, LAUNCH_FAILED, USAGE, TOOL_GROUPS, MODEL_FALLBACK, NODE_STATUS,
                                  NODE_PROBLEM, AGENT_LAUNCHED, SUPERVISOR_EXITED, CHILD_EXITED, NODE_PAUSED,
                                  LIFECYCLE_ERROR, MONITOR_RELAY, LEDGER_STALL, LEDGER_DISK_FULL, TRANSCRIPT_REPAIRED,
                                  EMPTY_RETRY, *RETRY_EVENTS})

# The public event stream's own types (docs/events.md): `legion run --json` begins with `run_started` and ends with
# `result`; `legion monitor --json` shows the monitor's snapshot as a `snapshot` event. No process sends them.
RUN_STARTED = "run_started"
RESULT = "result"
SNAPSHOT = "snapshot"


def _check_body(type_: str, body: Any) -> None:
    spec = _registry.get(type_)
    if spec is None:
        raise ProtocolError("unknown_type", f"message type {type_!r} is not registered")
    if not isinstance(body, dict):
        raise ProtocolError("bad_envelope", f"body of {type_!r} must be an object")
    for key, kind in spec.items():
        if key not in body:
            raise ProtocolError("missing_field", f"{type_!r} body lacks {key!r}")
        value = body[key]
        # bool is an int subclass; a flag is never a count.
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            raise ProtocolError(
                "bad_field", f"{type_!r} field {key!r} must be {_kind_name(kind)}, got {type(value).__name__}"
            )


def _as_tuple(kind: FieldSpec) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: FieldSpec) -> str:
    return " | ".join(k.__name__ for k in _as_tuple(kind))


def encode(msg: Message, *, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Serialise a message to one frame; raises ProtocolError for what `decode` would refuse."""
    if not isinstance(msg.sender, str):
        raise ProtocolError("bad_envelope", "sender must be a str")
    if msg.corr is not None and not isinstance(msg.corr, str):
        raise ProtocolError("bad_envelope", "corr must be a str or None")
    _check_body(msg.type, msg.body)
    try:
        raw = orjson.dumps({"v": PROTOCOL_VERSION, "t": msg.type, "s": msg.sender, "c": msg.corr, "b": msg.body})
    except TypeError as exc:  # orjson.JSONEncodeError: lone surrogates, >64-bit ints, non-str keys, …
        raise ProtocolError("unencodable", f"{msg.type!r} body cannot be sent: {exc}; repair it before sending "
                            "(strings must be valid Unicode — no lone UTF-16 surrogates; integers within 64 bits; "
                            "object keys str)") from None
    except Exception as exc:  # anything else orjson may raise must still be a protocol error, never a crash
        raise ProtocolError("unencodable", f"{msg.type!r} body cannot be sent: {type(exc).__name__}: {exc}") from None
    if len(raw) > max_bytes:
        raise ProtocolError("oversized", f"{msg.type!r} frame is {len(raw)} bytes, limit {max_bytes}")
    return raw


def decode(raw: bytes | bytearray | memoryview, *, max_bytes: int = MAX_FRAME_BYTES) -> Message:
    """Parse and validate one frame; anything malformed raises ProtocolError(reason)."""
    if len(raw) > max_bytes:
        raise ProtocolError("oversized", f"frame is {len(raw)} bytes, limit {max_bytes}")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError("not_json", str(exc)[:120]) from None
    if not isinstance(obj, dict):
        raise ProtocolError("not_object", f"frame is a JSON {type(obj).__name__}")
    version = obj.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", f"version {version!r}, expected {PROTOCOL_VERSION}")
    type_, sender, corr, body = obj.get("t"), obj.get("s"), obj.get("c"), obj.get("b")
    if not isinstance(type_, str) or not isinstance(sender, str):
        raise ProtocolError("bad_envelope", "'t' and 's' must be strings")
    if corr is not None and not isinstance(corr, str):
        raise ProtocolError("bad_envelope", "'c' must be a string or null")
    _check_body(type_, body)
    assert isinstance(body, dict)
    return Message(type=type_, sender=sender, body=body, corr=corr)


def valid_unicode(value: Any) -> Any:
    """``value`` with every string made valid Unicode: surrogate pairs joined, lone surrogates → U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {valid_unicode(k): valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [valid_unicode(v) for v in value]
    return value


def wire_safe(value: Any) -> Any:
    """``value`` itself when orjson can encode it, else with its strings repaired by `valid_unicode`
    (operator or model text may carry lone surrogates: undecodable argv bytes, an emoji split across chunks)."""
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return valid_unicode(value)
    return value


class DropCounter:
    """Counts dropped frames by reason; cheap enough for the hot path."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + n

    def __getitem__(self, reason: str) -> int:
        return self._counts.get(reason, 0)

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def __repr__(self) -> str:
        return f"DropCounter({self.snapshot()!r})"
