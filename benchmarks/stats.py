"""Timing summaries shared by the bench sections: median and spread of repeated measurements."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def summary_us(samples_us: Sequence[float]) -> dict[str, float]:
    """``{"median_us", "min_us", "max_us"}`` of per-call times in µs."""
    return {"median_us": statistics.median(samples_us), "min_us": min(samples_us), "max_us": max(samples_us)}


def ratio(a: float, b: float) -> float:
    """a / b, infinity when b is 0 (JSON writes it as Infinity)."""
    return a / b if b else float("inf")
