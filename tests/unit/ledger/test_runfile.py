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
