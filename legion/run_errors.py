"""The exit statuses of `legion run`/`resume` (docs/architecture.md §7) and the configuration error.

Without the run machinery."""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INFRA, EXIT_PAUSED = 0, 1, 2, 3, 130


class RunConfigError(Exception):
    """A usage or configuration error found before anything was started (exit 2)."""
