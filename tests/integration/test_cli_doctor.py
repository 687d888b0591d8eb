"""`legion doctor` as a process: `--json` with every check (the spawn probe is a real fork server), and the models
section from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

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


@pytest.mark.timeout(60)
def test_cli_json_output(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "legion", "-C", str(tmp_path), "doctor", "--json"],
        capture_output=True, timeout=50,
    )
    assert out.returncode == 0, out.stderr
    rows = orjson.loads(out.stdout)
    assert all(set(r) == {"name", "status", "detail", "fix"} for r in rows)


@pytest.mark.timeout(60)
def test_cli_models_section(tmp_path: Path) -> None:
    env = {**os.environ, **_project(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "legion", "-C", str(tmp_path), "doctor", "models", "--json"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1, out.stderr  # the broken pi provider and the unknown one fail
    names = {c["name"] for c in orjson.loads(out.stdout)}
    assert {"provider anthropic", "provider openai", "card worker"} <= names and "python" not in names
    assert SECRET not in out.stdout and SECRET not in out.stderr
