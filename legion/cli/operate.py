"""Operator verbs against a live run: `legion launch|steer|abort|retire|collect|wait|stop RUN …`.

Each verb is generated from its action's spec (workers/tools/action_specs.py: its help and arguments); it
sends one request to the run's operator socket (`ipc://<run_dir>/op.sock`, served by the root's
orchestrator) and prints the reply the `subagent` tool would get: the same handlers, replies and refusals.
Exit 0 when the action succeeded, 1 when it was refused (the reply says why), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from legion.cli.common import EXIT_REFUSED, EXIT_USAGE
from legion.ledger.runfile import OPERATOR_SOCKET
from legion.reports.liveness import root_alive
from legion.runs import resolve_run
from legion.workers.tools.action_specs import ACTION_SPECS, ActionSpec

REQUEST_SLACK_S = 30.0


def add_parsers(sub: Any) -> None:
    """One subcommand per action with CLI arguments in its spec (workers/tools/action_specs.py), in spec order."""
    for spec in ACTION_SPECS.values():
        if spec.cli is None:
            continue
        p: argparse.ArgumentParser = sub.add_parser(spec.name, help=spec.help)
        p.add_argument("run", help="run directory or run id")
        p.add_argument("--json", action="store_true", help="print the reply as JSON")
        for a in spec.cli:
            p.add_argument(*a.flags, **a.options)
        p.set_defaults(func=COMMANDS.get(spec.name, cmd_operator), verb=spec.name)


class ArgError(ValueError):
    """A command-line argument that cannot be sent (unreadable file, not UTF-8); the text says how to fix it."""


def text_arg(value: str, cwd: Path, what: str, *, files: bool = True) -> str:
    """`value`, or (`files`) the content of FILE for `@FILE`: strict UTF-8, else ArgError naming the file and
    byte offset."""
    if files and value.startswith("@"):
        path = cwd / value[1:]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ArgError(f"cannot read the {what} file: {exc}") from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArgError(f"the {what} file {path} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
                           f"{exc.start} ({exc.reason}); convert it first, e.g. `iconv -f latin1 -t utf-8`") from None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # argv bytes that are not UTF-8 arrive as lone surrogates
        offset = len(value[:exc.start].encode("utf-8", "surrogateescape"))
        byte = value[exc.start].encode("utf-8", "surrogateescape")
        raise ArgError(f"the {what} is not valid UTF-8: byte 0x{byte.hex() if len(byte) == 1 else '??'} at offset "
                       f"{offset}; pass UTF-8 text (or @FILE with UTF-8 content)") from None
    return value


def action_args(spec: ActionSpec, ns: argparse.Namespace, cwd: Path) -> dict[str, Any]:
    """The action's arguments from its subcommand's: each `Arg` fills its field (unset ones are left out)."""
    out: dict[str, Any] = {}
    for a in spec.cli or ():
        value = getattr(ns, a.dest)
        if a.field is None or value is None or value == []:
            continue
        if a.convert == "text":
            value = text_arg(value, cwd, a.field)
        elif a.convert == "ms":
            value = int(value * 1000)
        out[a.field] = value
    return out


def cmd_operator(ns: argparse.Namespace) -> int:
    """`legion VERB RUN …`: the action VERB with the arguments its spec maps from the command line."""
    return _operate(ns, ns.verb, ns.verb, lambda cwd: action_args(ACTION_SPECS[ns.verb], ns, cwd))


def _operate(ns: argparse.Namespace, label: str, action: str, make_args: Callable[[Path], dict[str, Any]]) -> int:
    cwd = Path(ns.cwd).resolve()
    run_dir = resolve_run(cwd, ns.run)
    socket = run_dir / OPERATOR_SOCKET
    if not socket.exists() or not root_alive(run_dir):
        print(f"legion {label}: run {run_dir.name} is not live (no {socket}); `legion status` shows a finished "
              "run", file=sys.stderr)
        return EXIT_USAGE
    try:
        args = make_args(cwd)
    except ArgError as exc:
        print(f"legion {label}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    timeout = args.get("timeoutMs", 60_000) / 1000 + REQUEST_SLACK_S
    try:
        reply = asyncio.run(request(f"ipc://{socket}", action, args, timeout))
    except Exception as exc:
        print(f"legion {label}: {unanswered(exc)}", file=sys.stderr)
        return failure_exit(exc)
    if ns.json:
        sys.stdout.write(orjson.dumps(reply).decode() + "\n")
    elif reply.get("ok"):
        print(reply.get("text") or reply)
    else:
        from legion.agents.spawn_hints import append_hint

        print(append_hint(str(reply.get("text") or reply), reply.get("code")))
    return 0 if reply.get("ok") else EXIT_REFUSED


def cmd_stop(ns: argparse.Namespace) -> int:
    """`stop NAME` is the operator action; `stop --all` (or no NAME) pauses the run and waits for it to end."""
    if ns.name and ns.all:
        print("legion stop: give a NAME or --all, not both", file=sys.stderr)
        return EXIT_USAGE
    if ns.name:
        return cmd_operator(ns)
    code = _operate(ns, "stop", "pause", lambda _cwd: {"force": ns.force})
    if code != 0:
        return code
    run_dir = resolve_run(Path(ns.cwd).resolve(), ns.run)
    deadline = time.monotonic() + ns.timeout
    while root_alive(run_dir):
        if time.monotonic() > deadline:
            print(f"legion stop: run {run_dir.name} is still shutting down after {ns.timeout:.0f}s "
                  "(its retire ladder may be waiting on a stuck tool); `legion status` follows it", file=sys.stderr)
            return EXIT_REFUSED
        time.sleep(0.05)
    print(f"run {run_dir.name} paused; `legion resume {run_dir.name}` continues it")
    return 0


def unanswered(exc: Exception) -> str:
    """Why a request to a live run got no reply, truthfully: refused by a busy root, or no answer at all."""
    from legion.bus.control import RemoteError

    if isinstance(exc, RemoteError):
        if exc.reason == "overload":
            return (f"the run's root is alive but refused the request: {exc.detail}. `legion stop`, `legion abort` "
                    "and `legion status` are always answered")
        return f"the run's root refused the request ({exc.reason}: {exc.detail})"
    return f"the run did not answer ({type(exc).__name__}: {exc}); is its root alive?"


def failure_exit(exc: Exception) -> int:
    """1 when the root answered with a refusal (busy, bad frame), 2 when it did not answer at all."""
    from legion.bus.control import RemoteError

    return EXIT_REFUSED if isinstance(exc, RemoteError) else EXIT_USAGE


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"stop": cmd_stop}  # beyond cmd_operator


async def request(endpoint: str, action: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One operator request to a live run's root; the reply body."""
    from legion.bus.control import ControlClient

    # one identity per connection: the ROUTER ignores a connection whose identity another one still holds (no
    # ROUTER_HANDOVER, see bus/control.py), so a second request right after the first would vanish
    client = ControlClient(endpoint, f"operator-{os.getpid()}-{secrets.token_hex(4)}")
    await client.connect()
    try:
        reply = await client.request("request", {"op": "legion.operator", "action": action, "args": args}, timeout)
        return dict(reply.body)
    finally:
        await client.close()
