"""ZeroMQ wire protocol, control channel, monitor stream and tcp monitor relay; of legion, it imports only `procs`.

- `protocol`: `Message`, `encode`/`decode` (one orjson frame), `register_type`, `DropCounter`,
  `wire_safe`/`valid_unicode` (repair strings orjson refuses before they go on the wire).
- `control`: `ControlServer` (root ROUTER) / `ControlClient` (worker DEALER): requests with
  timeouts, one-way sends, app heartbeats (`start_heartbeat`, `last_seen`, `silent_workers`),
  per-incarnation identities (`incarnation_identity`, `ControlServer.admit`/`forget`).
- `monitor`: `MonitorPublisher` (sequenced PUB + snapshot) and the Clone-pattern clients
  `MonitorClient` (asyncio) / `MonitorStream` (blocking).
- `security`: 0700 run directories, tcp:// only with CurveZMQ and a client-key allow-list.
- `handshake`: `HandshakeWatch`, why a CurveZMQ client is refused, told from its socket's handshake events.
- `relay`: `MonitorRelay`, the tcp monitor served with CurveZMQ by a process of its own (docs/servers.md).

The wire formats, for a client written without legion: docs/protocol.md.

The public names are exported lazily (PEP 562, `legion.lazy_exports`), so importing one submodule (the event
names of `protocol`, say, which the CLI's views read) never drags in ZeroMQ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from legion import lazy_exports

_EXPORTS: dict[str, str] = {
    "MAX_FRAME_BYTES": "protocol",
    "PROCESS_EVENT_TYPES": "protocol",
    "PROTOCOL_VERSION": "protocol",
    "REASONS": "protocol",
    "BusError": "control",
    "ChannelClosed": "control",
    "ControlClient": "control",
    "ControlServer": "control",
    "CurveClientConfig": "security",
    "CurveServerConfig": "security",
    "DropCounter": "protocol",
    "InsecureEndpointError": "security",
    "Message": "protocol",
    "MonitorClient": "monitor",
    "MonitorError": "monitor",
    "MonitorEvent": "monitor",
    "MonitorItem": "monitor",
    "MonitorPublisher": "monitor",
    "MonitorStream": "monitor",
    "PeerUnavailable": "control",
    "ProtocolError": "protocol",
    "RemoteError": "control",
    "RequestTimeout": "control",
    "Snapshot": "monitor",
    "SocketTuning": "control",
    "control_endpoint": "control",
    "decode": "protocol",
    "encode": "protocol",
    "ensure_private_dir": "security",
    "generate_certificates": "security",
    "incarnation_identity": "control",
    "ipc_endpoint": "security",
    "monitor_endpoints": "monitor",
    "register_type": "protocol",
    "registered_types": "protocol",
    "valid_unicode": "protocol",
    "wire_safe": "protocol",
}

__all__ = [
    "MAX_FRAME_BYTES",
    "PROCESS_EVENT_TYPES",
    "PROTOCOL_VERSION",
    "REASONS",
    "BusError",
    "ChannelClosed",
    "ControlClient",
    "ControlServer",
    "CurveClientConfig",
    "CurveServerConfig",
    "DropCounter",
    "InsecureEndpointError",
    "Message",
    "MonitorClient",
    "MonitorError",
    "MonitorEvent",
    "MonitorItem",
    "MonitorPublisher",
    "MonitorStream",
    "PeerUnavailable",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "Snapshot",
    "SocketTuning",
    "control_endpoint",
    "decode",
    "encode",
    "ensure_private_dir",
    "generate_certificates",
    "incarnation_identity",
    "ipc_endpoint",
    "monitor_endpoints",
    "register_type",
    "registered_types",
    "valid_unicode",
    "wire_safe",
]

__getattr__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from legion.bus.control import (
        BusError,
        ChannelClosed,
        ControlClient,
        ControlServer,
        PeerUnavailable,
        RemoteError,
        RequestTimeout,
        SocketTuning,
        control_endpoint,
        incarnation_identity,
    )
    from legion.bus.monitor import (
        MonitorClient,
        MonitorError,
        MonitorEvent,
        MonitorItem,
        MonitorPublisher,
        MonitorStream,
        Snapshot,
        monitor_endpoints,
    )
    from legion.bus.protocol import (
        MAX_FRAME_BYTES,
        PROCESS_EVENT_TYPES,
        PROTOCOL_VERSION,
        REASONS,
        DropCounter,
        Message,
        ProtocolError,
        decode,
        encode,
        register_type,
        registered_types,
        valid_unicode,
        wire_safe,
    )
    from legion.bus.security import (
        CurveClientConfig,
        CurveServerConfig,
        InsecureEndpointError,
        ensure_private_dir,
        generate_certificates,
        ipc_endpoint,
    )
