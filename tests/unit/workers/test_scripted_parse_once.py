"""A scripted model's script file is parsed once per content, however many calls read it (issue 22)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import legion.workers.providers.scripted as scripted
from legion.workers.providers.base import CompletionRequest, TextDelta, parse_model_ref
from legion.workers.providers.scripted import ScriptedProvider

pytestmark = pytest.mark.timeout(30)


def test_a_script_file_is_parsed_once_for_many_calls_and_again_when_it_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-reading and re-parsing the YAML on every model call was ~30% of a pool's samples at 1,000 nodes."""
    parses: list[Path] = []
    real = scripted.load_script

    def counting(source: Any, cwd: str | None = None) -> scripted.Script:
        parses.append(Path(source))
        return real(source, cwd)

    monkeypatch.setattr(scripted, "load_script", counting)
    path = tmp_path / "worker.yaml"
    path.write_text("turns: [one]\ndefault: {text: again}\n")
    provider = ScriptedProvider()

    async def texts(messages: list[dict[str, Any]]) -> list[str]:
        req = CompletionRequest(parse_model_ref(f"scripted/{path}"), "", messages)
        return [e.text async for e in provider.stream(req) if isinstance(e, TextDelta)]

    async def calls() -> list[list[str]]:
        first = [{"role": "user", "content": "go"}]
        later = [*first, {"role": "assistant", "content": [{"type": "text", "text": "one"}]},
                 {"role": "user", "content": "more"}]
        return [*await asyncio.gather(*(texts(first) for _ in range(20))), await texts(later)]

    got = asyncio.run(calls())
    assert got[:20] == [["one"]] * 20 and got[20] == ["again"]
    assert len(parses) <= 2  # two concurrent first reads may both parse; never one per call
    n = len(parses)
    asyncio.run(calls())
    assert len(parses) == n  # a later session of the same script parses nothing
    path.write_text("turns: [two, more]\n")  # another size: changed whatever the clock's resolution
    assert asyncio.run(texts_once(provider, path)) == ["two"] and len(parses) == n + 1


async def texts_once(provider: ScriptedProvider, path: Path) -> list[str]:
    req = CompletionRequest(parse_model_ref(f"scripted/{path}"), "", [{"role": "user", "content": "go"}])
    return [e.text async for e in provider.stream(req) if isinstance(e, TextDelta)]
