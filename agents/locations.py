"""Where definitions live (docs/architecture.md §9.11), computed from an explicit env mapping.

`process_env()` is the one place this package reads `os.environ`: only a top-level caller in the
root process uses it. Pooled sessions pass their own per-session env mapping instead (docs/spec-conformance.md §3.5).
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
    base = Path(home) if home else account_home()
    return base / ".config" / "legion"


def account_home() -> Path:
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


class UntrustedFile(PermissionError):
    """A settings file or card that another user can write (so what it configures would run as us)."""


def check_trusted(path: Path, st: os.stat_result | None = None) -> None:
    """Refuse a file that a user other than us (or root) can change, as ssh's StrictModes does for its config.

    The file (`st`, from the open descriptor) and every directory above it, along the path as given and along
    the symlinks' target, must be owned by us or root and not writable by group or others. A root-owned sticky
    directory (/tmp) is accepted: others cannot replace what we own in it. Raises `UntrustedFile` naming the
    file and the chmod/chown that fixes it."""
    uid = os.geteuid()
    absolute = Path(os.path.abspath(path))
    real = Path(os.path.realpath(absolute))
    seen: set[Path] = set()
    checks: list[tuple[Path, os.stat_result | None]] = [(real, st)]
    for chain in (absolute.parents, real.parents):
        checks += [(d, None) for d in chain]
    for where, info in checks:
        if where in seen:
            continue
        seen.add(where)
        try:
            info = info or os.stat(where)
        except OSError:
            continue
        is_dir = stat.S_ISDIR(info.st_mode)
        whose = "the file" if where == real else "its directory"
        if info.st_uid not in (0, uid):
            user = _user_name(uid)
            raise UntrustedFile(errno.EPERM, f"{path} is not trusted: {whose} {where} is owned by uid {info.st_uid}, "
                                f"not by you or root, so another user can change it; `chown {user} {where}` "
                                "(or remove it)", str(path))
        sticky_root_dir = is_dir and info.st_mode & stat.S_ISVTX and info.st_uid == 0
        if info.st_mode & 0o022 and not sticky_root_dir:
            raise UntrustedFile(errno.EPERM, f"{path} is not trusted: {whose} {where} is writable by "
                                f"{'group and others' if info.st_mode & 0o022 == 0o022 else 'group' if info.st_mode & 0o020 else 'others'} "
                                f"(mode {stat.S_IMODE(info.st_mode):04o}); `chmod go-w {where}`", str(path))


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def read_head(path: Path, limit: int, *, trusted: bool = True) -> bytes:
    """At most `limit + 1` bytes of a regular file (so an oversized file is detected without reading
    it all); a FIFO, device or directory raises OSError instead of blocking or streaming forever.
    With `trusted`, a file another user can write raises `UntrustedFile` (`check_trusted`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if trusted:
            check_trusted(path, st)
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
