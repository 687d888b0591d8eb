"""Bad input never raises anything but the component's own error type (Hypothesis)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legion.workers.outcome import outcome_of_messages
from legion.workers.providers.base import ProviderError, parse_model_ref
from legion.workers.providers.scripted import parse_script
from legion.workers.session_spec import SessionSpec, SpecError
from legion.workers.tools.catalog import all_tools
from legion.workers.tools.schema import validate
from legion.workers.transcript import Transcript, TranscriptError, read_transcript

pytestmark = pytest.mark.timeout(120)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)


@FUZZ
@given(st.binary(max_size=400))
def test_transcript_reader_and_open_never_crash(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.jsonl"
        path.write_bytes(raw)
        data = read_transcript(path)
        outcome_of_messages([e.get("message") for e in data.entries if isinstance(e.get("message"), dict)])
        try:
            t = Transcript.open(path, cwd=tmp)
        except TranscriptError:
            return
        t.messages()
        t.append_message({"role": "user", "content": "x", "timestamp": 1})
        t.close()
        assert read_transcript(path).entries[-1]["message"]["content"] == "x"


@FUZZ
@given(json_values)
def test_tool_schemas_validate_anything(value: Any) -> None:
    for tool in all_tools().values():
        assert isinstance(validate(value, tool.parameters), list)


@FUZZ
@given(json_values)
def test_script_parser_only_raises_provider_error(value: Any) -> None:
    with contextlib.suppress(ProviderError):
        parse_script(value)


@FUZZ
@given(st.dictionaries(st.sampled_from(["nodeId", "cwd", "model", "transcript", "budget", "env", "tools", "config",
                                        "depth", "team", "bogus"]), json_values, max_size=8))
def test_session_spec_only_raises_spec_error(value: dict[str, Any]) -> None:
    with contextlib.suppress(SpecError):
        SessionSpec.from_dict(value)


@FUZZ
@given(st.text(max_size=40))
def test_model_refs_only_raise_provider_error(text: str) -> None:
    try:
        ref = parse_model_ref(text)
    except ProviderError:
        return
    assert ref.provider and ref.model_id


def test_non_string_keys_are_reported_not_crashed() -> None:
    with pytest.raises(ProviderError, match="unknown key '1'"):
        parse_script({"turns": [], 1: "x", None: 2})
    with pytest.raises(SpecError, match="unknown key"):
        SessionSpec.from_dict({"nodeId": "n", 3: 4, None: 1})
