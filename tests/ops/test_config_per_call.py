"""A compiled operator call launches with its own MoeConfig, whoever else calls the same operator at
the same time: four threads (two worlds of two ranks) call dispatch on its compiled path with four
configs that differ per world in expert_token_nums_type, alternating shapes, with the interpreter
switching threads as often as it can and garbage collections whose finalizers yield the GIL. Every
call must give the bytes its own config gives (counts in one world, running sums in the other). The
operator's spec caches the last config: a launch that read another thread's would show here. (Whether
a collection lands inside the few C statements between reading the config and launching is up to the
interpreter; the compiled call copies what it reads of the config once, so no such moment exists.)"""

from __future__ import annotations

import gc
import sys
import threading
import time

import numpy as np

from aclnn_py.dtypes import bfloat16

W, H, K, E, STEPS = 2, 1024, 2, 4, 150


class _Yields:
    """Cyclic garbage whose finalizer lets another thread run (in the middle of whatever call the
    collection interrupted)."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


def _rank(rank: int, root: bytes, token_nums_type: int, start: threading.Barrier) -> list[str]:
    import aclnn_py as acl
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import MoeConfig, moe_distribute_dispatch
    from aclnn_py.ops.dispatch import allocate_outputs

    acl.Device(rank).set_current()
    problems: list[str] = []
    with Communicator(W, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = acl.Device(rank).create_stream()
        cfg = MoeConfig(ep_world_size=W, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl,
                        expert_token_nums_type=token_nums_type)
        rng = np.random.default_rng(rank)
        calls = []
        for bs in (4, 2):  # two shapes: the spec's pre-check key changes on every call
            x = acl.Tensor.from_numpy(rng.uniform(-1, 1, (bs, H)).astype(bfloat16))
            ids = acl.Tensor.from_numpy(np.tile(np.arange(K, dtype=np.int32), (bs, 1)) + rank * K)
            outs = allocate_outputs(cfg, x, ids, None, None, False, None)
            moe_distribute_dispatch(ctx, x, ids, config=cfg, outputs=outs, stream=s)  # a first launch: Python
            s.synchronize()
            calls.append((x, ids, outs, outs.expert_token_nums.numpy().tobytes()))
        start.wait()
        for step in range(STEPS):
            x, ids, outs, want = calls[step % 2]
            _Yields()
            moe_distribute_dispatch(ctx, x, ids, config=cfg, outputs=outs, stream=s)
            s.synchronize()
            got = outs.expert_token_nums.numpy().tobytes()
            if got != want:
                problems.append(f"step {step}: expert_token_nums {np.frombuffer(got, np.int64)}, "
                                f"want {np.frombuffer(want, np.int64)}")
        s.close()
        ctx.close()
    return problems


def test_each_call_launches_with_its_own_config(acl):
    from aclnn_py.hccl import RootInfo

    worlds = [(RootInfo.create(), token_nums_type) for token_nums_type in (0, 1)]
    start = threading.Barrier(2 * W)
    results: dict[tuple[int, int], list[str]] = {}
    errors: list[BaseException] = []

    def run(world: int, rank: int) -> None:
        root, token_nums_type = worlds[world]
        try:
            results[(world, rank)] = _rank(rank, bytes(root), token_nums_type, start)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            start.abort()

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(1, 1, 1)
    try:
        threads = [threading.Thread(target=run, args=(w, r)) for w in range(2) for r in range(W)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    assert not errors, errors[0]
    assert len(results) == 2 * W
    for where, problems in results.items():
        assert not problems, f"world {where[0]}, rank {where[1]}: {problems[:3]}"
