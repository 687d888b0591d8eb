"""Kept for `legion/prepare.py`, which imports `DAEMON_FILES` from here; the run composition moves to
`legion.orchestration` (issue 20), and with it this import. Everything else of the old module is in
`legion.cli.server` (the `keys` command, tcp monitor keys) and `legion.cli.run` (`run --detach`)."""

from legion.cli.server import DAEMON_FILES

__all__ = ["DAEMON_FILES"]
