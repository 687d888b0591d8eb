"""`legion init`, `team`, `rebuild` and `events --follow` as a user runs them."""

from __future__ import annotations

import subprocess

import orjson
import pytest

from legion.cli.settings_doc import render
from tests.events_schema import check_events
from tests.integration.cli_support import json_lines, legion, legion_here, project, start, stop_process
from tests.support import wait_until


def test_init_writes_once_and_refuses_to_overwrite() -> None:
    with project() as cwd:
        first = legion(cwd, "init")
        assert first.returncode == 0, first.stderr
        settings = cwd / ".legion" / "settings.json"
        card = cwd / ".legion" / "agents" / "reviewer-strict.md"
        assert orjson.loads(settings.read_bytes())["legion"]["maxDepth"] == 4
        # the project's reference is docs/settings.md, from the one generator
        assert (cwd / ".legion" / "settings.reference.md").read_text() == render()
        assert "docs/settings.md" in first.stdout
        card.write_text(card.read_text() + "\nmine\n")
        again = legion(cwd, "init")
        assert again.returncode == 2 and "nothing was written" in again.stderr
        assert card.read_text().endswith("mine\n")
        agents = legion(cwd, "agents", "--json")
        assert "reviewer-strict" in {row["name"] for row in orjson.loads(agents.stdout)}  # the sample card loads
        assert legion(cwd, "doctor", "models").returncode == 0


def test_team_lists_rosters_and_members_with_models() -> None:
    with project() as cwd:
        (cwd / ".legion").mkdir()
        (cwd / ".legion" / "settings.json").write_text(orjson.dumps({"teams": {"duo": {
            "description": "two", "members": [{"role": "worker", "name": "coder", "model": "scripted/echo"},
                                              "reviewer"]}}}).decode())
        listing = orjson.loads(legion(cwd, "team", "--json").stdout)
        assert [t["name"] for t in listing["teams"]] == ["default", "duo"] and listing["active"] == "default"
        duo = orjson.loads(legion(cwd, "team", "duo", "--json").stdout)
        assert [(m["name"], m["model"]) for m in duo["members"]] == [("coder", "scripted/echo"), ("reviewer", duo["members"][1]["model"])]
        missing = legion(cwd, "team", "dou")
        assert missing.returncode == 2 and "did you mean 'duo'" in missing.stderr


def test_rebuild_keeps_the_old_ledger_and_says_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    with project(worker_sleep=0) as cwd:
        assert legion(cwd, "run", "--run-id", "b1", "--model", "scripted/root.yaml", "task").returncode == 0
        run_dir = cwd / ".legion" / "runs" / "b1"
        out = legion_here(cwd, capsys, "rebuild", "b1", "--json")
        assert out.returncode == 0, out.stderr
        report = orjson.loads(out.stdout)
        assert report["nodes"] == 2 and report["phase_recovered"] is False and report["limits"]
        old = subprocess.run(["sqlite3", report["backup"], "select count(*) from events"], capture_output=True,
                             text=True)
        assert old.returncode != 0 or int(old.stdout) > 2  # the full history is kept beside it
        status = orjson.loads(legion_here(cwd, capsys, "status", "b1", "--json").stdout)
        assert {n["name"]: n["status"] for n in status["nodes"]} == {"root": "settled", "w1": "settled"}
        summary = orjson.loads(legion_here(cwd, capsys, "summary", "b1", "--json").stdout)
        assert {n["name"]: n["final"] for n in summary["nodes"]}["root"] == ["all done"]
        assert legion_here(cwd, capsys, "rebuild", "nope").returncode == 2
        assert run_dir.is_dir()


def test_events_follow_prints_events_as_they_land() -> None:
    with project(worker_sleep=1) as cwd:
        run = start(cwd, "run", "--run-id", "e1", "--model", "scripted/root.yaml", "task")
        printed = cwd / "followed.jsonl"
        try:
            wait_until(lambda: (cwd / ".legion" / "runs" / "e1" / "legion.db").exists(), message="the ledger", deadline=30.0)
            with printed.open("w") as sink:
                follow = start(cwd, "events", "e1", "--follow", "--json", stdout=sink)
            try:
                assert run.wait(60) == 0
                landed = json_lines(legion(cwd, "events", "e1", "--json", "--limit", "100000").stdout)
                # it follows until stopped (not on a guess of how long the run pauses between events)
                wait_until(lambda: len(json_lines(printed.read_text())) >= len(landed),
                           message=f"the follower to print the {len(landed)} events of the finished run", deadline=30.0)
            finally:
                stop_process(follow)
        finally:
            stop_process(run)
        followed = json_lines(printed.read_text())
        assert followed == landed  # each event once, in order
        check_events(landed, "legion events --json")
        assert [e["seq"] for e in landed] == sorted(e["seq"] for e in landed) and {e["run"] for e in landed} == {"e1"}
        types = [e["type"] for e in followed]
        # the root's tree_finalized closes a finished run, after the last settle
        assert "node_launched" in types and types[-2:] == ["node_settled", "tree_finalized"] and types.count("node_settled") == 2
        # --idle ends a follow once nothing lands for that long (here: a finished run, all printed first)
        idle = legion(cwd, "events", "e1", "--follow", "--json", "--idle", "0.5")
        assert idle.returncode == 0 and json_lines(idle.stdout) == landed

