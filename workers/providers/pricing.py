"""The price of one model call: a configured per-model ``cost`` wins, else ``genai-prices``, else unknown.

A configured cost is in $ per million tokens (pi's ``models.json`` shape: ``input``, ``output``,
``cacheRead``, ``cacheWrite``; a missing cache price is charged at the input price). A model neither
configured nor known to ``genai-prices`` costs ``None`` — unknown, never 0 — so summaries can say so and
a cost budget can count its tokens instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final

from loguru import logger

# legion/pi provider names whose genai-prices id differs
_PRICE_PROVIDER_IDS: Final = {"xai": "x-ai", "gemini": "google", "google-generative-ai": "google"}


def price_provider_id(provider: str) -> str:
    return _PRICE_PROVIDER_IDS.get(provider, provider)


def configured_cost(cost: Mapping[str, Any], *, input: int, output: int, cache_read: int,
                    cache_write: int) -> float | None:
    """Cost from a ``{input, output, cacheRead, cacheWrite}`` $/M-token table (None if it is malformed)."""
    try:
        p_in = float(cost.get("input", 0))
        p_out = float(cost.get("output", 0))
        p_read = float(cost.get("cacheRead", p_in))
        p_write = float(cost.get("cacheWrite", p_in))
    except (TypeError, ValueError):
        return None
    return (input * p_in + output * p_out + cache_read * p_read + cache_write * p_write) / 1e6


def library_cost(provider: str, model_id: str, *, input: int, output: int, cache_read: int, cache_write: int,
                 base_url: str | None = None) -> float | None:
    """Cost from genai-prices (input excludes cache tokens here, as Anthropic and legion count it)."""
    from genai_prices import Usage, calc_price

    usage = Usage(input_tokens=input + cache_read + cache_write, output_tokens=output,
                  cache_read_tokens=cache_read or None, cache_write_tokens=cache_write or None)
    attempts: list[dict[str, str]] = [{"provider_id": price_provider_id(provider)}]
    if base_url:
        attempts.append({"provider_api_url": base_url})
    for how in attempts:
        try:
            return float(calc_price(usage, model_id, **how).total_price)  # type: ignore[call-overload]
        except LookupError:
            continue
        except Exception as exc:  # a pricing bug must not fail a model call
            logger.warning("genai-prices failed for {}/{}: {!r}", provider, model_id, exc)
            return None
    return None


def cost_usd(provider: str, model_id: str, override: Mapping[str, Any] | None, *, input: int, output: int,
             cache_read: int = 0, cache_write: int = 0, base_url: str | None = None) -> float | None:
    """The call's cost in USD, or None when the price is unknown."""
    counts = {"input": input, "output": output, "cache_read": cache_read, "cache_write": cache_write}
    if isinstance(override, Mapping):
        return configured_cost(override, **counts)
    return library_cost(provider, model_id, base_url=base_url, **counts)


@lru_cache(maxsize=64)
def known_models(provider: str) -> tuple[str, ...]:
    """Model ids genai-prices knows for a provider (empty when it knows none)."""
    from genai_prices import data_snapshot

    for p in data_snapshot.get_snapshot().providers:
        if p.id == price_provider_id(provider):
            return tuple(m.id for m in p.models)
    return ()


def closest(model_id: str, candidates: tuple[str, ...] | list[str], n: int = 3) -> list[str]:
    """The known ids nearest to ``model_id`` (for "unknown model" errors)."""
    return difflib.get_close_matches(model_id, list(candidates), n=n, cutoff=0.4)
