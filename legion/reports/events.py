"""The one public shape of legion's events (docs/events.md): what `legion run --json`, `legion monitor --json` and
`legion events --json` print, one JSON object per line.

Every event is `{"type", "ts", "run", "seq", "node", …}` with its own fields at the top level: `public_event` turns
a monitor event (type, body) or a ledger event into it. `run_started` is the first event of `legion run --json`
and `result` the last (also the one object of `--output-format json`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from legion import __version__
from legion.bus.protocol import RESULT, RUN_STARTED

if TYPE_CHECKING:
    from legion.orchestration.run import RunResult
    from legion.reports.run_report import NodeReport

ENVELOPE = ("type", "ts", "run", "seq", "node")
NODE_KEYS = ("node_id", "nodeId")  # how the monitor's bodies and the workers' events name their node
RESULT_NODE_FIELDS = ("name", "parent", "depth", "role", "model", "status", "phase", "turns", "tool_calls",
                      "tokens_in", "tokens_out", "cache_read", "cache_write", "cost_usd", "unknown_cost_tokens",
                      "branch", "sha")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso_ts(ms: float) -> str:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds (`2026-12-02T17:14:53.123Z`)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def public_event(type_: str, fields: Mapping[str, Any], *, run: str, seq: int, ts_ms: float | None = None,
                 node: str | None = None) -> dict[str, Any]:
    """The public event: the envelope, then `fields` at the top level. The node is `node`, else the `node_id` (or
    `nodeId`) field; a field named like an envelope key keeps its value under that name plus `_`."""
    data = dict(fields)
    found = [data.pop(key, None) for key in NODE_KEYS]
    if node is None:
        node = next((n for n in found if isinstance(n, str)), None)
    out: dict[str, Any] = {"type": type_, "ts": iso_ts(now_ms() if ts_ms is None else ts_ms), "run": run,
                           "seq": seq, "node": node}
    for key, value in data.items():
        out[f"{key}_" if key in ENVELOPE else key] = value
    return out


def ledger_event(event: Mapping[str, Any], *, run: str) -> dict[str, Any]:
    """A stored event (a ledger row: id, node_id, type, data, ts) as a public event; its seq is the row's id. A
    damaged row still prints: data that is not an object is kept under `data`, a ts that is no number under `bad_ts`
    (the event's ts is then the epoch)."""
    data = event.get("data")
    fields: dict[str, Any] = dict(data) if isinstance(data, Mapping) else {"data": data}
    ts = event.get("ts")
    good = isinstance(ts, int | float) and not isinstance(ts, bool)
    if not good:
        fields["bad_ts"] = repr(ts)
    node = event.get("node_id")
    return public_event(str(event.get("type")), fields, run=run, seq=int(event.get("id") or 0),
                        ts_ms=ts if good else 0, node=node if isinstance(node, str) else None)


def settings_digest(settings: Mapping[str, Any]) -> str:
    """A short digest of the effective settings: two runs with the same digest ran with the same settings."""
    raw = orjson.dumps(settings, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def run_started(*, run: str, run_dir: Path, cwd: Path, model: str | None, agent: str, team: str | None,
                settings: Mapping[str, Any], resumed: bool = False) -> dict[str, Any]:
    """The first event of a run's stream (seq 0): what ran, where, with which settings and legion."""
    return public_event(RUN_STARTED, {
        "run_dir": str(run_dir), "cwd": str(cwd), "model": model or None, "agent": agent, "team": team,
        "settings_digest": settings_digest(settings), "legion_version": __version__, "resumed": resumed,
    }, run=run, seq=0, node=None)


def result(res: RunResult, *, seq: int, resume: str | None = None) -> dict[str, Any]:
    """The last event of a run's stream: how it ended, and its totals and nodes (from the ledger and transcripts)."""
    nodes = _result_nodes(res)
    fields: dict[str, Any] = {
        "status": res.status, "exit_code": res.exit_code, "is_error": res.exit_code != 0,
        "duration_ms": int(res.wall_s * 1000),
        "total_cost_usd": round(sum(n["cost_usd"] for n in nodes), 8),
        "unknown_cost_tokens": sum(n["unknown_cost_tokens"] for n in nodes),
        "num_turns": sum(n["turns"] for n in nodes),
        **{key: sum(n[key] for n in nodes) for key in ("tokens_in", "tokens_out", "cache_read", "cache_write")},
        "final_text": res.final_text, "detail": res.detail, "run_dir": str(res.run_dir), "nodes": nodes,
        "branches": res.branches,
    }
    if resume is not None:
        fields["resume"] = resume
    return public_event(RESULT, fields, run=res.run_id, seq=seq, node=None)


def _result_nodes(res: RunResult) -> list[dict[str, Any]]:
    """One object per node: the ledger's row and usage with the transcript's turns, tool calls and cache figures;
    the ledger's rows alone when the report cannot be read (a damaged transcript cache, a full disk …)."""
    from legion.reports.run_report import run_report

    try:
        return [_report_node(r) for r in run_report(res.run_dir)]
    except Exception:
        return [_row_node(row) for row in _agent_rows(res.nodes)]


def _report_node(report: NodeReport) -> dict[str, Any]:
    data = asdict(report)
    return {"node": report.id or report.name, **{key: data[key] for key in RESULT_NODE_FIELDS}}


def _agent_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    from legion.reports.views import is_operator_row

    return [row for row in rows if not is_operator_row(row)]


def _row_node(row: dict[str, Any]) -> dict[str, Any]:
    numbers = ("depth", "turns", "tool_calls", "tokens_in", "tokens_out", "cache_read", "cache_write",
               "unknown_cost_tokens")
    out: dict[str, Any] = {key: int(row.get(key) or 0) for key in numbers}
    out |= {"node": str(row.get("id")), "name": str(row.get("name") or row.get("id")), "parent": row.get("parent_id"),
            "role": row.get("role"), "model": row.get("model"), "status": row.get("status"), "phase": row.get("phase"),
            "cost_usd": float(row.get("cost_usd") or 0.0), "branch": None, "sha": None}
    return {"node": out["node"], **{key: out[key] for key in RESULT_NODE_FIELDS}}
