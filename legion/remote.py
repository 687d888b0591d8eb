"""Kept for `legion/prepare.py`, which imports `DAEMON_FILES` from here; the run composition moves to
`legion.orchestration` (issue 20), and with it this import (then `from legion.runs import DAEMON_FILES`, and this
file goes). What the old module held is in `legion.cli.server` (the `keys` command, a tcp monitor's keys),
`legion.cli.run` (`run --detach`) and `legion.reports.liveness` (a run's root died?)."""

from legion.runs import DAEMON_FILES

__all__ = ["DAEMON_FILES"]
