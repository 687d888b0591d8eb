"""`legion run --json` as a tool consumes it, written against docs/events.md only: a 3-node scripted tree read with
jq-like filters (the first event carries the run id, the `result` the total cost and the exit code, every event
validates), `--output-format json`'s one `result`, and several other trees (a failing child, a child's mail, a
fan-out) whose every event — on stdout and in `legion events --json` — validates against the page's schemas.

The filters are the jq programs of docs/events.md, written as Python (`select(.type == "result")` …)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import Project, call, launch, project, subagent, tools
from tests.events_schema import check_events, json_lines, schemas

pytestmark = pytest.mark.timeout(120)
USAGE = {"input": 1000, "output": 100, "cacheRead": 3000, "cacheWrite": 200, "cost": 0.0125}


def select(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    """jq `select(.type == TYPE)`."""
    return [e for e in events if e["type"] == type_]


def three_nodes(proj: Project) -> str:
    """root → c1, c2: each turn of each node costs $0.0125 and reads 3000 cached tokens."""
    kids = [{"name": n, "agent": "worker", "task": f"part {n}",
             "model": proj.script(n, {"text": f"{n} done", "usage": USAGE})} for n in ("c1", "c2")]
    return proj.script("root", {**launch(*kids), "usage": USAGE}, {**subagent("wait"), "usage": USAGE},
                       {"text": "both parts done", "usage": USAGE}, default={"text": "root done", "usage": USAGE})


def test_a_three_node_tree_read_with_jq_filters() -> None:
    with project() as proj:
        out = proj.run("two parts", "--model", three_nodes(proj), "--json", "--timeout", "90", run_id="tri")
        assert out.code == 0, out.explain()
        events = json_lines(out.stdout)  # every line is JSON: nothing else on stdout
        check_events(events, "the 3-node tree")
        # jq -r 'first(.[]) | .run' — the first event names the run
        first = events[0]
        assert first["type"] == "run_started" and first["run"] == "tri" and first["seq"] == 0
        assert first["run_dir"] == str(out.run_dir) and first["model"].startswith("scripted/")
        assert first["legion_version"] and first["settings_digest"].startswith("sha256:")
        # jq 'select(.type == "result") | {exit_code, total_cost_usd}' — the last event, the run's totals
        [res] = select(events, "result")
        assert events[-1] is res and res["exit_code"] == 0 and res["status"] == "settled" and not res["is_error"]
        turns = res["num_turns"]
        assert turns >= 5 and res["total_cost_usd"] == pytest.approx(0.0125 * turns)  # 3 root turns + 1 per child
        assert res["cache_read"] == 3000 * turns and res["cache_write"] == 200 * turns
        assert res["tokens_in"] >= 1000 * turns and res["final_text"] == "both parts done"
        assert sorted(n["node"] for n in res["nodes"]) == ["c1", "c2", "root"]
        assert {n["node"]: n["parent"] for n in res["nodes"]} == {"root": None, "c1": "root", "c2": "root"}
        # jq 'select(.type == "node_settled") | .node' — each node's settle, in the stream
        assert {e["node"] for e in select(events, "node_settled")} == {"root", "c1", "c2"}
        # every event: the same run, increasing seq, a UTC timestamp
        assert {e["run"] for e in events} == {"tri"}
        seqs = [e["seq"] for e in events]
        assert seqs == sorted(set(seqs)), seqs
        assert all(e["ts"].endswith("Z") for e in events)
        # the same run's stored events, in the same shape
        stored = proj.events(out.run_dir)
        assert {e["run"] for e in stored} == {"tri"} and select(stored, "tree_finalized")


def test_output_format_json_prints_one_result() -> None:
    with project() as proj:
        out = proj.run("two parts", "--model", three_nodes(proj), "--output-format", "json", "--timeout", "90")
        assert out.code == 0, out.explain()
        [res] = json_lines(out.stdout)
        assert res["type"] == "result" and res["exit_code"] == 0 and res["total_cost_usd"] > 0
        assert "node_settled" in out.stderr  # the plain lines went to stderr
        failed = proj.run("fail", "--model", proj.script("bad", {"error": "the model is down"}),
                          "--output-format", "json")
        [res] = json_lines(failed.stdout)
        assert failed.code == 1 and res["exit_code"] == 1 and res["is_error"] and res["status"] == "failed"
        assert "the model is down" in res["detail"]


def test_every_event_of_several_trees_is_documented_and_valid() -> None:
    """A failing child, a child that mails its parent, a steered child: stdout and the stored events validate
    (the harness checks both), and every type they use has its section in docs/events.md."""
    with project() as proj:
        failing = proj.script("boom", {"error": "the model is down"})
        mailer = proj.script("mailer", tools(call("legion_mail", {"to": "parent", "subject": "progress",
                                                                  "body": "half done", "kind": "report"})),
                             {"text": "mailed"}, default={"text": "mailed"})
        slow = proj.script("slow", tools(call("bash", {"command": "sleep 0.5"})), {"text": "slow done"},
                           default={"text": "slow done"})
        root = proj.script("root", launch({"name": "f1", "agent": "worker", "task": "fail", "model": failing},
                                          {"name": "m1", "agent": "worker", "task": "mail", "model": mailer},
                                          {"name": "s1", "agent": "worker", "task": "work", "model": slow}),
                           subagent("steer", name="s1", message="hurry"), subagent("wait"),
                           default={"text": "root done"})
        out = proj.run("several", "--model", root, "--json", "--timeout", "90")
        assert out.code == 0, out.explain()
        types = {e["type"] for e in out.events} | {e["type"] for e in proj.events(out.run_dir)}
        assert {"node_failed", "mail_sent", "node_steered", "tool_call", "usage", "agent_settled"} <= types, types
        assert types <= set(schemas()), types - set(schemas())
