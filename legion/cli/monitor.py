"""`legion monitor TARGET`: attach to a live run's event stream (the snapshot, then live events), on its
ipc:// sockets or from anywhere over a CurveZMQ tcp:// monitor (`legion.cli.server` reads the keys).

By default it prints the lines of `legion run`'s plain mode (`progress.LineView`), on stdout; `--json` prints the
snapshot (a `snapshot` event) and every event as JSON lines, in the public shape of docs/events.md. It ends, exit 0, once the run's root supervisor has exited
(`supervisor_exited`), unless `--follow` keeps it attached (to a `legion resume` of the same run, say).

`--ledger [URL] --run ID` attaches to the tcp monitor that run ID recorded in the ledger's runs table, with the
CurveZMQ server key it recorded (this client's key from --key); `--ledger` without --run lists the runs that have
one (the fleet view: legion/cli/fleet.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from legion.bus.protocol import SNAPSHOT, SUPERVISOR_EXITED
from legion.cli import fleet
from legion.cli.common import EXIT_USAGE, print_json
from legion.runs import resolve_run

if TYPE_CHECKING:
    from legion.bus.monitor import MonitorItem, MonitorStream
    from legion.bus.security import CurveClientConfig
    from legion.ledger import Ledger

TRAILING_S = 0.5  # after the root's supervisor_exited: the last events of the run still arrive within this
QUIET_S = 2.0  # without --follow: this long without an event, check that the run's root is still alive


def add_parser(sub: Any) -> None:
    p = sub.add_parser("monitor", help="attach to a live run's event stream (snapshot, then live events)")
    p.add_argument("target", nargs="?", help="run directory, run id, or a tcp:// / ipc:// monitor endpoint "
                                             "(or --ledger [URL] --run ID)")
    p.add_argument("--json", action="store_true", help="the snapshot and every event as JSON lines (docs/events.md)")
    p.add_argument("--follow", action="store_true",
                   help="stay attached after the run's root exits (default: exit 0 after its supervisor_exited)")
    p.add_argument("--count", type=int, default=0, help="stop after N live events (default: never)")
    p.add_argument("--idle", type=float, default=None, help="stop after S seconds without events")
    p.add_argument("--key", metavar="CLIENT.key_secret", help="tcp://: this client's CurveZMQ secret key")
    p.add_argument("--server-key", metavar="SERVER.key", help="tcp://: the run's public key")
    p.add_argument("--snapshot", metavar="ENDPOINT", help="the snapshot endpoint (default: tcp PORT+1)")
    fleet.add_fleet_args(p)
    p.set_defaults(func=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    from legion.bus.monitor import MonitorError, MonitorRefused, MonitorStream
    from legion.cli.server import client_config, monitor_endpoints
    from legion.run_errors import RunConfigError

    target = args.target
    snapshot = None
    run_dir: Path | None = None
    run_name = ""
    try:
        if fleet.wants_fleet(args):
            if target is not None:
                raise RunConfigError("with --ledger, name the run with --run ID, not a TARGET")
            found = fleet.run_fleet(args, _recorded)
            if not isinstance(found, tuple):
                return found
            run_name, target, snapshot, curve = found
        elif target is None:
            raise RunConfigError("name a run (a run directory or id), a tcp:// or ipc:// endpoint, or --ledger URL "
                                 "--run ID")
        else:
            curve = client_config(args.key, args.server_key)
            if target.startswith("tcp://"):
                target, snapshot = monitor_endpoints(target)
                snapshot = args.snapshot or snapshot
                if curve is None:
                    raise RunConfigError("a tcp:// monitor is CurveZMQ only: pass --key CLIENT.key_secret and "
                                         "--server-key SERVER.key")
            elif "://" not in target:
                run_dir = resolve_run(Path(args.cwd), target)
                target, run_name = str(run_dir), run_dir.name
            else:
                snapshot = args.snapshot
    except RunConfigError as exc:
        print(f"legion monitor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        stream = MonitorStream(target, snapshot_endpoint=snapshot, curve=curve)
    except MonitorRefused as exc:  # the run is live: it said no
        print(f"legion monitor: {exc}", file=sys.stderr)
        return 1
    except MonitorError as exc:
        print(f"legion monitor: {exc} — is the run still live? (`legion status` reads a finished run)",
              file=sys.stderr)
        return 1
    show: Callable[[MonitorItem], None] = _JsonShow(run_name) if args.json else _LineShow()
    try:
        with stream:
            return _follow(stream, show, args, run_dir)
    finally:
        if isinstance(show, _LineShow):
            show.view.close()


def _recorded(led: Ledger, args: argparse.Namespace) -> tuple[str, str, str, CurveClientConfig] | int:
    """The run's recorded tcp monitor (its endpoints and server key) with this client's key; or, without --run,
    the list of runs that have one (exit 0)."""
    import zmq.auth

    from legion.bus.security import CurveClientConfig
    from legion.cli.server import monitor_endpoints
    from legion.reports.fleet import FleetError
    from legion.run_errors import RunConfigError

    row = fleet.monitor_row(led, args)
    if row is None or row.monitor_endpoint is None or row.server_key is None:
        return 0
    if not args.key:
        raise FleetError(f"run '{row.run}' has a tcp monitor at {row.monitor_endpoint}: pass this client's key, "
                         "--key CLIENT.key_secret (its public key on the run's --monitor-allow list)")
    try:
        pub, snapshot = monitor_endpoints(fleet.reachable(row.monitor_endpoint, row.host))
        public, secret = zmq.auth.load_certificate(Path(args.key).expanduser())
        if secret is None:
            raise ValueError(f"{args.key} holds no secret key; pass the client's .key_secret file")
        server = zmq.auth.load_certificate(Path(args.server_key).expanduser())[0] if args.server_key \
            else row.server_key.encode()
        return row.run, pub, args.snapshot or snapshot, CurveClientConfig(public, secret, server)
    except (OSError, ValueError, RunConfigError) as exc:
        raise FleetError(f"monitor of run '{row.run}': {exc}") from None


def _follow(stream: MonitorStream, show: Callable[[MonitorItem], None], args: argparse.Namespace,
            run_dir: Path | None) -> int:
    """Show items until --count, --idle, the root's exit (unless --follow) or a root that is gone."""
    from legion.bus.monitor import Snapshot

    root: object = None
    seen, quiet, ended = 0, 0.0, False
    while True:
        wait = _wait(args, run_dir, ended)
        item = stream.next(wait)
        if item is None:
            if ended:
                return 0
            quiet += wait or 0.0
            if args.idle is not None and quiet >= args.idle:
                return 0
            if not args.follow and run_dir is not None and (code := _root_gone(run_dir)) is not None:
                return code
            continue
        quiet = 0.0
        show(item)
        sys.stdout.flush()  # a stream: each record reaches a pipe (`| jq`) as it happens, not in blocks
        if isinstance(item, Snapshot):
            root = item.state.get("root")
            continue
        seen += 1
        if args.count and seen >= args.count:
            return 0
        ended = ended or (not args.follow and item.type == SUPERVISOR_EXITED and item.body.get("supervisor") == root)


def _wait(args: argparse.Namespace, run_dir: Path | None, ended: bool) -> float | None:
    """How long to wait for the next item (None: for ever): the trailing events after the root's exit; else --idle,
    but at most QUIET_S when the run's root is to be checked (a run directory, no --follow)."""
    if ended:
        return TRAILING_S
    if args.follow or run_dir is None:
        return args.idle
    return QUIET_S if args.idle is None else min(args.idle, QUIET_S)


def _root_gone(run_dir: Path) -> int | None:
    """None while the run's root is alive; else say how the run stands and return the exit code (0: it ended, its
    last events lost on the way; 1: it died mid-run)."""
    from legion.ledger import read_run_json
    from legion.reports.liveness import root_alive

    if root_alive(run_dir):
        return None
    status = (read_run_json(run_dir) or {}).get("status", "?")
    died = status in ("starting", "running")
    print(f"legion monitor: the run's root has exited without its last events reaching this monitor (run.json status "
          f"{status}){'; `legion resume ' + run_dir.name + '` continues it' if died else ''}", file=sys.stderr)
    return 1 if died else 0


class _JsonShow:
    """`--json`: each item as a public event (docs/events.md); a snapshot is a `snapshot` event whose fields are the
    snapshot's state (`root`, `nodes`), and names the run for a tcp:// monitor."""

    def __init__(self, run: str) -> None:
        self.run = run

    def __call__(self, item: MonitorItem) -> None:
        from legion.bus.monitor import Snapshot
        from legion.reports.events import public_event

        if isinstance(item, Snapshot):
            state = dict(item.state)
            self.run = str(state.pop("run", None) or self.run)
            print_json(public_event(SNAPSHOT, state, run=self.run, seq=item.seq))
        else:
            print_json(public_event(item.type, item.body, run=self.run, seq=item.seq))


class _LineShow:
    """The human view: `legion run`'s plain lines (progress.LineView) on stdout."""

    def __init__(self) -> None:
        from legion.cli.progress import LineView

        self.view = LineView(sys.stdout)
        self.snapshots = 0

    def __call__(self, item: MonitorItem) -> None:
        from legion.bus.monitor import Snapshot

        if isinstance(item, Snapshot):
            self.snapshots += 1
            self.view.snapshot(item.state, item.seq, first=self.snapshots == 1)
        else:
            self.view.event(item.type, item.body)
