"""Property tests: the precedence chain is a total order; loading never raises a foreign exception."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legion.agents import (
    CARD_FIELDS,
    THINKING_LEVELS,
    AgentConfig,
    AgentDefinitionError,
    CardError,
    ModelRequest,
    SettingsError,
    TeamMember,
    VerdictError,
    build_settings,
    model_label,
    parse_card,
    parse_settings_bytes,
    parse_verdict,
    resolve_model,
    split_thinking_suffix,
)

LEVELS = range(1, 9)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _scenario(present: frozenset[int], inherit_top: bool) -> dict[str, Any]:
    if 4 in present:
        present = present | {8}  # the provider-scoped override needs a parent provider
    model = {n: f"lvl{n}/m{n}" for n in LEVELS}
    top = min(present) if present else None
    if inherit_top and top is not None and top not in (7, 8):
        model[top] = "inherit"
    raw: dict[str, Any] = {"presets": {"p": {"model": model[2]} if 2 in present else {"kind": "native"}}}
    if 4 in present:
        raw["agentOverridesByProvider"] = {"lvl8": {"worker": {"model": model[4]}}}
    if 5 in present:
        raw["agentOverrides"] = {"worker": {"model": model[5]}}
    if 7 in present:
        raw["defaultModel"] = model[7]
    agent = AgentConfig(name="worker", prompt="p", model=model[6] if 6 in present else None)
    return {
        "agent": agent,
        "settings": build_settings([raw]),
        "request": ModelRequest(
            model=model[1] if 1 in present else None, preset="p" if 2 in present else None
        ),
        "member": TeamMember(role="worker", model=model[3]) if 3 in present else None,
        "parent_model": model[8] if 8 in present else None,
        "present": present,
        "top": top,
        "model": model,
    }


@FAST
@given(st.frozensets(st.sampled_from(list(LEVELS)), min_size=1), st.booleans())
def test_precedence_chain_is_a_total_order(present: frozenset[int], inherit_top: bool) -> None:
    sc = _scenario(present, inherit_top)
    kwargs = {k: sc[k] for k in ("request", "member", "parent_model")}
    top = sc["top"]
    if sc["model"][top] == "inherit":
        if sc["parent_model"] is None:
            with pytest.raises(AgentDefinitionError, match="inherit"):
                resolve_model(sc["agent"], sc["settings"], **kwargs)
            return
        res = resolve_model(sc["agent"], sc["settings"], **kwargs)
        assert res.via_inherit and res.origin == "inherited" and res.level == top
        assert res.model == sc["parent_model"]
        return
    res = resolve_model(sc["agent"], sc["settings"], **kwargs)
    assert res.level == top, (sorted(sc["present"]), res)
    assert res.model == sc["model"][top]
    assert res.origin == ("explicit" if top <= 6 else "inherited")
    # removing the winner hands the launch to the next present level, never to a weaker one
    rest = sc["present"] - {top}
    if rest and not (top == 8 and 4 in rest):
        nxt = _scenario(frozenset(rest), False)
        res2 = resolve_model(
            nxt["agent"], nxt["settings"], **{k: nxt[k] for k in ("request", "member", "parent_model")}
        )
        assert res2.level == min(nxt["present"]) > top


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_keys = st.one_of(
    st.sampled_from([*CARD_FIELDS, "spawnMode", "placement", "modle", "alias"]), st.text(max_size=15)
)


def _only_card_errors(raw: bytes) -> None:
    """parse_card raises nothing but a CardError, and that error names the file and a line in it."""
    try:
        card = parse_card(raw, path="/fuzz/card.md")
    except CardError as exc:
        assert exc.path == "/fuzz/card.md"
        assert exc.line is not None and 1 <= exc.line <= raw.count(b"\n") + raw.count(b"\r") + 1, exc
        assert str(exc).startswith(f"/fuzz/card.md:{exc.line}: ")
        return
    assert isinstance(card, AgentConfig)
    with contextlib.suppress(AgentDefinitionError):
        resolve_model(card, build_settings([{}]), parent_model="scripted/parent")


@FAST
@given(st.dictionaries(_keys, _values, max_size=8))
def test_arbitrary_frontmatter_mappings_raise_only_card_errors(front: dict[str, Any]) -> None:
    text = yaml.safe_dump(front, allow_unicode=True)
    _only_card_errors(f"---\n{text}---\nbody\n".encode())


@FAST
@given(st.text(max_size=300))
def test_arbitrary_frontmatter_text_raises_only_card_errors(text: str) -> None:
    _only_card_errors(f"---\n{text}\n---\nbody".encode("utf-8", "surrogatepass"))


_BOM = b"\xef\xbb\xbf"
_newline = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def _card_bytes(draw: st.DrawFn) -> bytes:
    """Raw bytes shaped like a card in every way that matters: BOM, fences, line endings, garbage."""
    nl = draw(_newline)
    head = draw(st.sampled_from([b"", _BOM]))
    open_fence = draw(st.sampled_from([b"---", b"--- ", b"", b"----", b"..."]))
    front = draw(st.binary(max_size=200))
    close = draw(st.sampled_from([b"---", b"...", b"", b"--"]))
    body = draw(st.binary(max_size=60))
    return head + open_fence + nl + front + nl + close + nl + body


@FAST
@given(st.one_of(st.binary(max_size=400), _card_bytes()))
def test_arbitrary_bytes_raise_only_card_errors(raw: bytes) -> None:
    _only_card_errors(raw)
    _only_card_errors(b"---\n" + raw)


@st.composite
def _settings_bytes(draw: st.DrawFn) -> bytes:
    """Raw bytes shaped like a settings file: BOM, line endings, a valid prefix, then garbage."""
    nl = draw(_newline)
    head = draw(st.sampled_from([b"", _BOM]))
    prefix = draw(
        st.sampled_from(
            [b"", b"{", b'{"legion": {"maxDepth": ', b'{"teams": {"a": {"members": [', b'{"provid']
        )
    )
    return head + prefix.replace(b" ", nl) + draw(st.binary(max_size=200))


@FAST
@given(st.one_of(st.binary(max_size=300), _settings_bytes()))
def test_arbitrary_settings_bytes_raise_only_settings_errors(raw: bytes) -> None:
    try:
        build_settings([parse_settings_bytes(raw, path="/fuzz.json")], sources=["/fuzz.json"])
    except SettingsError as exc:
        assert exc.path == "/fuzz.json"
        assert exc.line is not None and str(exc).startswith(f"/fuzz.json:{exc.line}: "), exc


_settings_keys = st.sampled_from(
    [
        "enabled",
        "legion",
        "inprocess",
        "supervision",
        "defaultModel",
        "team",
        "teams",
        "presets",
        "agentOverrides",
        "agentOverridesByProvider",
        "providers",
        "retentionDays",
        "maxActive",
        "members",
        "model",
    ]
)


@FAST
@given(
    st.recursive(
        st.dictionaries(_settings_keys, _scalars, max_size=5),
        lambda inner: st.dictionaries(st.one_of(_settings_keys, st.text(max_size=8)), inner, max_size=4),
        max_leaves=15,
    )
)
def test_arbitrary_settings_structures_raise_only_settings_errors(data: dict[str, Any]) -> None:
    try:
        raw = json.dumps(data, allow_nan=True).encode()
    except (TypeError, ValueError):
        return
    with contextlib.suppress(SettingsError):
        build_settings([parse_settings_bytes(raw, path="/fuzz.json")])


@FAST
@given(st.text(max_size=300))
def test_arbitrary_reviewer_text_raises_only_verdict_errors(body: str) -> None:
    for text in (body, f"```legion-verdict\n{body}\n```"):
        with contextlib.suppress(VerdictError):
            parse_verdict(text)


_model_ids = st.from_regex(r"[a-z][a-z0-9]{0,6}/[a-z0-9][a-z0-9.\-]{0,10}", fullmatch=True)


@FAST
@given(_model_ids, st.sampled_from(THINKING_LEVELS))
def test_label_and_split_round_trip(base: str, level: str) -> None:
    label = model_label(base, level)
    assert split_thinking_suffix(label) == (base, level)
    assert model_label(label, "low" if level != "low" else "high") == label  # a known suffix wins


@FAST
@given(
    _model_ids,
    st.one_of(st.none(), st.just(False), st.sampled_from(THINKING_LEVELS)),
    st.one_of(st.none(), st.sampled_from(THINKING_LEVELS)),
)
def test_per_call_suffix_always_wins(base: str, thinking: Any, suffix: str | None) -> None:
    agent = dataclasses.replace(AgentConfig(name="w", prompt="p"), thinking=thinking)
    model = f"{base}:{suffix}" if suffix else base
    res = resolve_model(agent, build_settings([{}]), request=ModelRequest(model=model))
    expected = suffix if suffix else (thinking if isinstance(thinking, str) else None)
    assert res.thinking == expected and res.model == base


_yamlish = st.one_of(
    st.from_regex(r"\d{4}-\d{1,2}-\d{1,2}( \d{1,2}:\d{2}:\d{2})?", fullmatch=True),
    st.sampled_from(
        [
            "!!binary AAAA",
            "!!binary ???",
            "!!python/object:os.system x",
            "&a [*a]",
            "*nope",
            "!!int x",
            "!!float y",
            "!!timestamp 2001-13-45",
            "{? [a]: b}",
            "!!set {a}",
            "0o9",
            "1_000",
            ".nan",
            "~",
            "[",
            "'unterminated",
            "|\n  block",
            ">-\n folded",
            "!!omap [a: 1]",
            "!!merge x",
        ]
    ),
    st.text(alphabet="[]{}:,-!&*?|>'\"#% \n\tab1", max_size=20),
)


@FAST
@given(st.lists(st.tuples(_keys, _yamlish), max_size=6))
def test_yaml_edge_scalars_raise_only_card_errors(pairs: list[tuple[str, str]]) -> None:
    lines = "\n".join(f"{k.replace(chr(10), ' ')}: {v}" for k, v in pairs)
    _only_card_errors(f"---\n{lines}\n---\nbody".encode("utf-8", "surrogatepass"))


_team_names = st.sampled_from(["default", "alpha", "beta", "gamma"])


@FAST
@given(
    st.one_of(st.none(), _team_names),
    st.one_of(st.none(), _team_names),
    st.dictionaries(st.sampled_from(["HOME", "PATH", "TEAM"]), st.text(max_size=5), max_size=3),
)
def test_team_selection_chain_holds_for_any_env(
    setting: str | None, env_team: str | None, other: dict[str, str]
) -> None:
    from legion.agents import TEAM_ENV, active_team, team_column

    raw: dict[str, Any] = {"teams": {"alpha": {}, "beta": {}, "gamma": {}}}
    if setting is not None:
        raw["team"] = setting
    env = dict(other)
    if env_team is not None:
        env[TEAM_ENV] = env_team
    chosen = active_team(build_settings([raw]), env).name
    assert chosen == (env_team if env_team is not None else setting if setting is not None else "default")
    assert team_column(chosen) == (None if chosen == "default" else chosen)


_LEGION_INTS = {"maxDepth": (1, 64), "maxChildrenPerNode": (1, 1000), "mailRatePer5Min": (1, 10_000)}


@FAST
@given(
    st.dictionaries(st.sampled_from(sorted(_LEGION_INTS)), st.integers(1, 64), max_size=3),
    st.dictionaries(st.sampled_from(sorted(_LEGION_INTS)), st.integers(1, 64), max_size=3),
    st.booleans(),
)
def test_project_over_user_merge_and_explicitness(
    user: dict[str, int], project: dict[str, int], empty_block: bool
) -> None:
    from legion.agents.settings_schema import LEGION_SPEC

    raws: list[dict[str, Any]] = [
        {"legion": user} if user or empty_block else {},
        {"legion": project} if project else {},
    ]
    s = build_settings(raws)
    defaults = LEGION_SPEC.defaults()
    for key in _LEGION_INTS:
        expected = project.get(key, user.get(key, defaults[key]))
        assert s.get(f"legion.{key}") == expected
        assert s.is_explicit(f"legion.{key}") == (key in user or key in project)
    assert s.is_explicit("legion") == bool(user or project or empty_block)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.frozensets(st.sampled_from(["worker", "scout", "alpha", "beta", "gamma"])), min_size=3, max_size=3
    )
)
def test_the_last_layer_holding_a_name_wins(layers: list[frozenset[str]]) -> None:
    import tempfile
    from pathlib import Path

    from legion.agents import load_catalog

    with tempfile.TemporaryDirectory() as tmp:
        dirs = {layer: Path(tmp) / layer for layer in ("builtin", "user", "project")}
        for (layer, directory), names in zip(dirs.items(), layers, strict=True):
            directory.mkdir()
            for name in names:
                (directory / f"{name}.md").write_text(f"---\nname: {name}\n---\nfrom {layer}\n")
        catalog = load_catalog(tmp, env={"HOME": tmp}, layer_dirs=dirs)
        for name in set().union(*layers):
            winner = [layer for layer, names in zip(dirs, layers, strict=True) if name in names][-1]
            card = catalog.require(name)
            assert (card.source, card.prompt) == (winner, f"from {winner}")
        assert set(catalog.names()) == set().union(*layers)
