"""Guard: budgets, read-only bash discipline, ledger refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from legion.workers.context import Budget, SessionContext
from legion.workers.guard import Guard, mutating_reason
from legion.workers.tools.base import ToolContext, run_tool
from legion.workers.tools.catalog import select_tools


@pytest.mark.parametrize("command", [
    "ls -la", "cat a.py | grep x", "git status && git diff HEAD~1", "pytest -q 2>&1 | tail -5",
    "grep -rn foo . 2>/dev/null", "find . -name '*.py' -exec grep -l x {} +", "sed -n 1,10p f", "echo hi >&2",
    "python -m pytest", "wc -l < input.txt", "bash -c 'ls -la | head'", "sh -c \"grep -rn x .\"",
    "awk '$1 > 5' data.txt", "echo \"a -> b\"", "python3 -c 'print(1 > 0)'", "grep -n '=>' f.js",
    "ls >/dev/null 2>&1", "cmd &> /dev/null", "ls 1>&2", "git branch", "git branch -a --sort=-committerdate",
    "git branch --show-current", "git tag -l 'v*'", "git tag", "git config --get user.name",
    "git config user.email", "git config --list --show-origin", "git stash list", "git worktree list",
    "git -C repo branch -vv",
    # a project's own checks (the read-only reviewer runs them)
    "npm test", "npm t", "npm run typecheck", "npm run lint", "npm run test:unit", "pnpm test", "yarn run check",
    "npm --prefix web test", "make test", "make lint check", "make -C sub test", "cargo test", "cargo check",
    "cargo clippy --all-targets", "cargo fmt --check", "npm test 2>&1 | tail -20", "timeout 300 make test",
])
def test_read_only_allows(command: str) -> None:
    assert mutating_reason(command) is None


@pytest.mark.parametrize("command", [
    "rm -rf build", "echo x > f", "echo x >> f", "cat a | tee b", "git commit -am x", "git -C repo push",
    "sed -i s/a/b/ f", "FOO=1 make", "find . -delete", "find . -exec rm {} ;", "ls; mv a b",
    "echo $(touch x)", "pip install requests", "python3 -m pip install x", "cp a b", "xargs rm < list",
    "ls &> out.txt", "/bin/rm x", "bash -c 'rm -rf build'", "sh -lc \"echo x > f\"", "eval rm x",
    "ls | bash", "bash script.sh", "timeout 5 bash -c 'git push'",
    "timeout 10s rm x", "nice -n 10 rm x", "ls >| out", "ls;>f", "echo x 2> err.log", "cat a >& b",
    "echo 'unterminated > x", "git branch new-feature", "git branch -D old", "git tag v1.0",
    "git tag -d v1", "git config user.name bob", "git config --unset user.name", "git stash",
    "git stash pop", "git worktree add ../wt", "git branch -m a b", "echo \"$(cat a > b)\"", "echo \"`cat a > b`\"",
    # package and build commands stay refused; a check's output written to a file is still a write
    "npm install", "npm i left-pad", "npm run build", "npm run lint-fix", "yarn add x", "make", "make install",
    "make test install", "cargo build", "cargo fmt", "cargo install ripgrep", "npm test > out.txt",
    "make test && rm -rf build", "npm run",
])
def test_read_only_refuses(command: str) -> None:
    assert mutating_reason(command) is not None


def test_budgets_and_read_only_tools() -> None:
    g = Guard(SessionContext(node_id="n", cwd="/w", budget=Budget(turn_budget=2, tool_budget=1),
                             acceptance_role="read-only"))
    assert g.before_turn() is None and g.before_turn() is None
    assert g.before_turn() is not None and "turnBudget exhausted: 2 of 2" in (g.before_turn() or "")
    assert g.check_tool("write", {"path": "a", "content": ""}) == (
        "write is not allowed: this session's acceptance role is read-only")
    refusal = g.check_tool("bash", {"command": "ls"})
    assert refusal is not None and refusal.startswith("toolBudget exhausted: 1 of 1")


def test_ledger_refusal_paths_and_bash(tmp_path: object) -> None:
    g = Guard(SessionContext(node_id="n", cwd="/w", ledger_path="/run/x/ledger.sqlite"))
    assert "legion.db" in (g.check_tool("read", {"path": ".legion/legion.db"}) or "")
    assert g.check_tool("read", {"path": "legion.db-wal"}) is not None
    assert g.check_tool("read", {"path": "/run/x/ledger.sqlite"}) is not None
    assert g.check_tool("bash", {"command": "sqlite3 .legion/LEGION.DB 'select 1'"}) is not None
    assert g.check_tool("bash", {"command": "cat /run/x/ledger.sqlite"}) is not None
    assert g.check_tool("read", {"path": "src/legion_db.py"}) is None
    assert g.check_tool("bash", {"command": "ls"}) is None


def test_ledger_refusal_follows_symlinks_and_dotdot(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "legion.db").write_bytes(b"SQLite format 3\x00")
    (tmp_path / "notes.txt").symlink_to(tmp_path / "run" / "legion.db")
    (tmp_path / "rundir").symlink_to(tmp_path / "run")
    g = Guard(SessionContext(node_id="n", cwd=str(tmp_path)))  # no ledger path known to the session
    for path in ("notes.txt", str(tmp_path / "notes.txt"), "rundir/legion.db", "run/../run/legion.db",
                 "rundir/../notes.txt"):
        assert "legion.db" in (g.check_tool("read", {"path": path}) or ""), path
    assert g.check_tool("read", {"path": "run"}) is None


async def test_file_tools_refuse_the_ledger_behind_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "legion.db").write_text("needle secret")
    (tmp_path / "alias.txt").symlink_to(tmp_path / "legion.db")
    (tmp_path / "plain.txt").write_text("needle here")
    ctx = ToolContext(SessionContext(node_id="n", cwd=str(tmp_path)), tmp_path / "out")
    tools = select_tools(None)
    for name, args in (("read", {"path": "alias.txt"}), ("write", {"path": "alias.txt", "content": "x"}),
                       ("edit", {"path": "alias.txt", "oldText": "needle", "newText": "x"})):
        result = await run_tool(tools[name], args, ctx)
        assert result.is_error and "legion.db" in result.text, (name, result.text)
    grep = await run_tool(tools["grep"], {"pattern": "needle"}, ctx)
    assert grep.text == "plain.txt:1: needle here"
    found = await run_tool(tools["find"], {"pattern": "*.txt"}, ctx)
    assert found.text == "plain.txt"
    assert (tmp_path / "legion.db").read_text() == "needle secret"
