"""Latency/throughput summaries shared by the benchmarks (min, median, p95, max)."""

from __future__ import annotations

import statistics


def p95(ordered: list[float]) -> float:
    """Nearest-rank 95th percentile of an already sorted, non-empty list."""
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def summary(values: list[float], *, count: bool = False) -> dict[str, float]:
    """min/median/p95/max of `values` rounded to 3 places, plus the sample count `n` when `count`."""
    ordered = sorted(values)
    out: dict[str, float] = {
        "min": round(ordered[0], 3),
        "median": round(statistics.median(ordered), 3),
        "p95": round(p95(ordered), 3),
        "max": round(ordered[-1], 3),
    }
    if count:
        out["n"] = len(ordered)
    return out
