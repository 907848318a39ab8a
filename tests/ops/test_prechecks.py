"""Python pre-checks (aclnn_py/ops/prechecks.py) raise exactly what the C side returns: for each rule of
the attribute, size and window rules (docs/operators.md) broken alone, the message with precheck=True equals the mock's own message
(precheck=False), class and code included."""

from __future__ import annotations

import numpy as np
import pytest

from aclnn_py.dtypes import bfloat16

BASE = dict(ep_world_size=2, ep_rank_id=0, moe_expert_num=2)

CASES = [
    dict(ep_world_size=1), dict(ep_world_size=769), dict(ep_rank_id=2), dict(ep_rank_id=-1),
    dict(tp_world_size=2), dict(tp_rank_id=1), dict(tp_world_size=1, tp_rank_id=-1), dict(expert_shard_type=1), dict(shared_expert_num=5),
    dict(shared_expert_rank_num=2), dict(shared_expert_num=0, shared_expert_rank_num=1),
    dict(shared_expert_num=2, shared_expert_rank_num=1), dict(moe_expert_num=0), dict(moe_expert_num=1025),
    dict(moe_expert_num=3), dict(zero_expert_num=-1), dict(copy_expert_num=-1), dict(const_expert_num=-1),
    dict(comm_alg="hierarchy"), dict(comm_alg="ring"), dict(bs=513), dict(hidden=1023), dict(hidden=8193),
    dict(topk=17, moe_expert_num=18), dict(topk=3), dict(global_bs=3), dict(global_bs=2, bs=4),
    dict(comm_alg="fullmesh_v2", bs=257), dict(comm_alg="fullmesh_v2", topk=13, moe_expert_num=14),
    dict(ccl_buffer_size=-1), dict(ccl_buffer_size=1 << 20), dict(ccl_buffer_size=(1 << 20) + 4096),
]


def _case_id(c: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in c.items())


def _not_called(*args):
    raise AssertionError("the C phase 1 was called although the pre-check should have refused")


def _rank(rank, world_size, root, which):
    import aclnn_py as acl
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_combine, prepare_dispatch

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        if rank != 0:
            return []
        out = []
        for case in CASES:
            c = dict(case)
            bs, h, k = c.pop("bs", 2), c.pop("hidden", 1024), c.pop("topk", 1)
            kw = {**BASE, "ccl_buffer_size": ccl, **c}
            x = acl.Tensor.zeros((bs, h), bfloat16)
            ids = acl.Tensor.zeros((bs, k), np.int32)
            msgs = []
            lib = acl.backend().lib
            gws = f"aclnnMoeDistribute{'Dispatch' if which == 'dispatch' else 'Combine'}V5GetWorkspaceSize"
            real = getattr(lib, gws)
            for pre in (True, False):
                # with the pre-check on, the C phase 1 must not even be called
                setattr(lib, gws, _not_called if pre else real)
                try:
                    if which == "dispatch":
                        prepare_dispatch(ctx, x, ids, precheck=pre, **kw)
                    else:
                        a = max(bs, 1) * 2 * max(k, 1)
                        prepare_combine(ctx, acl.Tensor.zeros((a, h), bfloat16), ids,
                                        acl.Tensor.zeros((a * 128,), np.int32), acl.Tensor.zeros((4,), np.int32),
                                        precheck=pre, **kw)
                    msgs.append(None)
                except acl.AclnnError as e:
                    msgs.append((type(e).__name__, e.code, e.message))
                finally:
                    setattr(lib, gws, real)
            out.append((_case_id(case), msgs))
        return out


@pytest.mark.parametrize("which", ["dispatch", "combine"])
def test_prechecks_match_the_c_side(acl, which):
    from aclnn_py.worlds import run_threads

    results = run_threads(_rank, 2, which, timeout=120)[0]
    assert len(results) == len(CASES)
    for case, (py, c) in results:
        assert c is not None, f"{case}: the mock accepted it"
        assert py == c, f"{case}:\n python: {py}\n      C: {c}"
        assert c[0] == "AclnnParamInvalid" and c[1] == 161002
