"""Hosts, simulated honestly (issue 24 item 6): network namespaces on one machine, each with its own network
stack and host name, joined by a bridge in a namespace of its own, so that nothing touches the machine's own
interfaces and every address lives only inside this machine.

`lan(["h1", "h2", "db"])` makes one namespace per name plus the switch, gives host i the address 10.X.Y.(i+1)/24
(a subnet picked per call, so concurrent tests do not meet), and removes everything afterwards — killing what
still runs inside. `Lan.argv(name, argv)` runs a command inside a host: its network namespace (nsenter) and a
new UTS namespace whose host name is the host's name (unshare), so `socket.gethostname()` differs per host.
Needs root and iproute2; `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
IP_TIMEOUT_S = 20


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux)"
    probe = f"lgprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=IP_TIMEOUT_S)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


@dataclass
class Lan:
    tag: str
    addresses: dict[str, str]  # host name -> its address

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def enter(self, host: str, *, uid: int | None = None, gid: int | None = None) -> list[str]:
        """The nsenter prefix that runs a command in `host`'s network namespace (as uid/gid when given)."""
        prefix = ["nsenter", f"--net={NETNS_DIR / self.ns(host)}"]
        if uid is not None:
            prefix += ["-S", str(uid), "-G", str(gid if gid is not None else uid)]
        return prefix

    def argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on `host`: its network, and a host name of its own."""
        return [*self.enter(host), "unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *argv]

    def pids(self, host: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns(host)], capture_output=True, text=True,
                             timeout=IP_TIMEOUT_S)
        return [int(p) for p in out.stdout.split()]


def _kill_inside(lan_: Lan, host: str) -> None:
    for pid in lan_.pids(host):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def lan(hosts: Sequence[str]) -> Iterator[Lan]:
    """The namespaces, their links and addresses; torn down (processes inside killed) on exit."""
    tag = f"lg{os.getpid() % 100000}{random.randrange(100):02d}"
    subnet = f"10.{random.randrange(200, 250)}.{random.randrange(1, 250)}"
    made = Lan(tag, {host: f"{subnet}.{i + 1}" for i, host in enumerate(hosts)})
    switch = f"{tag}-sw"
    created: list[str] = []
    try:
        for name in (switch, *(made.ns(h) for h in hosts)):
            _ip("netns", "add", name)
            created.append(name)
            _ip("link", "set", "lo", "up", ns=name)
        _ip("link", "add", "br0", "type", "bridge", ns=switch)
        _ip("link", "set", "br0", "up", ns=switch)
        for i, host in enumerate(hosts):
            # the pair is made inside the switch, then one end moves into the host (names are per namespace)
            _ip("link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", ns=switch)
            _ip("link", "set", "eth0", "netns", made.ns(host), ns=switch)
            _ip("link", "set", f"p{i}", "master", "br0", ns=switch)
            _ip("link", "set", f"p{i}", "up", ns=switch)
            _ip("addr", "add", f"{made.addresses[host]}/24", "dev", "eth0", ns=made.ns(host))
            _ip("link", "set", "eth0", "up", ns=made.ns(host))
        yield made
    finally:
        for host in hosts:
            if made.ns(host) in created:
                with contextlib.suppress(Exception):
                    _kill_inside(made, host)
        for name in reversed(created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=IP_TIMEOUT_S)
