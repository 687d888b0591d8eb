"""Which database a ledger target names: a path (or `file:` URI, `:memory:`) is SQLite, a `postgresql://` URL
is PostgreSQL (psycopg 3). Anything else that looks like a URL is refused here, with the forms accepted."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from legion.ledger.errors import LedgerUrlError

# postgres:// is libpq's alias; +psycopg names the only driver legion ships
_PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_RUN_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True, slots=True)
class PgTarget:
    """A PostgreSQL ledger: `url` as given (libpq form, no driver suffix), `shown` without its password."""

    url: str
    shown: str


def is_url(target: str | Path) -> bool:
    return isinstance(target, str) and _SCHEME_RE.match(target) is not None


def redact(url: str) -> str:
    """The URL with any password replaced by ***, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def parse_target(target: str | Path) -> Path | str | PgTarget:
    """A path or SQLite URI (returned unchanged) or a PgTarget; LedgerUrlError for any other URL."""
    if not is_url(target):
        return target
    text = str(target)
    scheme = text.split("://", 1)[0].lower()
    if scheme not in _PG_SCHEMES:
        raise LedgerUrlError(
            redact(text),
            f"the scheme {scheme!r} is not supported; use postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
            "(PostgreSQL through psycopg 3), or a file path for an embedded SQLite ledger",
        )
    url = "postgresql://" + text.split("://", 1)[1]
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise LedgerUrlError(redact(text), f"it does not parse ({exc}); the form is "
                             "postgresql://USER:PASSWORD@HOST:PORT/DATABASE") from exc
    if parts.path.strip("/") == "" and "dbname=" not in parts.query and "host=" not in parts.query:
        raise LedgerUrlError(redact(text), "it names no database; add one: postgresql://USER@HOST:PORT/DATABASE")
    return PgTarget(url=url, shown=redact(url))


def check_run_id(run_id: object) -> str:
    """The key one run's rows carry in a shared database: a plain name, as `legion run --run-id` takes."""
    if not isinstance(run_id, str) or _RUN_ID_RE.fullmatch(run_id) is None:
        raise LedgerUrlError(
            "", f"run id {run_id!r} is not a plain name (1 to 128 of letters, digits, '.', '_', '-')"
        )
    return run_id
