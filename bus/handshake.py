"""Why a CurveZMQ client gets nothing, told at once: the outcome of its socket's first handshake.

A server that refuses a client ends the connection inside the CurveZMQ handshake, and a client waiting
for data would hear nothing until its own timeout. The socket's monitor sees the handshake's outcome
within milliseconds: a key the server's ZAP handler refuses (not on the allow-list) arrives as an
authentication failure with the ZAP status (400); a wrong server key, or an address the tcp relay does not
admit, as a connection ended without detail (ZeroMQ retries: twice in a row decides). The relay's
`monitor-relay.log` names each refused key (docs/servers.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_WATCHED = zmq.EVENT_HANDSHAKE_SUCCEEDED | _FAILED
# a failure can be a dropped connection under load; the server refusing keeps failing at every retry
REFUSALS = 2

_Wait = tuple[Any, int, int]  # (socket to poll, zmq.POLLIN, timeout in ms): the clients' step protocol


class HandshakeWatch:
    """The handshake events of one client socket; attach it before the socket connects."""

    def __init__(self, sock: Any, endpoint: str) -> None:
        self.endpoint = endpoint
        self._sock = sock
        self.monitor = sock.get_monitor_socket(_WATCHED)  # the socket's own class: asyncio or blocking
        self._io: zmq.Socket[bytes] = zmq.Socket.shadow(self.monitor.underlying)

    def steps(self, timeout: float) -> Generator[_Wait, int, str | None]:
        """Wait up to `timeout` s for the first handshake: None once one succeeded (or nothing was decided in
        time: the caller's own timeouts apply), else why the server refused this client."""
        deadline = time.monotonic() + timeout
        failures = 0
        while True:
            try:
                event = recv_monitor_message(self._io, zmq.NOBLOCK)["event"]
            except zmq.Again:
                left = deadline - time.monotonic()
                if left <= 0 or not (yield self.monitor, zmq.POLLIN, int(left * 1000) + 1):
                    return None
                continue
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return None
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                return self.refused_key()
            failures += 1
            if failures >= REFUSALS:
                return self.refused_connection()

    def refused_key(self) -> str:
        return (f"{self.endpoint} refused this client's key in the CurveZMQ handshake: its public key is not on the "
                "run's allow-list (`legion run --monitor-allow FILE`); the run's monitor-relay.log names the "
                "refused key")

    def refused_connection(self) -> str:
        return (f"{self.endpoint} ended the CurveZMQ handshake: --server-key is not the run's public key (run.json's "
                "monitor.serverKey), or the run's monitor relay does not admit this address (its "
                "monitor-relay.log says why)")

    def close(self) -> None:
        """Stop watching (idempotent)."""
        if self.monitor is None:
            return
        with contextlib.suppress(zmq.ZMQError):  # the socket is closed already: so is its monitor
            self._sock.disable_monitor()
        self.monitor.close(linger=0)
        self.monitor = None
