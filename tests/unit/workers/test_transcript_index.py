"""The pool's duplicate-transcript check is one index lookup, not a resolve() of every hosted transcript (issue 22)."""

from __future__ import annotations

import pathlib
from pathlib import Path
from typing import Any

import pytest

from legion.workers.pool import PoolLimits
from legion.workers.session_service import SessionService

pytestmark = pytest.mark.timeout(60)
HOSTED = 12


def spec(tmp_path: Path, node: str, **extra: Any) -> dict[str, Any]:
    return {"nodeId": node, "cwd": str(tmp_path), "model": "scripted/s", "transcript": str(tmp_path / f"{node}.jsonl"),
            "scripts": {"s": {"default": {"text": "ok"}}}, **extra}


async def test_a_launch_resolves_no_hosted_transcript_and_a_retired_ones_path_is_free_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = SessionService(send=None, request=None, limits=PoolLimits(max_active=HOSTED + 2, max_queued=2))
    for i in range(HOSTED):
        r = await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, f"n{i}")})
        assert r.get("status") != "error" and "code" not in r, r
    resolved: list[Path] = []
    real = pathlib.Path.resolve

    def counting(self: Path, strict: bool = False) -> Path:
        resolved.append(self)
        return real(self, strict)

    monkeypatch.setattr(pathlib.Path, "resolve", counting)
    hosted = {str(tmp_path / f"n{i}.jsonl") for i in range(HOSTED)}
    r = await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "fresh")})
    assert "code" not in r, r
    # per launch: the new spec's path and the new session's own, never the hosted sessions' (it was all of them)
    assert not hosted & {str(p) for p in resolved}, resolved
    r = await svc.handle_request({"op": "session.launch",
                                  "spec": {**spec(tmp_path, "dup"), "transcript": str(tmp_path / "x" / ".." / "n3.jsonl")}})
    assert r["code"] == "DUPLICATE" and "already in use by session 'n3'" in r["error"]
    await svc.handle_request({"op": "session.retire", "nodeId": "n3"})
    r = await svc.handle_request({"op": "session.launch", "spec": {**spec(tmp_path, "again"),
                                                                   "transcript": str(tmp_path / "n3.jsonl")}})
    assert "code" not in r, r  # the retired session's transcript is free for another session
    await svc.close()
