"""Prices (configured, genai-prices, unknown), the thinking-level table and provider-entry checks."""

from __future__ import annotations

import pytest
from genai_prices import Usage, calc_price

from legion.workers.providers.base import ProviderError
from legion.workers.providers.config import parse_entry
from legion.workers.providers.pricing import closest, cost_usd, known_models
from legion.workers.providers.thinking import THINKING_TABLE, choose


@pytest.mark.parametrize(("provider", "model"), [("anthropic", "claude-sonnet-4-5"), ("anthropic", "claude-haiku-4-5"),
                                                 ("openai", "gpt-4o"), ("openai", "gpt-5")])
def test_library_price_matches_genai_prices(provider: str, model: str) -> None:
    got = cost_usd(provider, model, None, input=1000, output=400, cache_read=5000, cache_write=700)
    want = calc_price(Usage(input_tokens=6700, output_tokens=400, cache_read_tokens=5000, cache_write_tokens=700),
                      model, provider_id=provider).total_price
    assert got == pytest.approx(float(want)) and got is not None and got > 0


def test_unknown_model_or_provider_costs_none_not_zero() -> None:
    assert cost_usd("anthropic", "claude-does-not-exist-9", None, input=10, output=10) is None
    assert cost_usd("my-vllm", "qwen", None, input=10, output=10, base_url="http://127.0.0.1:9/v1") is None


def test_configured_cost_overrides_the_library() -> None:
    cost = {"input": 2.0, "output": 8.0, "cacheRead": 0.5}
    got = cost_usd("openai", "gpt-4o", cost, input=1_000_000, output=500_000, cache_read=2_000_000, cache_write=1000)
    assert got == pytest.approx(2.0 + 4.0 + 1.0 + 1000 * 2.0 / 1e6)  # a missing cacheWrite price is the input price
    assert cost_usd("x", "m", {"input": 0, "output": 0}, input=5, output=5) == 0.0  # free is known, not unknown


def test_closest_known_models() -> None:
    assert "claude-sonnet-4-5" in closest("claude-sonet-4-5", known_models("anthropic"))
    assert known_models("no-such-provider") == ()


def test_thinking_table_and_downgrades() -> None:
    assert choose("anthropic-messages", "anthropic", "m", "medium").value == 8192
    assert choose("anthropic-messages", "anthropic", "m", None).value is None
    high = choose("anthropic-messages", "anthropic", "m", "xhigh")
    assert (high.level, high.value) == ("high", 16384) and high.warning and "using 'high'" in high.warning
    effort = choose("openai-completions", "openai", "gpt-5", "xhigh")
    assert (effort.level, effort.value) == ("high", "high")
    off = choose("openai-completions", "local", "m", "low", reasoning=False)
    assert off.value is None and off.warning and "reasoning: false" in off.warning
    assert set(THINKING_TABLE["anthropic-messages"]) == set(THINKING_TABLE["openai-completions"])


def test_entry_checks_name_the_key() -> None:
    with pytest.raises(ProviderError, match="baseUrl is required"):
        parse_entry("mine", {"models": ["a"]})
    with pytest.raises(ProviderError, match="maxRetries must be a non-negative integer"):
        parse_entry("openai", {"maxRetries": -1})
    with pytest.raises(ProviderError, match=r"models\['a'\].cost"):
        parse_entry("openai", {"models": [{"id": "a", "cost": {"input": "cheap"}}]})
    groq = parse_entry("groq", {})
    assert groq.key_env == "GROQ_API_KEY" and groq.url({}) == "https://api.groq.com/openai/v1"
    anthropic = parse_entry("anthropic", {})
    assert anthropic.url({"ANTHROPIC_BASE_URL": "http://proxy/"}) == "http://proxy"
    assert anthropic.key({"ANTHROPIC_API_KEY": ""})[1] and "set but empty" in (anthropic.key({"ANTHROPIC_API_KEY": ""})[1] or "")


USAGES = [(0, 0, 0, 0), (1000, 400, 5000, 700), (150_000, 2000, 60_000, 0), (199_999, 1, 0, 1), (200_000, 1, 0, 0),
          (200_001, 10, 0, 0), (10, 3_000_000, 0, 0), (300_000, 1000, 500_000, 100_000)]


@pytest.mark.parametrize("provider", ["anthropic", "openai", "google"])
def test_cached_rates_equal_the_library_for_every_model_and_tier(provider: str) -> None:
    """The per-price rates (a dot product per call) give genai-prices' own total, across tier thresholds."""
    from genai_prices import data_snapshot

    models = next(p.models for p in data_snapshot.get_snapshot().providers if p.id == provider)
    checked = 0
    for model in models:
        for i, o, cr, cw in USAGES:
            try:
                want = float(calc_price(Usage(input_tokens=i + cr + cw, output_tokens=o, cache_read_tokens=cr or None,
                                              cache_write_tokens=cw or None), model.id, provider_id=provider).total_price)
            except Exception:
                continue  # a price the library itself cannot compute for these counts
            got = cost_usd(provider, model.id, None, input=i, output=o, cache_read=cr, cache_write=cw)
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (model.id, (i, o, cr, cw))
            checked += 1
    assert checked > 20


def test_a_tiered_price_switches_band_above_the_threshold() -> None:
    below = cost_usd("anthropic", "claude-sonnet-4-5", None, input=200_000, output=0)
    above = cost_usd("anthropic", "claude-sonnet-4-5", None, input=200_001, output=0)
    assert below == pytest.approx(200_000 * 3 / 1e6) and above == pytest.approx(200_001 * 6 / 1e6)
