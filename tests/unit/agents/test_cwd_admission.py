"""The allowed set of working directories (docs/spec-conformance.md §11): exact after realpath, no prefixes, `~`,
`$HOME` and `${HOME}` expand in the settings, relative entries are settings errors. The refusals through a real
run are in tests/e2e/test_cwd_admission.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from legion.agents import (
    CWD_NOT_ALLOWED,
    LaunchRefused,
    SettingsError,
    admit_cwd,
    build_settings,
    parse_settings_bytes,
)
from legion.agents.cwd_admission import allowed_cwds, expand_home


def _refusal(requested: object, caller: Path, external: list[str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(LaunchRefused) as info:
        admit_cwd(requested, caller, external, env or {})
    assert info.value.code == CWD_NOT_ALLOWED
    return str(info.value)


@pytest.mark.parametrize("written", ["~", "$HOME", "${HOME}"])
def test_home_forms_expand_only_at_the_start(written: str) -> None:
    env = {"HOME": "/home/ada"}
    assert expand_home(f"{written}/work", env) == "/home/ada/work"
    assert expand_home(written, env) == "/home/ada"
    assert expand_home(f"/srv/{written}/x", env) == f"/srv/{written}/x"
    assert expand_home(f"{written}x/work", env) == f"{written}x/work"  # ~x is another user's home: not expanded


def test_the_caller_cwd_and_each_configured_directory_are_admitted_exactly(tmp_path: Path) -> None:
    caller, ext = tmp_path / "project", tmp_path / "home" / "other"
    (caller / "sub").mkdir(parents=True)
    (ext / "inner").mkdir(parents=True)
    env = {"HOME": str(tmp_path / "home")}
    external = ["~/other", str(tmp_path / "missing")]
    assert allowed_cwds(caller, external, env) == (caller.resolve(), ext.resolve())  # the missing one admits nothing
    assert admit_cwd(str(caller), caller, external, env) == caller.resolve()
    assert admit_cwd(str(ext) + "/", caller, external, env) == ext.resolve()
    assert admit_cwd(str(ext / "inner" / ".."), caller, external, env) == ext.resolve()
    for outside in (caller / "sub", ext / "inner", tmp_path):  # subdirectories and parents are not admitted
        message = _refusal(str(outside), caller, external, env)
        assert "is not an allowed working directory" in message and "externalDirectories" in message
        assert str(ext.resolve()) in message and str(caller.resolve()) in message
    sibling = tmp_path / "home" / "other-too"  # a path prefix of an allowed directory
    sibling.mkdir()
    assert "is not an allowed working directory" in _refusal(str(sibling), caller, external, env)


def test_a_directory_the_run_made_is_admitted_for_any_caller(tmp_path: Path) -> None:
    caller, worktree = tmp_path / "project", tmp_path / "run" / "worktrees" / "alpha"
    caller.mkdir()
    (worktree / "src").mkdir(parents=True)
    assert admit_cwd(str(worktree), caller, [], {}, [worktree]) == worktree.resolve()
    assert "is not an allowed working directory" in _refusal(str(worktree), caller, [])
    with pytest.raises(LaunchRefused, match="is not an allowed working directory"):
        admit_cwd(str(worktree / "src"), caller, [], {}, [worktree])


def test_a_symlink_is_admitted_by_its_target(tmp_path: Path) -> None:
    caller, ext = tmp_path / "project", tmp_path / "ext"
    caller.mkdir()
    ext.mkdir()
    (tmp_path / "link").symlink_to(ext)
    (tmp_path / "sneaky").symlink_to(caller / "..")
    assert admit_cwd(str(tmp_path / "link"), caller, [str(ext)], {}) == ext.resolve()
    message = _refusal(str(tmp_path / "sneaky"), caller, [str(ext)], {})
    assert f"(= {os.path.realpath(tmp_path)})" in message  # the canonical path it was judged by


def test_bad_requests_say_what_is_wrong(tmp_path: Path) -> None:
    assert "is not an absolute path" in _refusal("project", tmp_path, [])
    assert "is not an existing directory" in _refusal(str(tmp_path / "nope"), tmp_path, [])
    (tmp_path / "file").write_text("x")
    assert "is not an existing directory" in _refusal(str(tmp_path / "file"), tmp_path, [])
    assert "non-empty absolute directory path" in _refusal(7, tmp_path, [])
    assert "non-empty absolute directory path" in _refusal(" ", tmp_path, [])


def test_the_setting_takes_absolute_or_home_paths_only() -> None:
    raw = parse_settings_bytes(json.dumps({"externalDirectories": ["/srv/a", "~/b", "$HOME/c", "${HOME}"]}).encode())
    assert build_settings([raw]).external_directories == ("/srv/a", "~/b", "$HOME/c", "${HOME}")
    assert build_settings([]).external_directories == ()
    for bad in ("relative/dir", "~other/x", "$HOMEX/y"):
        with pytest.raises(SettingsError) as info:
            parse_settings_bytes(json.dumps({"externalDirectories": ["/ok", bad]}).encode(), path="/p/settings.json")
        assert info.value.dotted == "externalDirectories[1]" and "must be an absolute directory path" in str(info.value)
    with pytest.raises(SettingsError, match="duplicate"):
        parse_settings_bytes(json.dumps({"externalDirectories": ["/a", "/a"]}).encode())
