"""Operator verbs against a live run: `legion launch|steer|abort|retire|stop|wait|collect RUN …`.

Each sends one request to the run's operator socket (`ipc://<run_dir>/op.sock`, served by the root's
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
from pathlib import Path
from typing import Any

import orjson

from legion.cli.common import EXIT_REFUSED, EXIT_USAGE
from legion.reports.liveness import root_alive
from legion.runs import resolve_run

OPERATOR_SOCKET = "op.sock"
REQUEST_SLACK_S = 30.0


def add_parsers(sub: Any) -> None:
    def verb(name: str, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
        p.add_argument("run", help="run directory or run id")
        p.add_argument("--json", action="store_true", help="print the reply as JSON")
        p.set_defaults(func=cmd_operator, verb=name)
        return p

    p = verb("launch", "launch an agent into a live run (under the root session unless --parent)")
    p.add_argument("--agent", required=True, help="the role card")
    p.add_argument("--task", required=True, help="the task text (@FILE reads a file)")
    p.add_argument("--name", help="the node name (default: <role>-N)")
    p.add_argument("--model", help="provider/model-id[:thinking]")
    p.add_argument("--parent", help="the node to launch under (default: the root session)")
    p = verb("steer", "queue a message for a running node")
    p.add_argument("name")
    p.add_argument("message")
    p = verb("abort", "interrupt a node's current turn (it stays alive)")
    p.add_argument("name")
    p = verb("retire", "retire a node and its subtree")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="skip the graceful stage of the retire ladder")
    p = verb("stop", "stop a node and its subtree; --all (or no NAME) pauses the whole run (resumable)")
    p.add_argument("name", nargs="?", help="the node (default with --all: the whole run)")
    p.add_argument("--all", action="store_true", help="pause the run: every node retired (session-shutdown), "
                   "phases untouched; `legion resume` continues it")
    p.add_argument("--force", action="store_true", help="skip the graceful stage of the retire ladder")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a paused run to end (default 60)")
    p.set_defaults(func=cmd_stop)
    p = verb("wait", "wait until the named nodes (default: the root session) settle")
    p.add_argument("names", nargs="*")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    p = verb("collect", "a settled node's full result")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for it to settle (default 300)")


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


def _args(ns: argparse.Namespace, cwd: Path) -> dict[str, Any]:
    verb = ns.verb
    if verb == "launch":
        task = text_arg(ns.task, cwd, "task")
        out = {"agent": ns.agent, "task": task, "name": ns.name, "model": ns.model, "parent": ns.parent}
    elif verb == "steer":
        out = {"name": ns.name, "message": ns.message}
    elif verb == "pause":
        out = {"force": ns.force}
    elif verb in ("retire", "stop"):
        out = {"name": ns.name, "force": ns.force}
    elif verb == "wait":
        out = {"names": ns.names or None, "timeoutMs": int(ns.timeout * 1000)}
    elif verb == "collect":
        out = {"name": ns.name, "timeoutMs": int(ns.timeout * 1000)}
    else:
        out = {"name": ns.name}
    return {k: v for k, v in out.items() if v is not None}


def cmd_operator(ns: argparse.Namespace) -> int:
    label = getattr(ns, "label", ns.verb)
    cwd = Path(ns.cwd).resolve()
    run_dir = resolve_run(cwd, ns.run)
    socket = run_dir / OPERATOR_SOCKET
    if not socket.exists() or not root_alive(run_dir):
        print(f"legion {label}: run {run_dir.name} is not live (no {socket}); `legion status` shows a finished "
              "run", file=sys.stderr)
        return EXIT_USAGE
    try:
        args = _args(ns, cwd)
    except ArgError as exc:
        print(f"legion {label}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    timeout = args.get("timeoutMs", 60_000) / 1000 + REQUEST_SLACK_S
    try:
        reply = asyncio.run(request(f"ipc://{socket}", ns.verb, args, timeout))
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
    ns.verb, ns.label = "pause", "stop"
    code = cmd_operator(ns)
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
