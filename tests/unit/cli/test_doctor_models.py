"""`legion doctor models`: every provider, whether its key is present (never the key), each card's model."""

from __future__ import annotations

import json
from pathlib import Path

from legion.cli import doctor

SECRET = "sk-ant-very-secret-value"


def _project(tmp_path: Path) -> dict[str, str]:
    """A project whose worker card runs on anthropic, a pi models.json with a custom provider and a broken one."""
    (tmp_path / ".legion").mkdir()
    (tmp_path / ".legion" / "settings.json").write_text(json.dumps({
        "agentOverrides": {"worker": {"model": "anthropic/claude-sonnet-4-5:high"},
                           "scout": {"model": "ollama/llama3.1:8b"},
                           "planner": {"model": "nowhere/model-x"}},
        "providers": {"local": {"baseUrl": "http://127.0.0.1:9/v1", "apiKey": "LOCAL_KEY", "models": ["m"]}}}))
    pi = tmp_path / "pi-agent"
    pi.mkdir()
    (pi / "models.json").write_text(json.dumps({"providers": {
        "ollama": {"baseUrl": "http://127.0.0.1:11434/v1", "api": "openai-completions", "apiKey": "ollama",
                   "models": [{"id": "llama3.1:8b"}]},
        "broken": {"baseUrl": "http://h", "apiKeyy": "X"}}}))
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
            "PI_CODING_AGENT_DIR": str(pi), "ANTHROPIC_API_KEY": SECRET, "LOCAL_KEY": ""}


def test_models_section_lists_providers_keys_and_cards(tmp_path: Path) -> None:
    env = _project(tmp_path)
    checks = {c.name: c for c in doctor.model_checks(tmp_path, env=env)}
    assert checks["provider anthropic"].status == "ok" and "ANTHROPIC_API_KEY is set" in checks["provider anthropic"].detail
    assert checks["provider openai"].status == "off" and "OPENAI_API_KEY is not set" in checks["provider openai"].detail
    assert "LOCAL_KEY is set but empty" in checks["provider local"].detail
    assert "no key needed" not in checks["provider ollama"].detail and "literal key" in checks["provider ollama"].detail
    assert checks["provider broken"].status == "fail" and "apiKeyy" in checks["provider broken"].detail
    assert checks["card worker"].status == "ok" and "anthropic/claude-sonnet-4-5:high" in checks["card worker"].detail
    assert checks["card scout"].status == "ok" and "ollama/llama3.1:8b" in checks["card scout"].detail
    # a local model nobody prices is named as such; a priced one is not
    assert "price unknown" in checks["card scout"].detail and "providers.ollama" in checks["card scout"].detail
    assert "price unknown" not in checks["card worker"].detail
    assert checks["card planner"].status == "fail" and "unknown provider 'nowhere'" in checks["card planner"].detail
    assert all(SECRET not in c.detail and SECRET not in c.fix for c in checks.values())
    assert doctor.exit_code(list(checks.values())) == 1


def test_missing_key_for_a_used_provider_warns_with_the_variable(tmp_path: Path) -> None:
    env = _project(tmp_path)
    del env["ANTHROPIC_API_KEY"]
    checks = {c.name: c for c in doctor.model_checks(tmp_path, env=env)}
    assert checks["provider anthropic"].status == "warn" and "export ANTHROPIC_API_KEY" in checks["provider anthropic"].fix
    assert checks["card worker"].status == "warn" and "ANTHROPIC_API_KEY is not set" in checks["card worker"].detail


def test_bad_provider_settings_are_one_clear_failure(tmp_path: Path) -> None:
    (tmp_path / ".legion").mkdir()
    (tmp_path / ".legion" / "settings.json").write_text(json.dumps({"providers": {"x": {"baseUrl": "ftp://nope"}}}))
    checks = doctor.model_checks(tmp_path, env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "x"),
                                                 "PI_CODING_AGENT_DIR": str(tmp_path / "none")})
    assert len(checks) == 1 and checks[0].status == "fail" and "baseUrl" in checks[0].detail
