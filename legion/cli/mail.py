"""`legion mail RUN [NODE]` (a node's inbox and outbox with delivery states) and
`legion mail send RUN TO --subject … --body …` (mail as the operator, through the live run's op.sock).

Listing reads the run's ledger read-only (a finished run too). Sending needs the live run: the root's
orchestrator routes it like a `legion_mail` call (same limits, refusals and postman). Exit 0 on success,
1 when the send was refused (the reply says why and how to fix it), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import sys
from pathlib import Path
from typing import Any

import orjson

from legion.cli.common import EXIT_REFUSED, EXIT_USAGE
from legion.cli.operate import (
    REQUEST_SLACK_S,
    ArgError,
    failure_exit,
    request,
    text_arg,
    unanswered,
)
from legion.ledger.constants import OPERATOR_NODE
from legion.ledger.errors import LedgerError
from legion.ledger.runfile import OPERATOR_SOCKET
from legion.reports.liveness import root_alive
from legion.runs import LEDGER_FILE, ledger_url, open_run_ledger, resolve_run

COLUMNS = ("id", "from_node", "to_node", "subject", "body", "kind", "urgency", "delivered", "created_at")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "mail", help="a node's inbox and outbox (`legion mail RUN [NODE]`), or send as the operator "
        "(`legion mail send RUN TO --subject … --body …`)")
    p.add_argument("words", nargs="+", metavar="RUN [NODE] | send RUN TO",
                   help="run directory or id and an optional node; or `send`, the run and the recipient")
    p.add_argument("--subject", help="send: the subject (≤ 256 bytes)")
    p.add_argument("--body", help="send: the body (@FILE reads a file; ≤ 32 KB)")
    p.add_argument("--kind", choices=["question", "report", "handoff", "notice"], help="send: the kind")
    p.add_argument("--urgency", choices=["info", "action-needed"], default="info", help="send: urgency")
    p.add_argument("--limit", type=int, default=200, help="list: at most this many mails per box (default 200)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_mail)


def cmd_mail(ns: argparse.Namespace) -> int:
    words: list[str] = ns.words
    if words[0] == "send":
        if len(words) != 3 or ns.subject is None or ns.body is None:
            print("legion mail send: usage: legion mail send RUN TO --subject TEXT --body TEXT", file=sys.stderr)
            return EXIT_USAGE
        return _send(ns, words[1], words[2])
    if len(words) > 2:
        print("legion mail: usage: legion mail RUN [NODE]  |  legion mail send RUN TO --subject … --body …",
              file=sys.stderr)
        return EXIT_USAGE
    return _list(ns, words[0], words[1] if len(words) == 2 else None)


def _send(ns: argparse.Namespace, run: str, to: str) -> int:
    cwd = Path(ns.cwd).resolve()
    try:  # checked here, and again where the root reads the frame (bus/control.py answers bad UTF-8)
        body = text_arg(ns.body, cwd, "body")
        subject = text_arg(ns.subject, cwd, "subject", files=False)
        text_arg(to, cwd, "recipient", files=False)
    except ArgError as exc:
        print(f"legion mail send: {exc}", file=sys.stderr)
        return EXIT_USAGE
    run_dir = resolve_run(cwd, run)
    socket = run_dir / OPERATOR_SOCKET
    if not socket.exists() or not root_alive(run_dir):
        print(f"legion mail send: run {run_dir.name} is not live (no {socket}); mail needs a running root",
              file=sys.stderr)
        return EXIT_USAGE
    args = {"to": to, "subject": subject, "body": body, "kind": ns.kind, "urgency": ns.urgency}
    try:
        reply = asyncio.run(request(f"ipc://{socket}", "mail", {k: v for k, v in args.items() if v is not None},
                                    REQUEST_SLACK_S))
    except Exception as exc:
        print(f"legion mail send: {unanswered(exc)}", file=sys.stderr)
        return failure_exit(exc)
    if ns.json:
        sys.stdout.write(orjson.dumps(reply).decode() + "\n")
    else:
        print(reply.get("text") or reply)
    return 0 if reply.get("ok") else EXIT_REFUSED


def read_mail(run_dir: Path, node: str | None, limit: int) -> dict[str, list[dict[str, Any]]]:
    """{"inbox", "outbox"} of `node` (or {"all"} without one), newest last, each with its state name."""
    if ledger_url(run_dir) is not None:
        return _read_shared(run_dir, node, limit)
    uri = f"file:{run_dir / LEDGER_FILE}?mode=ro"
    cols = ", ".join(COLUMNS)
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5.0)) as db:
        def query(where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
            sql = f"SELECT {cols} FROM (SELECT {cols} FROM messages {where} ORDER BY id DESC LIMIT ?) ORDER BY id"
            return [_row(r) for r in db.execute(sql, (*params, limit))]

        if node is None:
            return {"all": query("", ())}
        return {"inbox": query("WHERE to_node = ?", (node,)), "outbox": query("WHERE from_node = ?", (node,))}


def _read_shared(run_dir: Path, node: str | None, limit: int) -> dict[str, list[dict[str, Any]]]:
    """read_mail for a run on a PostgreSQL ledger: its rows, through the ledger."""
    with contextlib.closing(open_run_ledger(run_dir)) as ledger:
        def rows(**who: str) -> list[dict[str, Any]]:
            return [_row(tuple(m[c] for c in COLUMNS)) for m in ledger.recent_mail(**who, limit=limit)]

        if node is None:
            return {"all": rows()}
        return {"inbox": rows(to_node=node), "outbox": rows(from_node=node)}


def _row(values: tuple[Any, ...]) -> dict[str, Any]:
    from legion.ledger.constants import Delivery  # here: importing the ledger costs every command ~150 ms

    row = dict(zip(COLUMNS, values, strict=True))
    try:
        row["state"] = Delivery(int(row["delivered"])).name
    except (TypeError, ValueError):
        row["state"] = f"INVALID({row['delivered']!r})"
    return row


def _list(ns: argparse.Namespace, run: str, node: str | None) -> int:
    from legion.reports.views import printable

    run_dir = resolve_run(Path(ns.cwd).resolve(), run)
    if node in ("operator", OPERATOR_NODE):
        node = OPERATOR_NODE
    try:
        boxes = read_mail(run_dir, node, max(1, ns.limit))
    except sqlite3.Error as exc:
        print(f"legion mail: cannot read {run_dir / LEDGER_FILE}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LedgerError as exc:  # a run on a PostgreSQL ledger: the server, or its credentials
        print(f"legion mail: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if ns.json:
        sys.stdout.write(orjson.dumps({"run": str(run_dir), "node": node, **boxes}).decode() + "\n")
        return 0
    print(f"run {run_dir}" + (f" · node {printable(node)}" if node else ""))
    for name, rows in boxes.items():
        print(f"{name} ({len(rows)}):")
        print("\n".join(_line(r) for r in rows) or "  (none)")
    return 0


def _line(row: dict[str, Any]) -> str:
    # subjects are model text: no line or escape of theirs reaches the terminal
    from legion.reports.views import printable

    kind = f" [{printable(row['kind'])}]" if row.get("kind") else ""
    urgent = " !" if row.get("urgency") == "action-needed" else ""
    return (f"  #{printable(row['id']):<5} {printable(row['state']):<9} {printable(row['from_node'])} → "
            f"{printable(row['to_node'])}{kind}{urgent}: {printable(row['subject'])}")
