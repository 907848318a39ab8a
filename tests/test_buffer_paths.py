"""The same dispatch → expert → combine round through every public route gives the same bytes for
every output: ``MoeDistributeBuffer.low_latency_dispatch / _combine``, ``aclnn_py.ops.moe_distribute_
dispatch / _combine``, the plans the buffer makes (``plan_dispatch`` / ``plan_combine``) and the plan
classes built directly (``DispatchPlan`` / ``CombinePlan``).

Seeded configurations of tests/helpers/moe_cases.py (quant modes 0 and 2, with and without weights,
x_active_mask, shared experts, special experts, uneven BS, every comm_alg and comm quant mode) run in
thread worlds of 2 and 4 ranks on both SoC profiles. ``ACLNN_PY_DIFF_EXAMPLES`` sets how many
configurations each (profile, world size) runs (docs/testing_with_the_mock.md)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import pytest
from helpers.moe_cases import A950, Y_FORMATS, Case, make_inputs, random_case, replace
from helpers.moe_world import expert_fn

EXAMPLES = int(os.environ.get("ACLNN_PY_DIFF_EXAMPLES", "12"))
WORLDS = (2, 4)
PATHS = ("buffer", "ops", "buffer plans", "plans")
DISPATCH_OUTPUTS = ("expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
                    "expand_scales")


def configurations(soc: str, w: int, count: int) -> list[Case]:
    """`count` seeded configurations for world size `w`: the A3 matrix (what every route takes: fp16 /
    bf16 x, quant mode 0 or 2, no elastic_info or performance_info), on the 950 with its fp8 expand_x
    of quant mode 2 and its MX comm quant modes too."""
    rng = np.random.default_rng(7_100 + 31 * w + (1 if soc == A950 else 0))
    cases = []
    for i in range(count):
        c = random_case(rng, w, seed=9_000_000 + 1000 * w + i, combine=True)
        if soc == A950:  # the 950's own expand_x formats of quant mode 2 and its MX comm quant modes
            fmt = str(rng.choice(Y_FORMATS[2])) if c.quant == 2 else None
            c = replace(c, soc=A950, yfmt=fmt, comm_quant=int(rng.choice([0, 2, 3, 4])))
        cases.append(c)
    return cases


def _digest(t: Any, stream: Any) -> str:
    # the device bytes, unwritten rows included (a download copies the received rows only)
    return hashlib.sha256(np.ascontiguousarray(t.numpy_view(stream=stream)).view(np.uint8)).hexdigest()


def _round(rank: int, world_size: int, root: bytes, cases: list[Case]) -> list[dict[str, dict[str, str]]]:
    """Every case through every route on this rank: per case and route, a digest of each output."""
    import aclnn_py as acl

    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device(rank).create_stream()
        results = [_routes(c, rank, buf, s, names=i % 2 == 0) for i, c in enumerate(cases)]
        s.synchronize()
        s.close()
    return results


def _routes(c: Case, rank: int, buf: Any, s: Any, names: bool) -> dict[str, dict[str, str]]:
    """One case through the four routes, in the same order on every rank. The buffer's plans are
    called with the buffer's names and host arrays (`names`), or with device Tensors."""
    from helpers.moe_cases import datatype

    import aclnn_py as acl
    from aclnn_py.dtypes import as_datatype
    from aclnn_py.ops import (
        CombinePlan,
        DispatchPlan,
        MoeConfig,
        moe_distribute_combine,
        moe_distribute_dispatch,
    )

    inp = make_inputs(c)
    x, ids = inp.x[rank], inp.ids[rank]
    bs, k = ids.shape
    mask = inp.mask[rank] if inp.mask else None
    escales = inp.escales[rank] if inp.escales else None
    weights = inp.weights[rank] if inp.weights else None
    scales = inp.scales[rank] if inp.scales is not None else None
    shared_x = inp.shared_x[rank] if inp.shared_x else None
    ori_x = inp.ori_x[rank] if (c.C or c.Q) else None
    consts = dict(const_expert_alpha_1=inp.alpha1, const_expert_alpha_2=inp.alpha2, const_expert_v=inp.const_v)
    y_dtype = datatype(c.yfmt) if c.yfmt else None
    mask_shape = None if mask is None else mask.shape
    experts = dict(zero_expert_num=c.Z, copy_expert_num=c.C, const_expert_num=c.Q, shared_expert_num=c.S,
                   shared_expert_rank_num=c.R, num_max_dispatch_tokens_per_rank=c.global_bs // c.W)
    cfg = MoeConfig(ep_world_size=c.W, ep_rank_id=rank, moe_expert_num=c.E, ccl_buffer_size=buf.ccl_buffer_size,
                    shared_expert_num=c.S, shared_expert_rank_num=c.R, zero_expert_num=c.Z, copy_expert_num=c.C,
                    const_expert_num=c.Q, global_bs=c.global_bs, comm_alg=c.comm_alg, quant_mode=c.quant,
                    expert_token_nums_type=c.ent_type, comm_quant_mode=c.comm_quant)
    digests: dict[str, dict[str, str]] = {}

    def expert_out(d: Any) -> np.ndarray:
        """The experts' rows for all A rows of dispatch's expand_x (rows >= N are not read)."""
        ds = d.dynamic_scales.numpy(stream=s) if c.quant == 2 else None
        return expert_fn(c, d.expand_x.numpy(stream=s), ds)

    def record(path: str, d: Any, x_out: Any) -> None:
        digests[path] = {name: _digest(getattr(d, name), s) for name in DISPATCH_OUTPUTS}
        digests[path]["x_out"] = _digest(x_out, s)

    # MoeDistributeBuffer, per call (host arrays)
    d = buf.low_latency_dispatch(x, ids, c.E, quant_mode=c.quant, comm_alg=c.comm_alg, x_smooth_scale=scales,
                                 x_active_mask=mask, topk_weights=escales, expert_token_nums_type=c.ent_type,
                                 y_dtype=y_dtype, stream=s, **experts)
    y = buf.low_latency_combine(expert_out(d), ids, weights, d.assist_info_for_combine, d.ep_recv_counts,
                                num_experts=c.E, comm_alg=c.comm_alg, comm_quant_mode=c.comm_quant, x_active_mask=mask,
                                shared_expert_x=shared_x, ori_x=ori_x, stream=s, **consts, **experts)
    record("buffer", d, y)

    # aclnn_py.ops, per call (device Tensors)
    up = {name: None if v is None else acl.Tensor.from_numpy(v, stream=s)
          for name, v in dict(x=x, ids=ids, mask=mask, escales=escales, weights=weights, scales=scales,
                              shared_x=shared_x, ori_x=ori_x).items()}
    d = moe_distribute_dispatch(buf.context, up["x"], up["ids"], config=cfg, scales=up["scales"],
                                x_active_mask=up["mask"], expert_scales=up["escales"], y_dtype=y_dtype, stream=s)
    y = moe_distribute_combine(buf.context, expert_out(d), up["ids"], d.assist_info_for_combine, d.ep_recv_counts,
                               up["weights"], config=cfg, x_active_mask=up["mask"], shared_expert_x=up["shared_x"],
                               ori_x=up["ori_x"], stream=s, **consts)
    record("ops", d, y)

    # the plans MoeDistributeBuffer makes
    dplan = buf.plan_dispatch(bs, c.H, c.E, k, x_dtype=x.dtype, quant_mode=c.quant, comm_alg=c.comm_alg,
                              with_weights=escales is not None, mask_shape=mask_shape,
                              smooth_scales_shape=None if scales is None else scales.shape,
                              expert_token_nums_type=c.ent_type, y_dtype=y_dtype, stream=s, **experts)
    cplan = buf.plan_combine(dplan, with_weights=weights is not None, comm_quant_mode=c.comm_quant,
                             comm_alg=c.comm_alg, mask_shape=mask_shape, with_shared_expert_x=shared_x is not None,
                             with_ori_x=ori_x is not None, num_experts=c.E, stream=s, **experts)
    if names:
        d = dplan(x, ids, scales=scales, x_active_mask=mask, topk_weights=escales, stream=s)
        y = cplan(expert_out(d), ids, d.assist_info_for_combine, d.ep_recv_counts, topk_weights=weights,
                  x_active_mask=mask, shared_expert_x=shared_x, ori_x=ori_x, stream=s, **consts)
    else:
        d = dplan(up["x"], up["ids"], scales=up["scales"], x_active_mask=up["mask"], expert_scales=up["escales"],
                  stream=s)
        ex = acl.Tensor.from_numpy(expert_out(d), stream=s)
        y = cplan(ex, up["ids"], d.assist_info_for_combine, d.ep_recv_counts, up["weights"], x_active_mask=up["mask"],
                  shared_expert_x=up["shared_x"], ori_x=up["ori_x"], stream=s, **consts)
    record("buffer plans", d, y)
    dplan.close()
    cplan.close()

    # the plan classes, built directly from the same config
    dplan = DispatchPlan(buf.context, bs=bs, hidden=c.H, topk=k, x_dtype=x.dtype, config=cfg,
                         scales_shape=None if scales is None else scales.shape, mask_shape=mask_shape,
                         with_expert_scales=escales is not None, y_dtype=y_dtype, stream=s)
    d = dplan(x, ids, scales=scales, x_active_mask=mask, expert_scales=escales, stream=s)
    cplan = CombinePlan(buf.context, a=d.expand_x.shape[0], bs=bs, hidden=c.H, topk=k, dtype=as_datatype(x.dtype),
                        assist_len=d.assist_info_for_combine.shape[0], counts_len=d.ep_recv_counts.shape[0],
                        config=cfg, with_expert_scales=weights is not None, mask_shape=mask_shape,
                        with_shared_expert_x=shared_x is not None, with_ori_x=ori_x is not None, stream=s)
    y = cplan(expert_out(d), ids, d.assist_info_for_combine, d.ep_recv_counts, weights, x_active_mask=mask,
              shared_expert_x=shared_x, ori_x=ori_x, stream=s, **consts)
    record("plans", d, y)
    dplan.close()
    cplan.close()
    return digests


@pytest.mark.parametrize("w", WORLDS)
def test_every_route_gives_the_same_bytes(acl: Any, profile: str, w: int) -> None:
    from aclnn_py.worlds import run_threads

    cases = configurations(profile, w, EXAMPLES)
    per_rank = run_threads(_round, w, cases, timeout=600)
    for rank, results in enumerate(per_rank):
        assert len(results) == len(cases)
        for c, digests in zip(cases, results):
            reference = digests["buffer"]
            for path in PATHS[1:]:
                differ = [name for name, h in digests[path].items() if h != reference[name]]
                assert not differ, f"{path} differs from the buffer in {differ}: rank {rank}, {c}"


def test_the_configurations_cover_what_the_routes_take(acl: Any) -> None:
    """The default run covers every feature the routes share, on each profile."""
    for soc in ("Ascend910_93", A950):
        cases = [c for w in WORLDS for c in configurations(soc, w, EXAMPLES)]
        assert {c.quant for c in cases} == {0, 2}
        assert {c.weights for c in cases} == {False, True}
        assert {c.escales for c in cases} == {False, True}
        assert {c.mask for c in cases} >= {"none", "1d", "2d"}
        assert any(c.R for c in cases) and not all(c.R for c in cases)  # shared-expert ranks, and none
        assert {c.comm_quant for c in cases} >= ({0, 2, 3, 4} if soc == A950 else {0, 2})
        assert len({c.comm_alg for c in cases}) == 3
        assert any(len(set(c.bss)) > 1 for c in cases) and any(c.global_bs for c in cases)
        assert any(c.Z for c in cases) and any(c.C for c in cases) and any(c.Q for c in cases)
        if soc == A950:
            assert {c.yfmt for c in cases if c.quant == 2} >= {"int8", "float8_e4m3fn", "float8_e5m2"}
