"""Which ledger a new run records into, checked before the run exists (README "Running a task").

`legion run --ledger URL`, else the environment variable `LEGION_LEDGER_URL`, else the setting
`legion.ledger.url`; none of them: the run's own SQLite `legion.db`. A URL is checked by connecting once: a
malformed URL, wrong credentials, an unreachable server, a newer schema, a database that is not a legion
ledger, and a run id that already has rows there are refused (`RunConfigError`, exit 2) with the ledger
layer's message. How the password travels is ledger/location.py's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from legion.agents import Settings
from legion.ledger.location import PASSWORD_ENV, URL_ENV
from legion.run_errors import RunConfigError


@dataclass(frozen=True)
class LedgerChoice:
    """A run's PostgreSQL ledger: the URL legion records (no password) and the password the URL carried."""

    url: str
    origin: str  # --ledger | LEGION_LEDGER_URL | legion.ledger.url
    password: str | None = field(default=None, repr=False)


def choose_ledger(flag: str | None, env: Mapping[str, str], settings: Settings) -> tuple[str, str] | None:
    """(the URL, where it came from), or None for the run's own SQLite file."""
    for value, origin in ((flag, "--ledger"), (env.get(URL_ENV), URL_ENV),
                          (settings.get("legion.ledger.url"), "legion.ledger.url")):
        if isinstance(value, str) and value.strip():
            return value.strip(), origin
    return None


def apply_password(choice: LedgerChoice | None) -> None:
    """Hand the URL's password to this process's ledger connections and to the run's workers (they inherit it)."""
    if choice is not None and choice.password is not None:
        os.environ[PASSWORD_ENV] = choice.password


def recorded_ledger(url: object, env: Mapping[str, str], settings_url: object = None) -> LedgerChoice | None:
    """The PostgreSQL ledger a run.json names, with the password of `LEGION_LEDGER_URL` (or the setting) when that
    names the same database; otherwise the environment supplies it (LEGION_LEDGER_PASSWORD, PGPASSWORD, ~/.pgpass)."""
    if not isinstance(url, str) or not url:
        return None
    from legion.ledger.location import split_password

    for given in (env.get(URL_ENV), settings_url):
        if isinstance(given, str) and given.strip():
            bare, password = split_password("postgresql://" + given.strip().split("://", 1)[-1])
            if bare == url and password is not None:
                return LedgerChoice(url, "run.json", password)
    return LedgerChoice(url, "run.json")


def check_ledger(url: str, origin: str, run_id: str) -> LedgerChoice:
    """Connect once as the run will (migrating an empty database) and check the run id is free there."""
    from legion.ledger import LedgerError, open_ledger
    from legion.ledger.location import password_free

    try:
        bare, password = password_free(url)
        with contextlib.closing(open_ledger(url, run_id=run_id)) as ledger:
            taken = bool(ledger.list_nodes())
    except LedgerError as exc:
        raise RunConfigError(f"{exc} (the ledger URL came from {origin})") from None
    if taken:
        raise RunConfigError(f"run id {run_id!r} already has rows in the ledger at {bare}: pick another --run-id "
                             f"(`legion resume {run_id}` continues that run from its own project)")
    return LedgerChoice(bare, origin, password)
