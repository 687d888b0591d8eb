"""Endpoint security: private run directories, and CurveZMQ with a client allow-list for tcp://.

`ipc://` sockets live in a 0700 run directory, so only the run's user can connect. A `tcp://`
bind is refused unless a `CurveServerConfig` is given: the socket becomes a CURVE server and a
ZAP authenticator (one per ZeroMQ context, shared by the sockets bound in it) admits only the
listed client public keys (and, optionally, only the listed peer IP addresses — note that ZAP
IP rules apply to every CURVE socket of the same context).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from loguru import logger
from zmq.auth.thread import ThreadAuthenticator

ZAP_DOMAIN = "legion"
REFUSED_LOGGED = 100
# sockaddr_un.sun_path is 108 bytes on Linux including the NUL terminator.
IPC_PATH_MAX = 107

_KEYGEN_HINT = (
    "create keys with: python -c \"import zmq.auth; "
    "zmq.auth.create_certificates('KEYDIR', 'server'); zmq.auth.create_certificates('KEYDIR', 'client')\" "
    "(or legion.bus.security.generate_certificates), then pass "
    "CurveServerConfig.from_certificates('KEYDIR/server.key_secret', ['KEYDIR/client.key']) to the server "
    "and CurveClientConfig.from_certificates('KEYDIR/client.key_secret', 'KEYDIR/server.key') to clients"
)


class InsecureEndpointError(ValueError):
    """An endpoint that would expose the bus without authentication or outside a private directory."""


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create `path` (and parents) if needed and make sure it is ours and mode 0700."""
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = p.stat()
    if st.st_uid != os.getuid():
        raise InsecureEndpointError(
            f"run directory {p} is owned by uid {st.st_uid}, not by us (uid {os.getuid()}); "
            "use a run directory you own"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(p, 0o700)
    return p


def ipc_endpoint(run_dir: str | os.PathLike[str], name: str) -> str:
    """`ipc://<run_dir>/<name>`, refusing paths the kernel cannot bind."""
    path = Path(run_dir).absolute() / name
    if len(os.fsencode(str(path))) > IPC_PATH_MAX:
        raise InsecureEndpointError(
            f"ipc socket path {path} is longer than {IPC_PATH_MAX} bytes (the Unix socket limit); "
            "use a shorter run directory"
        )
    return f"ipc://{path}"


def check_bind_endpoint(endpoint: str, curve: CurveServerConfig | None) -> None:
    """Raise unless binding `endpoint` is allowed: ipc in a private dir, inproc, or tcp with Curve."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise ValueError(f"endpoint {endpoint!r} has no transport; use ipc://<run_dir>/ctl.sock or tcp://HOST:PORT")
    if scheme == "tcp":
        if curve is None:
            raise InsecureEndpointError(
                f"refusing to bind {endpoint}: a tcp:// endpoint is reachable from the network and must use "
                f"CurveZMQ with an allow-list of client keys, but no CurveServerConfig was given; {_KEYGEN_HINT}"
            )
        return
    if scheme == "ipc":
        parent = Path(rest).parent
        if len(os.fsencode(rest)) > IPC_PATH_MAX:
            raise InsecureEndpointError(f"ipc socket path {rest} is longer than {IPC_PATH_MAX} bytes; shorten it")
        try:
            mode = stat.S_IMODE(parent.stat().st_mode)
        except FileNotFoundError:
            raise InsecureEndpointError(
                f"cannot bind {endpoint}: directory {parent} does not exist; create the run directory first "
                "(legion.bus.security.ensure_private_dir)"
            ) from None
        if mode & 0o077:
            raise InsecureEndpointError(
                f"refusing to bind {endpoint}: directory {parent} has mode {mode:o}, so other users could "
                f"connect; ipc sockets must live in a 0700 run directory (chmod 700 {parent})"
            )
        return
    if scheme == "inproc":
        return
    raise ValueError(f"unsupported transport {scheme!r} in {endpoint!r}; use ipc:// or tcp://")


def restrict_ipc_socket(endpoint: str) -> None:
    """Make a bound `ipc://` socket file 0600 (defence in depth: the 0700 directory is the guard)."""
    scheme, _, path = endpoint.partition("://")
    if scheme == "ipc" and not path.startswith("@"):  # "@..." is Linux's abstract namespace: no file
        os.chmod(path, 0o600)


def _check_key(key: bytes, what: str) -> bytes:
    if isinstance(key, str):
        key = key.encode("ascii")
    if not isinstance(key, bytes) or len(key) != 40:
        raise ValueError(f"{what} must be a 40-character Z85 CurveZMQ key (see zmq.curve_keypair)")
    return key


@dataclass(frozen=True)
class CurveServerConfig:
    """Server keypair plus the client public keys (Z85) allowed to connect."""

    public_key: bytes
    secret_key: bytes
    allowed_clients: frozenset[bytes]
    allowed_ips: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "public_key", _check_key(self.public_key, "server public key"))
        object.__setattr__(self, "secret_key", _check_key(self.secret_key, "server secret key"))
        keys = frozenset(_check_key(k, "allowed client key") for k in self.allowed_clients)
        if not keys:
            raise ValueError(f"CurveServerConfig needs at least one allowed client public key; {_KEYGEN_HINT}")
        object.__setattr__(self, "allowed_clients", keys)

    @classmethod
    def from_certificates(
        cls,
        server_secret_file: str | os.PathLike[str],
        client_public_files: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
        allowed_ips: Iterable[str] = (),
    ) -> CurveServerConfig:
        """Load the server `.key_secret` and the allowed clients (`.key` files, or a directory of them)."""
        public, secret = zmq.auth.load_certificate(server_secret_file)
        if secret is None:
            raise ValueError(f"{server_secret_file} holds no secret key; pass the server's .key_secret file")
        if isinstance(client_public_files, str | os.PathLike) and Path(client_public_files).is_dir():
            clients = frozenset(zmq.auth.load_certificates(client_public_files))
        else:
            files = [client_public_files] if isinstance(client_public_files, str | os.PathLike) else client_public_files
            clients = frozenset(zmq.auth.load_certificate(f)[0] for f in files)
        return cls(public, secret, clients, tuple(allowed_ips))


@dataclass(frozen=True)
class CurveClientConfig:
    """Client keypair plus the server public key it expects."""

    public_key: bytes
    secret_key: bytes
    server_public_key: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "public_key", _check_key(self.public_key, "client public key"))
        object.__setattr__(self, "secret_key", _check_key(self.secret_key, "client secret key"))
        object.__setattr__(self, "server_public_key", _check_key(self.server_public_key, "server public key"))

    @classmethod
    def from_certificates(
        cls, client_secret_file: str | os.PathLike[str], server_public_file: str | os.PathLike[str]
    ) -> CurveClientConfig:
        public, secret = zmq.auth.load_certificate(client_secret_file)
        if secret is None:
            raise ValueError(f"{client_secret_file} holds no secret key; pass the client's .key_secret file")
        server_public, _ = zmq.auth.load_certificate(server_public_file)
        return cls(public, secret, server_public)


def generate_certificates(key_dir: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Create `<name>.key` / `<name>.key_secret` in a private `key_dir`; returns (public, secret) paths."""
    d = ensure_private_dir(key_dir)
    public, secret = zmq.auth.create_certificates(d, name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


class _AllowList:
    """ZAP credentials provider: thread-safe membership test over Z85 client keys."""

    def __init__(self) -> None:
        self._refs: dict[bytes, int] = {}
        self._refused: set[bytes] = set()  # logged once each, at most REFUSED_LOGGED (a flood cannot fill the log)

    def add(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            self._refs[k] = self._refs.get(k, 0) + 1

    def remove(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            n = self._refs.get(k, 0) - 1
            if n <= 0:
                self._refs.pop(k, None)
            else:
                self._refs[k] = n

    def callback(self, domain: str, key: bytes) -> bool:
        """Is this client's key (Z85) allowed? A refused one is logged: the client cannot be told which."""
        if key in self._refs:
            return True
        if key not in self._refused and len(self._refused) < REFUSED_LOGGED:
            self._refused.add(key)
            logger.warning("CurveZMQ: refused client key {} (not on the allow-list; each key is logged once)",
                           key.decode("ascii", "replace"))
        return False


@dataclass
class _AuthEntry:
    auth: ThreadAuthenticator
    allow: _AllowList
    users: int = 0
    ips: dict[str, int] = field(default_factory=dict)


_auth_lock = threading.Lock()
_auth_by_ctx: dict[int, _AuthEntry] = {}


def _start_authenticator(ctx: zmq.Context, timeout: float = 5.0) -> ThreadAuthenticator:
    """Start a ZAP authenticator, retrying while a just-stopped one still holds the ZAP endpoint."""
    deadline = time.monotonic() + timeout
    while True:
        auth = ThreadAuthenticator(ctx, log=None)
        try:
            auth.start()
            return auth
        except zmq.ZMQError as exc:
            auth.stop()
            # Closing a socket is asynchronous in libzmq: the previous authenticator's inproc
            # endpoint can stay bound for a moment after stop().
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def acquire_curve_server(ctx: zmq.Context, sock: zmq.Socket, cfg: CurveServerConfig) -> None:
    """Make `sock` a CURVE server and admit only `cfg.allowed_clients` (call before bind)."""
    with _auth_lock:
        entry = _auth_by_ctx.get(id(ctx))
        if entry is None:
            auth = _start_authenticator(ctx)
            allow = _AllowList()
            auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=allow)
            entry = _auth_by_ctx[id(ctx)] = _AuthEntry(auth, allow)
        entry.users += 1
        entry.allow.add(cfg.allowed_clients)
        if cfg.allowed_ips:
            entry.auth.allow(*cfg.allowed_ips)
    sock.curve_secretkey = cfg.secret_key
    sock.curve_publickey = cfg.public_key
    sock.curve_server = True
    sock.zap_domain = ZAP_DOMAIN.encode()


def release_curve_server(ctx: zmq.Context, cfg: CurveServerConfig) -> None:
    """Undo `acquire_curve_server`; the authenticator stops with its last user."""
    with _auth_lock:
        entry = _auth_by_ctx.get(id(ctx))
        if entry is None:
            return
        entry.allow.remove(cfg.allowed_clients)
        entry.users -= 1
        if entry.users <= 0:
            entry.auth.stop()
            del _auth_by_ctx[id(ctx)]


def apply_curve_client(sock: zmq.Socket, cfg: CurveClientConfig) -> None:
    """Make `sock` a CURVE client of the server whose public key is in `cfg` (call before connect)."""
    sock.curve_secretkey = cfg.secret_key
    sock.curve_publickey = cfg.public_key
    sock.curve_serverkey = cfg.server_public_key
