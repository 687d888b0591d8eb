"""Kept for `legion/prepare.py`, which imports `DAEMON_FILES` from here (the CLI's branch leaves that file to its
owner); once that import reads `from legion.runs import DAEMON_FILES`, this file goes. What the old module held is in
`legion.cli.server` (the `keys` command, a tcp monitor's keys), `legion.cli.run` (`run --detach`) and
`legion.reports.liveness` (whether a run's root died)."""

from legion.runs import DAEMON_FILES

__all__ = ["DAEMON_FILES"]
