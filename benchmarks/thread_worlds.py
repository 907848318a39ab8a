"""Thread worlds: dispatch → expert → combine rounds through MoeDistributeBuffer with the W ranks as
threads of one process (:mod:`.world_rounds`), up to the largest worlds each SoC profile allows (A3:
768, Ascend950: 1024), checked against :mod:`aclnn_py.golden`: start-up, warm-up and steady rounds
(device Tensors, host arrays), teardown, the process's peak memory, and the growth per doubling of W.

Each world runs in a child process of its own, so its peak memory is its own, the SoC switch
(``_mock.set_soc``) stays there, and a crash or hang of the mock becomes a row with the reason.
When a size fails, smaller ones (halving) are tried until one works, so the section always
reports the largest size that runs today next to the failure.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import memory
from .progress import SILENT, Progress
from .scaling import short_reason, worlds_up_to
from .world_rounds import WorldRounds, growth_per_doubling, rank_rounds, summarize

DEFAULT_WORLDS = ("A3:64-768", "950:128-1024")
SOC_ALIASES = {"a3": "Ascend910_93", "ascend910_93": "Ascend910_93", "950": "Ascend950", "ascend950": "Ascend950"}


@dataclass(frozen=True)
class ThreadWorld:
    """One thread world: SoC profile, ranks, and the (small) model; experts = W."""

    soc: str
    world_size: int
    tokens: int = 1
    hidden: int = 1024
    topk: int = 1

    def rounds(self) -> WorldRounds:
        return WorldRounds(self.world_size, self.tokens, self.hidden, self.topk, experts=self.world_size,
                           keep_outputs=True, memory_of_rank0_only=True, c_loop=True)


def parse_world(spec: str) -> list[tuple[str, int]]:
    """``"A3:768"`` → [(SoC profile name, 768)]; ``"A3:64-768"`` → the sizes doubling from 64 up to 768."""
    soc, sep, w = spec.partition(":")
    name = SOC_ALIASES.get(soc.strip().lower())
    low, dash, high = w.strip().partition("-")
    if not sep or name is None or not low.isdigit() or (dash and not high.isdigit()) \
            or int(low) < 2 or (dash and int(high) < int(low)):
        raise ValueError(f"thread world {spec!r}: expected SOC:W or SOC:W1-W2 (W doubling from W1 up to W2) with "
                         "SOC one of A3, Ascend910_93, 950, Ascend950 and 2 <= W1 <= W2")
    if not dash:
        return [(name, int(low))]
    return [(name, size) for size in worlds_up_to(int(high), smallest=int(low))]


def _child(rank: int, world_size: int, root: bytes, tw: ThreadWorld, timeout: float) -> dict[str, Any]:
    """The child process (a world of one): switch the SoC profile, run the W threads, report each rank."""
    from aclnn_py import _mock
    from aclnn_py.worlds import run_threads

    _mock.set_soc(tw.soc)
    t_launch = time.perf_counter()
    ranks = run_threads(rank_rounds, tw.world_size, tw.rounds(), t_launch, timeout=timeout, share_one_cpu=True)
    return {"ranks": ranks, "t_end": time.perf_counter()}


def golden_mismatches(tw: ThreadWorld, ranks: list[dict[str, Any]]) -> list[int]:
    """Ranks whose expand_x, assist info, receive counts or x_out differ from the golden's bytes."""
    from aclnn_py import golden
    from aclnn_py.tools.demo import expert_ffn, rank_inputs

    m = tw.rounds().demo_model()
    inputs = [rank_inputs(m, r) for r in range(tw.world_size)]

    def fn(rank: int, d: golden.DispatchResult) -> np.ndarray:
        return expert_ffn(m, rank, d.expand_x, None, d.expert_token_nums)

    def field(name: str) -> list[np.ndarray]:
        arrays = [getattr(i, name) for i in inputs]
        assert all(a is not None for a in arrays)  # the model has weights and no mask
        return arrays

    g_disp, g_comb = golden.round_trip(field("x"), field("ids"), fn, expert_scales=field("weights"),
                                       moe_expert_num=m.experts, soc=tw.soc)
    bad = []
    for r, (res, gd, gc) in enumerate(zip(ranks, g_disp, g_comb)):
        same = (res["expand_x"].tobytes() == gd.expand_x.tobytes()
                and np.array_equal(res["assist"], gd.assist_info_for_combine)
                and np.array_equal(res["ep_recv_counts"], gd.ep_recv_counts)
                and res["x_out"][gc.written].tobytes() == gc.x_out[gc.written].tobytes())
        if not same:
            bad.append(r)
    return bad


def run_thread_world(tw: ThreadWorld, timeout: float, connect_timeout: float | None = None) -> dict[str, Any]:
    """One thread world in a child process, checked against the golden; a row with figures, or with
    ``error`` when it failed."""
    from aclnn_py.worlds import spawn

    row: dict[str, Any] = {**asdict(tw), "experts": tw.world_size}
    saved = os.environ.get("HCCL_CONNECT_TIMEOUT")
    if connect_timeout is not None:  # the child reads it when its world forms
        os.environ["HCCL_CONNECT_TIMEOUT"] = str(connect_timeout)
    t0 = time.perf_counter()
    try:
        child = spawn(_child, 1, tw, timeout, timeout=timeout + 60)[0]
    except Exception as exc:  # noqa: BLE001 - the failure of this size is the row
        row.update(error=short_reason(exc), wall_s=time.perf_counter() - t0)
        return row
    finally:
        if connect_timeout is not None:
            if saved is None:
                os.environ.pop("HCCL_CONNECT_TIMEOUT", None)
            else:
                os.environ["HCCL_CONNECT_TIMEOUT"] = saved
    ranks = child["ranks"]
    row.update(summarize(tw.rounds(), ranks, child["t_end"]))
    # the process's peak as rank 0 read it after the rounds: the C loop's executors, made later, have
    # outputs of their own, which are not the buffer's
    row.update(peak_rss_mb=row["peak_rss_mb_per_rank"], wall_s=time.perf_counter() - t0)
    g0 = time.perf_counter()
    bad = golden_mismatches(tw, ranks)
    row.update(golden_s=time.perf_counter() - g0, golden_match=not bad, mismatched_ranks=bad[:16])
    return row


def memory_refusal(rows: list[dict[str, Any]], soc: str, size: int, reserve_mb: float) -> str | None:
    """Why a world of `size` threads is not run, or None: its memory estimated from the largest smaller
    world of the same profile that ran, growing as W² (every rank holds outputs sized by the W ranks it
    may receive from), does not fit in MemAvailable minus `reserve_mb`."""
    ran = [r for r in rows if r["soc"] == soc and "error" not in r and r["world_size"] < size]
    if not ran:
        return None
    prev = max(ran, key=lambda r: r["world_size"])
    need = prev["peak_rss_mb"] * (size / prev["world_size"]) ** 2
    avail = memory.available_mb()
    if need <= avail - reserve_mb:
        return None
    return (f"not run: about {need:.0f} MiB needed (W = {prev['world_size']} took {prev['peak_rss_mb']:.0f} MiB, "
            f"x (W / {prev['world_size']})^2), {avail:.0f} MiB available, {reserve_mb:.0f} MiB kept in reserve")


def thread_worlds(worlds: list[tuple[str, int]], tokens: int = 1, hidden: int = 1024, topk: int = 1,
                  timeout: float = 900.0, connect_timeout: float | None = None, fallback: bool = True,
                  smallest: int = 16, reserve_mb: float = 4096.0,
                  progress: Progress = SILENT) -> list[dict[str, Any]]:
    """For each (SoC, W): a row per attempted size. On a failure and with `fallback`, W is halved
    (not below `smallest`) until a size works; every attempt is a row."""
    rows: list[dict[str, Any]] = []
    for soc, w in worlds:
        size = w
        while True:
            tw = ThreadWorld(soc=soc, world_size=size, tokens=tokens, hidden=hidden, topk=topk)
            too_big = memory_refusal(rows, soc, size, reserve_mb)
            if too_big is not None:
                rows.append({**asdict(tw), "experts": size, "requested_world_size": w, "error": too_big})
                progress(f"thread world: {soc} W={size} not run (memory)")
                break
            progress(f"thread world: {soc} W={size} threads (BS={tokens}, H={hidden}, K={topk}, E={size})")
            row = run_thread_world(tw, timeout, connect_timeout)
            row["requested_world_size"] = w
            rows.append(row)
            if "error" in row:
                progress(f"thread world: {soc} W={size} failed: {row['error']}")
            else:
                progress(f"thread world: {soc} W={size} start-up {row['startup_s']:.2f} s, steady round "
                         f"{row['round_ms']:.1f} ms (host arrays {row['host_round_ms']:.1f} ms), peak RSS "
                         f"{row['peak_rss_mb']:.0f} MiB, golden {'match' if row['golden_match'] else 'MISMATCH'}")
            if "error" not in row or not fallback or size // 2 < smallest:
                break
            size //= 2
    for soc in dict.fromkeys(soc for soc, _ in worlds):
        growth_per_doubling([r for r in rows if r["soc"] == soc])
    return rows
