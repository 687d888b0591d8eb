"""Settings and cards that another user can write are refused (as ssh's StrictModes refuses its config): a
symlinked settings.json pointing at a world-writable file, a file of another uid, a group-writable card, a
writable directory above them. Real files, real modes and owners."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from legion.agents.catalog import load_catalog
from legion.agents.errors import SettingsError
from legion.agents.settings import load_settings

BOOTSTRAP = '{"legion": {"worktreeBootstrap": ["touch /tmp/pwned"]}}'


def _settings(project: Path) -> Path:
    return project / ".legion" / "settings.json"


def test_a_symlink_to_a_world_writable_settings_file_is_refused(project: Path, env: dict[str, str],
                                                                tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    target = shared / "settings.json"
    target.write_text("{}")
    target.chmod(0o666)
    _settings(project).symlink_to(target)
    with pytest.raises(SettingsError) as err:
        load_settings(project, env=env)
    text = str(err.value)
    assert str(target) in text and "writable by group and others (mode 0666)" in text
    assert f"`chmod go-w {target}`" in text
    target.chmod(0o644)
    load_settings(project, env=env)  # fixed as the message says: accepted


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_a_settings_file_owned_by_another_user_is_refused(project: Path, env: dict[str, str]) -> None:
    path = _settings(project)
    path.write_text("{}")
    os.chown(path, 54321, -1)
    with pytest.raises(SettingsError) as err:
        load_settings(project, env=env)
    assert "owned by uid 54321, not by you or root" in str(err.value) and f"`chown root {path}`" in str(err.value)


def test_a_writable_directory_above_the_settings_is_refused(project: Path, env: dict[str, str]) -> None:
    path = _settings(project)
    path.write_text("{}")
    (project / ".legion").chmod(0o777)
    with pytest.raises(SettingsError, match=r"its directory .*\.legion is writable by group and others"):
        load_settings(project, env=env)
    (project / ".legion").chmod(0o1777)  # sticky, but not root's own: still refused
    if os.stat(project / ".legion").st_uid != 0:
        with pytest.raises(SettingsError):
            load_settings(project, env=env)
    (project / ".legion").chmod(0o755)
    load_settings(project, env=env)


def test_a_group_writable_card_is_an_error_row_not_a_loaded_card(project: Path, env: dict[str, str]) -> None:
    card = project / ".legion" / "agents" / "evil.md"
    card.write_text("---\nname: evil\ndescription: runs things\n---\nYou do the thing.\n")
    card.chmod(0o664)
    catalog = load_catalog(project, env=env, strict=False)
    assert "evil" not in catalog.cards
    assert any("evil.md" in str(e) and "writable by group" in str(e) and "chmod go-w" in str(e)
               for e in catalog.errors), catalog.errors
    card.chmod(0o644)
    assert "evil" in load_catalog(project, env=env, strict=False).cards
