"""Issue 23's small things, each through the command as a user runs it on a real run (scripted models): plurals
("1 turn"), `status`'s header and no operator row, `events`' times, `doctor models` on unset keys, `agents project`
without the built-ins, `resume --detach`."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_support import (
    gate_worker,
    legion,
    legion_here,
    live_run,
    project,
    start,
    stop_process,
)
from tests.support import wait_until


@pytest.fixture(scope="module")
def echo_run() -> Iterator[Path]:
    """A finished one-node run: the root answers in one turn (scripted/echo)."""
    cwd = Path(tempfile.mkdtemp(prefix="los", dir="/tmp"))
    try:
        out = legion(cwd, "run", "--run-id", "e1", "--model", "scripted/echo", "say hi")
        assert out.returncode == 0, out.stderr + out.stdout
        yield cwd
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def test_one_turn_is_singular(echo_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = legion_here(echo_run, capsys, "summary", "e1")
    assert out.returncode == 0, out.stderr
    root = next(line for line in out.stdout.splitlines() if line.startswith("root "))
    assert " · 1 turn · 0 tools · " in root, root
    assert re.search(r"^total: 1 node · ", out.stdout, re.M), out.stdout
    assert not re.search(r"\b1 (turns|tools|nodes)\b", out.stdout), out.stdout


def test_events_show_iso_times_local_and_utc_in_json(echo_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import datetime, timedelta

    import orjson

    text = legion_here(echo_run, capsys, "events", "e1")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines
    now = datetime.now().astimezone()
    for line in lines:
        stamp = line.split()[1]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", stamp), line
        assert abs(datetime.fromisoformat(stamp) - now) < timedelta(minutes=10), line
    raw = legion_here(echo_run, capsys, "events", "e1", "--json")
    events = [orjson.loads(line) for line in raw.stdout.splitlines()]
    assert events and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["ts"]) for e in events), events
    assert [datetime.fromisoformat(e["ts"]).astimezone().isoformat(timespec="milliseconds") for e in events] == [
        line.split()[1] for line in lines]  # the same moments as the human lines, in UTC
    followed = legion_here(echo_run, capsys, "events", "e1", "--follow", "--idle", "0")
    assert [line.split()[1] for line in followed.stdout.splitlines()] == [line.split()[1] for line in lines]


def test_status_has_a_header_and_no_operator_row(capsys: pytest.CaptureFixture[str]) -> None:
    """The operator mails w1 of a live run (which writes the operator's pseudo-node into the ledger); `status` and
    `tree` then list the run's nodes under a header, without an `operator` row."""
    import orjson

    with project() as cwd:
        release = gate_worker(cwd)
        proc = start(cwd, "run", "--run-id", "s1", "--model", "scripted/root.yaml", "task")
        try:
            live_run(cwd)
            sent = legion(cwd, "mail", "send", "s1", "w1", "--subject", "hello", "--body", "from the operator")
            assert sent.returncode == 0, sent.stderr + sent.stdout
            release.touch()
            assert proc.wait(60) == 0
        finally:
            stop_process(proc)
        raw = orjson.loads(legion_here(cwd, capsys, "status", "s1", "--json").stdout)
        assert "@operator" in {n["id"] for n in raw["nodes"]}  # the ledger has it (--json shows the rows as they are)
        out = legion_here(cwd, capsys, "status", "s1")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("node "))
        assert lines[header].split() == ["node", "status", "phase", "model", "updated"]
        names = [line.split()[0] for line in lines[header + 1:]]
        assert "root" in names and "w1" in names and "operator" not in names, out.stdout
        assert "operator" not in legion_here(cwd, capsys, "tree", "s1").stdout
        summary = legion_here(cwd, capsys, "summary", "s1").stdout
        assert not any(line.startswith("operator") for line in summary.splitlines()), summary


def test_doctor_models_does_not_tick_a_provider_whose_key_is_not_set(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import orjson

    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no user cards or pi models.json of this machine
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "pi"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-shown")
    out = legion_here(tmp_path, capsys, "doctor", "models")
    assert out.returncode == 0, out.stderr
    openai = next(line for line in out.stdout.splitlines() if "provider openai" in line)
    assert not openai.startswith("✓") and openai.startswith("–") and "OPENAI_API_KEY is not set" in openai, openai
    anthropic = next(line for line in out.stdout.splitlines() if "provider anthropic" in line)
    assert anthropic.startswith("✓") and "ANTHROPIC_API_KEY is set" in anthropic
    assert "sk-test-not-shown" not in out.stdout
    checks = {c["name"]: c for c in orjson.loads(legion_here(tmp_path, capsys, "doctor", "models", "--json").stdout)}
    assert checks["provider openai"]["status"] == "off" and checks["provider anthropic"]["status"] == "ok"
    summary = legion_here(tmp_path, capsys, "doctor", "summary").stdout
    assert re.search(r"^✓ models .* 0 problem", summary, re.M), summary  # an unused provider is not a problem


def test_agents_project_lists_only_the_projects_cards(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import orjson

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    cards = tmp_path / ".legion" / "agents"
    cards.mkdir(parents=True)
    assert legion_here(tmp_path, capsys, "agents", "project").stdout.strip() == "(no project cards)"
    (cards / "mine.md").write_text("---\nname: mine\ndescription: my own\nmodel: openai/gpt-4.1\n---\nDo it.\n")
    (cards / "worker.md").write_text("---\nname: worker\ndescription: the project's worker\n---\nWork.\n")
    rows = orjson.loads(legion_here(tmp_path, capsys, "agents", "project", "--json").stdout)
    assert sorted((r["name"], r["source"]) for r in rows) == [("mine", "project"), ("worker", "project")]
    text = legion_here(tmp_path, capsys, "agents", "project")
    assert text.returncode == 0 and [line.split()[0] for line in text.stdout.splitlines()] == ["mine", "worker"]
    every = {r["name"]: r["source"] for r in orjson.loads(legion_here(tmp_path, capsys, "agents", "--json").stdout)}
    assert every["mine"] == every["worker"] == "project" and every["planner"] == "builtin"  # `both`: every card
    assert orjson.loads(legion_here(tmp_path, capsys, "agents", "user", "--json").stdout) == []


def test_resume_detach_continues_a_paused_run_as_a_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    import os

    import orjson

    def run_json(run_dir: Path) -> dict[str, object]:
        try:
            data = orjson.loads((run_dir / "run.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    with project() as cwd:
        release = gate_worker(cwd)
        proc = start(cwd, "run", "--run-id", "d1", "--model", "scripted/root.yaml", "task")
        try:
            run_dir = live_run(cwd)
            assert legion(cwd, "stop", "d1", "--all").returncode == 0
            assert proc.wait(30) == 130
        finally:
            stop_process(proc)
        assert not (run_dir / "daemon.pid").exists()
        release.touch()
        out = legion(cwd, "resume", "d1", "--all", "--detach", "--progress-every", "0", timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout == "d1\n" and "paused nodes of run d1" in out.stderr  # stdout: the run id only
        pid = int((run_dir / "daemon.pid").read_text())
        assert os.getsid(pid) == pid  # its own session
        wait_until(lambda: run_json(run_dir).get("status") == "settled", deadline=60,
                   message="the detached resume to settle")

        def daemon_state() -> str:  # run.json says settled a moment before the daemon process exits
            state = str(orjson.loads(legion_here(cwd, capsys, "status", "d1", "--json").stdout)["state"])
            return state if "running" not in state else ""

        assert "exited (run status settled)" in wait_until(daemon_state, deadline=30, message="the daemon to exit")
        log = (run_dir / "daemon.log").read_text()
        assert "settled (exit 0)" in log and "all done" in log
        again = legion(cwd, "resume", "d1", "--all", "--detach")  # refused here, before any daemon
        assert again.returncode == 2 and "is finished" in again.stderr and again.stdout == ""
        assert int((run_dir / "daemon.pid").read_text()) == pid
