"""Working-directory admission (docs/spec-conformance.md §11): which `cwd` a launch may give its child.

A child works in its caller's cwd unless the launch names another one. A named `cwd` must be an absolute path of
an existing directory and, once both sides are canonical (realpath), exactly one of the caller's allowed set: the
caller's own cwd, one of the settings' `externalDirectories`, or a directory the run made itself (its teams' git
worktrees, so that a reviewer can be sent into a team's checkout). The set is exact: a subdirectory or a path prefix
of an allowed directory is not admitted. A configured entry may start with `~`, `$HOME` or `${HOME}`; one that
does not exist (yet) admits nothing until it does.

This is admission, not a sandbox: it decides where a child's session starts (its file tools' relative paths and its
bash commands' starting directory); what a session then reaches by absolute paths or `cd` is discipline.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from legion.agents.guards import LaunchRefused
from legion.agents.locations import account_home
from legion.agents.settings_schema import EXTERNAL_DIRECTORIES, HOME_PREFIX

CWD_NOT_ALLOWED: Final = "CWD_NOT_ALLOWED"


def expand_home(value: str, env: Mapping[str, str]) -> str:
    """`~`, `$HOME` or `${HOME}` at the start of `value` → the home directory (`HOME`, else the account's)."""
    home = env.get("HOME", "").strip() or str(account_home())
    return HOME_PREFIX.sub(lambda _: home.rstrip("/") or "/", value, count=1)


def canonical_dir(path: str | Path) -> Path | None:
    """The realpath of an existing directory; None when it is not one (or cannot be resolved)."""
    try:
        real = Path(os.path.realpath(path, strict=True))
    except (OSError, RuntimeError):
        return None
    return real if real.is_dir() else None


def allowed_cwds(caller_cwd: str | Path, external: Iterable[str], env: Mapping[str, str],
                 made: Iterable[Path] = ()) -> tuple[Path, ...]:
    """The caller's allowed set: its own cwd, each configured directory that exists, then the directories the run
    made (`made`); canonical, no repeats."""
    out: list[Path] = []
    for raw in (str(caller_cwd), *(expand_home(e, env) for e in external), *map(str, made)):
        real = canonical_dir(raw)
        if real is not None and real not in out:
            out.append(real)
    return tuple(out)


def admit_cwd(requested: object, caller_cwd: str | Path, external: Iterable[str], env: Mapping[str, str],
              made: Iterable[Path] = ()) -> Path:
    """The canonical directory a launch's `cwd` names, or `LaunchRefused` (`CWD_NOT_ALLOWED`) saying how to fix it."""
    if not isinstance(requested, str) or not requested.strip():
        raise LaunchRefused(f"/cwd: must be a non-empty absolute directory path, got {requested!r}",
                            code=CWD_NOT_ALLOWED)
    if not os.path.isabs(requested):
        raise LaunchRefused(f"/cwd: {requested!r} is not an absolute path; give the directory's full path (a child "
                            f"works in your own cwd {caller_cwd} when you leave out 'cwd')", code=CWD_NOT_ALLOWED)
    real = canonical_dir(requested)
    if real is None:
        raise LaunchRefused(f"/cwd: {requested} is not an existing directory", code=CWD_NOT_ALLOWED)
    allowed = allowed_cwds(caller_cwd, external, env, made)
    if real not in allowed:
        shown = ", ".join(str(p) for p in allowed) or "(none)"
        raise LaunchRefused(
            f"/cwd: {requested}{f' (= {real})' if str(real) != requested else ''} is not an allowed working "
            f"directory. Allowed (exactly these, not their subdirectories): {shown}. Leave out 'cwd' to work in "
            f"your own cwd, or ask the operator to add the directory to '{EXTERNAL_DIRECTORIES}' in .legion/settings.json",
            code=CWD_NOT_ALLOWED, requested=requested, allowed=[str(p) for p in allowed])
    return real
