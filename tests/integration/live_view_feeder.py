"""The live view on this process's terminal, fed a tree of N agent nodes (40 live ones, the rest settled): what
tests/integration/test_live_view_fit.py runs in tmux panes of several sizes. Runs until STOP_FILE exists.

    python live_view_feeder.py NODES STOP_FILE
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from legion.cli.progress import LiveView

LIVE = 40
MODEL = "anthropic/claude-sonnet-4-5"  # the name the old view cut from the left at 80 columns


def main() -> int:
    nodes, stop = int(sys.argv[1]), Path(sys.argv[2])
    view = LiveView()
    names = ["root"] + [f"worker-{i:03d}" for i in range(nodes - 1)]
    try:
        for i, name in enumerate(names):
            parent = None if i == 0 else "root" if i <= 8 else names[1 + (i - 9) % 8]
            view.event("node_status", {"node_id": name, "status": "starting", "parent_id": parent})
            view.event("agent_launched", {"node_id": name, "parent_id": parent, "role": "worker", "model": MODEL})
            view.event("node_launched", {"node_id": name, "status": "running"})
            view.event("usage", {"node_id": name, "turns": 1 + i % 7, "input": 12_000 + 37 * i, "output": 400 + i,
                                 "costUsd": 0.0123 * (i % 9)})
        for name in names[LIVE:]:  # the first LIVE nodes stay live, the others have settled
            view.event("node_settled", {"node_id": name, "status": "settled", "reason": "normal"})
        turn = 0
        while not stop.exists():
            turn += 1
            view.event("usage", {"node_id": names[turn % LIVE], "turns": 7 + turn, "input": 20_000 + turn,
                                 "output": 500, "costUsd": 0.5})
            time.sleep(0.05)
    finally:
        view.close()
    print("FEEDER DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
