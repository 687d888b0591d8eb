"""Which fleet a run belongs to, and where it runs: the keys its row in the ledger's `runs` table carries
(docs/servers.md "A fleet").

A fleet is every run of one project that records into one PostgreSQL ledger. The project is named by the setting
`legion.project` when set, else by the project's git remote `origin` (credentials and a trailing `.git` dropped,
so a checkout over https and one over ssh of the same host path agree), else by the project directory's name.
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

from legion.agents import Settings

_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?([^:/]+):(.+)$")  # git@host:owner/repo.git
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/]*@)?([^/:]+)(?::\d+)?/(.+)$")


def normalise_remote(remote: str) -> str | None:
    """`host/path` of a git remote URL (https, ssh or scp-like), or None when it names no host."""
    text = remote.strip()
    for pattern in (_URL, _SCP_LIKE):
        match = pattern.match(text)
        if match:
            host, path = match.group(1).lower(), match.group(2).strip("/")
            return f"{host}/{path.removesuffix('.git')}" if path else None
    return None


def _origin(project_dir: Path) -> str | None:
    try:
        proc = subprocess.run(["git", "config", "--get", "remote.origin.url"], cwd=str(project_dir),
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return normalise_remote(proc.stdout) if proc.returncode == 0 else None


def project_key(project_dir: Path, settings: Settings) -> str:
    """The fleet's name for this project: `legion.project`, else the origin remote, else the directory name."""
    named = settings.get("legion.project")
    if isinstance(named, str) and named.strip():
        return named.strip()
    return _origin(project_dir) or project_dir.resolve().name


def host_name() -> str:
    """This host as the fleet view shows it (the pod's or the machine's name)."""
    return socket.gethostname()
