"""Bad input through `legion run` (issue 14's acceptance list): an HTML page instead of JSON from either
provider, a malformed pi models.json, a provider block with unknown keys, a key variable set but empty. Each
run ends with a clear reason recorded in the root's transcript (or a clear settings error before it starts),
never a crash or a hang, and nothing the user wrote is changed."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.harness import Outcome, messages, project
from tests.e2e.test_providers import run_async, stub_provider

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from anthropic_stub import AnthropicStub
from anthropic_stub import Reply as AnthropicReply
from openai_stub import OpenAIStub, Reply

pytestmark = pytest.mark.timeout(90)
HTML = "<!doctype html><html><head><title>Sign in</title></head><body>Corporate proxy login</body></html>"


@pytest.fixture
async def anthropic_stub() -> AsyncIterator[AnthropicStub]:
    stub = await AnthropicStub().start()
    yield stub
    await stub.close()


def _root_failure(out: Outcome) -> str:
    """The run failed, and the root's transcript records why (the reason a person reads)."""
    assert out.code != 0, out.explain()
    last = messages(out.run_dir / "root.jsonl")[-1]
    assert last["role"] == "assistant" and last["stopReason"] == "error", last
    return str(last.get("errorMessage") or "")


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_an_html_page_instead_of_json_ends_the_run_with_the_reason(
        api: str, stubs: tuple[OpenAIStub, OpenAIStub], anthropic_stub: AnthropicStub) -> None:
    with project() as proj:
        if api == "openai":
            stubs[0].default = Reply(content_type="text/html", body=HTML)
            proj.settings({"providers": {"openai": stub_provider(stubs[0], "gpt-test")}})
            model = "openai/gpt-test"
        else:
            anthropic_stub.default = AnthropicReply(content_type="text/html", body=HTML)
            proj.settings({"providers": {"anthropic": {"baseUrl": anthropic_stub.base_url, "apiKey": "STUB_KEY"}}})
            model = "anthropic/claude-sonnet-4-5"
        out = await run_async(proj, "hello", "--model", model, env={"STUB_KEY": "sk-e2e"})
        reason = _root_failure(out)
        assert "HTML page" in reason and "baseUrl" in reason, reason
        assert "HTML page" in out.stdout + out.stderr, out.explain()
        assert "Traceback" not in out.stdout + out.stderr


async def test_a_malformed_pi_models_json_is_named_and_left_as_it_was(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    with project() as proj:
        agent_dir = proj.dir / "pi-agent"
        agent_dir.mkdir()
        broken = '{"providers": {"ollama": {"baseUrl": "http://127.0.0.1:11434/v1", "models": [{"id": "llama3"}]'
        (agent_dir / "models.json").write_text(broken)
        out = await run_async(proj, "hello", "--model", "ollama/llama3", env={"PI_CODING_AGENT_DIR": str(agent_dir)})
        # refused before the run starts (legion/prepare.py): the provider it would have defined is unknown
        assert out.code == 2 and not out.run_dir.exists(), out.explain()
        assert "not valid JSON" in out.stderr and str(agent_dir / "models.json") in out.stderr, out.explain()
        assert (agent_dir / "models.json").read_text() == broken  # read only: nothing lost


async def test_a_provider_block_with_unknown_keys_is_a_clear_error(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    with project() as proj:
        proj.settings({"providers": {"openai": {"baseURL": stubs[0].base_url, "apiKey": "STUB_KEY"}}})
        out = await run_async(proj, "hello", "--model", "openai/gpt-test", env={"STUB_KEY": "sk-e2e"})
        assert out.code != 0 and "Traceback" not in out.stdout + out.stderr, out.explain()
        assert "baseURL" in out.stdout + out.stderr and "baseUrl" in out.stdout + out.stderr, out.explain()
        assert stubs[0].requests == []


async def test_a_key_variable_set_but_empty_names_the_variable(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    with project() as proj:
        proj.settings({"providers": {"openai": stub_provider(stubs[0], "gpt-test")}})
        out = await run_async(proj, "hello", "--model", "openai/gpt-test", env={"STUB_KEY": ""})
        assert out.code == 2 and not out.run_dir.exists(), out.explain()  # refused before it starts
        assert "STUB_KEY is set but empty" in out.stderr and stubs[0].requests == [], out.explain()
