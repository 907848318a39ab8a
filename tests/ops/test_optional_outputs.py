"""Optional dispatch outputs left None reach the C function as NULL (as CANN's callers pass them), on
every route to the C call: per call (compiled and Python), prepare_dispatch, and plans. What C accepts
gives the same bytes as a call with every output; what it refuses is its own 161001 naming the
output, the same with and without the Python pre-checks."""

from __future__ import annotations

import numpy as np
import pytest

from aclnn_py.dtypes import bfloat16

W, BS, H, K, E = 2, 4, 1024, 2, 4


def _rank(rank, world_size, root):
    import aclnn_py as acl
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import DispatchPlan, MoeConfig, moe_distribute_dispatch, prepare_dispatch
    from aclnn_py.ops.dispatch import allocate_outputs

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = acl.Device(rank).create_stream()
        cfg = MoeConfig(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl)
        rng = np.random.default_rng(rank)
        x = acl.Tensor.from_numpy(rng.uniform(-1, 1, (BS, H)).astype(bfloat16), stream=s)
        ids = acl.Tensor.from_numpy(np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32),
                                    stream=s)
        w = acl.Tensor.from_numpy(rng.uniform(0, 1, (BS, K)).astype(np.float32), stream=s)

        def fresh(es=None):
            return allocate_outputs(cfg, x, ids, es, None, False, None)

        def bytes_of(outs):
            s.synchronize()
            n = int(outs.ep_recv_counts.numpy()[-1])
            return (outs.expand_x.numpy()[:n].tobytes(), outs.assist_info_for_combine.numpy()[:3 * n].tobytes(),
                    outs.expert_token_nums.numpy().tobytes(), outs.ep_recv_counts.numpy().tobytes())

        def attempt(fn):
            try:
                return "ok", bytes_of(fn())
            except acl.AclnnError as e:
                return type(e).__name__, e.code, e.message

        full = fresh()
        moe_distribute_dispatch(ctx, x, ids, config=cfg, outputs=full, stream=s)
        want = ("ok", bytes_of(full))
        got = {}
        no_tp = dict(tp_recv_counts=None, expand_scales=None)
        got["compiled"] = attempt(lambda: moe_distribute_dispatch(ctx, x, ids, config=cfg,
                                                                  outputs=fresh()._replace(**no_tp), stream=s))
        # attributes as keywords: the Python path
        got["python"] = attempt(lambda: moe_distribute_dispatch(ctx, x, ids, outputs=fresh()._replace(**no_tp),
                                                                stream=s, ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=E,
                                                                ccl_buffer_size=ccl))
        got["mapping"] = attempt(lambda: moe_distribute_dispatch(ctx, x, ids, config=cfg, stream=s,
                                                                 outputs={"tp_recv_counts": None}))

        def prepared():
            p = prepare_dispatch(ctx, x, ids, config=cfg, outputs=fresh()._replace(**no_tp), stream=s)
            p.launch(s)
            return p.result
        got["prepare"] = attempt(prepared)
        plan = DispatchPlan(ctx, bs=BS, hidden=H, topk=K, x_dtype=bfloat16, config=cfg, stream=s)
        got["plan"] = attempt(lambda: plan(x, ids, outputs=fresh()._replace(**no_tp), stream=s))
        refusals = {}
        for pre in (True, False):
            refusals[("dynamic_scales", pre)] = attempt(lambda pre=pre: moe_distribute_dispatch(
                ctx, x, ids, config=cfg, outputs=fresh()._replace(dynamic_scales=None), stream=s, precheck=pre))
            refusals[("expand_scales", pre)] = attempt(lambda pre=pre: moe_distribute_dispatch(
                ctx, x, ids, config=cfg, expert_scales=w, outputs=fresh(w)._replace(expand_scales=None), stream=s,
                precheck=pre))
        plan_result = plan(x, ids, outputs=fresh()._replace(**no_tp), stream=s)
        kinds = [type(t).__name__ for t in plan_result]
        plan.close()
        return want, got, refusals, kinds


def test_optional_outputs_left_none(acl):
    from aclnn_py.worlds import run_threads

    for want, got, refusals, kinds in run_threads(_rank, W, timeout=120):
        for route, result in got.items():
            assert result == want, route
        for (name, _), result in refusals.items():
            assert result[:2] == ("AclnnParamNullptr", 161001), result
            assert result[2].startswith(f"{name}: must not be NULL"), result
        for name in ("dynamic_scales", "expand_scales"):
            assert refusals[(name, True)] == refusals[(name, False)]
        # a plan writes its own buffer where an output is left None, and returns what it wrote
        assert kinds == ["Tensor"] * 7


@pytest.mark.parametrize("field", ["dynamic_scales", "tp_recv_counts", "expand_scales"])
def test_dispatch_outputs_type_allows_none(field):
    import typing

    from aclnn_py.ops import DispatchOutputs

    hints = typing.get_type_hints(DispatchOutputs)
    assert type(None) in typing.get_args(hints[field])
