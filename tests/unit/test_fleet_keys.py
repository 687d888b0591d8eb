"""The fleet's project key and host name (legion/fleet.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from legion.agents import Settings
from legion.fleet import host_name, normalise_remote, project_key

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("remote", "key"), [
    ("https://github.com/acme/app.git", "github.com/acme/app"),
    ("https://user:token@GitHub.com/acme/app", "github.com/acme/app"),
    ("ssh://git@github.com:22/acme/app.git", "github.com/acme/app"),
    ("git@github.com:acme/app.git", "github.com/acme/app"),
    ("/srv/git/app.git", None),
    ("", None),
])
def test_remotes_of_one_repository_agree(remote: str, key: str | None) -> None:
    assert normalise_remote(remote) == key


def test_the_setting_wins_then_origin_then_the_directory(tmp_path: Path) -> None:
    project = tmp_path / "shop"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    empty = Settings({})
    assert project_key(project, empty) == "shop"
    subprocess.run(["git", "-C", str(project), "remote", "add", "origin", "git@example.org:team/shop.git"],
                   check=True)
    assert project_key(project, empty) == "example.org/team/shop"
    assert project_key(project, Settings({"legion": {"project": " payments "}})) == "payments"


def test_host_name_is_not_empty() -> None:
    assert host_name()
