"""Plans (repeatable executors): identical bytes to the per-call path over seeded
configurations, after rebinding to new input and output buffers and with host arrays; changing what
a plan fixed is refused with a clear message."""

from __future__ import annotations

import numpy as np
import pytest

from aclnn_py.dtypes import bfloat16

CONFIGS = [  # (W, BS, H, K, E, quant, weights, mask, S, R, comm_quant)
    (2, 4, 1024, 2, 4, 0, True, None, 1, 0, 0),
    (2, 8, 2048, 4, 8, 2, False, "2d", 1, 0, 2),
    (4, 6, 1024, 3, 6, 2, True, "1d", 1, 1, 0),
    (4, 5, 7168, 2, 8, 0, False, None, 1, 0, 2),
]


def _inputs(rng, bs, h, k, e, weights, mask):
    x = rng.uniform(-2, 2, (bs, h)).astype(np.float32).astype(bfloat16)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(bs)]).astype(np.int32)
    w = rng.uniform(0, 1, (bs, k)).astype(np.float32) if weights else None
    m = None
    if mask == "1d":
        m = np.arange(bs) < bs - 1
    elif mask == "2d":
        m = rng.uniform(size=(bs, k)) < 0.7
    return x, ids, w, m


def _rank(rank, world_size, root, cfg, seed):
    import aclnn_py as acl
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator

    w_, bs, h, k, e, quant, weights, mask, s_, r_, cq = cfg
    dev = acl.Device.current()
    stream = dev.create_stream()
    rng = np.random.default_rng([seed, rank])
    results = []
    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        common = dict(shared_expert_num=s_, shared_expert_rank_num=r_)
        mshape = None if mask is None else ((bs,) if mask == "1d" else (bs, k))
        dplan = buf.plan_dispatch(bs, h, e, k, x_dtype=bfloat16, quant_mode=quant, with_weights=weights,
                                  mask_shape=mshape, **common)
        cplan = buf.plan_combine(dplan, with_weights=weights, comm_quant_mode=cq, mask_shape=mshape,
                                 num_experts=e, **common)
        for step in range(3):
            x, ids, w, m = _inputs(rng, bs, h, k, e, weights, mask)
            # per-call path
            ref = buf.low_latency_dispatch(x, ids, e, quant_mode=quant, topk_weights=w, x_active_mask=m,
                                           stream=stream, **common)
            buf.synchronize(stream)
            n = int(ref.ep_recv_counts.numpy()[-1])
            y = np.zeros(ref.expand_x.shape, bfloat16)
            y[:n] = (ref.expand_x.numpy()[:n].astype(np.float32) * 0.5).astype(bfloat16)
            ref_out = buf.low_latency_combine(y, ids, w, ref.assist_info_for_combine, ref.ep_recv_counts,
                                              num_experts=e, x_active_mask=m, comm_quant_mode=cq, stream=stream,
                                              **common)
            buf.synchronize(stream)
            # plan path: step 0 host arrays into the plan's buffers, step 1 Tensors bound by address,
            # step 2 Tensors again plus caller-provided outputs (rebinding outputs too)
            if step == 0:
                args = (x, ids)
                kw = dict(expert_scales=w, x_active_mask=m)
            else:
                args = (acl.Tensor.from_numpy(x), acl.Tensor.from_numpy(ids))
                kw = dict(expert_scales=None if w is None else acl.Tensor.from_numpy(w),
                          x_active_mask=None if m is None else acl.Tensor.from_numpy(m))
            outs = None
            if step == 2:
                outs = type(dplan.outputs)(*(acl.Tensor.empty(t.shape, t.dtype) for t in dplan.outputs))
            d = dplan(*args, outputs=outs, stream=stream, **kw)
            yt = acl.Tensor.from_numpy(y)
            x_out = acl.Tensor.empty((bs, h), bfloat16) if step == 2 else None
            c = cplan(yt, args[1], d.assist_info_for_combine, d.ep_recv_counts,
                      kw["expert_scales"] if weights else None, x_active_mask=kw["x_active_mask"], x_out=x_out,
                      stream=stream)
            stream.synchronize()
            assert int(d.ep_recv_counts.numpy()[-1]) == n
            same = [
                d.expand_x.numpy()[:n].tobytes() == ref.expand_x.numpy()[:n].tobytes(),
                d.assist_info_for_combine.numpy()[:3 * n].tobytes()
                == ref.assist_info_for_combine.numpy()[:3 * n].tobytes(),
                d.ep_recv_counts.numpy().tobytes() == ref.ep_recv_counts.numpy().tobytes(),
                d.expert_token_nums.numpy().tobytes() == ref.expert_token_nums.numpy().tobytes(),
            ]
            if quant:
                same.append(d.dynamic_scales.numpy()[:n].tobytes() == ref.dynamic_scales.numpy()[:n].tobytes())
            written = np.ones(bs, bool) if m is None else (m if m.ndim == 1 else m.any(axis=1))
            same.append(c.numpy()[written].tobytes() == ref_out.numpy()[written].tobytes())
            results.append((step, same))
        dplan.close()
        cplan.close()
        stream.close()
    return results


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "W{}-BS{}-H{}-K{}-E{}-q{}-w{}-m{}-S{}R{}-cq{}".format(*c))
def test_plan_matches_per_call_path(acl, cfg):
    from aclnn_py.worlds import run_threads

    for rank_results in run_threads(_rank, cfg[0], cfg, 11, timeout=240):
        for step, same in rank_results:
            assert all(same), f"step {step}: {same}"


def _refusals(rank, world_size, root):
    import aclnn_py as acl
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator

    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        plan = buf.plan_dispatch(4, 1024, 4, 2, x_dtype=bfloat16, with_weights=False)
        x = np.zeros((4, 1024), bfloat16)
        ids = np.tile(np.array([[0, 1]], np.int32), (4, 1))
        msgs = []
        for call in (
            lambda: plan(np.zeros((5, 1024), bfloat16), ids),                       # other BS
            lambda: plan(acl.Tensor.from_numpy(np.zeros((4, 1024), np.float16)), ids),  # other dtype
            lambda: plan(x, ids, expert_scales=np.ones((4, 2), np.float32)),        # input absent at plan time
            lambda: plan(x, None),                                                  # a required input missing
        ):
            try:
                call()
                msgs.append(None)
            except acl.AclnnError as e:
                msgs.append(e.message)
        plan.close()
        return msgs


def test_plan_refuses_what_it_fixed(acl):
    from aclnn_py.worlds import run_threads

    msgs = run_threads(_refusals, 2, timeout=120)[0]
    assert msgs[0] == "x: the plan is fixed to shape (4, 1024) (got (5, 1024))"
    assert msgs[1].startswith("x: the plan is fixed to shape (4, 1024) BF16 contiguous (got (4, 1024) FLOAT16")
    # a plan made by the buffer names the buffer's parameters and its with_weights flag
    assert msgs[2] == "topk_weights: this plan was built without weights; build it with with_weights=True"
    assert msgs[3] == "topk_idx: this plan was built with it; pass it on every call"


def _own_outputs_again(rank, world_size, root):
    """A call whose outputs give a Tensor for ep_recv_counts only (None: the plan's own), then a call
    without outputs: it must write every output into the plan's own buffers again, not the Tensor
    the caller gave the call before. Per step: whose ep_recv_counts hold the counts."""
    import aclnn_py as acl
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator
    from aclnn_py.ops import DispatchOutputs

    rng = np.random.default_rng([3, rank])
    stream = acl.Device.current().create_stream()
    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        plan = buf.plan_dispatch(4, 1024, 4, 2, x_dtype=bfloat16, with_weights=False)
        x = acl.Tensor.from_numpy(rng.uniform(-2, 2, (4, 1024)).astype(np.float32).astype(bfloat16))
        ids = acl.Tensor.from_numpy(np.stack([rng.choice(4, 2, replace=False) for _ in range(4)]).astype(np.int32))
        want = buf.low_latency_dispatch(x, ids, 4, stream=stream).ep_recv_counts.numpy().tobytes()
        own = plan.outputs.ep_recv_counts
        mine = acl.Tensor.empty(own.shape, own.dtype)
        written = []
        for outputs in (DispatchOutputs(*([None] * 4), mine, None, None), None):
            for t in (own, mine):
                t.fill_bytes(0)
            plan(x, ids, outputs=outputs, stream=stream)
            stream.synchronize()
            written.append(tuple(t.numpy().tobytes() == want for t in (own, mine)))
        plan.close()
    stream.close()
    return written


def test_a_call_without_outputs_writes_the_plans_own_after_a_call_that_gave_some(acl):
    from aclnn_py.worlds import run_threads

    for written in run_threads(_own_outputs_again, 2, timeout=120):
        assert written == [(False, True), (True, False)]  # (the plan's own, the caller's)
