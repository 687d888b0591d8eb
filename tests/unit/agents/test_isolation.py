"""Context objects never touch os.environ (docs/spec-conformance.md §1.3, §3.5) and the workers can consume our output."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from legion.agents import build_settings

AGENTS = Path(__file__).resolve().parents[3] / "agents"


def test_only_the_documented_selection_point_reads_os_environ() -> None:
    offenders = []
    for path in sorted(AGENTS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "unsetenv"):
                name = node.attr
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                name = ",".join(a.name for a in node.names if a.name in ("environ", "getenv", "putenv"))
            if name:
                where = f"{path.name}:{getattr(node, 'lineno', 0)}"
                if where.split(":")[0] != "locations.py" or name != "environ":
                    offenders.append(f"{where} uses os.{name}")
    assert offenders == [], offenders
    assert "return os.environ" in (AGENTS / "locations.py").read_text()


def test_provider_settings_feed_the_workers_provider_registry() -> None:
    registry_mod = pytest.importorskip("legion.workers.providers.registry")
    s = build_settings(
        [
            {
                "providers": {
                    "local": {
                        "baseUrl": "http://127.0.0.1:9/v1",
                        "apiKeyEnv": "LOCAL_KEY",
                        "models": ["m1", {"id": "m2", "cost": {"input": 1, "output": 2}}],
                    }
                },
            }
        ]
    )
    providers = s.get("providers")
    assert providers["local"]["apiKey"] == "LOCAL_KEY" and "apiKeyEnv" not in providers["local"]
    assert providers["local"]["models"] == [{"id": "m1"}, {"id": "m2", "cost": {"input": 1.0, "output": 2.0}}]
    registry = registry_mod.ProviderRegistry(providers)
    assert {"local", "openai", "scripted"} <= set(registry.known)


def test_conflicting_api_key_names_are_refused() -> None:
    from legion.agents import SettingsError

    with pytest.raises(
        SettingsError, match=r"providers\.local: apiKey and apiKeyEnv name different variables"
    ):
        build_settings([{"providers": {"local": {"apiKey": "A", "apiKeyEnv": "B"}}}])


def test_user_dir_without_home_in_the_env_does_not_consult_the_process_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pwd

    from legion.agents import user_config_dir

    monkeypatch.setenv("HOME", str(tmp_path / "decoy"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "decoy-xdg"))
    expected = Path(pwd.getpwuid(__import__("os").getuid()).pw_dir) / ".config" / "legion"
    assert user_config_dir({}) == expected
    assert user_config_dir({"XDG_CONFIG_HOME": "relative/ignored", "HOME": "/h"}) == Path("/h/.config/legion")
