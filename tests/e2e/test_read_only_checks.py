"""A read-only role may run the project's own checks (docs/spec-conformance.md §3.5): the built-in reviewer,
whose card is `acceptance.role: read-only`, runs `make test` through `legion run`, and is still refused a
command that changes the project."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.harness import Project, call, launch, project, tool_results, tools, until_recorded

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def proj() -> Iterator[Project]:
    with project() as p:
        yield p


def test_a_read_only_reviewer_runs_the_projects_checks_and_is_refused_a_change(proj: Project) -> None:
    run_id = "ro-checks"
    (proj.dir / "Makefile").write_text("test:\n\t@echo all checks passed\n")
    rv = proj.script("rv", tools(call("bash", {"command": "make test"})),
                     tools(call("bash", {"command": "touch made.txt"})),
                     {"text": "reviewed"}, default={"text": "done"})
    root = proj.script("root", launch({"name": "rv", "agent": "reviewer", "task": "review", "model": rv}),
                       tools(call("bash", {"command": until_recorded(run_id, ["rv"])})),
                       {"text": "over"}, default={"text": "noted"})
    out = proj.run("review it", "--model", root, run_id=run_id)
    assert out.code == 0, out.explain()
    check, change = tool_results(out.run_dir / "rv.jsonl", tool="bash")
    assert "all checks passed" in check, check
    assert "read-only" in change and "touch" in change, change
    assert not (proj.dir / "made.txt").exists()
