"""Issue 24 item 6 as a gate: the three-host trial (tests/fleet_trial.py) N times in a row; every trial must pass.

Three network namespaces act as hosts (each its own network stack and host name), a fourth runs PostgreSQL;
each host runs a tree into it, one host's root is killed mid-run, the fleet is checked from another host and the
killed run is resumed on its own. Prints one JSON object; exits 1 when a trial fails, 0 with `"skipped"` when
this machine cannot make network namespaces (not root, no iproute2) or has no PostgreSQL server.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from tests import netns
from tests.fleet_trial import run_trial
from tests.pg_server import find_bindir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="trials in a row (default 10, the issue's)")
    parser.add_argument("--budget", type=float, default=None, help="the fleet-wide cost budget the trials set")
    args = parser.parse_args()
    why_not = netns.unavailable() or (None if find_bindir() else "no PostgreSQL server installed")
    report: dict[str, object] = {"bench": "fleet_hosts", "trials_asked": args.trials,
                                 "targets": {"passed_in_a_row": args.trials}}
    if why_not is not None:
        report.update(skipped=why_not, ok=True)
        print(orjson.dumps(report).decode())
        return 0
    started = time.monotonic()
    seconds: list[float] = []
    failure: str | None = None
    for trial in range(args.trials):
        try:
            seconds.append(float(run_trial(args.budget)["seconds"]))
        except Exception as exc:  # a trial that fails for any reason ends the streak: report it
            failure = f"trial {trial + 1}: {exc!r}\n{traceback.format_exc()[-3000:]}"
            break
    report.update(passed_in_a_row=len(seconds), trial_seconds=seconds, seconds=round(time.monotonic() - started, 1),
                  failure=failure, ok=failure is None, cpus=os.cpu_count(), loadavg=[round(x, 2) for x in os.getloadavg()])
    print(orjson.dumps(report).decode())
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
