"""The documented serving loop, run long: every step a model's new activations and new expert outputs
(Tensors made that step and dropped without ``close()``, or host arrays), a dispatch and a combine
through MoeDistributeBuffer, 2 ranks. After warm-up nothing may grow: the mock's live descriptors, the
memory pool's bytes in use, and the process's resident memory.

The default run is short (enough steps to show a leak of one object per step); the CI stage runs the
same loop for 20 000 steps (marker ``soak``):

    pytest -m soak tests/test_serving_soak.py
"""

from __future__ import annotations

import os
import threading
from typing import Any

import ml_dtypes
import numpy as np
import pytest

E, BS, H, K = 4, 8, 1024, 2
SETS = 4  # distinct input sets, in turn (a model's activations differ every step)


def _inputs(rank: int, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng([rank, i])
    x = rng.uniform(-1, 1, (BS, H)).astype(ml_dtypes.bfloat16)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    return x, ids, rng.uniform(0, 1, (BS, K)).astype(np.float32)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _serve(rank: int, world_size: int, root: bytes, steps: int, device_inputs: bool, samples: list[Any],
           quiet: threading.Barrier, every: int) -> list[bytes]:
    """`steps` steps of the serving loop; every `every` steps (rank 0) a sample of what lives. Returns
    x_out's bytes of the last step of each input set."""
    import aclnn_py as acl
    from aclnn_py import _mock

    sets = [_inputs(rank, i) for i in range(SETS)]
    last: list[bytes] = [b""] * SETS
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device(rank).create_stream()
        for step in range(steps):
            x, ids, w = sets[step % SETS]
            if device_inputs:  # new activations every step, never closed
                x, ids, w = (acl.Tensor.from_numpy(a, stream=s) for a in (x, ids, w))
            else:  # new host arrays every step
                x, ids, w = x.copy(), ids.copy(), w.copy()
            out = buf.low_latency_dispatch(x, ids, E, topk_weights=w, stream=s)
            # the experts' output: a new Tensor each step (an identity expert), never closed
            expert_out = out.expand_x.clone(stream=s) if device_inputs else out.expand_x.numpy(stream=s)
            y = buf.low_latency_combine(expert_out, ids, w, out.assist_info_for_combine, out.ep_recv_counts,
                                        num_experts=E, stream=s)
            if step >= steps - SETS:
                last[step % SETS] = y.numpy(stream=s).tobytes()
            if step % every == every - 1:  # both ranks quiet (their holds released), rank 0 samples
                del x, ids, w, out, expert_out, y
                s.synchronize()
                quiet.wait()
                if rank == 0:
                    samples.append((step + 1, _mock.stats()["tensors"], acl.get_memory_pool().used_bytes(),
                                    _rss_bytes()))
                quiet.wait()
                continue
            del x, ids, w, out, expert_out, y
        s.synchronize()
        comm.barrier()
        s.close()
    return last


def _expected(rank: int) -> list[bytes]:
    """Identity experts: x_out = x · Σ weights, as the golden computes it."""
    from aclnn_py import golden

    xs, ids, ws = zip(*[_inputs(r, i) for i in range(SETS) for r in range(2)])
    out = []
    for i in range(SETS):
        pick = [2 * i, 2 * i + 1]
        _, comb = golden.round_trip([xs[j] for j in pick], [ids[j] for j in pick], lambda r, d: d.expand_x,
                                    moe_expert_num=E, expert_scales=[ws[j] for j in pick])
        out.append(comb[rank].x_out.tobytes())
    return out


def _soak(acl: Any, steps: int, device_inputs: bool) -> None:
    samples: list[Any] = []
    every = max(steps // 20, 50)
    results = acl.worlds.run_threads(_serve, 2, steps, device_inputs, samples, threading.Barrier(2), every,
                                     timeout=1800)
    for rank, last in enumerate(results):
        assert last == _expected(rank), f"rank {rank}: x_out differs from the golden"
    warm = [smp for smp in samples if smp[0] > steps // 4]   # after warm-up
    assert len(warm) >= 6, samples
    third = len(warm) // 3
    early, late = warm[:third], warm[-third:]
    # flat: what the last third of the run reaches, the first third already reached (a leak of one object
    # per step would add `every` descriptors between samples; what queued work holds comes and goes)
    for i, what, slack in ((1, "live descriptors", 8), (2, "the pool's bytes in use", 64 << 10),
                           (3, "resident memory", 2 << 20)):
        assert max(s[i] for s in late) <= max(s[i] for s in early) + slack, f"{what} grew: {samples}"


@pytest.mark.parametrize("device_inputs", [True, False], ids=["device-tensors", "host-arrays"])
def test_serving_loop_holds_nothing_per_step(acl: Any, device_inputs: bool) -> None:
    _soak(acl, 1200, device_inputs)


@pytest.mark.soak
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("device_inputs", [True, False], ids=["device-tensors", "host-arrays"])
def test_serving_loop_soak(acl: Any, device_inputs: bool) -> None:
    _soak(acl, 20_000, device_inputs)
