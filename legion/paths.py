"""Where a project's legion state lives: the `.legion/` folder and its run directories (DESIGN §9.11).

User-level locations are resolved by `legion.agents.locations`; private run directories are made by
`legion.bus.security.ensure_private_dir`.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_DIR_NAME = ".legion"


def project_dir(cwd: Path | None = None) -> Path:
    """The project's `.legion/` folder (it may not exist yet)."""
    return (cwd or Path.cwd()) / PROJECT_DIR_NAME


def runs_dir(cwd: Path | None = None) -> Path:
    """The folder holding one sub-folder per run."""
    return project_dir(cwd) / "runs"
