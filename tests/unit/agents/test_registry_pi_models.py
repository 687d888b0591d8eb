"""The model registry knows pi's models.json providers, so a pi user's models resolve without warnings."""

from __future__ import annotations

import json
from pathlib import Path

from legion.agents.registry import ModelRegistry, pi_models_path, read_pi_models
from legion.agents.settings import build_settings


def test_pi_models_json_providers_are_known(tmp_path: Path) -> None:
    (tmp_path / "models.json").write_text(json.dumps({"providers": {
        "ollama": {"baseUrl": "http://127.0.0.1:11434/v1", "models": [{"id": "llama3.1:8b"}]},
        "proxy": {"baseUrl": "http://h"}}}))
    env = {"PI_CODING_AGENT_DIR": str(tmp_path), "HOME": str(tmp_path / "home")}
    assert pi_models_path(env) == tmp_path / "models.json"
    settings = build_settings([{"providers": {"proxy": {"baseUrl": "http://h", "models": ["only"]}}}])
    reg = ModelRegistry.from_settings(settings, env=env)
    assert reg.warnings_for("ollama/llama3.1:8b:high") == []
    assert reg.warnings_for("proxy/other")[0].startswith("Using custom model id.")  # settings win per provider
    assert reg.warnings_for("anthropic/claude-sonnet-4-5") == []


def test_default_location_and_broken_file(tmp_path: Path) -> None:
    assert pi_models_path({"HOME": str(tmp_path)}) == tmp_path / ".pi" / "agent" / "models.json"
    (tmp_path / "models.json").write_text("{broken")
    read = read_pi_models(tmp_path / "models.json")
    assert read.providers == {} and read.problem and "not valid JSON" in read.problem
    reg = ModelRegistry.from_settings(build_settings([]), pi_models=read)
    assert "Unknown provider 'ollama'" in reg.warnings_for("ollama/x")[0]
