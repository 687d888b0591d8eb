"""Teams at runtime: `legion_phase`, the root's phase writes, verification, timeouts and branch delivery.

`Teams` (one per orchestrator, made by the run's composition `Run` and reached by handlers as `orch.teams`) is the only writer of `nodes.phase`: every transition
is evaluated by `phase_machine.evaluate` and written through the root's ledger writer (`orch.ctx.write`) with
its event, one team at a time. Events: the closed set has no `phase_rejected`, so a rejection is a
`phase_change` event whose data carries `rejected: <reason>` (and `alarm: true` for a broken invariant); a
verification run is a `phase_change` event with `verification: passed|failed` and no phase move.

- `legion_phase {to, note?, evidence?, reason?, supersedes?}` — the centurion's requests (docs/spec-conformance.md §5.9).
- Entering `verifying` starts the contract's `legion-verify` commands in the worktree (one run at a time per
  run): green → the supervisor moves the team to `done` and sends the collection prompt; red → back to
  `implementing` as a rework (the third fails the team, `rework_exhausted`).
- A team whose workers all failed is moved to `failed` (`all_children_failed`); a team in phase `failed`
  ends with status `failed` even when its session settles normally afterwards (the marker is kept).
- Phase timeouts (§5.8): a periodic task writes one `phase_timeout` event and one `Phase timeout:` notice mail
  to the centurion's parent per stint (keyed on `phase_since`); it never changes a phase.
- `collect_checks` (called by `subagent collect`): card acceptance criteria with a `command` on a terminal
  collect, and a delivered team's branch + HEAD sha read from git.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Final

from loguru import logger

from legion.agents.errors import VerdictError
from legion.agents.verdict import parse_verdict
from legion.codes import INTERNAL
from legion.ledger import Ledger
from legion.ledger.constants import NODE_HANDLED, PHASE_CHANGE, PHASE_TIMEOUT
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.commands import Reply, tool
from legion.orchestration.orchestrator import Orchestrator
from legion.orchestration.phase_machine import (
    CENTURION_REQUIRED,
    REVIEWER,
    Child,
    Decision,
    Facts,
    Machine,
    evaluate,
    machine_for,
)
from legion.orchestration.refusals import INVALID_PARAMS, ActionRefused
from legion.orchestration.verify import VerifySlot, contract_commands, run_command, run_verification
from legion.orchestration.worktree import WorktreeError, branch_head, team_worktree

DEFAULT_CONTRACT: Final = "CONTRACT.md"
VERIFYING: Final = "verifying"
TICK_S: Final = 1.0
VERIFY_SLOTS: Final = 1
CRITERION_TAIL: Final = 600  # characters of a failing acceptance command's output quoted in the collect
RETIRE_CAUSES: Final = ("retire", "stop", "force_stop")
def _now_ms() -> int:
    return int(time.time() * 1000)


class Teams:
    """Phase decisions, verification, timeout notices and delivery for the teams of one run (one per
    orchestrator: its hooks and the phase-timeout task ticking every `tick_s`, default `TICK_S`)."""

    def __init__(self, orch: Orchestrator, *, tick_s: float | None = None) -> None:
        self.orch = orch
        self.tick_s = TICK_S if tick_s is None else tick_s
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.verification: dict[str, tuple[int, bool]] = {}  # team → (phase_since of the stint, green)
        self.handled: dict[str, set[str]] = {}
        self.timeouts_sent: set[tuple[str, int]] = set()
        self.timeouts_failed: set[tuple[str, int]] = set()
        self.slot = VerifySlot(VERIFY_SLOTS)
        self.verify_runs = 0
        self.retired: set[str] = set()  # teams last seen retired: their next start is a revival
        orch.subscribe("status", self._on_status)
        orch.subscribe("settled", self._on_settled)
        orch.spawn(self._timeout_loop(), "phase-timeouts")
        orch.attach(teams=self)  # `legion_phase` and collect's acceptance checks reach it through `orch.teams`

    # ----- reading --------------------------------------------------------------------------
    def machine(self, node: AgentNode) -> Machine | None:
        return machine_for(node.spec.get("phases"))

    def teams(self) -> list[AgentNode]:
        return [n for n in self.orch.tree if n.spec.get("phases") is not None]

    def row(self, node_id: str) -> dict[str, Any]:
        return self.orch.ctx.ledger.get_node(node_id) or {}

    def worktree(self, team: AgentNode) -> Path:
        return Path(team.spec.get("cwd") or self.orch.ctx.cwd)

    def _handled(self, team: str) -> set[str]:
        found = self.handled.get(team)
        if found is None:
            found = set()
            for ev in self.orch.ctx.ledger.events_after(0, limit=100_000):
                if ev.type == NODE_HANDLED and ev.data.get("team") == team and ev.node_id:
                    found.add(ev.node_id)
            self.handled[team] = found
        return found

    def contract(self, team: AgentNode, row: dict[str, Any], evidence: Any) -> tuple[Path | None, str]:
        """The contract file: `evidence` naming a file in the worktree, else the recorded one, else CONTRACT.md."""
        root = self.worktree(team).resolve()
        for candidate in (evidence if isinstance(evidence, str) and evidence.strip() else None,
                          row.get("contract_path"), DEFAULT_CONTRACT):
            if not candidate:
                continue
            path = (root / candidate.strip()).resolve()
            if not path.is_relative_to(root):
                return None, f"{candidate!r} is outside the team's worktree {root}"
            if path.is_file() and path.stat().st_size > 0:
                return path, ""
        named = evidence if isinstance(evidence, str) and evidence.strip() else DEFAULT_CONTRACT
        return None, f"{named} does not exist or is empty in {root}"

    def facts(self, team: AgentNode, row: dict[str, Any], evidence: Any = None) -> Facts:
        handled = self._handled(team.id)
        children = [Child(c.id, c.role, c.status, c.settled_at, c.final_text, c.id in handled)
                    for c in self.orch.tree.children(team.id)]
        contract, hint = self.contract(team, row, evidence)
        facts = Facts(children=children, contract_ok=contract is not None, contract_hint=hint,
                      rework_count=int(row.get("rework_count") or 0))
        reviewers = [c for c in children if c.role == REVIEWER and c.status == "settled"]
        if reviewers:
            latest = max(reviewers, key=lambda c: c.settled_at or 0.0)
            facts.reviewer_settled = True
            try:
                facts.verdict = parse_verdict(latest.final_text)
            except VerdictError as exc:
                facts.verdict_error = str(exc)
        stint = self.verification.get(team.id)
        if stint is not None and stint[0] == row.get("phase_since"):
            facts.verification = stint[1]
        return facts

    # ----- deciding and writing ---------------------------------------------------------------
    async def request(self, team: AgentNode, to: Any, actor: str, *, reason: str | None = None,
                      note: str | None = None, evidence: Any = None,
                      terminal_reason: str | None = None) -> Decision:
        """Evaluate and (when accepted) write one transition; a rejection is recorded as an event."""
        machine = self.machine(team)
        if machine is None:
            return Decision(False, CENTURION_REQUIRED, f"{CENTURION_REQUIRED}: '{team.id}' runs no phase machine")
        async with self.locks[team.id]:
            row = self.row(team.id)
            current = row.get("phase")
            facts = self.facts(team, row, evidence)
            decision = evaluate(machine, current, to, actor, facts, reason)
            if not decision.ok:
                await self._record_rejection(team, current, to, actor, decision)
                if decision.forced is not None:
                    forced_to, forced_why = decision.forced
                    await self._write(team, machine, row, forced_to, "supervisor", rework=False, exceeded=True,
                                      note=decision.message, terminal_reason=forced_why, contract=None)
                    # the centurion reads it in its tool reply; a supervisor request's ruling is told
                    self._after(team, forced_to, None if actor == "centurion" else
                                f"the team failed: {decision.message}")
                return decision
            assert decision.edge is not None
            contract = None
            if current == machine.start and not machine.phases[str(to)].terminal:
                contract, _ = self.contract(team, row, evidence)
            why: str | None = terminal_reason or ("parent_decision" if to == "failed" else None)
            await self._write(team, machine, row, str(to), actor, rework=decision.edge.rework,
                              note=note or reason, terminal_reason=why, contract=contract)
        self._after(team, str(to), None)
        return decision

    async def force(self, team: AgentNode, to: str, terminal_reason: str, note: str, *, tell: bool = True) -> bool:
        """A supervisor ruling (all members failed, the parent retired the team): no edge conditions."""
        machine = self.machine(team)
        if machine is None:
            return False
        async with self.locks[team.id]:
            row = self.row(team.id)
            if row.get("phase") in (None, *[p for p, v in machine.phases.items() if v.terminal]):
                return False
            await self._write(team, machine, row, to, "supervisor", rework=False, note=note,
                              terminal_reason=terminal_reason, contract=None)
        if tell and to != "aborted":  # a retired team is not woken up to be told
            self._after(team, to, f"the team is now '{to}' ({terminal_reason}): {note}")
        return True

    async def _write(self, team: AgentNode, machine: Machine, row: dict[str, Any], to: str, actor: str, *,
                     rework: bool, note: str | None, terminal_reason: str | None, contract: Path | None,
                     exceeded: bool = False) -> None:
        """`exceeded`: a forced failure records the rework attempt that exceeded maxRework in its event (the row
        keeps the count of reworks done)."""
        current = row.get("phase")
        fields: dict[str, Any] = {"phase": to, "phase_since": _now_ms()}
        data: dict[str, Any] = {"from": current, "to": to, "actor": actor}
        if rework or exceeded:
            attempt = int(row.get("rework_count") or 0) + 1
            if rework:
                fields["rework_count"] = attempt
            data["rework"] = attempt
            data["maxRework"] = machine.max_rework
        if contract is not None:
            fields["contract_path"] = str(contract)
            data["contract_path"] = str(contract)
        if terminal_reason:
            data["terminalReason"] = terminal_reason
        if note:
            data["note"] = note[:2000]
        back_to_start = to == machine.start and current != machine.start
        parent = team.parent

        def write(led: Ledger) -> None:
            with led.transaction():
                led.update_node(team.id, **fields)
                led.append_event(team.id, PHASE_CHANGE, data)
            if back_to_start and parent is not None:  # the plan was wrong: the superior is told (§5.1)
                with contextlib.suppress(Exception):
                    led.send_mail(team.id, parent, f"Phase change: {team.id} back to {to}",
                                  f"{team.id} went back from {current} to {to}: {note or 'no note given'}",
                                  kind="notice")

        await self.orch.ctx.write(write)
        self.orch.root.publish(PHASE_CHANGE, {"node_id": team.id, **data})  # the live view's phase column
        logger.info("phase {}: {} → {} ({}{})", team.id, current, to, actor,
                    f", {terminal_reason}" if terminal_reason else "")

    async def _record_rejection(self, team: AgentNode, current: Any, to: Any, actor: str, decision: Decision) -> None:
        data = {"from": current, "to": to if isinstance(to, str) else repr(to), "actor": actor,
                "rejected": decision.reason, "message": decision.message[:2000]}
        if decision.alarm:
            data["alarm"] = True
        with contextlib.suppress(Exception):  # the rejection stands even if its record cannot be written
            await self.orch.ctx.write(lambda led: led.append_event(team.id, PHASE_CHANGE, data))

    def _after(self, team: AgentNode, to: str, tell: str | None) -> None:
        """What an entered phase starts: verification, the collection prompt, a message to the team."""
        if to == VERIFYING:
            self._hold(team, self._verify(team), f"verify:{team.id}")
        elif to == "done":
            self._hold(team, self.tell(team, collection_prompt(self.orch.ctx.run_dir, team)), f"collect-prompt:{team.id}")
        elif tell:
            self._hold(team, self.tell(team, tell), f"phase-notice:{team.id}")

    def _hold(self, team: AgentNode, coro: Any, name: str) -> None:
        """Run `coro` while the team counts as busy: a parent's wait and the run's end wait for it."""
        self.orch.hold(team, coro, name)

    async def tell(self, team: AgentNode, text: str) -> None:
        """A supervisor message to the centurion, as a new run once its current run has ended (a message
        queued into a running session would leave a gap between its settle and the follow-up in which the
        run could end); the team stays busy meanwhile."""
        try:
            while self.orch.running(team):
                await team.changed.wait()
            if team.status == "retired" and self.row(team.id).get("phase") == "aborted":
                return
            await self.orch.revive(team, text)
            deadline = time.monotonic() + 10.0
            while not team.live and time.monotonic() < deadline:  # its resumed status lands through the writer
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(team.changed.wait(), max(0.01, deadline - time.monotonic()))
        except Exception as exc:
            logger.warning("phase message to {} not delivered: {!r}", team.id, exc)

    # ----- verification -----------------------------------------------------------------------
    async def _verify(self, team: AgentNode) -> None:
        row = self.row(team.id)
        since = int(row.get("phase_since") or 0)
        contract = Path(row["contract_path"]) if row.get("contract_path") else None
        commands, error = contract_commands(contract)
        out_dir = self.orch.ctx.run_dir / "verify" / team.id / str(since)
        timeout_ms = self.orch.ctx.settings.legion.verify_command_timeout_ms
        async with self.slot:
            self.verify_runs += 1
            if commands:
                report = await run_verification(commands, self.worktree(team), out_dir, timeout_ms)
            else:
                from legion.orchestration.verify import VerifyReport

                report = VerifyReport(error=error)
        passed = report.passed
        data = {"phase": VERIFYING, "verification": "passed" if passed else "failed", "phase_since": since,
                "commands": [{"command": c.command, "exit": c.exit_code, "timedOut": c.timed_out,
                              "ms": c.duration_ms, "output": str(c.output_path)} for c in report.commands]}
        if report.error:
            data["error"] = report.error
        await self.orch.ctx.write(lambda led: led.append_event(team.id, PHASE_CHANGE, data))
        if self.row(team.id).get("phase_since") != since:
            return  # the team moved on meanwhile (retired, failed): the result belongs to a finished stint
        self.verification[team.id] = (since, passed)
        summary = report.summary()
        if passed:
            decision = await self.request(team, "done", "supervisor", note=summary)
            if not decision.ok:
                await self.tell(team, f"Verification is green but the team cannot complete yet: {decision.message}")
        else:
            decision = await self.request(team, "implementing", "supervisor", note=summary)
            if decision.ok:
                await self.tell(team, f"Verification is red; the team is back in implementing (rework "
                                f"{self.row(team.id).get('rework_count')}). Fix it and go through review again.\n"
                                f"{summary}")
            elif decision.forced is None:
                await self.tell(team, f"Verification is red: {summary}\n({decision.message})")

    # ----- hooks ------------------------------------------------------------------------------
    def _on_status(self, node: AgentNode, status: str, event: str | None, data: dict[str, Any]) -> None:
        if self.machine(node) is None:
            return
        if status == "retired":
            self.retired.add(node.id)
            if data.get("reason") in RETIRE_CAUSES:
                self.orch.spawn(self.force(node, "aborted", "parent_retire", "the parent retired the team"),
                                 f"aborted:{node.id}")
        elif status == "running" and node.id in self.retired:
            self.retired.discard(node.id)
            self.orch.spawn(self._revived(node), f"revived:{node.id}")

    async def _revived(self, team: AgentNode) -> None:
        """A revived team keeps its phase, and its stint restarts: it can time out again (docs/spec-conformance.md §10 item 17)."""
        machine = self.machine(team)
        phase = self.row(team.id).get("phase")
        if machine is None or phase is None or machine.phases.get(phase) is None or machine.phases[phase].terminal:
            return
        since = _now_ms()
        await self.orch.ctx.write(lambda led: led.update_node(team.id, phase_since=since))

    def _on_settled(self, node: AgentNode) -> None:
        if self.machine(node) is not None:
            self._hold(node, self._team_settled(node), f"team-settled:{node.id}")

    async def _team_settled(self, team: AgentNode) -> None:
        """The safety net when a team's run ends: all its workers failed → phase failed (the marker), and a
        team in phase failed keeps status failed (a normal settle does not overwrite the marker, docs/spec-conformance.md §10 item 25)."""
        workers = self.facts(team, self.row(team.id)).workers
        if workers and all(c.status == "failed" for c in workers):
            await self.force(team, "failed", "all_children_failed",
                             f"every worker failed: {', '.join(c.id for c in workers)}", tell=False)
        if self.row(team.id).get("phase") == "failed" and team.status != "failed":
            self.orch.root.mark_failed(team.id, "phase_failed")

    # ----- timeouts -----------------------------------------------------------------------------
    async def _timeout_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                await self.check_timeouts()
            except Exception as exc:  # the next tick retries
                logger.warning("phase timeout check failed: {!r}", exc)

    async def check_timeouts(self, now_ms: int | None = None) -> int:
        """One notice per stint whose phase timeout has passed; returns how many were written."""
        now = now_ms if now_ms is not None else _now_ms()
        written = 0
        for team in self.teams():
            machine = self.machine(team)
            row = self.row(team.id)
            phase, since = row.get("phase"), row.get("phase_since")
            if machine is None or phase is None or since is None or team.parent is None:
                continue
            if machine.phases.get(phase) is None or machine.phases[phase].terminal:
                continue
            limit = self.orch.ctx.settings.phase_timeout_ms(phase, machine.timeout_ms(phase))
            key = (team.id, int(since))
            if limit <= 0 or now - since < limit or key in self.timeouts_sent:
                continue
            self.timeouts_sent.add(key)
            try:
                if await self.orch.ctx.write(functools.partial(_timeout_notice, team=team, phase=str(phase),
                                                               since=int(since), limit=limit, now=now)):
                    written += 1
            except Exception as exc:  # e.g. the centurion's mail rate limit: nothing was written, retried
                self.timeouts_sent.discard(key)
                if key not in self.timeouts_failed:
                    self.timeouts_failed.add(key)
                    logger.warning("phase timeout notice of {} not written yet (retried each tick): {}", team.id, exc)
        return written


def _timeout_notice(led: Ledger, *, team: AgentNode, phase: str, since: int, limit: int, now: int) -> bool:
    """The `phase_timeout` event and its notice mail, once per stint (also across a restarted root)."""
    for ev in led.events_after(0, limit=100_000, node_id=team.id):
        if ev.type == PHASE_TIMEOUT and ev.data.get("phase_since") == since:
            return False
    minutes = (now - since) / 60_000
    body = (f"{team.id} has been in phase '{phase}' for {minutes:.1f} min (its timeout is {limit / 60_000:.1f} "
            f"min). Nothing was changed: decide — steer it to extend, abort its current turn (it stays), or "
            f"retire the team (→ aborted).")
    assert team.parent is not None
    with led.transaction():
        led.append_event(team.id, PHASE_TIMEOUT, {"phase": phase, "phase_since": since, "timeoutMs": limit,
                                                    "elapsedMs": now - since})
        led.send_mail(team.id, team.parent, f"Phase timeout: {team.id} in {phase}", body, kind="notice",
                      urgency="action-needed")
    return True


def collection_prompt(run_dir: Path, team: AgentNode) -> str:
    wt = team_worktree(run_dir, team.id)
    branch, base = (wt.branch, wt.base) if wt else ("your branch", "HEAD")
    return (f"▣ legion · supervisor: verification is green and the team is DONE. Collect now: squash the team's "
            f"work onto one commit on branch {branch} in your worktree {team.spec.get('cwd')} (from base "
            f"{base}: `git add -A && git reset --soft {base} && git commit -m "
            f"'<summary>'`), then report the branch name and its HEAD sha (`git rev-parse HEAD`), summarise the "
            "verdict (what was delivered, verified and how, what is left open). Attach an MR/PR URL only if a "
            "remote exists and you created it; never invent a URL, a sha or a test result. Do not merge.")


def delivery(run_dir: Path, team: AgentNode) -> dict[str, Any] | None:
    """A team's branch and its HEAD sha as git has them (None without a worktree)."""
    wt = team_worktree(run_dir, team.id)
    if wt is None:
        return None
    try:
        sha = branch_head(wt.repo, wt.branch)
    except WorktreeError as exc:
        return {"node": team.id, "branch": wt.branch, "sha": None, "error": str(exc)}
    return {"node": team.id, "branch": wt.branch, "sha": sha, "base": wt.base,
            "commits": sha is not None and sha != wt.base}


def delivered_branches(orch: Orchestrator, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each team's branch with its HEAD sha read from git, and its phase from `rows` (the final node rows)."""
    phases = {r.get("id"): r.get("phase") for r in rows}
    found = []
    for team in orch.tree:
        info = delivery(orch.ctx.run_dir, team)
        if info is not None:
            info["phase"] = phases.get(team.id)
            found.append(info)
    return found


async def collect_checks(orch: Orchestrator, child: AgentNode) -> tuple[list[str], dict[str, Any]]:
    """On a terminal collect: run the card's acceptance criteria with a `command` (a failing one quoted by the tail
    of its output), list those without one as a pending checklist for the caller, and check a team's branch."""
    lines: list[str] = []
    details: dict[str, Any] = {}
    info = await asyncio.to_thread(delivery, orch.ctx.run_dir, child)
    if info is not None:
        details["delivery"] = info
        if info.get("sha"):
            extra = "" if info.get("commits") else " (no commits beyond its base)"
            lines.append(f"branch {info['branch']} at {info['sha']} (read from git){extra}")
            if child.final_text and info["sha"][:7] not in child.final_text:
                lines.append(f"⚠ the reported result does not name git's HEAD sha {info['sha'][:12]} of "
                             f"{info['branch']}: trust git's")
        else:
            lines.append(f"⚠ branch {info['branch']} not found in git: {info.get('error') or 'no such branch'}")
    try:
        card = orch.ctx.catalog.require(child.role)
    except Exception:
        return lines, details
    declared = card.acceptance.criteria if card.acceptance else ()
    if child.status not in ("settled", "failed"):  # aborted/blocked collects skip it
        return lines, details
    manual = [c.description for c in declared if not c.command]
    if manual:  # nothing can check these: the caller does, before it accepts the result
        details["pending"] = manual
        lines.append("acceptance checklist (no command: check these yourself):")
        lines.extend(f"- [ ] {text}" for text in manual)
    criteria = [c for c in declared if c.command]
    if not criteria:
        return lines, details
    # the run's verification slot; a bare orchestrator without the Teams runtime gets one of its own
    slot = orch.teams.slot if orch.teams is not None else VerifySlot(VERIFY_SLOTS)
    timeout = orch.ctx.settings.legion.verify_command_timeout_ms / 1000
    out_dir = orch.ctx.run_dir / "acceptance" / child.id / f"r{child.rounds}"
    results: list[dict[str, Any]] = []
    failed: list[str] = []
    async with slot:
        for n, crit in enumerate(criteria, start=1):
            assert crit.command is not None
            res = await run_command(crit.command, Path(child.spec.get("cwd") or orch.ctx.cwd), timeout,
                                    out_dir / f"{n}.log")
            results.append({"criterion": crit.description, "command": crit.command, "ok": res.ok,
                            "exit": res.exit_code, "timedOut": res.timed_out, "output": str(res.output_path)})
            if not res.ok:
                why = "timed out (process tree killed)" if res.timed_out else f"exit {res.exit_code}"
                tail = res.tail[-CRITERION_TAIL:].strip()
                failed.append(f"✗ {crit.description} (`{crit.command}`): {why}"
                              + (f"\n  {tail.replace(chr(10), chr(10) + '  ')}" if tail else " (no output)"))
    green = sum(1 for r in results if r["ok"])
    level = "verified" if green == len(results) else "rejected"
    details["acceptance"] = {"level": level, "criteria": results}
    lines.append(f"acceptance: {level} ({green}/{len(results)} command(s) green; "
                 f"output under {out_dir})")
    lines.extend(failed)
    return lines, details


# ----- the tool ---------------------------------------------------------------------------------

@tool("legion_phase")
async def legion_phase(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    teams = orch.teams
    if teams is None:
        return {"ok": False, "code": INTERNAL, "text": "legion_phase: the Teams runtime is not running in this run"}
    if teams.machine(caller) is None:
        return {"ok": False, "code": CENTURION_REQUIRED,
                "text": f"{CENTURION_REQUIRED}: legion_phase is for a centurion whose launch declared a phase machine; "
                        f"'{caller.id}' ({caller.role}) has none"}
    for key in ("note", "evidence", "reason"):
        if args.get(key) is not None and not isinstance(args.get(key), str):
            raise ActionRefused(f"/{key}: must be a string", INVALID_PARAMS)
    supersedes = args.get("supersedes")
    handled = await _supersede(teams, caller, supersedes) if supersedes else []
    to = args.get("to")
    decision = await teams.request(caller, to, "centurion", reason=args.get("reason"), note=args.get("note"),
                                   evidence=args.get("evidence"))
    row = teams.row(caller.id)
    details = {"phase": row.get("phase"), "reworkCount": row.get("rework_count"), "handled": handled or None}
    if not decision.ok:
        return {"ok": False, "code": decision.reason, "text": decision.message,
                "details": {**details, "reason": decision.reason, "forced": decision.forced}}
    text = f"phase: {decision.message}"
    if to == VERIFYING:
        text += ("; the supervisor runs the contract's legion-verify commands now and tells you the result "
                 "(green moves the team to done)")
    return {"ok": True, "text": text, "details": details}


async def _supersede(teams: Teams, team: AgentNode, value: Any) -> list[str]:
    """`supersedes`: failed members whose work a settled sibling took over (→ node_handled)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ActionRefused("/supersedes: a member name or a list of them", INVALID_PARAMS)
    children = {c.id: c for c in teams.orch.tree.children(team.id)}
    for name in names:
        child = children.get(name)
        if child is None:
            raise ActionRefused(f"/supersedes: '{name}' is not a member of your team; members: "
                              f"{', '.join(children) or '(none)'}", INVALID_PARAMS)
        if child.status != "failed":
            raise ActionRefused(f"/supersedes: '{name}' is {child.status}, not failed: only a failure is superseded",
                              INVALID_PARAMS)
    by = [c.id for c in children.values() if c.status == "settled" and c.role == children[names[0]].role]
    if not by:
        raise ActionRefused(f"/supersedes: no settled {children[names[0]].role} sibling took over the work of "
                          f"{', '.join(names)}; re-dispatch it instead", INVALID_PARAMS)
    handled = teams._handled(team.id)

    def write(led: Ledger) -> None:
        with led.transaction():
            for name in names:
                led.append_event(name, NODE_HANDLED, {"team": team.id, "how": "supersedes", "by": by})

    await teams.orch.ctx.write(write)
    handled.update(names)
    return list(names)
