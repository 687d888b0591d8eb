"""`legion resume RUN [NAME…|--all]`: a new root on a paused run's directory and ledger (SEED-SPEC §2.10).

Never a second run for the same root session: the run directory (found by run.json's `sessionFile`, the
root session's transcript) is reopened, its ledger continued. Before anything starts, `prepare_resume`
refuses what cannot be resumed (a live owner, a corrupt or newer run.json, an unknown or terminal name),
converges abnormal leftovers (a root killed with SIGKILL: its live rows become `failed` + `node_abandoned`
by the orphan scan, then they are resumable like paused ones) and lists the paused nodes. `resume` then
restores the orchestrator's tree from the ledger and the launch records, revives the root session with
the startup hint (its paused direct children; it must not resume itself) and the nodes asked for, each
from its transcript. Settled nodes and nodes in a terminal phase are never revived.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from legion.agents import AgentDefinitionError, load_catalog, load_settings
from legion.ledger import SchemaVersionError, open_ledger, owner_alive, read_run_json, run_hygiene
from legion.run import (
    RUN_SCHEMA,
    Prepared,
    RunConfigError,
    RunOptions,
    RunResult,
    drive,
    load_launch_records,
)
from legion.supervision.agent_tree import AgentNode
from legion.supervision.orchestrator import NOTICE_MARKER, Orchestrator, did_you_mean
from legion.supervision.root import RootSupervisor
from legion.workers.outcome import derive_outcome
from legion.workers.session import CUT_STOP, RUN_CUT_TYPE
from legion.workers.transcript import context_messages, read_transcript

RESUMABLE = frozenset({"retired", "failed"})
TERMINAL_PHASES = frozenset({"done", "failed", "aborted"})
CHILD_RESUME_TEXT = ("▣ legion · the operator resumed this run after a pause (not a new task). Continue your task "
                     "where you left off.")


@dataclass
class Paused:
    """One node of the run that a resume could bring back."""

    id: str
    parent: str | None
    role: str
    status: str
    phase: str | None
    depth: int

    def line(self) -> str:
        return f"{'  ' * self.depth}{self.id} ({self.role}) {self.status}, phase {self.phase or '-'}"


@dataclass
class ResumePlan:
    prepared: Prepared
    paused: list[Paused]
    revive: list[str]  # nodes to revive besides the root session, parents first
    root_id: str
    abandoned: list[str] = field(default_factory=list)


def find_run_by_session(cwd: Path, session_file: str) -> Path | None:
    """The run directory whose run.json names `session_file` as its root session (run reuse)."""
    from legion.runs import list_runs

    target = str(Path(session_file).resolve())
    for run_dir in list_runs(cwd):
        data = _peek(run_dir)
        if isinstance(data, dict) and data.get("sessionFile") and str(Path(data["sessionFile"]).resolve()) == target:
            return run_dir
    return None


def _peek(run_dir: Path) -> Any:
    import orjson

    try:
        return orjson.loads((run_dir / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def prepare_resume(run_dir: Path, names: list[str], all_: bool, *, env: dict[str, str] | None = None,
                   timeout: float | None = None) -> ResumePlan:
    """Everything that can refuse before a root starts; converges orphans of a dead owner."""
    env = dict(os.environ) if env is None else env
    data = _run_json(run_dir)
    owner = data.get("owner")
    if isinstance(owner, dict) and owner_alive(owner):
        raise RunConfigError(f"run {run_dir.name} is live: its root (pid {owner.get('pid')}) owns it; "
                             f"`legion stop {run_dir.name} --all` pauses it, then resume")
    cwd = Path(str(data.get("cwd") or run_dir.parent.parent.parent))
    rows, abandoned = _converge(run_dir)
    records = load_launch_records(run_dir)
    by_id = {str(r["id"]): r for r in rows if str(r["id"]) in records}
    root_id = next((i for i, r in by_id.items() if r.get("parent_id") is None and not r.get("depth")), None)
    if root_id is None:
        raise RunConfigError(f"run {run_dir.name} has no root session record (launches/root.json); it was started "
                             "by an older legion or never launched its root session: nothing to resume")
    finished = data.get("status") == "settled"
    if not _resumable(by_id[root_id], root=True, finished=finished):
        raise RunConfigError(f"run {run_dir.name} is finished: its root session is {by_id[root_id]['status']} "
                             "(settled members are not revived); start a new `legion run`")
    paused = [Paused(i, r.get("parent_id"), str(r.get("role")), str(r["status"]), r.get("phase"),
                     int(r.get("depth") or 0))
              for i, r in by_id.items() if _resumable(r, root=i == root_id, finished=finished)]
    wanted = _wanted(names, all_, by_id, paused, root_id)
    raw_opts = data.get("options")
    opts: dict[str, Any] = raw_opts if isinstance(raw_opts, dict) else {}
    try:
        settings = load_settings(cwd, env=env)
        catalog = load_catalog(cwd, env=env, settings=settings)
    except AgentDefinitionError as exc:
        raise RunConfigError(str(exc)) from None
    options = RunOptions(task=str(data.get("task") or ""), cwd=cwd, agent=str(data.get("agent") or "root"),
                         model=opts.get("model"), team=opts.get("team"), preset=opts.get("preset"),
                         run_id=str(data.get("runId") or run_dir.name), timeout=timeout,
                         max_cost=opts.get("maxCostUsd"), env=env)
    prepared = Prepared(options, settings, catalog, options.run_id or run_dir.name, run_dir)
    return ResumePlan(prepared, paused, wanted, root_id, abandoned)


def _run_json(run_dir: Path) -> dict[str, Any]:
    raw = run_dir / "run.json"
    if not raw.exists():
        raise RunConfigError(f"{raw} is missing: not a legion run directory, or it was never started "
                             "(`legion rebuild` cannot make one)")
    data = read_run_json(run_dir)
    if data is None:
        raise RunConfigError(f"{raw} is corrupt; it was moved aside to run.json.corrupt (nothing deleted). "
                             f"Repair it from that copy (it needs runId, cwd, owner, sessionFile), then resume")
    schema = data.get("schema", 1)
    if not isinstance(schema, int) or schema > RUN_SCHEMA:
        raise RunConfigError(f"{raw} has schema {schema!r}, newer than this legion understands ({RUN_SCHEMA}); "
                             "resume it with the newer legion that started it")
    return data


def _converge(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The ledger's nodes after the orphan scan (the owner is dead: any live row is an orphan now)."""
    try:
        ledger = open_ledger(run_dir / "legion.db")
    except SchemaVersionError as exc:
        raise RunConfigError(str(exc)) from None
    with contextlib.closing(ledger):
        report = run_hygiene(ledger, run_dir.parent, current_run=run_dir, orphan_stale_ms=0,
                             retention_days=float("inf"))
        if report.nodes_abandoned:
            logger.info("orphan scan: {} converged to failed (node_abandoned)", ", ".join(report.nodes_abandoned))
        return ledger.list_nodes(), report.nodes_abandoned


def _resumable(row: dict[str, Any], *, root: bool = False, finished: bool = False) -> bool:
    """Paused or abandoned and not in a terminal phase. The root session while its run is not finished (a pause
    leaves an idle root `settled`); a team in a non-terminal phase, idle or not (its work is not done); any other
    member only when its last run did not succeed (settled members keep their result)."""
    status = row["status"]
    if row.get("phase") in TERMINAL_PHASES or status not in RESUMABLE | {"settled"}:
        return False
    if root:
        return status in RESUMABLE or not finished
    if row.get("phase") is not None:
        return True
    if status == "settled":
        return False
    return not row.get("session_file") or derive_outcome(row["session_file"]) != "success"


def run_was_cut(transcript: Path) -> bool:
    """The session continues its interrupted run by itself when relaunched (workers/session.py `continue_run`):
    its last real message is a user message or tool result, or an assistant turn a worker stop cut."""
    try:
        entries = read_transcript(transcript).leaf_path()
    except OSError:
        return False
    real = [m for m in context_messages(entries) if not m.get("customType")]
    if not real:
        return False
    last = real[-1]
    if last.get("role") != "assistant":
        return True
    if last.get("stopReason") != "aborted":
        return False
    for entry in reversed(entries):
        if entry.get("type") == "custom" and entry.get("customType") == RUN_CUT_TYPE:
            data = entry.get("data")
            return isinstance(data, dict) and data.get("cause") == CUT_STOP
        if entry.get("type") == "message" and (entry.get("message") or {}).get("role") == "assistant":
            return False
    return False


def _wanted(names: list[str], all_: bool, rows: dict[str, dict[str, Any]], paused: list[Paused],
            root_id: str) -> list[str]:
    if all_:
        return [p.id for p in paused if p.id != root_id]
    wanted: list[str] = []
    for name in names:
        row = rows.get(name)
        if row is None:
            raise RunConfigError(f"no node '{name}' in this run{did_you_mean(name, list(rows))}; "
                                 f"paused: {', '.join(p.id for p in paused) or '(none)'}")
        if not _resumable(row, root=name == root_id):
            if row["status"] not in RESUMABLE | {"settled"}:
                raise RunConfigError(f"'{name}' is {row['status']}, not paused")
            why = f"phase '{row['phase']}'" if row.get("phase") in TERMINAL_PHASES else "it settled"
            raise RunConfigError(f"'{name}' is terminal ({why}): its result stands and it is not revived; "
                                 "`legion launch` a new node for more work")
        if name != root_id:
            wanted.append(name)
    return wanted


def startup_hint(orch: Orchestrator, plan: ResumePlan) -> str:
    """The root session's first input on resume: its paused direct children, and not to resume itself."""
    root = plan.root_id
    children = [p for p in plan.paused if p.parent == root]
    lines = [f"{NOTICE_MARKER} (not from the operator's task): this run was paused and the operator resumed it. "
             "You are the root session and you are running again: do not resume yourself."]
    if children:
        lines.append("Your paused direct children:")
        for p in children:
            again = " — resumed with you" if p.id in plan.revive else ""
            lines.append(f"- {p.id} ({p.role}): {p.status}, phase {p.phase or '-'}{again}")
        lines.append("Resume one with `subagent resume` (name), or wait for those resumed with you; "
                     "`subagent status` shows the tree.")
    else:
        lines.append("None of your children is paused.")
    return "\n".join(lines)


async def resume(plan: ResumePlan, *, on_root: Callable[[RootSupervisor], None] | None = None,
                 install_signals: bool = True) -> RunResult:
    """Restore and revive (see the module docstring); the run's exit status as `legion run` gives it."""
    from legion.run import _write_run_json

    async def begin(orch: Orchestrator) -> None:
        assert orch.root.ledger is not None
        records = load_launch_records(plan.prepared.run_dir)
        for node in orch.restore(orch.root.ledger.list_nodes(), records):
            orch.root.publish("agent_launched", {"node_id": node.id, "parent_id": node.parent, "role": node.role,
                                                 "model": node.model, "depth": node.depth, "backend": node.backend,
                                                 "restored": True})
        root = orch.tree.get(plan.root_id)
        assert root is not None
        _write_run_json(plan.prepared, status="running", session_file=str(root.transcript))
        # members first (deepest first), the root session last: a quick root must not find an idle tree and end
        # the run before its team is back
        for child in sorted(filter(None, map(orch.tree.get, plan.revive)), key=lambda n: -n.depth):
            await _revive(orch, child, CHILD_RESUME_TEXT)
        if any(p.id == root.id for p in plan.paused):
            await _revive(orch, root, startup_hint(orch, plan), steer=True)

    return await drive(plan.prepared, begin, on_root=on_root, install_signals=install_signals, fresh=False)


async def _revive(orch: Orchestrator, node: AgentNode, text: str, *, steer: bool = False) -> None:
    """From its transcript: a cut run continues by itself (running members continue their context); an idle
    session gets `text` as its prompt. With `steer` (the root's startup hint) a cut run gets `text` too, at its
    next turn boundary."""
    if not run_was_cut(node.transcript):
        await orch.revive(node, text)
        return
    await orch.revive(node)
    if not steer:
        return
    reply = await orch.root.session_request(node.id, "session.steer", text=text)
    if not reply.get("ok"):
        logger.warning("resume note to {} not delivered: {}", node.id, reply.get("error"))
