"""Mail between agents on a run recording into PostgreSQL (`legion run --ledger URL`): a parent and its child write
to each other along the tree edge, the postman delivers both, `legion mail RUN` lists them from the database, and
the rows PostgreSQL holds under the run id say the same."""

from __future__ import annotations

from pathlib import Path

import orjson
import psycopg
import pytest

from legion.ledger.constants import Delivery
from tests.integration.cli_support import legion, project, start, stop_process
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)

ROOT = """\
turns:
  - tool_calls:
      - name: subagent
        arguments: {action: launch, agent: worker, name: w1, task: "one", model: scripted/mailer.yaml}
  - tool_calls:
      - name: legion_mail
        arguments: {to: w1, subject: "from root", body: "root to w1: use b.txt", urgency: action-needed}
  - tool_calls:
      - name: bash
        arguments: {command: "until [ -e %(release_root)s ]; do sleep 0.05; done"}
  - tool_calls:
      - name: subagent
        arguments: {action: wait, names: [w1]}
default:
  text: "all done"
"""
# Both mails are action-needed: steered into a busy recipient at its next boundary (an info mail waits for the end
# of the recipient's run). The root stays in its bash call until the test has seen w1's mail handed to it, so the
# mail goes in at that call's boundary, as a user message (a mail that reaches a parent blocked in `wait` goes into
# the wait's result instead, and stays ACCEPTED: tests/e2e/test_mail_preempt.py). w1 mails its parent, waits (a few
# short turns) for its parent's mail, then for the test's go (given once both mails are DELIVERED) before it answers.
MAILER = """\
turns:
  - tool_calls:
      - name: legion_mail
        arguments: {to: parent, subject: "from w1", body: "w1 to root: started", kind: report, urgency: action-needed}
rules:
  - match: "RELEASED"
    reply: {text: "W1 RESULT"}
  - match: "root to w1: use b.txt"
    reply:
      tool_calls:
        - name: bash
          arguments: {command: "until [ -e %(release)s ]; do sleep 0.05; done; echo RELEASED"}
default:
  tool_calls:
    - name: bash
      arguments: {command: "sleep 0.1"}
"""


def _listing(cwd: Path, run_id: str, node: str) -> dict[str, list[dict[str, object]]]:
    out = legion(cwd, "mail", run_id, node, "--json")
    assert out.returncode == 0, out.stderr
    return orjson.loads(out.stdout)


def test_mail_along_a_tree_edge_is_delivered_and_listed_from_postgresql(pg_url: str) -> None:
    with project() as cwd:
        release, release_root = cwd / "release-w1", cwd / "release-root"
        (cwd / "root.yaml").write_text(ROOT % {"release_root": release_root})
        (cwd / "mailer.yaml").write_text(MAILER % {"release": release})
        proc = start(cwd, "run", "--run-id", "m1", "--ledger", pg_url, "--model", "scripted/root.yaml", "task")
        try:
            def states() -> list[list[str]]:  # read through `legion mail` on the live run: [root's, w1's]
                if not (cwd / ".legion" / "runs" / "m1" / "run.json").exists():
                    return [[], []]
                boxes = [_listing(cwd, "m1", node)["inbox"] for node in ("root", "w1")]
                return [[str(m["state"]) for m in box] for box in boxes]

            wait_until(lambda: states() in ([["ACCEPTED"], ["DELIVERED"]], [["DELIVERED"], ["DELIVERED"]]),
                       message="w1's mail handed to the root, the root's DELIVERED to w1", deadline=60.0)
            release_root.touch()
            wait_until(lambda: states() == [["DELIVERED"], ["DELIVERED"]], message="both mails DELIVERED",
                       deadline=60.0)
            release.touch()
            assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            stop_process(proc)
        assert not (cwd / ".legion" / "runs" / "m1" / "legion.db").exists()
        root_box, w1_box = _listing(cwd, "m1", "root"), _listing(cwd, "m1", "w1")
        assert [(m["from_node"], m["subject"], m["state"]) for m in root_box["inbox"]] == [("w1", "from w1", "DELIVERED")]
        assert [(m["from_node"], m["subject"], m["state"]) for m in w1_box["inbox"]] == [("root", "from root", "DELIVERED")]
        assert [m["to_node"] for m in root_box["outbox"]] == ["w1"]
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute("SELECT from_node, to_node, body, delivered, delivered_at IS NOT NULL FROM messages "
                                "WHERE run = 'm1' ORDER BY from_node").fetchall()
            events = dict(conn.execute("SELECT type, count(*) FROM events WHERE run = 'm1' AND type LIKE 'mail_%%' "
                                       "GROUP BY type").fetchall())
        assert [r[:3] for r in rows] == [("root", "w1", "root to w1: use b.txt"), ("w1", "root", "w1 to root: started")]
        assert [r[3:] for r in rows] == [(Delivery.DELIVERED, True)] * 2  # the state, and when it was stamped
        assert events.get("mail_sent") == 2 and events.get("mail_delivered") == 2
