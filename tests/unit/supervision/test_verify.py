"""Verification commands (docs/spec-conformance.md §2.8): real shell processes, a deadline that kills the whole tree."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil

from legion.orchestration.verify import (
    VerifySlot,
    contract_commands,
    run_command,
    run_verification,
    verify_block,
)


def test_verify_block_takes_the_last_block_and_skips_comments() -> None:
    text = "```legion-verify\nold\n```\nprose\n```legion-verify\n# a comment\n\npytest -q\nruff check .\n```\n"
    assert verify_block(text) == ["pytest -q", "ruff check ."]
    assert verify_block("```legion-verify\n```\n") == []  # empty: nothing to run (straight to done)
    assert verify_block("no block here") is None


def test_a_contract_without_a_block_is_an_error_that_says_how_to_fix_it(tmp_path: Path) -> None:
    contract = tmp_path / "CONTRACT.md"
    contract.write_text("# goal\n")
    commands, error = contract_commands(contract)
    assert commands is None and error is not None and "no ```legion-verify block" in error
    commands, error = contract_commands(None)
    assert commands is None and "no contract" in str(error)


def test_a_hanging_command_is_killed_at_its_timeout_with_its_whole_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # a child in the group, a grandchild that left the group (setsid), and a double-forked daemon that
    # left the tree but kept the group: all must die
    command = (f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; "
               f"( sleep 300 & echo $! >> {pids} ); echo $$ >> {pids}; sleep 300")
    started = time.monotonic()
    result = asyncio.run(run_command(command, tmp_path, 0.5, tmp_path / "out.log"))
    assert result.timed_out and result.exit_code is None and not result.ok
    assert time.monotonic() - started < 5
    for pid in (int(p) for p in pids.read_text().split()):
        deadline = time.monotonic() + 5
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"pid {pid} survived the verification timeout"
            time.sleep(0.02)


def test_a_command_that_does_not_exist_is_red_with_its_output(tmp_path: Path) -> None:
    report = asyncio.run(run_verification(["true", "no-such-command-xyz --flag"], tmp_path, tmp_path / "v", 10_000))
    assert not report.passed
    assert [c.exit_code for c in report.commands] == [0, 127]
    assert "not found" in report.commands[1].tail
    assert (tmp_path / "v" / "2.log").is_file()
    assert "exit 127" in report.summary()


def test_commands_run_in_the_worktree_cwd(tmp_path: Path) -> None:
    (tmp_path / "marker").write_text("x")
    report = asyncio.run(run_verification(["test -f marker", "pwd"], tmp_path, tmp_path / "v", 10_000))
    assert report.passed
    assert (tmp_path / "v" / "2.log").read_text().strip() == os.path.realpath(tmp_path)


def test_the_verification_slot_runs_one_verification_at_a_time(tmp_path: Path) -> None:
    async def both() -> list[tuple[float, float]]:
        slot = VerifySlot(1)
        spans: list[tuple[float, float]] = []

        async def one(n: int) -> None:
            async with slot:
                started = time.monotonic()
                await run_verification(["sleep 0.2"], tmp_path, tmp_path / f"v{n}", 10_000)
                spans.append((started, time.monotonic()))

        await asyncio.gather(one(1), one(2))
        return sorted(spans)

    first, second = asyncio.run(both())
    assert second[0] >= first[1]  # the second started only after the first ended
