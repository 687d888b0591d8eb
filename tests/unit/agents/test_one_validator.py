"""Cards and settings go through the JSON Schema validator that also checks tool calls (jsonschema-rs), and its errors
keep legion's texts: `file:line`, the dotted path, "did you mean" and the legal keys, in document order."""

from __future__ import annotations

import pytest

from legion.agents import CardError, SettingsError, UnknownFieldError, parse_card, parse_settings_bytes
from legion.agents.fields import CARD_SPEC
from legion.agents.schema import _compiled
from legion.agents.settings_schema import SETTINGS_SPEC


def _card(front: str) -> bytes:
    return f"---\n{front}---\nYou do the thing.\n".encode()


def test_the_tables_compile_to_json_schema_the_validator_takes() -> None:
    for table in (CARD_SPEC, SETTINGS_SPEC):
        compiled = _compiled(table)
        assert compiled is _compiled(table)  # compiled once per table
        assert compiled.schema["type"] == "object" and compiled.schema["additionalProperties"] is False
        assert set(compiled.schema["properties"]) == set(table.fields)


def test_a_value_json_cannot_hold_is_named_as_written() -> None:
    with pytest.raises(CardError) as info:
        parse_card(_card("name: worker\ndescription: 2024-01-02\n"), path="/c/worker.md")
    assert str(info.value) == "/c/worker.md:3: description: must be a string (got a date)"
    with pytest.raises(SettingsError) as err:
        parse_settings_bytes(b'{\n  "legion": {\n    "maxDepth": NaN\n  }\n}', path="/p/settings.json")
    assert err.value.dotted == "legion.maxDepth" and err.value.line == 3
    assert "must be an integer between 1 and 64 (got nan)" in str(err.value)


def test_every_wrong_key_of_a_card_is_listed_in_document_order_with_its_line() -> None:
    data = _card("name: worker\ntoolBudgte: 5\nrestart: always\nthinking: mid\nmaxSubagentDepth: 99\n")
    with pytest.raises(CardError) as info:
        parse_card(data, path="/c/worker.md")
    err = info.value
    assert not isinstance(err, UnknownFieldError) and err.line == 3
    assert err.message.startswith("4 problems in the frontmatter — line 3: unknown key 'toolBudgte'")
    assert "did you mean 'toolBudget'?" in err.message
    lines = [part.split(":")[0] for part in err.message.split("line ")[1:]]
    assert lines == ["3", "4", "5", "6"]
    assert "restart: must be one of: permanent, transient, temporary (got 'always')" in err.message
    assert "thinking: must be one of: off, minimal" in err.message
    assert "maxSubagentDepth: must be an integer between 1 and 16 (got 99)" in err.message


def test_a_bad_map_key_is_named_at_its_own_path() -> None:
    doc = b'{\n  "providers": {\n    "bad name!": {"baseUrl": "http://x"}\n  }\n}'
    with pytest.raises(SettingsError) as info:
        parse_settings_bytes(doc, path="/p/settings.json")
    assert info.value.dotted == "providers.bad name!" and info.value.line == 3
    assert "must match a provider name [A-Za-z0-9._-] (got 'bad name!')" in str(info.value)


def test_the_normalised_values_come_back() -> None:
    card = parse_card(_card("name: worker\ntools: 'read, grep'\ntoolBudget: 5.0\nthinking: ' high '\n"
                            "phases: [planning, implementing]\n"), path="/c/worker.md")
    assert card.tools == ("read", "grep") and card.tool_budget == 5 and isinstance(card.tool_budget, int)
    assert card.thinking == "high"
    assert card.phases is not None and [p.id for p in card.phases.phases] == ["planning", "implementing"]
    raw = parse_settings_bytes(b'{"providers": {"local": {"models": [{"id": "m", "cost": {"input": 1}}]}}}')
    assert raw["providers"]["local"]["models"][0]["cost"]["input"] == 1


@pytest.mark.parametrize("front", ["tools: &a [*a]", "extra: &a {k: *a}", "tools: &a [x, [y, *a]]"])
def test_a_yaml_alias_inside_its_own_anchor_is_a_card_error_not_a_crash(front: str) -> None:
    """Found by the property test: such a value nests without end, and the check recursed until Python stopped it."""
    with pytest.raises(CardError, match="nests more than 64 levels deep"):
        parse_card(f"---\nname: w\n{front}\n---\nbody".encode(), path="/p/card.md")
