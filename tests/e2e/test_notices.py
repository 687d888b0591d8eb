"""Completion notices (docs/spec-conformance.md §6.7): a parent that settles without waiting is woken by an automatic notice
carrying its children's results; one batch of completions is one wake-up, and no result is announced twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import (
    NOTICE_FIRST_LINE,
    Project,
    call,
    launch,
    node_rows,
    project,
    subagent,
    tools,
    until_recorded,
    user_texts,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def proj() -> Iterator[Project]:
    with project() as p:
        yield p


def notices(proj: Project, run_id: str) -> list[str]:
    texts = user_texts(proj.run_path(run_id) / "root.jsonl")
    return [t for t in texts if t.startswith(NOTICE_FIRST_LINE)]


def children(proj: Project, *names: str, delay_ms: int = 0) -> list[dict[str, object]]:
    return [{"name": n, "agent": "worker", "task": f"task {n}",
             "model": proj.script(n, {"text": f"result of {n}", "delay_ms": delay_ms})} for n in names]


def test_children_finishing_while_the_root_works_wake_it_once(proj: Project) -> None:
    """Both children settle while the root is still busy (its bash lasts until the ledger records their results): at its run
    boundary the root gets ONE notice with both results, answers it, and the run ends."""
    run_id = "notice-1"
    busy = until_recorded(run_id, ["n1", "n2"])
    root = proj.script("root", launch(*children(proj, "n1", "n2")),
                       tools(call("bash", {"command": busy})),
                       {"text": "dispatched; I will not wait"},
                       default={"text": "noted the results"})
    out = proj.run("dispatch and go", "--model", root, run_id=run_id)
    assert out.code == 0, out.explain()
    assert out.stdout.startswith("noted the results\n"), out.stdout
    [notice] = notices(proj, run_id)
    assert notice.splitlines()[0].startswith(NOTICE_FIRST_LINE) and "2 result(s)" in notice
    assert "result of n1" in notice and "result of n2" in notice
    assert "artifacts/n1/r1.md" in notice and "artifacts/n2/r1.md" in notice
    with proj.ledger(out.run_dir) as led:
        assert led.undelivered("root") == []
    assert {n: r["status"] for n, r in node_rows(out.run_dir).items()} == {"root": "settled", "n1": "settled",
                                                                         "n2": "settled"}


def test_an_idle_root_is_woken_and_nothing_is_announced_twice(proj: Project) -> None:
    """The root settles first; each child's result reaches it in exactly one notice."""
    run_id = "notice-2"
    names = ("s1", "s2", "s3")
    root = proj.script("root", launch(*children(proj, *names, delay_ms=300)), {"text": "dispatched"},
                       default={"text": "noted"})
    out = proj.run("dispatch and idle", "--model", root, run_id=run_id)
    assert out.code == 0, out.explain()
    got = notices(proj, run_id)
    assert 1 <= len(got) <= 3, got
    for n in names:
        assert sum(t.count(f"result of {n}") for t in got) == 1, got
    assert sum(int(t.split(": ")[1].split(" ")[0]) for t in got) == 3  # "N result(s) arrived" adds up
    with proj.ledger(out.run_dir) as led:
        assert led.undelivered("root") == []


def test_a_notice_listing_two_rounds_of_one_child_shows_each_rounds_own_text(proj: Project) -> None:
    """c1 answers, is continued and answers again while the root is busy: the one notice lists both rounds, each
    with its own result (from its artifact), and says where c1's whole conversation is."""
    run_id = "notice-rounds"
    c1 = proj.script("c1", {"text": "round one answer"}, {"text": "round two answer"}, default={"text": "more"})
    rounds = f".legion/runs/{run_id}/artifacts/c1"
    root = proj.script("root", launch({"name": "c1", "agent": "worker", "task": "first", "model": c1}),
                       tools(call("bash", {"command": until_recorded(run_id, ["c1"])})),
                       subagent("continue", name="c1", message="second"),
                       tools(call("bash", {"command": f"until [ -f {rounds}/r2.md ]; do sleep 0.02; done"})),
                       {"text": "both rounds are in"}, default={"text": "noted"})
    out = proj.run("two rounds", "--model", root, run_id=run_id)
    assert out.code == 0, out.explain()
    [notice] = notices(proj, run_id)
    first, second = notice.index("artifacts/c1/r1.md"), notice.index("artifacts/c1/r2.md")
    assert first < notice.index("round one answer") < second < notice.index("round two answer"), notice
    assert notice.count("round two answer") == 1, notice
    assert f"Complete conversation: {out.run_dir / 'c1.jsonl'}" in notice, notice
