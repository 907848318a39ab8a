"""Rank function and inputs of tests/ops/test_large_world.py: one full dispatch → combine round per rank,
the expert output being the dispatch output itself (so the combine result is fixed by the inputs)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

BS, H, K = 2, 1024, 2


def inputs(rank: int, world_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (BS, H) bf16, expert ids (BS, K) int32 (distinct per row, E = world_size), weights (BS, K)."""
    from ml_dtypes import bfloat16

    rng = np.random.default_rng([seed, rank])
    x = rng.standard_normal((BS, H), dtype=np.float32).astype(bfloat16)
    ids = np.stack([rng.choice(world_size, K, replace=False) for _ in range(BS)]).astype(np.int32)
    w = rng.random((BS, K), dtype=np.float32)
    return x, ids, w


def _dispatch_combine(ctx: Any, ccl: int, rank: int, world_size: int, x: np.ndarray, ids: np.ndarray,
                      w: np.ndarray) -> dict[str, Any]:
    """One dispatch and one combine on a new stream (the expert output is expand_x itself): the
    bytes to check."""
    from aclnn_py import Device
    from aclnn_py.ops import prepare_combine, prepare_dispatch

    stream = Device.current().create_stream()
    try:
        kw = dict(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=world_size, ccl_buffer_size=ccl,
                  stream=stream)
        p = prepare_dispatch(ctx, x, ids, expert_scales=w, **kw)
        p.launch(stream)
        stream.synchronize()
        o = p.result
        n = int(o.ep_recv_counts.numpy()[-1])
        q = prepare_combine(ctx, o.expand_x, ids, o.assist_info_for_combine, o.ep_recv_counts, w, **kw)
        q.launch(stream)
        stream.synchronize()
        return {"expand_x": o.expand_x.numpy()[:n].tobytes(), "x_out": q.result.numpy().tobytes(), "n": n}
    finally:
        stream.close()


def round_rank(rank: int, world_size: int, root: bytes, seed: int, timings: dict[str, Any],
               lock: threading.Lock) -> dict[str, Any]:
    import time

    from aclnn_py.hccl import Communicator, build_context

    x, ids, w = inputs(rank, world_size, seed)
    t0 = time.monotonic()
    with Communicator(world_size, rank, root) as comm:
        t1 = time.monotonic()
        ctx, ccl = build_context(comm)
        t2 = time.monotonic()
        out = _dispatch_combine(ctx, ccl, rank, world_size, x, ids, w)
        t3 = time.monotonic()
    with lock:   # when the first rank started, and when the last rank finished each phase
        timings["start"] = min(timings.get("start", t0), t0)
        for k, v in (("joined", t1), ("context", t2), ("round", t3)):
            timings[k] = max(timings.get(k, v), v)
    return out


def process_round(rank: int, world_size: int, root: bytes, seed: int, bs: int, h: int, k: int) -> dict[str, Any]:
    """A rank of a process world (aclnn_py.worlds.spawn): the same round at (bs, h, k); returns the
    bytes to check, when each phase ended (monotonic clock, shared by the processes of one machine)
    and this process's peak RSS."""
    import resource
    import time

    from aclnn_py.hccl import Communicator, build_context

    x, ids, w = process_inputs(rank, world_size, seed, bs, h, k)
    stamps = {"start": time.monotonic()}
    with Communicator(world_size, rank, root) as comm:
        stamps["joined"] = time.monotonic()
        ctx, ccl = build_context(comm)
        out = _dispatch_combine(ctx, ccl, rank, world_size, x, ids, w)
        stamps["round"] = time.monotonic()
    out["stamps"] = stamps
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def process_inputs(rank: int, world_size: int, seed: int, bs: int, h: int,
                   k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from ml_dtypes import bfloat16

    rng = np.random.default_rng([seed, rank, bs, h, k])
    x = rng.standard_normal((bs, h), dtype=np.float32).astype(bfloat16)
    ids = np.stack([rng.choice(world_size, k, replace=False) for _ in range(bs)]).astype(np.int32)
    w = rng.random((bs, k), dtype=np.float32)
    return x, ids, w
