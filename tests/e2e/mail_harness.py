"""A live run for the mail tests: root supervisor, pool, orchestrator, postman and the root session, as
`legion run` composes them (orchestration/run.py), with scripted models and a fast postman backstop."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from legion.agents import load_catalog, load_settings
from legion.ledger import open_ledger
from legion.ledger.constants import Delivery
from legion.ledger.ledger import Ledger
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.launch import LaunchRequest, RunContext
from legion.orchestration.orchestrator import POOL, Orchestrator
from legion.orchestration.postman import Postman
from legion.orchestration.stall import StallConfig
from legion.supervision.root import RootSupervisor
from tests.support import SESSION_PRELOAD, until

LEAD_CARD = """---
name: lead
description: A test lead that may launch children and mail.
kind: native
allowNestedSubagents: true
maxSubagentDepth: 3
restart: transient
tools: [subagent, legion_mail, legion_tree]
---
You lead.
"""


@dataclass
class Run:
    cwd: Path
    run_dir: Path
    root: RootSupervisor
    orch: Orchestrator
    postman: Postman
    ledger: Ledger  # a reader of the run's ledger (its own connection)

    def node(self, name: str) -> AgentNode:
        node = self.orch.tree.get(name)
        assert node is not None, f"no node {name}"
        return node

    def mail(self, **where: Any) -> list[dict[str, Any]]:
        rows = []
        for state in Delivery:
            if state.name == "INJECTED":
                continue
            for row in self.ledger.messages_in_state(state, limit=10_000):
                if all(row.get(k) == v for k, v in where.items()):
                    rows.append(row | {"state": state.name})
        return sorted(rows, key=lambda r: int(r["id"]))

    async def tool(self, node: str, tool: str, **args: Any) -> dict[str, Any]:
        return await self.orch.handle_tool(node, tool, args)

    async def launch(self, parent: str, name: str, script: str, agent: str = "worker") -> AgentNode:
        node, _ = await self.orch.launch(self.node(parent), LaunchRequest(agent=agent, task=f"task of {name}",
                                                                         name=name, model=f"scripted/{script}"))
        return node


def write_scripts(cwd: Path, scripts: dict[str, dict[str, Any]]) -> None:
    for name, script in scripts.items():
        (cwd / name).write_text(yaml.safe_dump(script), encoding="utf-8")


@contextlib.asynccontextmanager
async def mail_run(scripts: dict[str, dict[str, Any]], *, root_script: str = "root.yaml", interval: float = 0.2,
                   settings: dict[str, Any] | None = None, root_agent: str = "lead",
                   lease_ms: int = 60_000, stall: StallConfig | None = None,
                   cards: dict[str, str] | None = None) -> AsyncIterator[Run]:
    """A live run whose root session runs `root_script` (`cards`: more agent cards, by name); torn down (paused) at
    the end."""
    cwd = Path(tempfile.mkdtemp(prefix="lm", dir="/tmp"))
    run_dir = cwd / ".legion" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (cwd / ".legion" / "agents").mkdir(parents=True)
    for name, card in {"lead": LEAD_CARD, **(cards or {})}.items():
        (cwd / ".legion" / "agents" / f"{name}.md").write_text(card, encoding="utf-8")
    if settings:
        (cwd / ".legion" / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
    write_scripts(cwd, scripts)
    env: dict[str, str] = {"HOME": str(cwd), "PATH": "/usr/bin:/bin"}
    loaded = load_settings(cwd, env=env)
    catalog = load_catalog(cwd, env=env, settings=loaded)
    root = RootSupervisor(run_dir, run_id="r1", root_node=False, preload=SESSION_PRELOAD)
    await root.start()
    reader = open_ledger(run_dir / "legion.db")
    postman: Postman | None = None
    orch: Orchestrator | None = None
    try:
        await root.nodes.launch_pool(POOL, log_path=str(run_dir / "pool.log"))
        assert root.ledger is not None
        ctx = RunContext(run_dir=run_dir, run_id="r1", cwd=cwd, settings=loaded, catalog=catalog,
                         ledger=root.ledger, writer=root.writer, env=env)
        orch = Orchestrator(root.nodes, ctx)
        postman = Postman(orch, interval=interval, lease_ms=lease_ms, stall=stall).start()
        await orch.serve_operator()
        await orch.launch(None, LaunchRequest(agent=root_agent, task="the task", name="root",
                                              model=f"scripted/{root_script}"))
        yield Run(cwd, run_dir, root, orch, postman, reader)
    finally:
        if postman is not None:
            await postman.close()
        if orch is not None:
            await orch.close()
        with contextlib.suppress(Exception):
            await root.stop()
        reader.close()
        shutil.rmtree(cwd, ignore_errors=True)


async def delivered(run: Run, ids: list[int], timeout: float = 15.0) -> None:
    """Until every mail of `ids` is DELIVERED."""
    def check() -> bool:
        states = {int(r["id"]): r["state"] for r in run.mail()}
        return all(states.get(i) == "DELIVERED" for i in ids)

    try:
        await until(check, timeout, f"mails {ids} DELIVERED")
    except AssertionError as exc:  # their states at the deadline (not when the wait began)
        states = [(r["id"], r["state"]) for r in run.mail()]
        raise AssertionError(f"{exc}; at the deadline: {states}") from None
