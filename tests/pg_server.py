"""A throwaway PostgreSQL cluster for the tests: one per pytest process, under a temp directory, run by an
unprivileged user (postgres refuses to run as root), reachable on a unix socket in that directory (trust) and
on a free loopback port (password: the tests of wrong credentials need a password check).

Each test gets a fresh, empty database (`fresh_database`), dropped afterwards. A test that stops or restarts its
server (`halt`, `boot`, `restart`; `terminate` ends sessions) gets a cluster of its own (`own_pg_server`).
fsync is off: the cluster's durability is not under test, its speed is what the suite waits on. A benchmark's
cluster (`durable=True`, bench/pg_stress.py) syncs its commits as a production server does.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

SUPERUSER = "postgres"
PASSWORD = "legion-test-pw"
START_TIMEOUT_S = 60


def find_bindir() -> Path | None:
    """The newest installed server's bin directory (Debian's layout first, then PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _unprivileged() -> pwd.struct_passwd | None:
    """Who runs the server when we are root: a `legion-pg` user if the machine has one, else `nobody`."""
    if os.geteuid() != 0:
        return None
    for name in ("legion-pg", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root, and neither a 'legion-pg' nor a 'nobody' user exists to run postgres")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgServer:
    bindir: Path
    home: Path
    port: int
    user: pwd.struct_passwd | None
    durable: bool = False  # fsync on, as a production server runs (the benchmarks); off for the tests' speed
    listen: str = "127.0.0.1"  # the tcp address it listens on
    enter: tuple[str, ...] = ()  # a prefix (nsenter) that starts it inside another network namespace
    allow: str | None = None  # a CIDR whose clients may log in over tcp with the password, beside loopback

    @property
    def socket_url(self) -> str:
        return f"postgresql://{SUPERUSER}@/postgres?host={self.home}&port={self.port}"

    def url(self, database: str, *, password: str | None = None, host: str | None = None) -> str:
        """A URL of `database`: on the unix socket (trust), or with a password over loopback tcp."""
        if password is not None:
            return f"postgresql://{SUPERUSER}:{password}@{host or '127.0.0.1'}:{self.port}/{database}"
        return f"postgresql://{SUPERUSER}@/{database}?host={self.home}&port={self.port}"

    def _run(self, *args: str) -> None:
        if self.enter:  # nsenter switches to the server's user itself, once inside the namespace
            ids = () if self.user is None else ("-S", str(self.user.pw_uid), "-G", str(self.user.pw_gid))
            subprocess.run([*self.enter, *ids, *args], check=True, capture_output=True, timeout=START_TIMEOUT_S,
                           cwd=self.home)
            return
        kwargs = {} if self.user is None else {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        subprocess.run(args, check=True, capture_output=True, timeout=START_TIMEOUT_S, cwd=self.home, **kwargs)

    def start(self) -> None:
        pwfile = self.home / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.user is not None:
            for path in (self.home, pwfile):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(self.home / "data"), "-U", SUPERUSER, "-E", "UTF8",
                  "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "--no-sync")
        if self.allow is not None:
            with (self.home / "data" / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.allow} scram-sha-256\n")
        self.boot()

    def boot(self) -> None:
        """Start the initialised cluster (again, after `halt`)."""
        sync = "" if self.durable else "-c fsync=off -c full_page_writes=off -c synchronous_commit=off "
        options = (f"-k {self.home} -p {self.port} -c listen_addresses={self.listen} {sync}"
                   "-c max_connections=300")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.home / "data"), "-o", options,
                  "-l", str(self.home / "log"), "-w", "-t", str(START_TIMEOUT_S), "start")

    def halt(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data (`boot` starts it again): `fast` ends every session with an admin
        shutdown, `immediate` drops them as a crash does."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.home / "data"), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        """A server restart: every connection is dropped."""
        self.halt(mode)
        self.boot()

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.home / "data"), "-m", "immediate", "stop")

    def admin(self, sql: str) -> None:
        """One statement as the superuser, outside a transaction (CREATE/DROP DATABASE)."""
        with psycopg.connect(self.socket_url, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def terminate(self, database: str) -> int:
        """pg_terminate_backend every other session on `database`; how many were ended."""
        with psycopg.connect(self.socket_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,)).fetchall()
        return sum(1 for (ended,) in rows if ended)

    @contextlib.contextmanager
    def fresh_database(self) -> Iterator[str]:
        """An empty database for one test; its name. Dropped (with any connection left to it) afterwards."""
        name = "t_" + uuid.uuid4().hex[:16]
        self.admin(f"CREATE DATABASE {name} TEMPLATE template0")
        try:
            yield name
        finally:
            self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def running_server(*, durable: bool = False, listen: str = "127.0.0.1", enter: tuple[str, ...] = (),
                   allow: str | None = None) -> Iterator[PgServer]:
    """Start a cluster (raises RuntimeError with the reason when none can be started) and remove it after;
    `durable`: commits are fsynced (a benchmark's server), not the tests' unsynced one; `listen`, `enter` and
    `allow`: a server on another (simulated) host, tests/netns.py."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server is installed (no /usr/lib/postgresql/*/bin/initdb, no initdb on "
                           "PATH): apt-get install -y postgresql")
    # under /tmp itself: pytest's own temp folders are private to root, where the server user cannot enter
    home = Path(tempfile.mkdtemp(prefix="legion-pg-", dir="/tmp"))
    server = PgServer(bindir=bindir, home=home, port=_free_port(), user=_unprivileged(), durable=durable,
                      listen=listen, enter=enter, allow=allow)
    try:
        try:
            server.start()
        except subprocess.CalledProcessError as exc:
            log = (home / "log").read_text(errors="replace")[-2000:] if (home / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {exc.stderr.decode(errors='replace')[-2000:]} {log}") from exc
        yield server
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
