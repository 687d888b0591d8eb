"""Where a project's legion state lives: settings, cards and run directories (DESIGN §9.11)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_DIR_NAME = ".legion"


def project_dir(cwd: Path | None = None) -> Path:
    """The project's `.legion/` folder (it may not exist yet)."""
    return (cwd or Path.cwd()) / PROJECT_DIR_NAME


def user_config_dir() -> Path:
    """`$XDG_CONFIG_HOME/legion`, or `~/.config/legion`."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "legion"


def runs_dir(cwd: Path | None = None) -> Path:
    """The folder holding one sub-folder per run."""
    return project_dir(cwd) / "runs"


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) and make the leaf 0700: run state is private to its owner."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path
