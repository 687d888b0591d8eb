"""`legion resume RUN [NAME…|--all]`: a new root on a paused run's directory and ledger (docs/spec-conformance.md §2.10).

Never a second run for the same root session: the run directory (found by run.json's `sessionFile`, the
root session's transcript) is reopened, its ledger continued. Before anything starts, `prepare_resume`
refuses what cannot be resumed (a live owner, a corrupt or newer run.json, an unknown or terminal name),
converges abnormal leftovers (a root killed with SIGKILL, or one paused while its PostgreSQL server was down:
its live rows become `failed` + `node_abandoned` by the orphan scan, then they are resumable like paused ones;
a server that does not answer yet is waited for, up to `legion.ledger.unreachablePauseMs` and at least
RESUME_WAIT_MIN_S) and lists the paused nodes. `resume` then
restores the orchestrator's tree from the ledger and the launch records, revives the root session with
the startup hint (its paused direct children; it must not resume itself) and the nodes asked for, each
from its transcript. Settled nodes and nodes in a terminal phase are never revived.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from legion.agents import AgentDefinitionError, load_catalog, load_settings
from legion.ledger import LedgerError, open_ledger, owner_alive, read_run_json, run_hygiene
from legion.ledger.artifacts import artifact_relpath
from legion.ledger.constants import LIVE_STATUSES, NODE_SETTLED, TERMINAL_PHASES
from legion.ledger.errors import LedgerConnectError
from legion.ledger.ledger import Ledger
from legion.ledger.location import LEDGER_FILE, RUN_JSON_KEY, ledger_scope
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.orchestrator import NOTICE_MARKER, Orchestrator, did_you_mean
from legion.orchestration.run import (
    EXIT_FAILED,
    EXIT_OK,
    RUN_SCHEMA,
    Prepared,
    Run,
    RunConfigError,
    RunOptions,
    RunResult,
    load_launch_records,
    unreachable_pause_s,
)
from legion.run_ledger import LedgerChoice, apply_password, recorded_ledger
from legion.supervision.root import RootSupervisor
from legion.supervision.spawn import EarlyForkServer
from legion.workers.outcome import derive_outcome, final_answer
from legion.workers.session import CUT_STOP, RUN_CUT_TYPE
from legion.workers.transcript import TranscriptError, context_messages, read_transcript, repair_header

RESUMABLE = frozenset({"retired", "failed"})
RESUME_WAIT_MIN_S = 30.0  # the least a resume waits for a ledger server that does not answer yet
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
    recovered: list[str] = field(default_factory=list)  # finished answers recorded from their transcripts
    repaired: list[str] = field(default_factory=list)  # one line per transcript whose header was rebuilt
    unrevivable: dict[str, str] = field(default_factory=dict)  # node id -> why it cannot be revived

    def report_lines(self) -> list[str]:
        """What the resume did to the run's records before starting (printed by `legion resume`)."""
        lines = []
        if self.abandoned:
            lines.append(f"orphan scan: {', '.join(self.abandoned)} converged to failed (node_abandoned)")
        if self.recovered:
            lines.append(f"recovered from transcripts: {', '.join(self.recovered)} (a final answer the dead root "
                         "had not recorded: settled with it, its notice goes to its lead)")
        lines += self.repaired
        lines += [f"cannot revive {node}: {why}" for node, why in self.unrevivable.items()]
        return lines


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
    records = load_launch_records(run_dir)
    run_id = str(data.get("runId") or run_dir.name)
    ledger = recorded_ledger(data.get(RUN_JSON_KEY), env)
    apply_password(ledger)
    try:
        settings = load_settings(cwd, env=env)
    except AgentDefinitionError as exc:
        raise RunConfigError(str(exc)) from None
    wait_s = max(RESUME_WAIT_MIN_S, unreachable_pause_s(settings))
    rows, abandoned, recovered = _converge(run_dir, run_id, ledger, records, wait_s)
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
        catalog = load_catalog(cwd, env=env, settings=settings)
    except AgentDefinitionError as exc:
        raise RunConfigError(str(exc)) from None
    options = RunOptions(task=str(data.get("task") or ""), cwd=cwd, agent=str(data.get("agent") or "root"),
                         model=opts.get("model"), team=opts.get("team"), preset=opts.get("preset"),
                         run_id=run_id, timeout=timeout, max_cost=opts.get("maxCostUsd"), env=env)
    prepared = Prepared(options, settings, catalog, run_id, run_dir, model=str(by_id[root_id].get("model") or ""),
                        ledger=ledger)
    plan = ResumePlan(prepared, paused, wanted, root_id, abandoned, recovered)
    _repair_headers(plan, by_id, records, cwd)
    return plan


def _repair_headers(plan: ResumePlan, rows: dict[str, dict[str, Any]], records: dict[str, dict[str, Any]],
                    run_cwd: Path) -> None:
    """Rebuild the damaged header of every transcript about to be revived from the node's records (its cwd);
    a node whose transcript cannot be repaired is left out of the revive and reported, its siblings go on."""
    for node_id in [plan.root_id, *plan.revive]:
        row, spec = rows[node_id], records[node_id].get("spec")
        if node_id == plan.root_id and not any(p.id == node_id for p in plan.paused):
            continue
        transcript = row.get("session_file") or records[node_id].get("transcript")
        if not transcript:
            continue
        cwd = (spec.get("cwd") if isinstance(spec, dict) else None) or row.get("worktree_path") or str(run_cwd)
        try:
            repair = repair_header(transcript, cwd=str(cwd))
        except TranscriptError as exc:
            if node_id == plan.root_id:
                raise RunConfigError(f"the root session cannot be revived: {exc}") from None
            plan.unrevivable[node_id] = str(exc)
            plan.revive.remove(node_id)
            continue
        if repair is not None:
            plan.repaired.append(f"transcript {transcript}: {repair.describe()}")


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


def _open_when_reachable(target: str | Path, run_id: str, wait_s: float) -> Ledger:
    """Open the run's ledger; a PostgreSQL server that does not answer (down, restarting) is waited for up to
    `wait_s` seconds (legion.ledger.unreachablePauseMs), with backoff, saying so once on stderr."""
    deadline = time.monotonic() + wait_s
    delay, told = 0.2, False
    while True:
        try:
            return open_ledger(target, run_id=ledger_scope(target, run_id))
        except LedgerConnectError as exc:
            left = deadline - time.monotonic()
            if not exc.unreachable:
                raise
            if left <= 0:
                raise RunConfigError(f"{exc}. The server stayed unreachable for {wait_s:.0f}s: start it (or wait for "
                                     f"it), then `legion resume {run_id}` again; nothing was changed") from None
            if not told:
                print(f"legion resume: the ledger server at {exc.shown} cannot be reached ({exc.reason}); waiting up "
                      f"to {wait_s:.0f}s for it", file=sys.stderr, flush=True)
                told = True
        time.sleep(min(delay, max(left, 0.01)) * random.uniform(0.75, 1.25))
        delay = min(delay * 2, 2.0)


def _converge(run_dir: Path, run_id: str, choice: LedgerChoice | None, records: dict[str, dict[str, Any]],
              wait_s: float) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The ledger's nodes after the orphan scan (the owner is dead: any live row is an orphan now) and after
    recording the finished answers that the dead root had not (`_recover_answers`); (rows, abandoned,
    recovered)."""
    target: str | Path = choice.url if choice is not None else run_dir / LEDGER_FILE
    try:
        ledger = _open_when_reachable(target, run_id, wait_s)
    except LedgerError as exc:  # a newer schema, a server that stays unreachable, wrong credentials
        raise RunConfigError(str(exc)) from None
    with contextlib.closing(ledger):
        report = run_hygiene(ledger, run_dir.parent, current_run=run_dir, orphan_stale_ms=0,
                             retention_days=float("inf"))
        if report.nodes_abandoned:
            logger.info("orphan scan: {} converged to failed (node_abandoned)", ", ".join(report.nodes_abandoned))
        recovered = _recover_answers(ledger, run_dir, records)
        return ledger.list_nodes(), report.nodes_abandoned, recovered


def _recover_answers(ledger: Ledger, run_dir: Path, records: dict[str, dict[str, Any]]) -> list[str]:
    """Settle every member whose transcript ends in a completed final answer that the ledger has not recorded.

    A root killed between a worker's last line and that worker's settle leaves the answer in the transcript only
    (the orphan scan then marks the node `failed`). Such a node is recorded as its settle would have: `settled`
    with a `node_settled {reason: recovered}` event, then the answer as its next round's artifact, which owes
    its parent a completion notice (delivered once the tree is up, see `resume`). "Not recorded" means: no
    artifact of the node was written at or after the answer's time. Members of a team (a phase) are left to
    the phase machine; the root session is revived as before."""
    recovered = []
    for row in ledger.list_nodes():
        node_id = str(row["id"])
        if (node_id not in records or row.get("parent_id") is None or row.get("phase") is not None
                or row["status"] not in RESUMABLE | {"settled"} or not row.get("session_file")):
            continue
        answer = final_answer(str(row["session_file"]))
        if answer is None:
            continue
        artifacts = ledger.list_artifacts(node_id=node_id)
        if any(int(a["created_at"]) >= answer.at_ms for a in artifacts):
            continue
        rnd = max((int(a["round"]) for a in artifacts), default=0) + 1
        data = answer.text.encode("utf-8")
        while _artifact_file(run_dir, node_id, rnd) not in (None, data):  # a round file of another answer
            rnd += 1
        try:
            if _artifact_file(run_dir, node_id, rnd) == data:  # the dead root wrote its file, not its row
                ledger.record_artifact(node_id=node_id, name=node_id, round=rnd, bytes=len(data))
            else:
                ledger.write_artifact(run_dir, node_id=node_id, name=node_id, round=rnd, text=answer.text)
            if row["status"] != "settled":
                with ledger.transaction() as tx:
                    tx.update_node(node_id, status="settled")
                    tx.append_event(node_id, NODE_SETTLED, {"reason": "recovered", "outcome": "success"})
        except Exception as exc:  # e.g. a full disk: logged, the node stays as the orphan scan left it
            logger.error("the final answer of {} could not be recorded: {!r}", node_id, exc)
            continue
        logger.info("{}: its final answer was in its transcript only; recorded as settled (round {})", node_id, rnd)
        recovered.append(node_id)
    return recovered


def _artifact_file(run_dir: Path, name: str, rnd: int) -> bytes | None:
    """The bytes of round `rnd`'s artifact file of `name`, None when there is none."""
    try:
        return (run_dir / artifact_relpath(name, rnd)).read_bytes()
    except OSError:
        return None


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


def _ever_prompted(transcript: Path) -> bool:
    """Its transcript holds a user message (a session that never started has none)."""
    try:
        entries = read_transcript(transcript).leaf_path()
    except OSError:
        return False
    return any(m.get("role") == "user" and not m.get("customType") for m in context_messages(entries))


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
                 install_signals: bool = True, fork_server: EarlyForkServer | None = None) -> RunResult:
    """Restore and revive (see the module docstring); the run's exit status as `legion run` gives it."""

    async def begin(run: Run) -> None:
        orch = run.orchestrator
        records = load_launch_records(plan.prepared.run_dir)
        for node in orch.restore(orch.ctx.ledger.list_nodes(), records):
            run.announce(node, restored=True)
        root = orch.tree.get(plan.root_id)
        assert root is not None
        run.record("running", session_file=str(root.transcript))
        # members first (deepest first), the root session last: a quick root must not find an idle tree and end
        # the run before its team is back. Meanwhile a member that finishes at once does not wake its parent
        # (a lead, the root) with its notice: each node's first input is its own resume text (the root's: its
        # startup hint), the notice follows at its run boundary or below
        async with contextlib.AsyncExitStack() as held:
            for node in (root, *filter(None, map(orch.tree.get, plan.revive))):
                await held.enter_async_context(orch.resuming(node))
            for child in sorted(filter(None, map(orch.tree.get, plan.revive)), key=lambda n: -n.depth):
                if orch.tree.get(child.id) is not child or child.live:
                    continue  # a lead revived before it (by a notice) launched it again, or revived it already
                try:
                    await _revive(orch, child, CHILD_RESUME_TEXT)
                except Exception as exc:  # one node that cannot come back keeps none of its siblings down
                    logger.error("resume: {} could not be revived: {!r}", child.id, exc)
                    plan.unrevivable[child.id] = f"its session did not start again ({exc})"
            if any(p.id == root.id for p in plan.paused):
                await _revive(orch, root, startup_hint(orch, plan), steer=True)
        # results owed to an idle lead (answers recovered from transcripts, or recorded by the dead root just
        # before it died): it is woken with them now; a running lead gets them at its run boundary. A lead the
        # operator left paused keeps them owed until it is resumed.
        for node in list(orch.tree):
            if (not node.live and (node.status == "settled" or node.id == root.id)
                    and orch.ctx.ledger.undelivered(node.id)):
                await orch.deliver_notices(node.id)

    result = await Run(plan.prepared, fresh=False, on_root=on_root, install_signals=install_signals,
                       fork_server=fork_server).execute(begin)
    return tree_status(plan, result)


def tree_status(plan: ResumePlan, result: RunResult) -> RunResult:
    """`legion resume`'s exit status reflects the whole tree, not only the root session: a run whose root settled
    still exits 1 (EXIT_FAILED) while a member is `failed` outside a terminal phase (abandoned by the dead root and
    not revived, unrevivable, or failed again), naming them. Members the operator left paused (`retired`) do
    not count. See README "Exit status"."""
    if result.exit_code != EXIT_OK:
        return result
    records = load_launch_records(plan.prepared.run_dir)
    members = [r for r in result.nodes
               if str(r["id"]) != plan.root_id and (str(r["id"]) in records or r.get("session_file"))]
    failed = sorted(str(r["id"]) for r in members
                    if r.get("status") == "failed" and r.get("phase") not in TERMINAL_PHASES)
    # the run's stop retires every live node: one still starting or running was lost by it, not finished
    stuck = sorted(f"{r['id']} ({r['status']})" for r in members if r.get("status") in LIVE_STATUSES)
    whys = []
    if failed:
        whys.append(f"the root settled but {len(failed)} member(s) of the tree failed: {', '.join(failed)}")
    if stuck:
        whys.append(f"{len(stuck)} member(s) were left live when the run stopped: {', '.join(stuck)}")
    if not whys:
        return result
    result.exit_code = EXIT_FAILED
    result.detail = "; ".join([result.detail, *whys]).strip("; ")
    return result


def _stop_cut(transcript: Path) -> bool:
    """Its last run was cut by its worker's stop (a pause): an aborted last turn with a `stop` cut recorded."""
    try:
        entries = read_transcript(transcript).leaf_path()
    except OSError:
        return False
    real = [m for m in context_messages(entries) if not m.get("customType")]
    return bool(real) and real[-1].get("role") == "assistant" and run_was_cut(transcript)


async def _revive(orch: Orchestrator, node: AgentNode, text: str, *, steer: bool = False) -> None:
    """From its transcript: an idle session, or one a pause cut mid-run, gets `text` as its first input (a resume
    is a resume: no unprompted turn first, docs/spec-conformance.md §2.10); only a run a crash left mid-turn
    continues by itself, and with `steer` (the root's startup hint) it gets `text` at its next turn boundary."""
    if _stop_cut(node.transcript):
        await orch.revive(node, text)
        return
    if not run_was_cut(node.transcript):
        if not steer and not _ever_prompted(node.transcript) and node.task.strip():
            text = node.task  # the root died while it was starting: it never got its task, so it gets it now
        await orch.revive(node, text)
        return
    await orch.revive(node)
    if not steer:
        return
    reply = await orch.root.session_request(node.id, "session.steer", text=text)
    if not reply.get("ok"):
        logger.warning("resume note to {} not delivered: {}", node.id, reply.get("error"))
