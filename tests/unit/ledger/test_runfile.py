"""run.json: atomic write, read, and quarantine of a corrupt file (regression 45)."""

from __future__ import annotations

from pathlib import Path

import pytest

from legion.ledger import RunFileError, read_run_json, write_run_json

pytestmark = pytest.mark.timeout(30)


def test_round_trip_and_atomic_replace(tmp_path: Path) -> None:
    assert read_run_json(tmp_path) is None
    write_run_json(tmp_path, {"run_id": "r1", "children": []})
    write_run_json(tmp_path, {"run_id": "r1", "children": [{"name": "a"}]})
    assert read_run_json(tmp_path) == {"run_id": "r1", "children": [{"name": "a"}]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no tmp left behind


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"", b"\xff\xfe", b'{"a": 1'])
def test_corrupt_is_quarantined(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "run.json").write_bytes(content)
    assert read_run_json(tmp_path) is None
    assert not (tmp_path / "run.json").exists()
    assert (tmp_path / "run.json.corrupt").read_bytes() == content  # nothing lost
    write_run_json(tmp_path, {"ok": True})
    assert read_run_json(tmp_path) == {"ok": True}


def test_unserialisable_refused_and_old_file_kept(tmp_path: Path) -> None:
    write_run_json(tmp_path, {"v": 1})
    with pytest.raises(RunFileError, match="not JSON"):
        write_run_json(tmp_path, {"v": object()})
    with pytest.raises(RunFileError, match="dict"):
        write_run_json(tmp_path, [1])  # type: ignore[arg-type]
    with pytest.raises(RunFileError, match="cannot write"):
        write_run_json(tmp_path / "missing", {"v": 1})
    assert read_run_json(tmp_path) == {"v": 1}


def test_interleaved_writers_never_share_a_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A second write lands while the first is between fsync and rename (another thread, or a
    # signal-time rewrite): both must succeed and the file must be one of the two, whole.
    import os

    real_fsync, nested = os.fsync, []

    def fsync_then_interleave(fd: int) -> None:
        real_fsync(fd)
        if not nested:
            nested.append(True)
            write_run_json(tmp_path, {"writer": "second"})

    monkeypatch.setattr(os, "fsync", fsync_then_interleave)
    write_run_json(tmp_path, {"writer": "first"})
    monkeypatch.undo()
    assert read_run_json(tmp_path) == {"writer": "first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_second_corruption_keeps_the_first_quarantined_copy(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_bytes(b"{first")
    assert read_run_json(tmp_path) is None
    (tmp_path / "run.json").write_bytes(b"{second")
    assert read_run_json(tmp_path) is None
    assert (tmp_path / "run.json.corrupt").read_bytes() == b"{first"
    later = [p for p in tmp_path.iterdir() if p.name.startswith("run.json.corrupt.")]
    assert [p.read_bytes() for p in later] == [b"{second"]
