"""Where a run's ledger is and how its password travels: the URL legion records has none, the environment carries it,
and the choice of ledger for a new run follows --ledger, LEGION_LEDGER_URL, then the setting."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from legion.agents import load_settings
from legion.ledger.errors import LedgerUrlError
from legion.ledger.location import PASSWORD_ENV, password_free, split_password, with_env_password
from legion.run_ledger import choose_ledger, recorded_ledger
from legion.workers.context import inherited_env


@pytest.mark.parametrize(("url", "bare", "password"), [
    ("postgresql://u:s3cr%40t@h:5432/db", "postgresql://u@h:5432/db", "s3cr@t"),
    ("postgresql://u@h/db?password=pw&sslmode=require", "postgresql://u@h/db?sslmode=require", "pw"),
    ("postgresql://u@/db?host=/tmp/x&port=5", "postgresql://u@/db?host=/tmp/x&port=5", None),
])
def test_the_recorded_url_has_no_password(url: str, bare: str, password: str | None) -> None:
    assert split_password(url) == (bare, password)


def test_a_path_is_not_a_run_ledger_url() -> None:
    with pytest.raises(LedgerUrlError, match="must be postgresql://"):
        password_free("/tmp/legion.db")
    assert password_free("postgres://u:p@h/db") == ("postgresql://u@h/db", "p")


def test_the_password_comes_from_the_environment_only_for_a_url_without_one() -> None:
    env = {PASSWORD_ENV: "pw"}
    assert with_env_password("postgresql://u@h/db", env) == {"password": "pw"}
    assert with_env_password("postgresql://u:own@h/db", env) == {}
    assert with_env_password("postgresql://u@h/db", {}) == {}


def test_sessions_never_inherit_the_ledger_credentials() -> None:
    env = {PASSWORD_ENV: "pw", "LEGION_LEDGER_URL": "postgresql://u:pw@h/db", "PGPASSWORD": "own", "HOME": "/h"}
    assert inherited_env(env) == {"PGPASSWORD": "own", "HOME": "/h"}


def test_the_ledger_choice_follows_flag_then_environment_then_setting(tmp_path: Path) -> None:
    (tmp_path / ".legion").mkdir()
    (tmp_path / ".legion" / "settings.json").write_text('{"legion": {"ledger": {"url": "postgresql://s@h/db"}}}')
    settings = load_settings(tmp_path, env={})
    env = {"LEGION_LEDGER_URL": "postgresql://e@h/db"}
    assert choose_ledger("postgresql://f@h/db", env, settings) == ("postgresql://f@h/db", "--ledger")
    assert choose_ledger(None, env, settings) == ("postgresql://e@h/db", "LEGION_LEDGER_URL")
    assert choose_ledger(None, {}, settings) == ("postgresql://s@h/db", "legion.ledger.url")
    assert choose_ledger(None, {}, load_settings(tmp_path / "none", env={})) is None


def test_resume_takes_the_password_of_the_same_database_from_the_environment() -> None:
    env = {"LEGION_LEDGER_URL": "postgresql://u:pw@h/db"}
    choice = recorded_ledger("postgresql://u@h/db", env)
    assert choice is not None and choice.password == "pw" and "pw" not in repr(choice)
    other = recorded_ledger("postgresql://u@h/other", env)
    assert other is not None and other.password is None
    assert recorded_ledger(None, env) is None


def test_a_run_directory_names_its_ledger(tmp_path: Path) -> None:
    from legion.runs import ledger_url

    assert ledger_url(tmp_path) is None  # its own legion.db
    (tmp_path / "run.json").write_bytes(orjson.dumps({"ledger": "postgresql://u@h/db"}))
    assert ledger_url(tmp_path) == "postgresql://u@h/db"
