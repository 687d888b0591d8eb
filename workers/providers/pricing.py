"""The price of one model call: a configured per-model ``cost`` wins, else ``genai-prices``, else unknown.

A configured cost is in $ per million tokens (pi's ``models.json`` shape: ``input``, ``output``,
``cacheRead``, ``cacheWrite``; a missing cache price is charged at the input price). A model neither
configured nor known to ``genai-prices`` costs ``None`` — unknown, never 0 — so summaries can say so and
a cost budget can count its tokens instead.
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
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
    found = _priced_model(provider, model_id, base_url)
    if found is None:
        return None
    try:
        price = found[1].get_prices(datetime.now(UTC))
        return _rates(price).cost(input, output, cache_read, cache_write)
    except Exception as exc:  # a pricing bug must not fail a model call
        logger.warning("genai-prices failed for {}/{}: {!r}", provider, model_id, exc)
        return None


# A usage snapshot comes once per model call, but genai-prices' general calculation (unit registry,
# usage decomposition, Decimal) costs ~80 µs — more than the rest of a streamed turn's parsing. A price
# is affine in the four token counts between its tier thresholds (a tier applies its rate to all tokens
# once the prompt is larger than its start), so the library is asked once per price and tier for the
# cost of no tokens and of a million of each kind; a call's cost is then a dot product.
_MTOK: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class _Rates:
    """USD per call and per token of each kind, as genai-prices charges one untiered price."""

    base: float
    input: float
    output: float
    cache_read: float
    cache_write: float

    def cost(self, input: int, output: int, cache_read: int, cache_write: int) -> float:
        return (self.base + input * self.input + output * self.output + cache_read * self.cache_read
                + cache_write * self.cache_write)


@dataclass(frozen=True, slots=True)
class _Tiers:
    """One ``_Rates`` per prompt-size band: ``bands[k]`` holds while k tier starts lie below the prompt."""

    starts: tuple[int, ...]
    bands: tuple[_Rates, ...]

    def cost(self, input: int, output: int, cache_read: int, cache_write: int) -> float:
        band = bisect.bisect_left(self.starts, input + cache_read + cache_write)
        return self.bands[band].cost(input, output, cache_read, cache_write)


_MODELS: dict[tuple[int, str, str, str | None], tuple[Any, Any] | None] = {}
_RATES: dict[int, tuple[Any, _Tiers]] = {}  # id(price) -> (the price, kept alive; its rates)


def _priced_model(provider: str, model_id: str, base_url: str | None) -> tuple[Any, Any] | None:
    """genai-prices' (provider, model) for a call — by provider id, then by API URL — or None (cached)."""
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    key = (id(snapshot), provider, model_id, base_url)
    if key in _MODELS:
        return _MODELS[key]
    found = None
    for provider_id, url in ((price_provider_id(provider), None), (None, base_url)):
        if provider_id is None and url is None:
            continue
        try:
            found = snapshot.find_provider_model(model_id, None, provider_id, url)
            break
        except LookupError:
            continue
    if len(_MODELS) >= 1024:
        _MODELS.clear()
    _MODELS[key] = found
    return found


def _rates(price: Any) -> _Tiers:
    """The per-token rates of a price in each tier band, computed once per price object."""
    entry = _RATES.get(id(price))
    if entry is not None and entry[0] is price:
        return entry[1]
    rates = _tier_rates(price)
    if len(_RATES) >= 1024:
        _RATES.clear()
    _RATES[id(price)] = (price, rates)
    return rates


def _tier_rates(price: Any) -> _Tiers:
    from genai_prices.types import ModelPrice, TieredPrices

    prices = {k: v for k, v in vars(price).items() if v is not None}
    starts = sorted({t.start for v in prices.values() if isinstance(v, TieredPrices) for t in v.tiers})

    def band(total_input: int) -> _Rates:
        flat = {k: _tier_price(v, total_input) if isinstance(v, TieredPrices) else v for k, v in prices.items()}
        return _basis_rates(ModelPrice(**flat))

    return _Tiers(tuple(starts), tuple(band(start) for start in [0, *(s + 1 for s in starts)]))


def _tier_price(price: Any, total_input: int) -> Any:
    """The rate genai-prices applies for a prompt of ``total_input`` tokens (its ``calc_unit_price``)."""
    return next((t.price for t in reversed(price.tiers) if total_input > t.start), price.base)


def _basis_rates(price: Any) -> _Rates:
    from genai_prices import Usage

    def total(input: int = 0, output: int = 0, cache_read: int = 0, cache_write: int = 0) -> float:
        usage = Usage(input_tokens=input + cache_read + cache_write, output_tokens=output,
                      cache_read_tokens=cache_read or None, cache_write_tokens=cache_write or None)
        return float(price.calc_price(usage)["total_price"])

    base = total()
    return _Rates(base, (total(input=_MTOK) - base) / _MTOK, (total(output=_MTOK) - base) / _MTOK,
                  (total(cache_read=_MTOK) - base) / _MTOK, (total(cache_write=_MTOK) - base) / _MTOK)


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
