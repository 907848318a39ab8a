"""Timing summaries shared by the bench sections: median and spread of repeated measurements."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def summary_us(samples_us: Sequence[float]) -> dict[str, float]:
    """``{"median_us", "min_us", "max_us"}`` of per-call times in µs."""
    return {"median_us": statistics.median(samples_us), "min_us": min(samples_us), "max_us": max(samples_us)}


def batch_us(fn: Callable[[], object], calls: int) -> float:
    """µs per call of `calls` back-to-back calls of `fn` (one batch)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) * 1e6 / calls


def alternating_batch_us(first: Callable[[], object], second: Callable[[], object], calls: int) -> float:
    """µs per call of `calls` back-to-back calls alternating `first` and `second` (one batch)."""
    pairs, odd = divmod(calls, 2)
    t0 = time.perf_counter()
    for _ in range(pairs):
        first()
        second()
    if odd:
        first()
    return (time.perf_counter() - t0) * 1e6 / calls


def ratio(a: float, b: float) -> float:
    """a / b, infinity when b is 0 (JSON writes it as Infinity)."""
    return a / b if b else float("inf")
