"""Scaling over process worlds: W = 2, 4, 8, … processes up to ``--max-world`` at a small batch, each
rank running :mod:`.world_rounds` (start-up, warm-up and steady rounds through MoeDistributeBuffer
with device Tensors and with host arrays, teardown, memory), and the growth per doubling of W. A size
that fails (or would not fit in the machine's memory) ends the sweep with a row saying why, instead of
aborting the bench."""

from __future__ import annotations

import re
import time
from typing import Any

from . import memory
from .progress import SILENT, Progress
from .world_rounds import RANK_MODULES, WorldRounds, growth_per_doubling, rank_rounds, summarize

FIRST_GUESS_MB_PER_RANK = 64.0  # before any size has run: a rank process of the mock, roughly
HEADROOM = 1.5                  # a size's memory is estimated from the previous one, with margin


def worlds_up_to(max_world: int, smallest: int = 2) -> list[int]:
    """2, 4, 8, … doubling up to `max_world`, which ends the list even when not a power of two."""
    out = []
    w = smallest
    while w < max_world:
        out.append(w)
        w *= 2
    if max_world >= smallest:
        out.append(max_world)
    return out


def buffsize_mb() -> int:
    import os

    return int(os.environ.get("HCCL_BUFFSIZE", "200"))


_RANK_LIST = re.compile(r"\[((?:\d+, ){4})[^\]]*(?:\]|$)")  # a list of more than four rank numbers


def shorten_rank_lists(text: str) -> str:
    """``[3, 5, 8, 9, 12, ... (40 more)]`` → ``[3, 5, 8, 9, …]``: the counts elsewhere in a message
    say how many; a table cell has no room for hundreds of ranks."""
    return _RANK_LIST.sub(lambda m: f"[{m.group(1)}…]", text)


def short_reason(exc: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message`, long rank lists shortened, cut to `limit` characters (the
    rank's traceback is not wanted in a table)."""
    text = shorten_rank_lists(str(exc).strip().splitlines()[0]) if str(exc).strip() else ""
    msg = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"


def world_timeout(w: int) -> float:
    """Seconds allowed for one world of `w` processes: start-up grows with W on two cores."""
    return 120.0 + 3.0 * w


def run_process_world(spec: WorldRounds, timeout: float) -> dict[str, Any]:
    """One process world of `spec`'s rounds, summarized."""
    from aclnn_py.worlds import spawn

    t_launch = time.perf_counter()
    ranks = spawn(rank_rounds, spec.world_size, spec, t_launch, timeout=timeout, preload=RANK_MODULES)
    return summarize(spec, ranks, time.perf_counter())


def scaling(worlds: list[int], tokens: int = 8, hidden: int = 2048, topk: int = 4, rounds: int = 0,
            reserve_mb: float = 4096.0, progress: Progress = SILENT) -> list[dict[str, Any]]:
    """One row per world size, each with `rounds` steady rounds (0: :func:`~.world_rounds.steady_rounds`
    of its size);
    the first failure (or a size estimated not to fit in MemAvailable minus `reserve_mb`) is the last row,
    with ``error`` instead of figures."""
    out: list[dict[str, Any]] = []
    per_rank_mb = FIRST_GUESS_MB_PER_RANK
    for w in worlds:
        row: dict[str, Any] = {"world_size": w, "tokens": tokens, "hidden": hidden, "topk": topk}
        need, avail = w * per_rank_mb * HEADROOM, memory.available_mb()
        if need > avail - reserve_mb:
            row["error"] = (f"not run: about {need:.0f} MiB needed ({per_rank_mb:.0f} MiB per rank at the previous "
                            f"size x {HEADROOM}), {avail:.0f} MiB available, {reserve_mb:.0f} MiB kept in reserve")
            out.append(row)
            progress(f"scaling: W={w} not run (memory)")
            break
        spec = WorldRounds(w, tokens, hidden, topk, experts=2 * w, rounds=rounds)
        progress(f"scaling: W={w} processes, {spec.rounds} steady rounds (BS={tokens}, H={hidden}, K={topk}, "
                 f"E={2 * w})")
        t0 = time.perf_counter()
        try:
            r = run_process_world(spec, timeout=world_timeout(w))
        except Exception as exc:  # noqa: BLE001 - any failure of one size is reported as its row
            row.update(error=short_reason(exc), wall_s=time.perf_counter() - t0)
            out.append(row)
            progress(f"scaling: W={w} failed: {row['error']}")
            break
        row.update(r, window_mb_per_rank=2 * buffsize_mb(), wall_s=time.perf_counter() - t0)
        out.append(row)
        if r["pss_mb_total"] > 0:
            per_rank_mb = r["pss_mb_total"] / w
    growth_per_doubling(out)
    return out
