"""Thread ranks that use their devices' default streams (stream=None) must not share per-stream
state: the NULL handle names a different stream on every device (regression: one workspace was
shared by all devices' default streams, so concurrent ranks corrupted each other's rounds)."""

from __future__ import annotations

from typing import Any

import numpy as np

from aclnn_py import golden
from aclnn_py.dtypes import bfloat16
from aclnn_py.worlds import run_threads


def _inputs(rank: int, rnd: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng([rank, rnd])
    x = rng.uniform(-1, 1, (8, 1024)).astype(bfloat16)
    ids = np.stack([rng.choice(8, 4, replace=False) for _ in range(8)]).astype(np.int32)
    w = rng.uniform(0, 1, (8, 4)).astype(np.float32)
    return x, ids, w


def _rank(rank: int, world_size: int, root: bytes, rounds: int) -> list[np.ndarray]:
    import aclnn_py as acl

    outs = []
    with acl.hccl.Communicator(world_size, rank, root) as comm:
        buf = acl.MoeDistributeBuffer(comm)
        for rnd in range(rounds):
            x, ids, w = _inputs(rank, rnd)
            d = buf.low_latency_dispatch(x, ids, 8, topk_weights=w)          # default stream
            buf.synchronize()
            y = buf.low_latency_combine(d.expand_x.numpy(), ids, w, d.assist_info_for_combine,
                                        d.ep_recv_counts, num_experts=8)
            buf.synchronize()
            outs.append(y.numpy())
    return outs


def test_thread_ranks_on_default_streams_match_golden(acl: Any) -> None:
    world, rounds = 2, 8
    got = run_threads(_rank, world, rounds, timeout=120)
    for rnd in range(rounds):
        ins = [_inputs(r, rnd) for r in range(world)]
        _, comb = golden.round_trip([i[0] for i in ins], [i[1] for i in ins], lambda r, d: d.expand_x,
                                    moe_expert_num=8, expert_scales=[i[2] for i in ins])
        for r in range(world):
            assert got[r][rnd].tobytes() == comb[r].x_out.tobytes(), (rnd, r)
