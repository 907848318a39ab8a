"""Throughput: one full round (dispatch + combine, plans, processes) on the mock at a reference
model, against the memcpy floor (copying the bytes the round moves, measured in the same run) and
the numpy golden of the same round. The rank function is shared with the scaling sweep."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from . import memory
from .progress import SILENT, Progress
from .stats import ratio
from .world_rounds import RANK_MODULES

REFERENCE = dict(world_size=8, tokens=128, hidden=7168, topk=8, experts=64, quant_mode=2)
QUICK = dict(world_size=4, tokens=16, hidden=2048, topk=4, experts=16, quant_mode=2)


def model_label(m: dict[str, int]) -> str:
    """A round's model in words, for progress, the text summary and the table title."""
    return (f"W = {m['world_size']} processes, {m['tokens']} tokens/rank, H = {m['hidden']}, K = {m['topk']}, "
            f"{m['experts']} experts, quant {m['quant_mode']}, bf16")


def round_inputs(m: dict[str, int], rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank `rank`'s x (bf16), expert ids and weights for model `m`, a pure function of both."""
    from aclnn_py.dtypes import bfloat16

    rng = np.random.default_rng([7, rank])
    x = rng.uniform(-1, 1, (m["tokens"], m["hidden"])).astype(np.float32).astype(bfloat16)
    ids = np.stack([rng.choice(m["experts"], m["topk"], replace=False) for _ in range(m["tokens"])]).astype(np.int32)
    w = rng.uniform(0, 1, (m["tokens"], m["topk"])).astype(np.float32)
    return x, ids, w


def round_rank(rank: int, world_size: int, root: bytes, m: dict[str, int], rounds: int) -> dict[str, Any]:
    """One rank of `rounds` timed rounds (after one warm-up) through MoeDistributeBuffer plans."""
    import aclnn_py as acl
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator

    dev = acl.Device.current()  # the launcher made rank % device_count current
    stream = dev.create_stream()
    x, ids, w = round_inputs(m, rank)
    bf16 = acl.dtypes.bfloat16
    times = []
    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        xt, idt, wt = (acl.Tensor.from_numpy(a) for a in (x, ids, w))
        dplan = buf.plan_dispatch(m["tokens"], m["hidden"], m["experts"], m["topk"], x_dtype=bf16,
                                  quant_mode=m["quant_mode"], with_weights=True)
        cplan = buf.plan_combine(dplan, with_weights=True, num_experts=m["experts"])
        y = acl.Tensor.zeros(dplan.outputs.expand_x.shape, bf16)
        for i in range(rounds + 1):
            comm.barrier(stream)
            stream.synchronize()
            t0 = time.perf_counter()
            out = dplan(xt, idt, expert_scales=wt, stream=stream)
            cplan(y, idt, out.assist_info_for_combine, out.ep_recv_counts, wt, stream=stream)
            stream.synchronize()
            if i:  # the first round warms up
                times.append(time.perf_counter() - t0)
        n = int(dplan.outputs.ep_recv_counts.numpy()[-1])
        h = m["hidden"]
        row_d = h * (1 if m["quant_mode"] else 2) + 4 + 12 + 4  # data, scale, triple, weight
        moved = n * row_d + n * h * 2  # dispatch in, combine back
        comm.barrier(stream)  # every rank has ended its last round before memory is read
        stream.synchronize()
        # the world's windows are still mapped here: what the rounds touched, and this rank's share
        shm_mb = memory.windows_mb()
        pss = memory.pss_mb()
        comm.barrier(stream)  # nobody unmaps before every rank has measured
        stream.synchronize()
        dplan.close()
        cplan.close()
    stream.close()
    return {"times": times, "bytes_moved": moved, "shm_mb": shm_mb, "pss_mb": pss,
            "peak_rss_mb": memory.peak_rss_mb()}


def memcpy_floor(nbytes: int, repeats: int = 7) -> float:
    """Seconds to copy `nbytes` once with numpy (a single large memcpy), median of repeats."""
    src = np.ones(max(nbytes, 1), np.uint8)
    dst = np.empty_like(src)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def golden_round_seconds(m: dict[str, int], repeats: int = 1) -> float:
    """Seconds of :func:`aclnn_py.golden.round_trip` on the same inputs (median of repeats)."""
    from aclnn_py import golden

    inputs = [round_inputs(m, r) for r in range(m["world_size"])]
    xs, ids, ws = [i[0] for i in inputs], [i[1] for i in inputs], [i[2] for i in inputs]

    def expert(rank: int, d: Any) -> np.ndarray:
        return np.zeros((d.num_rows, m["hidden"]), xs[0].dtype)

    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        golden.round_trip(xs, ids, expert, moe_expert_num=m["experts"], quant_mode=m["quant_mode"], expert_scales=ws)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run_world(m: dict[str, int], rounds: int, processes: bool = True, timeout: float = 900) -> dict[str, Any]:
    """`rounds` timed rounds of model `m` on W ranks; a round ends when its last rank does."""
    from aclnn_py.worlds import run_threads, spawn

    if processes:
        res = spawn(round_rank, m["world_size"], m, rounds, timeout=timeout, preload=RANK_MODULES)
    else:
        res = run_threads(round_rank, m["world_size"], m, rounds, timeout=timeout)
    per_round = [max(r["times"][i] for r in res) for i in range(rounds)]
    return {
        "round_s": {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)},
        "bytes_moved": sum(r["bytes_moved"] for r in res),
        "peak_rss_mb_per_rank": max(r["peak_rss_mb"] for r in res),
        "pss_mb_total": sum(r["pss_mb"] for r in res),
        "shm_mb": max(r["shm_mb"] for r in res),
    }


def throughput(m: dict[str, int], rounds: int = 5, golden: bool = True, progress: Progress = SILENT) -> dict[str, Any]:
    """The reference round against the memcpy floor and the golden."""
    progress(f"throughput: {rounds} timed rounds ({model_label(m)})")
    r = run_world(m, rounds)
    floor = memcpy_floor(r["bytes_moved"])
    if golden:
        progress("throughput: numpy golden of the same round")
    gold = golden_round_seconds(m) if golden else float("nan")
    med = r["round_s"]["median"]
    return {
        "model": m, "processes": True, "round_s": r["round_s"], "bytes_moved": r["bytes_moved"],
        "memcpy_floor_s": floor, "golden_round_s": gold,
        "round_over_memcpy_floor": ratio(med, floor), "golden_over_round": ratio(gold, med),
        "peak_rss_mb_per_rank": r["peak_rss_mb_per_rank"], "pss_mb_total": r["pss_mb_total"],
        "shm_touched_mb": r["shm_mb"],
    }
