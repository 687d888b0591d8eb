"""Provider resolution and the scripted-script format (validation, rules, sequencing)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from legion.workers.providers.base import (
    CompletionRequest,
    ErrorEvent,
    ProviderError,
    StopEvent,
    TextDelta,
    ToolCallDelta,
    parse_model_ref,
)
from legion.workers.providers.openai_compat import to_openai_messages
from legion.workers.providers.scripted import ScriptedProvider, load_script, parse_script, register_script


def test_parse_model_ref() -> None:
    assert parse_model_ref("scripted/echo").label == "scripted/echo"
    r = parse_model_ref("openrouter/openai/gpt-4o:xhigh")
    assert (r.provider, r.model_id, r.thinking) == ("openrouter", "openai/gpt-4o", "xhigh")
    r = parse_model_ref("ollama/llama3:8b")
    assert (r.model_id, r.thinking) == ("llama3:8b", None)
    for bad in ("gpt-4o", "/x", "p/", ""):
        with pytest.raises(ProviderError, match="provider"):
            parse_model_ref(bad)


@pytest.mark.parametrize(("script", "message"), [
    ({"turnz": []}, "unknown key 'turnz'"),
    ({"turns": [{"txt": "a"}]}, r"script.turns\[0\]: unknown key 'txt'"),
    ({"turns": [{"tool_calls": [{"name": "x", "argumnets": {}}]}]}, r"tool_calls\[0\]: unknown key 'argumnets'"),
    ({"turns": [{"stop_reason": "done"}]}, "stop_reason must be one of"),
    ({"turns": [{"delay_ms": -1}]}, "delay_ms must be a non-negative number"),
    ({"rules": [{"match": "(", "reply": "x"}]}, "not a valid regular expression"),
    ({"rules": [{"match": "a", "on": "tool", "reply": "x"}]}, "on must be user, toolResult or any"),
    ({"turns": [{"usage": {"inputs": 1}}]}, "unknown key 'inputs'"),
    ({"turns": "abc"}, "must be lists"),
])
def test_script_validation_errors(script: dict[str, Any], message: str) -> None:
    with pytest.raises(ProviderError, match=message):
        parse_script(script)


def test_load_script_from_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("turns:\n  - text: hi\ndefault: {text: bye}\n")
    (tmp_path / "s.json").write_text('{"turns": ["plain string turn"]}')
    (tmp_path / "bad.yaml").write_text("turns: [\n")
    assert load_script(tmp_path / "s.yaml").turns[0].text == "hi"
    assert load_script("s.json", cwd=str(tmp_path)).turns[0].text == "plain string turn"
    with pytest.raises(ProviderError, match="not valid YAML"):
        load_script(tmp_path / "bad.yaml")


def test_duplicate_keys_in_a_script_file_are_errors_naming_file_line_and_key(tmp_path: Path) -> None:
    (tmp_path / "dup.yaml").write_text("turns:\n  - text: first\n    thinking: hmm\n    text: second\n")
    with pytest.raises(ProviderError) as err:
        load_script(tmp_path / "dup.yaml")
    assert str(err.value) == (f"scripted: {tmp_path / 'dup.yaml'} is not valid YAML: line 4: duplicate key "
                              "'text' (first given on line 2)")
    (tmp_path / "flow.yaml").write_text("default: {text: a, text: b}\n")
    with pytest.raises(ProviderError, match=r"flow.yaml is not valid YAML: line 1: duplicate key 'text'"):
        load_script(tmp_path / "flow.yaml")
    (tmp_path / "top.yml").write_text("turns: [a]\nrules: []\nturns: [b]\n")
    with pytest.raises(ProviderError, match=r"top.yml is not valid YAML: line 3: duplicate key 'turns' \(first given on line 1\)"):
        load_script(tmp_path / "top.yml")
    (tmp_path / "dup.json").write_text('{"turns": ["a"], "turns": ["b"]}')
    with pytest.raises(ProviderError, match=r"dup.json is not valid JSON: duplicate key 'turns'"):
        load_script(tmp_path / "dup.json")
    # the same key in different mappings, and a merge key overridden, are not duplicates
    (tmp_path / "ok.yaml").write_text("turns:\n  - {text: a}\n  - {text: b}\ndefault:\n  <<: {text: x}\n  text: y\n")
    script = load_script(tmp_path / "ok.yaml")
    assert [t.text for t in script.turns] == ["a", "b"] and script.default is not None and script.default.text == "y"


def test_a_script_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "pipe.yaml")  # no writer: opening it for reading would wait for one
    with pytest.raises(ProviderError, match=r"pipe.yaml is a FIFO \(named pipe\), not a regular file"):
        load_script(tmp_path / "pipe.yaml")
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(ProviderError, match=r"dir\.yaml is a directory, not a regular file"):
        load_script(tmp_path / "dir.yaml")
    events = _collect(ScriptedProvider(), str(tmp_path / "pipe.yaml"), [{"role": "user", "content": "hi"}])
    assert isinstance(events[0], ErrorEvent) and "FIFO" in events[0].message


def test_a_script_over_the_size_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from legion.workers.providers import scripted

    monkeypatch.setattr(scripted, "MAX_SCRIPT_BYTES", 100)
    (tmp_path / "big.yaml").write_text("turns: [" + ", ".join(["x"] * 100) + "]\n")
    with pytest.raises(ProviderError, match=r"big.yaml is \d+ bytes, over the"):
        load_script(tmp_path / "big.yaml")


def test_a_script_file_is_parsed_again_only_when_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("turns: [one]\n")
    p = ScriptedProvider()
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    first = _collect(p, str(path), msgs)
    again = _collect(p, str(path), msgs)
    assert [e.text for e in first if isinstance(e, TextDelta)] == ["one"] == [e.text for e in again if isinstance(e, TextDelta)]
    path.write_text("turns: [two, more]\n")  # another size: seen as changed whatever the clock's resolution
    assert [e.text for e in _collect(p, str(path), msgs) if isinstance(e, TextDelta)] == ["two"]


def _collect(provider: ScriptedProvider, model: str, messages: list[dict[str, Any]], attempt: int = 0) -> list[Any]:
    async def run() -> list[Any]:
        req = CompletionRequest(parse_model_ref(f"scripted/{model}"), "", messages, attempt=attempt)
        return [e async for e in provider.stream(req)]

    return asyncio.run(run())


def test_sequence_rules_default_and_exhaustion() -> None:
    p = ScriptedProvider()
    register_script("seq", {"turns": [{"text": "first"}, {"tool_calls": [{"name": "ls", "arguments": {"path": "."}}]}],
                            "rules": [{"match": "VERDICT\\?", "on": "user", "reply": {"text": "VERDICT: approve"}},
                                      {"match": "^boom", "on": "toolResult", "reply": {"error": "tool went boom"}}]})
    user = {"role": "user", "content": "go"}
    asst = {"role": "assistant", "content": [], "stopReason": "stop"}
    ev = _collect(p, "seq", [user])
    assert ev[0] == TextDelta("first") and ev[-1] == StopEvent("stop")
    ev = _collect(p, "seq", [user, asst])
    assert ToolCallDelta(0, '{"path": "."}') in ev and ev[-1] == StopEvent("toolUse")
    ev = _collect(p, "seq", [user, asst, asst])
    assert isinstance(ev[-1], ErrorEvent) and "exhausted after 2 turns" in ev[-1].message
    ev = _collect(p, "seq", [{"role": "user", "content": "VERDICT?"}])
    assert ev[0] == TextDelta("VERDICT: approve")
    ev = _collect(p, "seq", [user, asst, {"role": "toolResult", "content": [{"type": "text", "text": "boom!"}]}])
    assert ev[-1] == ErrorEvent("tool went boom")
    ev = _collect(p, "nope", [user])
    assert isinstance(ev[0], ErrorEvent) and "unknown script 'nope'" in ev[0].message and "echo" in ev[0].message


def test_empty_attempts_depend_on_attempt_number() -> None:
    p = ScriptedProvider(scripts={"e": parse_script({"turns": [{"empty_attempts": 1, "text": "x"}]})})
    user = {"role": "user", "content": "go"}
    assert not any(isinstance(e, TextDelta) for e in _collect(p, "e", [user], attempt=0))
    assert TextDelta("x") in _collect(p, "e", [user], attempt=1)


def test_openai_message_conversion_skips_failed_turns() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}]},
            {"role": "assistant", "content": [], "stopReason": "error", "errorMessage": "x"},
            {"role": "assistant", "content": [{"type": "text", "text": "b"}], "stopReason": "stop"}]
    out = to_openai_messages("sys", msgs)
    assert out == [{"role": "system", "content": "sys"}, {"role": "user", "content": "a"},
                   {"role": "assistant", "content": "b"}]


def test_assembler_handles_late_tool_names_and_deltas_without_start() -> None:
    from legion.workers.assembler import AssistantBuilder
    from legion.workers.providers.base import ToolCallStart

    b = AssistantBuilder(parse_model_ref("x/y"), "openai-completions")
    b.feed(ToolCallStart(0, "c0", ""))
    b.feed(ToolCallDelta(0, '{"a"'))
    b.feed(ToolCallStart(0, "c0", "read"))
    b.feed(ToolCallDelta(0, ": 1}"))
    b.feed(ToolCallDelta(1, "{}"))  # a delta for a call that never started
    msg = b.message()
    calls = [c for c in msg["content"] if c["type"] == "toolCall"]
    assert calls[0] == {"type": "toolCall", "id": "c0", "name": "read", "arguments": {"a": 1}}
    assert calls[1]["id"] == "call_1" and msg["stopReason"] == "toolUse"


def test_documented_script_example_is_valid() -> None:
    import textwrap

    import yaml

    from legion.workers.providers import scripted

    doc = scripted.__doc__ or ""
    block = doc.split("Script format (YAML or JSON; the same structure as an inline dict)::", 1)[1]
    block = block.split("\nUnknown keys anywhere", 1)[0]
    script = parse_script(yaml.safe_load(textwrap.dedent(block)))
    assert len(script.turns) == 5 and len(script.rules) == 1 and script.default is not None
    assert script.turns[0].tool_calls[0].name == "bash" and script.turns[2].empty
    assert script.turns[3].empty_attempts == 2 and script.turns[4].hang


def test_openai_tool_calls_without_index_or_with_parsed_arguments() -> None:
    """Whole tool calls without ``index`` (one per chunk) stay separate; object arguments are accepted."""
    from legion.workers.assembler import AssistantBuilder
    from legion.workers.providers.base import ModelRef
    from legion.workers.providers.openai_compat import OpenAICompatProvider

    tool_ids: dict[int, str] = {}
    builder = AssistantBuilder(ModelRef("local", "m"), "openai-completions")
    deltas = [{"tool_calls": [{"id": "a", "function": {"name": "ls", "arguments": "{\"path\": "}}]},
              {"tool_calls": [{"function": {"arguments": "\"src\"}"}}]},
              {"tool_calls": [{"id": "b", "function": {"name": "read", "arguments": {"path": "x"}}}]},
              {"tool_calls": ["junk"]}]
    for delta in deltas:
        for event in OpenAICompatProvider._choice_events({"delta": delta}, tool_ids):
            builder.feed(event)
    calls = builder.tool_calls()
    assert [(c.id, c.name, c.arguments) for c in calls] == [("a", "ls", {"path": "src"}),
                                                           ("b", "read", {"path": "x"})]


@pytest.mark.parametrize("api", ["openai-completions", "anthropic-messages"])
def test_a_request_the_provider_cannot_build_is_an_error_event_not_an_exception(api: str) -> None:
    """The Provider contract holds while the request body is built too: a tool without a description ends
    the call with an ErrorEvent naming the provider and the cause (nothing is sent)."""
    from legion.workers.providers.base import CompletionRequest, ErrorEvent, ModelRef
    from legion.workers.providers.config import parse_entry
    from legion.workers.providers.registry import build_provider

    provider = build_provider(parse_entry("local", {"api": api, "baseUrl": "http://127.0.0.1:9", "apiKey": "NO_SUCH"}))
    request = CompletionRequest(ModelRef("local", "m"), "sys", [{"role": "user", "content": "hi"}],
                                tools=[{"name": "t", "parameters": {"type": "object"}}], env={"NO_SUCH": "k"})

    async def run() -> list[Any]:
        try:
            return [event async for event in provider.stream(request)]
        finally:
            await provider.aclose()

    events = asyncio.run(run())
    assert len(events) == 1 and isinstance(events[0], ErrorEvent), events
    assert "provider 'local'" in events[0].message and "KeyError" in events[0].message
