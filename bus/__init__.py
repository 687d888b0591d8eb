"""ZeroMQ wire protocol, control channel and monitor stream (imports nothing of legion)."""

from .control import (
    BusError,
    ChannelClosed,
    ControlClient,
    ControlServer,
    PeerUnavailable,
    RemoteError,
    RequestTimeout,
    SocketTuning,
    control_endpoint,
)
from .protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    DropCounter,
    Message,
    ProtocolError,
    decode,
    encode,
    register_type,
    registered_types,
)
from .security import (
    CurveClientConfig,
    CurveServerConfig,
    InsecureEndpointError,
    ensure_private_dir,
    generate_certificates,
    ipc_endpoint,
)

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "BusError",
    "ChannelClosed",
    "ControlClient",
    "ControlServer",
    "CurveClientConfig",
    "CurveServerConfig",
    "DropCounter",
    "InsecureEndpointError",
    "Message",
    "PeerUnavailable",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "SocketTuning",
    "control_endpoint",
    "decode",
    "encode",
    "ensure_private_dir",
    "generate_certificates",
    "ipc_endpoint",
    "register_type",
    "registered_types",
]
