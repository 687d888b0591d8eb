"""Where definitions live (DESIGN §9 decision 11), computed from an explicit env mapping.

`process_env()` is the one place this package reads `os.environ`: only a top-level caller in the
root process uses it. Pooled sessions pass their own per-session env mapping instead (SEED-SPEC §3.5).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final

PROJECT_DIR: Final = ".legion"
SETTINGS_FILE: Final = "settings.json"
AGENTS_DIR: Final = "agents"


def process_env() -> Mapping[str, str]:
    """The root process's environment (a documented selection point; never written)."""
    return os.environ


def user_config_dir(env: Mapping[str, str]) -> Path:
    """`$XDG_CONFIG_HOME/legion`, else `$HOME/.config/legion`."""
    xdg = env.get("XDG_CONFIG_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "legion"
    home = env.get("HOME", "").strip()
    base = Path(home) if home else _account_home()
    return base / ".config" / "legion"


def _account_home() -> Path:
    """The user's home from the password database (not from any environment)."""
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except (KeyError, OSError):
        return Path("/nonexistent")


def user_agents_dir(env: Mapping[str, str]) -> Path:
    return user_config_dir(env) / AGENTS_DIR


def user_settings_path(env: Mapping[str, str]) -> Path:
    return user_config_dir(env) / SETTINGS_FILE


def project_agents_dir(cwd: str | Path) -> Path:
    return Path(cwd) / PROJECT_DIR / AGENTS_DIR


def project_settings_path(cwd: str | Path) -> Path:
    return Path(cwd) / PROJECT_DIR / SETTINGS_FILE


def read_head(path: Path, limit: int) -> bytes:
    """At most `limit + 1` bytes of a regular file (so an oversized file is detected without reading
    it all); a FIFO, device or directory raises OSError instead of blocking or streaming forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
