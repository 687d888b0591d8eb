"""`legion monitor TARGET`: attach to a live run's event stream (the snapshot, then live events), on its
ipc:// sockets or from anywhere over a CurveZMQ tcp:// monitor (`legion.cli.server` reads the keys)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from legion.cli.common import EXIT_USAGE, print_json
from legion.runs import resolve_run


def add_parser(sub: Any) -> None:
    p = sub.add_parser("monitor", help="attach to a live run's event stream (snapshot, then live events)")
    p.add_argument("target", help="run directory, run id, or a tcp:// / ipc:// monitor endpoint")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--count", type=int, default=0, help="stop after N live events (default: never)")
    p.add_argument("--idle", type=float, default=None, help="stop after S seconds without events")
    p.add_argument("--key", metavar="CLIENT.key_secret", help="tcp://: this client's CurveZMQ secret key")
    p.add_argument("--server-key", metavar="SERVER.key", help="tcp://: the run's public key")
    p.add_argument("--snapshot", metavar="ENDPOINT", help="the snapshot endpoint (default: tcp PORT+1)")
    p.set_defaults(func=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    from legion.bus.monitor import MonitorError, MonitorRefused, MonitorStream, Snapshot
    from legion.cli.server import client_config, monitor_endpoints
    from legion.run_errors import RunConfigError

    target = args.target
    snapshot = None
    try:
        curve = client_config(args.key, args.server_key)
        if target.startswith("tcp://"):
            target, snapshot = monitor_endpoints(target)
            snapshot = args.snapshot or snapshot
            if curve is None:
                raise RunConfigError("a tcp:// monitor is CurveZMQ only: pass --key CLIENT.key_secret and "
                                     "--server-key SERVER.key")
        elif "://" not in target:
            target = str(resolve_run(Path(args.cwd), target))
        else:
            snapshot = args.snapshot
    except RunConfigError as exc:
        print(f"legion monitor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        stream = MonitorStream(target, snapshot_endpoint=snapshot, curve=curve, idle_timeout=args.idle)
    except MonitorRefused as exc:  # the run is live: it said no
        print(f"legion monitor: {exc}", file=sys.stderr)
        return 1
    except MonitorError as exc:
        print(f"legion monitor: {exc} — is the run still live? (`legion status` reads a finished run)",
              file=sys.stderr)
        return 1
    seen = 0
    with stream:
        for item in stream:
            if isinstance(item, Snapshot):
                record: dict[str, Any] = {"snapshot": item.seq, "state": item.state}
            else:
                record = {"seq": item.seq, "type": item.type, "body": item.body}
                seen += 1
            if args.json:
                print_json(record)
            else:
                print(orjson.dumps(record).decode())
            sys.stdout.flush()  # a stream: each record reaches a pipe (`| jq`) as it happens, not in blocks
            if args.count and seen >= args.count:
                break
    return 0
