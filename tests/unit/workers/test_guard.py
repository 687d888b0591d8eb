"""Guard: budgets, read-only bash discipline, ledger refusal."""

from __future__ import annotations

import pytest

from legion.workers.context import Budget, SessionContext
from legion.workers.guard import Guard, mutating_reason


@pytest.mark.parametrize("command", [
    "ls -la", "cat a.py | grep x", "git status && git diff HEAD~1", "pytest -q 2>&1 | tail -5",
    "grep -rn foo . 2>/dev/null", "find . -name '*.py' -exec grep -l x {} +", "sed -n 1,10p f", "echo hi >&2",
    "python -m pytest", "wc -l < input.txt",
])
def test_read_only_allows(command: str) -> None:
    assert mutating_reason(command) is None


@pytest.mark.parametrize("command", [
    "rm -rf build", "echo x > f", "echo x >> f", "cat a | tee b", "git commit -am x", "git -C repo push",
    "sed -i s/a/b/ f", "FOO=1 make", "find . -delete", "find . -exec rm {} ;", "ls; mv a b",
    "echo $(touch x)", "pip install requests", "python3 -m pip install x", "cp a b", "xargs rm < list",
    "ls &> out.txt", "/bin/rm x",
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
