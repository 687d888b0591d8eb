"""Settings: strict schema, defaults in one place, deep merge, explicitness (docs/spec-conformance.md §1.2, §10 items 18, 37)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from legion.agents import (
    PHASE_TIMEOUTS_MS,
    SettingsError,
    build_settings,
    load_catalog,
    load_settings,
    parse_settings_bytes,
    phase_timeouts_ms,
)
from legion.agents.settings import SETTINGS_SPEC


def test_defaults_without_any_file(env: dict[str, str], project: Path) -> None:
    s = load_settings(project, env=env)
    assert s.sources == () and s.explicit == frozenset()
    assert s.enabled is True
    assert s.get("legion.maxDepth") == 4 and s.get("legion.maxChildrenPerNode") == 8
    assert s.get("legion.maxActiveNodes") == 30
    assert s.get("legion.phaseTimeouts") == PHASE_TIMEOUTS_MS
    assert s.get("legion.verifyCommandTimeoutMs") == 600_000 and s.get("legion.mailRatePer5Min") == 10
    assert s.get("legion.silenceNoticeMs") == 120_000 and s.get("legion.orphanStaleMs") == 90_000
    assert s.legion.loop_notice_ms == 20 * 60_000 and s.legion.silence_notice_ms == 120_000
    lim = s.inprocess
    assert (lim.max_active, lim.max_queued_launches, lim.launch_queue_timeout_ms, lim.start_timeout_ms) == (
        30,
        32,
        900_000,
        15_000,
    )
    sup = s.supervision
    assert (sup.max_restarts, sup.restart_period_ms, sup.force_rpc) == (3, 60_000, False)
    assert sup.backoff_base_ms <= sup.backoff_cap_ms
    assert s.get("retentionDays") == 14 and s.get("eventRetentionDays") and s.get("eventMaxRows")
    assert s.default_model is None and s.team is None


def test_inprocess_max_active_is_8_when_the_block_exists_without_it() -> None:
    assert build_settings([{"inprocess": {}}]).inprocess.max_active == 8
    assert build_settings([{"inprocess": {"maxQueuedLaunches": 4}}]).inprocess.max_active == 8
    assert build_settings([{"inprocess": {"maxActive": 12}}]).inprocess.max_active == 12
    assert build_settings([{}]).inprocess.max_active == 30


def test_project_deep_merges_over_user(
    env: dict[str, str], project: Path, user_dir: Path, write_settings: Callable[[Path, dict[str, Any]], Path]
) -> None:
    write_settings(
        user_dir / "settings.json",
        {
            "defaultModel": "openai/gpt-4o",
            "legion": {"maxDepth": 3, "mailRatePer5Min": 5},
            "presets": {"fast": {"model": "openai/gpt-4o-mini"}},
        },
    )
    write_settings(project / ".legion" / "settings.json", {"legion": {"maxDepth": 2}})
    s = load_settings(project, env=env)
    assert s.get("legion.maxDepth") == 2 and s.get("legion.mailRatePer5Min") == 5
    assert s.default_model == "openai/gpt-4o" and "fast" in s.presets
    assert len(s.sources) == 2


def test_provider_sections_merge_per_provider_and_models_per_id() -> None:
    user = {
        "providers": {
            "local": {
                "baseUrl": "http://127.0.0.1:8000/v1",
                "apiKeyEnv": "LOCAL_KEY",
                "models": [{"id": "a", "contextWindow": 1000}, "b"],
            },
            "other": {"baseUrl": "https://x.example/v1"},
        },
        "agentOverridesByProvider": {
            "local": {"worker": {"model": "local/a"}, "scout": {"model": "local/b"}}
        },
    }
    project = {
        "providers": {
            "local": {
                "baseUrl": "http://127.0.0.1:9000/v1",
                "models": [{"id": "a", "contextWindow": 2000}, "c"],
            }
        },
        "agentOverridesByProvider": {"local": {"worker": {"model": "local/c"}}},
    }
    s = build_settings([user, project])
    local = s.providers["local"]
    assert local.base_url == "http://127.0.0.1:9000/v1" and local.api_key_env == "LOCAL_KEY"
    assert sorted(local.models) == ["a", "b", "c"]
    models = s.get("providers.local.models")
    assert {"id": "a", "contextWindow": 2000} in models and {"id": "a", "contextWindow": 1000} not in models
    assert "other" in s.providers
    assert s.agent_overrides_by_provider["local"] == {"worker": "local/c", "scout": "local/b"}


def test_explicit_values_are_tracked() -> None:
    # docs/spec-conformance.md §10 item 18: default-filled values must not look explicit
    s = build_settings([{"legion": {"phaseTimeouts": {"implementing": 120_000}}}])
    assert s.is_explicit("legion.phaseTimeouts.implementing")
    assert s.is_explicit("legion.phaseTimeouts") and s.is_explicit("legion")
    assert not s.is_explicit("legion.phaseTimeouts.planning")
    assert s.get("legion.phaseTimeouts.planning") == PHASE_TIMEOUTS_MS["planning"]
    assert not s.is_explicit("legion.maxDepth")


def test_phase_timeout_clock_source_chain() -> None:
    # docs/spec-conformance.md §10 item 18 / §5.8: card 300000 beats a default 3600000; an explicit operator value beats the card
    default = build_settings([{}])
    assert default.phase_timeout_ms("implementing", card_timeout_ms=300_000) == 300_000
    assert default.phase_timeout_ms("implementing") == 3_600_000
    assert default.phase_timeout_ms("custom-phase") == 0
    assert default.phase_timeout_ms("custom-phase", card_timeout_ms=5) == 5
    operator = build_settings([{"legion": {"phaseTimeouts": {"implementing": 7_200_000}}}])
    assert operator.phase_timeout_ms("implementing", card_timeout_ms=300_000) == 7_200_000
    assert operator.phase_timeout_ms("reviewing", card_timeout_ms=300_000) == 300_000


_CENTURION_WITH_TIMEOUTS = """name: centurion
phases:
  phases:
    - {id: planning, next: [implementing]}
    - {id: implementing, next: [done], timeoutMs: 300000}
    - {id: done, terminal: true}"""


@pytest.mark.parametrize(
    ("operator", "expected"),
    [
        (None, 300_000),  # no settings file: the card beats the default-filled 3600000
        ({"legion": {"maxDepth": 5}}, 300_000),  # a legion block without phaseTimeouts
        ({"legion": {"phaseTimeouts": {"planning": 1000}}}, 300_000),  # another phase written
        ({"legion": {"phaseTimeouts": {"implementing": 3_600_000}}}, 3_600_000),  # written = explicit
        ({"legion": {"phaseTimeouts": {"implementing": 0}}}, 0),  # an operator may switch it off
    ],
)
def test_regression_18_card_timeout_vs_default_and_explicit_operator_value(
    env: dict[str, str],
    project: Path,
    user_dir: Path,
    write_card: Callable[..., Path],
    write_settings: Callable[[Path, dict[str, Any]], Path],
    operator: dict[str, Any] | None,
    expected: int,
) -> None:
    # docs/spec-conformance.md §10 item 18, through the real files: card on disk, operator settings in the user file
    write_card(project / ".legion" / "agents", "centurion.md", _CENTURION_WITH_TIMEOUTS)
    if operator is not None:
        write_settings(user_dir / "settings.json", operator)
    settings = load_settings(project, env=env)
    centurion = load_catalog(project, env=env, settings=settings).require("centurion")
    assert centurion.source == "project" and centurion.phases is not None
    timeouts = phase_timeouts_ms(centurion.phases, settings)
    assert timeouts["implementing"] == expected
    assert timeouts["planning"] == (1000 if operator and "planning" in str(operator) else 900_000)
    assert "done" not in timeouts


def test_default_model_inherit_is_rejected_at_parse_time() -> None:
    # docs/spec-conformance.md §10 item 37
    with pytest.raises(SettingsError, match=r"defaultModel: 'inherit' is not allowed here"):
        parse_settings_bytes(b'{"defaultModel": "inherit"}', path="/s.json")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (
            {"legion": {"maxDepht": 3}},
            r"legion.maxDepht: unknown key 'maxDepht' in legion — did you mean 'maxDepth'\?",
        ),
        ({"inproces": {}}, r"inproces: unknown key 'inproces' in settings — did you mean 'inprocess'\?"),
        ({"supervision": {"maxRestart": 1}}, r"supervision.maxRestart: .*did you mean 'maxRestarts'\?"),
        ({"legion": {"maxDepth": 0}}, r"legion.maxDepth: must be an integer between 1 and 64"),
        (
            {"legion": {"phaseTimeouts": {"planning": "15m"}}},
            r"legion.phaseTimeouts.planning: must be an integer",
        ),
        (
            {"legion": {"phaseTimeouts": {"Bad Phase": 1}}},
            r"legion.phaseTimeouts.Bad Phase: must match a phase id",
        ),
        ({"enabled": "yes"}, r"enabled: must be true or false"),
        ({"inprocess": {"maxActive": 0}}, r"inprocess.maxActive: must be an integer between 1"),
        ({"defaultModel": "gpt-4o"}, r"defaultModel: must be a model of the form"),
        (
            {"teams": {"alpha": {"members": [{"model": "openai/x"}]}}},
            r"teams.alpha.members\[0\].role: is required",
        ),
        ({"teams": {"alpha": {"membres": []}}}, r"teams.alpha.membres: .*did you mean 'members'\?"),
        ({"presets": {"fast": {"modle": "openai/x"}}}, r"presets.fast.modle: .*did you mean 'model'\?"),
        ({"presets": {"fast": {"kind": "docker"}}}, r"presets.fast.kind: must be one of: native, pi"),
        (
            {"agentOverrides": {"worker": {"toolBudget": -1}}},
            r"agentOverrides.worker.toolBudget: must be an integer",
        ),
        (
            {"agentOverridesByProvider": {"openai": {"worker": {"model": ""}}}},
            r"agentOverridesByProvider.openai.worker.model: must be a non-empty string",
        ),
        (
            {"agentOverridesByProvider": {"openai": {"worker": {"model": 3}}}},
            r"agentOverridesByProvider.openai.worker.model: must be a string",
        ),
        (
            {"agentOverridesByProvider": {"openai": {"worker": {"thinking": "high"}}}},
            r"agentOverridesByProvider.openai.worker.thinking: unknown key .*model only",
        ),
        (
            {"providers": {"local": {"baseUrl": "ftp://x"}}},
            r"providers.local.baseUrl: must match an http\(s\)",
        ),
        ({"providers": {"local": {"apiKeyEnv": "not valid"}}}, r"providers.local.apiKeyEnv: must match"),
        (
            {"providers": {"local": {"models": [{"name": "x"}]}}},
            r"providers.local.models\[0\].id: is required",
        ),
        ({"retentionDays": -1}, r"retentionDays: must be an integer between 0 and 3650"),
        ({"team": "ghost"}, r"team: unknown team 'ghost'"),
        (
            {"teams": {"a": {"members": [{"role": "worker", "preset": "fsat"}]}}, "presets": {"fast": {}}},
            r"teams.a.members\[0\].preset: unknown preset 'fsat' — did you mean 'fast'\?",
        ),
        (
            {"agentOverrides": {"worker": {"preset": "nope"}}},
            r"agentOverrides.worker.preset: unknown preset 'nope'",
        ),
        (
            {"supervision": {"backoffBaseMs": 9000}},
            r"supervision.backoffBaseMs: the restart backoff starts at 9000 ms but is capped at 5000 ms",
        ),
    ],
)
def test_bad_settings_name_the_full_dotted_path(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        build_settings([parse_settings_bytes(json.dumps(data).encode(), path="/x/settings.json")])


def test_errors_name_the_file(
    env: dict[str, str], project: Path, write_settings: Callable[[Path, dict[str, Any]], Path]
) -> None:
    path = write_settings(project / ".legion" / "settings.json", {"legion": {"maxDepth": "deep"}})
    with pytest.raises(SettingsError) as info:
        load_settings(project, env=env)
    assert info.value.dotted == "legion.maxDepth" and info.value.line is not None
    assert str(info.value).startswith(f"{path}:{info.value.line}: legion.maxDepth:")
    assert '"maxDepth"' in path.read_text().splitlines()[info.value.line - 1]


@pytest.mark.parametrize(
    ("raw", "needle", "line"),
    [
        (b"\xff\xfe\x00garbage", "not valid UTF-8", 1),
        (b'{\n  "team": "a",\n  "x": "\xc3\x28"\n}', "not valid UTF-8", 3),
        (b"{not json", "invalid JSON at column 2", 1),
        (b'{\r\n"enabled": true,\r\n\r\n"team": }', "invalid JSON", 4),
        (b"[1, 2]", "must be a JSON object", 1),
        (b'{\n"a": 1,\n"a": 2}', "duplicate key 'a'", 3),
        (b"[" * 100_000 + b"]" * 100_000, "invalid JSON", 1),
        (b"NaN", "must be a JSON object", 1),
        (b'{\n "legion": {\n  "maxDepth": 1e400}}', "legion.maxDepth: must be an integer", 3),
        (b'\xef\xbb\xbf{\r\n "legion":\r\n  {"maxDeptj": 3}}', "did you mean 'maxDepth'", 3),
    ],
)
def test_arbitrary_bytes_give_a_clear_error_with_file_and_line(raw: bytes, needle: str, line: int) -> None:
    with pytest.raises(SettingsError, match=needle) as info:
        parse_settings_bytes(raw, path="/x.json")
    assert (info.value.path, info.value.line) == ("/x.json", line)
    assert str(info.value).startswith(f"/x.json:{line}: ")


def test_empty_file_is_empty_settings() -> None:
    assert parse_settings_bytes(b"  \n", path="/x.json") == {}


def test_a_directory_in_place_of_the_file_is_a_clear_error(env: dict[str, str], project: Path) -> None:
    (project / ".legion" / "settings.json").mkdir()
    with pytest.raises(SettingsError, match="cannot read settings"):
        load_settings(project, env=env)


def test_every_default_lives_in_the_schema() -> None:
    defaults = SETTINGS_SPEC.defaults()
    for key in (
        "enabled",
        "legion",
        "inprocess",
        "supervision",
        "retentionDays",
        "eventRetentionDays",
        "eventMaxRows",
    ):
        assert key in defaults
    assert defaults["inprocess"] == {
        "maxQueuedLaunches": 32,
        "launchQueueTimeoutMs": 900_000,
        "startTimeoutMs": 15_000,
    }


def test_settings_reads_no_process_environment(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    project: Path,
    tmp_path: Path,
    write_settings: Callable[[Path, dict[str, Any]], Path],
) -> None:
    decoy = tmp_path / "decoy"
    write_settings(decoy / "legion" / "settings.json", {"defaultModel": "openai/decoy"})
    monkeypatch.setenv("XDG_CONFIG_HOME", str(decoy))
    assert load_settings(project, env=env).default_model is None
    assert load_settings(project, env={**env, "XDG_CONFIG_HOME": str(decoy)}).default_model == "openai/decoy"


def test_typed_views_match_the_dotted_values() -> None:
    s = build_settings([{"legion": {"maxDepth": 3, "phaseTimeouts": {"review2": 5}}, "eventMaxRows": 5000}])
    g = s.legion
    assert (g.max_depth, g.max_children_per_node, g.max_active_nodes, g.mail_rate_per_5min) == (3, 8, 30, 10)
    assert g.phase_timeouts_ms == {**PHASE_TIMEOUTS_MS, "review2": 5}
    assert (g.worktree_bootstrap, g.worktree_bootstrap_timeout_ms, g.usage_poll_ms) == ("", 600_000, 30_000)
    r = s.retention
    assert (r.retention_days, r.event_retention_days, r.event_max_rows) == (14, 30, 5000)


def test_build_settings_rejects_bad_programmatic_input_cleanly() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5000):
        node["legion"] = {}
        node = node["legion"]
    with pytest.raises(SettingsError):
        build_settings([deep])
    with pytest.raises(SettingsError, match="must be an object"):
        build_settings([cast(Any, ["not", "a", "mapping"])])
    with pytest.raises(SettingsError) as info:
        build_settings([{}, {"legion": {"maxDepth": 0}}], sources=["user.json", "project.json"])
    assert str(info.value).startswith("project.json: legion.maxDepth")


def test_reference_lists_every_key_with_its_default() -> None:
    from legion.agents import card_reference, settings_reference

    rows = {path: (kind, default) for path, kind, default, _ in settings_reference()}
    assert rows["legion.maxDepth"] == ("integer between 1 and 64", 4)
    assert rows["inprocess.maxActive"][1] == 30
    assert rows["supervision.forceRpc"] == ("boolean", False)
    assert rows["legion.phaseTimeouts"][1] == PHASE_TIMEOUTS_MS
    assert "teams.<name>.members[].role" in rows and "providers.<name>.models[].cost.input" in rows
    assert "agentOverridesByProvider.<name>.<name>.model" in rows
    cards = {path for path, _, _ in card_reference()}
    assert {"model", "acceptance.level", "acceptance.criteria[].command", "restartPeriodMs"} <= cards
