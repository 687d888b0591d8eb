"""`replace_file`: the one whole-file writer — atomic replace, its temp file never left behind, fsync on demand."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from legion.procs import durable
from legion.procs.durable import replace_file


def test_replace_file_replaces_whole_and_leaves_only_the_target(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    replace_file(target, b"new" * 100_000)
    assert target.read_bytes() == b"new" * 100_000
    assert os.listdir(tmp_path) == ["state.json"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_replace_file_mode_and_custom_prefix(tmp_path: Path) -> None:
    replace_file(tmp_path / ".gitignore", b"*\n", durable=False, mode=0o644, prefix="x.")
    assert stat.S_IMODE((tmp_path / ".gitignore").stat().st_mode) == 0o644


def test_a_failed_rename_removes_the_temp_file_and_keeps_the_old_target(tmp_path: Path) -> None:
    target = tmp_path / "busy"
    target.mkdir()  # a directory cannot be replaced by a file
    (target / "inside").write_text("kept")
    with pytest.raises(OSError):
        replace_file(target, b"data")
    assert os.listdir(tmp_path) == ["busy"]
    assert (target / "inside").read_text() == "kept"


def test_durable_fsyncs_the_file_and_the_directory_and_non_durable_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(durable.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    replace_file(tmp_path / "a", b"1")
    assert len(synced) == 2  # the temp file, then the directory holding the rename
    synced.clear()
    replace_file(tmp_path / "b", b"2", durable=False)
    assert synced == []


def _count_syncfs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    assert durable._syncfs is not None, "this kernel/libc has syncfs(2)"
    calls: list[int] = []
    real = durable._syncfs
    monkeypatch.setattr(durable, "_syncfs", lambda fd: (calls.append(fd), real(fd))[1])
    return calls


def test_sync_paths_makes_many_files_durable_with_one_syncfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = []
    for i in range(20):
        folder = tmp_path / f"artifacts/w{i}"
        folder.mkdir(parents=True)
        files.append(folder / "r1.md")
        files[-1].write_bytes(b"result")
    fsyncs: list[int] = []
    monkeypatch.setattr(durable.os, "fsync", lambda fd: fsyncs.append(fd))
    calls = _count_syncfs(monkeypatch)
    assert durable.sync_paths([*files, files[0], tmp_path / "gone" / "x"]) == 1  # one filesystem, one call
    assert len(calls) == 1 and fsyncs == []  # a missing folder is skipped; no per-file fsync


def test_sync_paths_without_syncfs_fsyncs_each_file_and_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    files = [tmp_path / "a" / "1", tmp_path / "a" / "2", tmp_path / "3"]
    for f in files:
        f.write_bytes(b"x")
    monkeypatch.setattr(durable, "_syncfs", None)
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(durable.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    assert durable.sync_paths([*files, tmp_path / "a" / "deleted"]) == 5  # three files, two folders
    assert len(synced) == 5


def test_a_failing_syncfs_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f").write_bytes(b"x")
    monkeypatch.setattr(durable, "_syncfs", lambda fd: -1)
    monkeypatch.setattr(durable.ctypes, "get_errno", lambda: 5)
    with pytest.raises(OSError, match="syncfs"):
        durable.sync_paths([tmp_path / "f"])
