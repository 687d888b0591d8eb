"""Working-directory admission through `legion run` (docs/spec-conformance.md §11): a launch's `cwd` must be, after
realpath, exactly its caller's cwd or one of the settings' `externalDirectories`; anything else — a subdirectory of
an allowed directory, a relative path, a directory that does not exist — is refused `CWD_NOT_ALLOWED` with the fix,
and the refused launch creates nothing. An admitted child's session works there: its bash starts there and its
file tools resolve relative paths there. The operator's `legion launch --workdir` is admitted the same way, and a
team worktree the run made is admitted too."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from tests.e2e.harness import (
    Project,
    call,
    kill_tree,
    launch,
    node_rows,
    project,
    subagent,
    tool_results,
    tools,
)
from tests.e2e.teams_support import git
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)
REFUSED = ("inner", "sub", "rel", "gone")


@pytest.fixture
def proj() -> Iterator[Project]:
    with project() as p:
        yield p


@pytest.fixture
def external() -> Iterator[Path]:
    """A directory outside the project (its own /tmp directory)."""
    path = Path(tempfile.mkdtemp(prefix="lext", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def external_script(directory: Path, name: str, *turns: object) -> str:
    """A script a child working in `directory` finds (a scripted model path is relative to the session's cwd)."""
    path = directory / "scripts" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"turns": list(turns)}, sort_keys=False))
    return f"scripted/scripts/{name}.yaml"


def assert_nothing_created(run: Path, name: str) -> None:
    assert name not in node_rows(run), name
    assert not list(run.glob(f"{name}.jsonl")) and not list(run.glob(f"{name}.*.jsonl")), name
    assert not (run / "launches" / f"{name}.json").exists(), name


def test_a_launch_cwd_outside_the_allowed_set_is_refused_and_creates_nothing(proj: Project, external: Path) -> None:
    real = Path(os.path.realpath(external))
    (external / "inner").mkdir()
    (proj.dir / "sub").mkdir()
    link = proj.dir / "ext-link"  # another name for the external directory: admitted by its realpath
    link.symlink_to(external)
    proj.settings({"externalDirectories": [str(external)]})
    gate = proj.dir / "gate"
    away = external_script(external, "away", tools(call("bash", {"command": "pwd -P"})),
                           tools(call("write", {"path": "made-here.txt", "content": "away was here\n"})),
                           {"text": "away done"})
    op_ok = external_script(external, "op2", tools(call("bash", {"command": "pwd -P"})), {"text": "op2 done"})
    home = proj.script("home", tools(call("bash", {"command": "pwd -P"})), {"text": "home done"})
    steps = [{"name": "away", "agent": "worker", "task": "work over there", "cwd": str(link), "model": away},
             {"name": "home", "agent": "worker", "task": "work here", "cwd": str(proj.dir), "model": home},
             {"name": "inner", "agent": "worker", "task": "x", "cwd": str(external / "inner"), "model": home},
             {"name": "sub", "agent": "worker", "task": "x", "cwd": str(proj.dir / "sub"), "model": home},
             {"name": "rel", "agent": "worker", "task": "x", "cwd": "sub", "model": home},
             {"name": "gone", "agent": "worker", "task": "x", "cwd": str(external / "missing"), "model": home}]
    root = proj.script("root", launch(*steps),
                       tools(call("bash", {"command": f"until [ -e {gate} ]; do sleep 0.02; done"})),
                       subagent("wait", timeoutMs=60_000), {"text": "root done"})
    proc, run = proj.start("cwd admission", "--model", root, "--timeout", "90")
    try:
        wait_until(lambda: node_rows(run).get("root", {}).get("status") == "running" and "away" in node_rows(run),
                   60, "the root's batch launched")
        refused = proj.cli("launch", run.name, "--agent", "worker", "--task", "x", "--name", "op1",
                           "--workdir", str(proj.dir / "sub"), timeout=60)
        admitted = proj.cli("launch", run.name, "--agent", "worker", "--task", "y", "--name", "op2",
                            "--workdir", str(external), "--model", op_ok, timeout=60)
        gate.touch()
        _, stderr = proc.communicate(timeout=90)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, stderr

    reply = tool_results(run / "root.jsonl")[0]
    assert "▶ away" in reply and "▶ home" in reply, reply
    for name in REFUSED:
        assert f"✗ {name}: CWD_NOT_ALLOWED" in reply, reply
        assert_nothing_created(run, name)
    assert f"{external / 'inner'} is not an allowed working directory" in reply, reply
    assert f"{proj.dir / 'sub'} is not an allowed working directory" in reply, reply
    assert "not their subdirectories" in reply and "externalDirectories" in reply, reply  # the fix
    assert "'sub' is not an absolute path" in reply, reply
    assert f"{external / 'missing'} is not an existing directory" in reply, reply

    assert refused.returncode == 1 and "CWD_NOT_ALLOWED" in refused.stdout + refused.stderr, refused
    assert_nothing_created(run, "op1")
    assert admitted.returncode == 0, (admitted.stdout, admitted.stderr)

    rows = node_rows(run)
    for name, where in (("away", real), ("home", Path(os.path.realpath(proj.dir))), ("op2", real)):
        assert rows[name]["status"] == "settled", rows[name]
        assert rows[name]["worktree_path"] is None, rows[name]  # an admitted directory is not a team worktree
        assert tool_results(run / f"{name}.jsonl", "bash")[0].strip() == str(where)  # bash starts there
        spec = orjson.loads((run / "launches" / f"{name}.json").read_bytes())["spec"]
        assert spec["cwd"] == str(where)  # a later root revives it there
    assert (real / "made-here.txt").read_text() == "away was here\n"  # a relative path of a file tool
    assert not (proj.dir / "made-here.txt").exists()


def test_a_team_worktree_is_admitted_and_a_centurion_has_its_own_set(proj: Project) -> None:
    """The run's own team worktree is admitted (the root sends a reviewer into it; the centurion names it for a
    member); the centurion's set is its worktree's, so the project itself — the root's cwd — is refused to it."""
    run = proj.run_path("e2e-1")
    wt = run / "worktrees" / "alpha"
    pwd = tools(call("bash", {"command": "pwd -P"}))
    for name in ("m1", "rv"):
        proj.script(name, pwd, {"text": f"{name} done"})
    proj.script("alpha", launch({"name": "m1", "agent": "worker", "task": "t", "cwd": str(wt),
                                 "model": "scripted/scripts/m1.yaml"},
                                {"name": "m2", "agent": "worker", "task": "t", "cwd": str(proj.dir),
                                 "model": "scripted/scripts/m1.yaml"}),
                subagent("wait", timeoutMs=60_000), {"text": "alpha done"})
    root = proj.script("root", subagent("launch", agent="centurion", name="alpha", task="lead",
                                        model="scripted/scripts/alpha.yaml"),
                       launch({"name": "rv", "agent": "reviewer", "task": "look", "cwd": str(wt),
                               "model": "scripted/scripts/rv.yaml"},
                              {"name": "rv2", "agent": "reviewer", "task": "look", "cwd": str(wt / "scripts"),
                               "model": "scripted/scripts/rv.yaml"}),
                       subagent("wait", timeoutMs=60_000), {"text": "root done"})
    git(proj.dir, "init", "-q", "-b", "main")
    git(proj.dir, "add", "-A")
    git(proj.dir, "commit", "-q", "-m", "scripts")  # a worktree starts from HEAD: the scripts are in it
    out = proj.run("a team", "--model", root, run_id="e2e-1", timeout=90)
    assert out.code == 0, out.explain()

    real = os.path.realpath(wt)
    rows = node_rows(run)
    for name in ("alpha", "m1", "rv"):
        assert rows[name]["status"] == "settled", rows[name]
        assert rows[name]["worktree_path"] == str(wt), rows[name]
    for name in ("m1", "rv"):
        assert tool_results(run / f"{name}.jsonl", "bash")[0].strip() == real
    assert "✗ rv2: CWD_NOT_ALLOWED" in tool_results(run / "root.jsonl")[1]
    alpha = tool_results(run / "alpha.jsonl")[0]
    assert "▶ m1" in alpha and "✗ m2: CWD_NOT_ALLOWED" in alpha, alpha
    assert f"Allowed (exactly these, not their subdirectories): {real}" in alpha, alpha  # not the project
    for name in ("m2", "rv2"):
        assert_nothing_created(run, name)
