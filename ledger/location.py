"""Where one run's ledger is, and how its credentials travel.

- A run without a ledger URL keeps SQLite's `legion.db` in its run directory (`LEDGER_FILE`).
- A run on PostgreSQL records the URL *without its password* in run.json (`RUN_JSON_KEY`); launch records,
  worker specs and logs carry that same URL. The password, when the URL named one, travels to the run's
  processes in the environment variable `PASSWORD_ENV`, which `pg_engine` hands to libpq for a URL that names
  none; libpq's own `PGPASSWORD` and `~/.pgpass` work as ever. Sessions' environments never carry it
  (workers/context.py drops `SECRET_ENV`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from legion.ledger.target import PgTarget, is_url, parse_target

LEDGER_FILE = "legion.db"
RUN_JSON_KEY = "ledger"
URL_ENV = "LEGION_LEDGER_URL"
PASSWORD_ENV = "LEGION_LEDGER_PASSWORD"
SECRET_ENV = frozenset({URL_ENV, PASSWORD_ENV})


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without a password, in its netloc or a `password=` query parameter; that password or None)."""
    parts = urlsplit(url)
    password = None if parts.password is None else unquote(parts.password)  # libpq gets it as typed, not encoded
    netloc = parts.netloc
    if password is not None:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{userinfo.split(':', 1)[0]}@{host}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if k != "password"]
    if len(kept) == len(query):
        return urlunsplit(parts._replace(netloc=netloc)), password
    password = next(v for k, v in query if k == "password")
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(kept))), password


def password_free(target: str) -> tuple[str, str | None]:
    """A PostgreSQL URL as legion records it (libpq form, no password) and its password; LedgerUrlError for
    anything that is not one."""
    from legion.ledger.errors import LedgerUrlError

    parsed = parse_target(target)
    if not isinstance(parsed, PgTarget):
        raise LedgerUrlError(str(target), "a run's ledger URL must be postgresql://USER@HOST:PORT/DATABASE; "
                             "without a URL a run keeps its SQLite ledger (legion.db) in its run directory")
    return split_password(parsed.url)


def with_env_password(url: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """libpq connect arguments for `url`: the password from `PASSWORD_ENV` when the URL names none."""
    env = os.environ if env is None else env
    if split_password(url)[1] is not None:
        return {}
    password = env.get(PASSWORD_ENV)
    return {"password": password} if password else {}


def ledger_target(run_dir: str | Path, given: str | Path | None = None) -> str | Path:
    """Where a root records: `given` (a `postgresql://` URL, or a file path), else the run's own SQLite file."""
    if given is None:
        return Path(run_dir) / LEDGER_FILE
    return given if is_url(given) else Path(given)


def ledger_scope(target: str | Path, run_id: str | None) -> str | None:
    """The run id a Ledger on `target` is opened with: a shared PostgreSQL database needs it, a file is the run's."""
    return run_id if is_url(target) else None
