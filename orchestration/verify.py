"""Acceptance verification (docs/spec-conformance.md §2.8): the contract's `legion-verify` commands and card criteria.

`run_command` runs one shell command in its own process group with a deadline; at the deadline the whole
process tree is stopped, then TERMed and KILLed (the group and every descendant, also one that left the
group with setsid) through the process layer (`legion.procs`). `verify_block` reads the last
```legion-verify block of a contract (one command per line, `#` comments and blank lines skipped).
`run_verification` runs every command of a block in the worktree, each with its own timeout, output to a
file in the run directory, and returns a `VerifyReport`. A `VerifySlot` bounds how many verification runs
one run executes at once (one by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from legion.procs import ProcRef, freeze_tree, run_to_completion, snapshot_tree, sweep

VERIFY_FENCE: Final = "legion-verify"
_BLOCK: Final = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*legion-verify[ \t]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S)
OUTPUT_TAIL: Final = 2000  # characters of a failing command's output quoted back to the team
FREEZE_TIMEOUT_S: Final = 1.0
TERM_GRACE_S: Final = 0.5  # a timed-out command's tree gets TERM, then KILL after this


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int | None  # None: killed at the timeout
    timed_out: bool
    duration_ms: int
    output_path: Path
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class VerifyReport:
    commands: list[CommandResult] = field(default_factory=list)
    error: str | None = None  # the block could not be read (no contract, no block)

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.ok for c in self.commands)

    def summary(self) -> str:
        if self.error:
            return f"verification could not run: {self.error}"
        if not self.commands:
            return "verification: the legion-verify block is empty (nothing to run): green"
        lines = [f"verification: {sum(c.ok for c in self.commands)}/{len(self.commands)} command(s) green"]
        for c in self.commands:
            state = "ok" if c.ok else ("TIMED OUT (process tree killed)" if c.timed_out else f"exit {c.exit_code}")
            lines.append(f"- `{c.command}`: {state} in {c.duration_ms} ms — output {c.output_path}")
            if not c.ok and c.tail:
                lines.append("  " + c.tail.replace("\n", "\n  "))
        return "\n".join(lines)


class VerifySlot:
    """At most `limit` verification runs at once per run (docs/spec-conformance.md §2.8 `acquireVerifySlot`)."""

    def __init__(self, limit: int = 1) -> None:
        self._sem = asyncio.Semaphore(max(1, limit))

    async def __aenter__(self) -> VerifySlot:
        await self._sem.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._sem.release()


def verify_block(text: str) -> list[str] | None:
    """The commands of the last ```legion-verify block (None when there is no block)."""
    blocks = _BLOCK.findall(text)
    if not blocks:
        return None
    lines = (line.strip() for line in blocks[-1][1].splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def kill_tree(pid: int) -> list[ProcRef]:
    """Stop the command's whole tree (its process, every descendant, its process group — also members that
    left the group with setsid), then TERM and KILL them all (legion.procs); returns survivors (none)."""
    root = ProcRef.from_pid(pid)
    refs = [root] if root is not None else []
    if root is not None:
        refs += freeze_tree(root, FREEZE_TIMEOUT_S)  # nothing forks past a stopped parent
    known = {(r.pid, r.create_time) for r in refs}
    refs += [r for r in snapshot_tree([pid]) if (r.pid, r.create_time) not in known]
    return sweep(refs, signal_timeout=TERM_GRACE_S, own_pgid=os.getpgrp())


async def run_command(command: str, cwd: Path, timeout_s: float, output: Path,
                      env: dict[str, str] | None = None) -> CommandResult:
    """`sh -c command` in its own process group, stdout+stderr to `output`; killed (tree) at the timeout."""
    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with output.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", command, cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL, stdout=sink,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=env)
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
        finally:
            if timed_out or proc.returncode is None:
                await run_to_completion(kill_tree, proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()
    code = None if timed_out else proc.returncode
    return CommandResult(command, code, timed_out, int((time.monotonic() - started) * 1000), output,
                         _tail(output))


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - OUTPUT_TAIL))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


async def run_verification(commands: list[str], cwd: Path, out_dir: Path, timeout_ms: int) -> VerifyReport:
    """Each command in turn in `cwd`, each with `timeout_ms`; output files `out_dir/<n>.log`."""
    report = VerifyReport()
    for n, command in enumerate(commands, start=1):
        report.commands.append(await run_command(command, cwd, timeout_ms / 1000, out_dir / f"{n}.log"))
    return report


def contract_commands(contract: Path | None) -> tuple[list[str] | None, str | None]:
    """(commands, error) of a contract file: error when it is missing or has no legion-verify block."""
    if contract is None:
        return None, "no contract was recorded for this team (it left planning without one)"
    try:
        text = contract.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return None, f"the contract {contract} cannot be read: {exc.strerror or exc}"
    commands = verify_block(text)
    if commands is None:
        return None, (f"the contract {contract} has no ```{VERIFY_FENCE} block: add one with the commands that "
                      "verify the work, one per line (an empty block means nothing to verify)")
    return commands, None
