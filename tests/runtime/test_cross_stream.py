"""Work queued on one stream reads what work queued before it on another stream wrote, with no event in
the caller's code: a dispatch on stream s1 and a combine on s2 give the right bytes on every rank when
one rank is late (its peers' dispatch outputs are still being written when the combine is queued), for
the buffer API, the operators (their compiled steady state included) and plans; a copy into a Tensor
lands after a pending write on another stream; a download on a given stream waits for the writer."""

from __future__ import annotations

import numpy as np
import pytest

from aclnn_py.dtypes import bfloat16

W, BS, H, K, E = 2, 8, 1024, 4, 8
LATE = 0.5  # seconds rank 1's dispatch is delayed: rank 0's dispatch outputs stay unwritten that long


def _inputs(rank, round_=0):
    rng = np.random.default_rng(rank + 10 * round_)
    x = rng.uniform(-1, 1, (BS, H)).astype(bfloat16)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    w = rng.uniform(0, 1, (BS, K)).astype(np.float32)
    return x, ids, w


def _round(route, rank, world_size, root, two_streams):
    import aclnn_py as acl
    from aclnn_py import _mock
    from aclnn_py.ops import CombinePlan, DispatchPlan, MoeConfig
    from aclnn_py.ops.dispatch import allocate_outputs

    with acl.hccl.Communicator(world_size, rank, root) as comm:
        buf = acl.MoeDistributeBuffer(comm)
        dev = acl.Device(rank)
        s1 = dev.create_stream()
        s2 = dev.create_stream() if two_streams else s1
        # two sets of inputs, so that reading the outputs of the round before is a wrong answer
        sets = [tuple(acl.Tensor.from_numpy(a) for a in _inputs(rank, i)) for i in range(2)]
        xt, idt, wt = sets[0]
        cfg = MoeConfig(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=E,
                        ccl_buffer_size=buf.ccl_buffer_size)
        plans = None
        if route == "plan":
            dp = DispatchPlan(buf.context, bs=BS, hidden=H, topk=K, x_dtype=bfloat16, config=cfg,
                              with_expert_scales=True, stream=s1)
            o = dp.outputs
            cp = CombinePlan(buf.context, a=o.expand_x.shape[0], bs=BS, hidden=H, topk=K, dtype=bfloat16,
                             assist_len=o.assist_info_for_combine.shape[0], counts_len=o.ep_recv_counts.shape[0],
                             config=cfg, with_expert_scales=True, stream=s2)
            plans = dp, cp
        outs = allocate_outputs(cfg, xt, idt, wt, None, False, None), acl.Tensor.empty((BS, H), bfloat16)
        # the last round is the steady state (a stream's first launch takes the Python path, a Tensor's
        # first use makes its descriptor); only it has a late rank
        for i, late in ((0, False), (1, False), (0, two_streams)):
            if late and rank == 1:
                _mock.inject_fault("dispatch", rank=1, kind="delay", seconds=LATE)
            y = _one_round(route, buf, cfg, sets[i], outs, (s1, s2), plans)
            got = y.numpy(stream=s2)
            s1.synchronize()
        _mock.clear_faults()
        return got.tobytes()


def _one_round(route, buf, cfg, inputs, outs, streams, plans):
    from aclnn_py.ops import moe_distribute_combine, moe_distribute_dispatch

    (xt, idt, wt), (d, x_out), (s1, s2) = inputs, outs, streams
    if route == "buffer":
        out = buf.low_latency_dispatch(xt, idt, E, topk_weights=wt, stream=s1)
        return buf.low_latency_combine(out.expand_x, idt, wt, out.assist_info_for_combine, out.ep_recv_counts,
                                       num_experts=E, stream=s2)
    if route == "ops":
        # caller-made outputs, a MoeConfig and Streams: the operators' compiled steady state
        moe_distribute_dispatch(buf.context, xt, idt, config=cfg, expert_scales=wt, outputs=d, stream=s1)
        return moe_distribute_combine(buf.context, d.expand_x, idt, d.assist_info_for_combine, d.ep_recv_counts,
                                      wt, config=cfg, x_out=x_out, stream=s2)
    dp, cp = plans
    out = dp(xt, idt, expert_scales=wt, stream=s1)
    return cp(out.expand_x, idt, out.assist_info_for_combine, out.ep_recv_counts, wt, stream=s2)


@pytest.mark.parametrize("route", ["buffer", "ops", "plan"])
def test_combine_on_another_stream_reads_the_dispatch(acl, route):
    from aclnn_py.worlds import run_threads

    want = run_threads(lambda r, n, root: _round(route, r, n, root, False), W, timeout=120)
    got = run_threads(lambda r, n, root: _round(route, r, n, root, True), W, timeout=120)
    for rank in range(W):
        assert got[rank] == want[rank], f"rank {rank}: combine on s2 read dispatch outputs before s1 wrote them"


def _copy_after_write(rank, world_size, root):
    import aclnn_py as acl
    from aclnn_py import _mock

    x, ids, _ = _inputs(rank)
    with acl.hccl.Communicator(world_size, rank, root) as comm:
        buf = acl.MoeDistributeBuffer(comm)
        s1, s2 = acl.Device(rank).create_stream(), acl.Device(rank).create_stream()
        if rank == 1:
            _mock.inject_fault("dispatch", rank=1, kind="delay", seconds=LATE)
        out = buf.low_latency_dispatch(x, ids, E, stream=s1)
        counts = out.ep_recv_counts
        # a download on s2 of what s1 is still writing: waits for s1 too
        early = counts.numpy(stream=s2)
        mine = np.arange(counts.shape[0], dtype=np.int32) + 1000
        if rank == 1:
            _mock.inject_fault("dispatch", rank=1, kind="delay", seconds=LATE)
        out2 = buf.low_latency_dispatch(x, ids, E, stream=s1)
        # a copy on s2 into what s1 is still writing: lands after that write
        out2.ep_recv_counts.copy_from(mine, stream=s2)
        s1.synchronize()
        s2.synchronize()
        after = out2.ep_recv_counts.numpy()
        _mock.clear_faults()
        return early, counts.numpy(), after, mine


def test_copies_and_downloads_wait_for_a_write_on_another_stream(acl):
    from aclnn_py.worlds import run_threads

    for early, final, after, mine in run_threads(_copy_after_write, W, timeout=120):
        assert early.tobytes() == final.tobytes()
        assert int(final[-1]) > 0  # the rows this rank received: written by the dispatch
        assert after.tobytes() == mine.tobytes()
