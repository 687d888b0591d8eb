"""Where a project's legion state lives: `.legion/` and its run directories (docs/architecture.md §9.11).

User-level locations are resolved by `legion.agents.locations`; private run directories are made by
`legion.bus.security.ensure_private_dir`.
"""

from __future__ import annotations

from pathlib import Path

from legion.procs.durable import replace_file

PROJECT_DIR_NAME = ".legion"


def project_dir(cwd: Path | None = None) -> Path:
    """The project's `.legion/` folder (it may not exist yet)."""
    return (cwd or Path.cwd()) / PROJECT_DIR_NAME


def runs_dir(cwd: Path | None = None) -> Path:
    """The folder holding one sub-folder per run."""
    return project_dir(cwd) / "runs"


def ensure_ignored(cwd: Path | None = None) -> Path:
    """`.legion/.gitignore` holding `*`: git ignores legion's state without touching the user's `.gitignore`."""
    folder = project_dir(cwd)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".gitignore"
    if not path.exists():
        replace_file(path, b"# written by legion: its runs, logs and ledgers stay out of git\n*\n", durable=False,
                     mode=0o644)
    return path
