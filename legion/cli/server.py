"""Runs on servers: `legion keys` and the CurveZMQ options of a tcp:// monitor (`run --monitor…`, `monitor --key…`).

- `legion keys NAME [--dir DIR]` writes a CurveZMQ keypair `NAME.key` (public, give it away) and
  `NAME.key_secret` (0600) in DIR (default `~/.config/legion/keys`, 0700).
- `legion run --monitor tcp://HOST:PORT --monitor-key server.key_secret --monitor-allow FILE`: the monitor
  relay (a process the root supervises; the root never listens on tcp: docs/servers.md) serves the PUB on
  HOST:PORT and the snapshot endpoint on HOST:PORT+1, both CURVE servers; FILE is the allow-list, one
  client per line: a 40-character Z85 public key or the path of a `.key` file (`#` starts a comment).
  A client not on it gets nothing (ZAP refuses the handshake).
- `legion monitor tcp://HOST:PORT --key client.key_secret --server-key server.key` attaches from anywhere.

`legion run --detach` (a run as a daemon) is in `legion.cli.run`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from legion.run_errors import RunConfigError


def default_key_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "legion" / "keys"


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("keys", help="create a CurveZMQ keypair for a tcp:// monitor (NAME.key, NAME.key_secret)")
    p.add_argument("name", help="the key's name, e.g. server or alice")
    p.add_argument("--dir", help=f"where (default {default_key_dir()})")
    p.set_defaults(func=cmd_keys)


def cmd_keys(args: argparse.Namespace) -> int:
    from legion.bus.security import generate_certificates

    key_dir = Path(args.dir).expanduser() if args.dir else default_key_dir()
    public, secret = key_dir / f"{args.name}.key", key_dir / f"{args.name}.key_secret"
    if public.exists() or secret.exists():
        print(f"legion keys: {public} or {secret} exists already; nothing was written (pick another name)",
              file=sys.stderr)
        return 2
    public, secret = generate_certificates(key_dir, args.name)
    print(f"public key (share it): {public}\nsecret key (keep it, 0600): {secret}")
    return 0


def read_allow_list(path: Path) -> list[bytes]:
    """Client public keys from an allow-list file (Z85 keys or .key file paths, one per line)."""
    import zmq.auth

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise RunConfigError(f"cannot read the monitor allow-list {path}: {exc.strerror or exc}") from None
    keys: list[bytes] = []
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if len(line) == 40 and not Path(line).exists():
            keys.append(line.encode("ascii"))
            continue
        cert = (path.parent / line) if not Path(line).is_absolute() else Path(line)
        try:
            keys.append(zmq.auth.load_certificate(cert)[0])
        except (OSError, ValueError) as exc:
            raise RunConfigError(f"{path}:{n}: {line!r} is neither a 40-character Z85 public key nor a readable "
                                 f".key file ({exc})") from None
    if not keys:
        raise RunConfigError(f"the monitor allow-list {path} names no client; add a client's public key "
                             "(`legion keys NAME` makes one)")
    return keys


def monitor_endpoints(endpoint: str) -> tuple[str, str]:
    """(PUB, snapshot) for `tcp://HOST:PORT`: the snapshot endpoint is PORT+1."""
    if not endpoint.startswith("tcp://") or ":" not in endpoint[6:]:
        raise RunConfigError(f"--monitor {endpoint!r}: expected tcp://HOST:PORT")
    host, _, port = endpoint[6:].rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65535:
        raise RunConfigError(f"--monitor {endpoint!r}: PORT must be a number below 65535 (PORT+1 is the snapshot)")
    return endpoint, f"tcp://{host}:{int(port) + 1}"


def server_config(endpoint: str | None, key: str | None, allow: str | None) -> tuple[Any, Any]:
    """(monitor_tcp, curve) for RunOptions, or (None, None) without --monitor; refuses an unauthenticated tcp."""
    if endpoint is None:
        if key or allow:
            raise RunConfigError("--monitor-key/--monitor-allow need --monitor tcp://HOST:PORT")
        return None, None
    if not key or not allow:
        raise RunConfigError("--monitor tcp:// needs --monitor-key SERVER.key_secret and --monitor-allow FILE "
                             "(CurveZMQ: a tcp monitor is never open); `legion keys server` makes a pair")
    import zmq.auth

    from legion.bus.security import CurveServerConfig

    try:
        public, secret = zmq.auth.load_certificate(Path(key).expanduser())
    except (OSError, ValueError) as exc:
        raise RunConfigError(f"cannot read the monitor key {key}: {exc}") from None
    if secret is None:
        raise RunConfigError(f"{key} holds no secret key; pass the server's .key_secret file")
    curve = CurveServerConfig(public, secret, frozenset(read_allow_list(Path(allow).expanduser())))
    return monitor_endpoints(endpoint), curve


def client_config(key: str | None, server_key: str | None) -> Any:
    if not key and not server_key:
        return None
    if not key or not server_key:
        raise RunConfigError("a tcp monitor needs both --key CLIENT.key_secret and --server-key SERVER.key")
    from legion.bus.security import CurveClientConfig

    try:
        return CurveClientConfig.from_certificates(Path(key).expanduser(), Path(server_key).expanduser())
    except (OSError, ValueError) as exc:
        raise RunConfigError(f"monitor keys: {exc}") from None
