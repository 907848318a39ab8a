"""What CANN accepts and the mock once refused, through the Python routes (aclnn_py.ops and
MoeDistributeBuffer), each run checked against the golden bit for bit: the first generation's
expert_scales, the reserved group_list_type, tp_send_counts without a TP domain; and the nearest refused
neighbour of each, with CANN's status code. The C path of the same rules: tests/test_group_gens_checks.py
and tests/ops/test_moe_checks.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers.group_gens import GenCase, World, expert, golden_round, make_inputs, run_each, run_ranks

import aclnn_py as acl
from aclnn_py import MoeDistributeBuffer, ops
from aclnn_py.errors import AclnnParamInvalid, AclnnParamNullptr


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    want = np.ascontiguousarray(np.asarray(want, dtype=got.dtype))
    assert got.shape == want.shape, f"{what}: shape {got.shape} != golden {want.shape}"
    assert got.tobytes() == want.tobytes(), f"{what}: differs from the golden"


CASES = [GenCase(gen=1, W=8, BS=2, quant=2, seed=71, escales=True),
         GenCase(gen=2, W=4, quant=0, seed=72, escales=True),
         GenCase(gen=5, W=4, quant=2, seed=73, escales=True)]


@pytest.mark.parametrize("case", CASES, ids=[c.label() for c in CASES])
def test_buffer_and_ops_accept_what_cann_accepts(case: GenCase) -> None:
    """Dispatch through MoeDistributeBuffer with topk_weights (expert_scales) on the generation; combine
    through aclnn_py.ops with group_list_type 1 and a tp_send_counts without a TP domain, as CANN's
    samples pass them."""
    inp = make_inputs(case)
    world = World(case)
    got: dict[int, tuple[np.ndarray, ...]] = {}

    def rank(e: int, t: int) -> None:
        acl.Device(e).set_current()
        s = world.streams[e, t]
        named = case.gen != 5
        with MoeDistributeBuffer(world.ep[e, t], generation=case.gen) as buf:
            out = buf.low_latency_dispatch(inp.x[0][e], inp.ids[0][e], case.E, quant_mode=case.quant,
                                           topk_weights=inp.weights[0][e], x_smooth_scale=inp.scales, stream=s)
            n = int(out.ep_recv_counts.numpy()[case.W - 1])
            dyn = out.dynamic_scales.numpy()[:n] if case.quant == 2 else None
            y = np.zeros((out.expand_x.shape[0], case.H), case.dtype)
            y[:n] = expert(case, 0, out.expand_x.numpy()[:n], dyn)
            cfg = ops.MoeConfig(ep_world_size=case.W, ep_rank_id=e, moe_expert_num=case.E,
                                ccl_buffer_size=0 if named else buf.ccl_buffer_size, group_list_type=1,
                                generation=case.gen, group_ep=buf.comm.name if named else "")
            x_out = ops.moe_distribute_combine(buf.context, y, inp.ids[0][e], out.assist_info_for_combine,
                                               out.ep_recv_counts, inp.weights[0][e], config=cfg,
                                               tp_send_counts=np.array([n, 0], np.int32), stream=s)
            got[e] = (out.expand_x.numpy()[:n], out.expand_scales.numpy()[:n], x_out.numpy())

    try:
        run_ranks(case, rank)
    finally:
        world.close()
    disp, comb = golden_round(case, inp)
    for e, (rows, escales, x_out) in got.items():
        d, c = disp[0][e], comb[0][e]
        _same(rows, d.expand_x, f"rank {e} expand_x")
        _same(escales, d.expand_scales, f"rank {e} expand_scales")
        _same(x_out[c.written], c.x_out[c.written], f"rank {e} x_out")


@pytest.fixture(scope="module")
def v1_world() -> Any:
    c = GenCase(gen=1, W=8, BS=2)
    w = World(c)
    yield c, w
    w.close()


def test_nearest_refusals_through_ops(v1_world: Any) -> None:
    """The nearest refused neighbours, through aclnn_py.ops, with CANN's codes: an over-long group_ep on
    dispatch (161001) and on combine (161002), expert_scales of a wrong shape (161002). An empty group_ep
    (161001 on the C path) is refused earlier, by MoeConfig, naming the parameter."""
    c, w = v1_world
    inp = make_inputs(c)
    acl.Device(0).set_current()
    s = w.streams[0, 0]

    def cfg(**kw: Any) -> ops.MoeConfig:
        base: dict[str, Any] = dict(ep_world_size=c.W, ep_rank_id=0, moe_expert_num=c.E, ccl_buffer_size=0,
                                    generation=1, group_ep=w.ep[0, 0].name)
        return ops.MoeConfig(**(base | kw))

    x, ids, wts = inp.x[0][0], inp.ids[0][0], inp.weights[0][0]
    with pytest.raises(ops.GenerationError, match="group_ep: .* pass group_ep"):
        cfg(group_ep="")
    with pytest.raises(AclnnParamNullptr, match="group_ep: must be shorter than 128"):
        ops.prepare_dispatch(None, x, ids, config=cfg(group_ep="g" * 128), stream=s)
    with pytest.raises(AclnnParamInvalid, match=r"expert_scales: shape must be \(BS, K\)"):
        ops.prepare_dispatch(None, x, ids, config=cfg(), expert_scales=wts[:, :1], stream=s)
    d = ops.prepare_dispatch(None, x, ids, config=cfg(), expert_scales=wts, stream=s)
    try:
        out = d.result
        with pytest.raises(AclnnParamInvalid, match="group_ep: must be shorter than 128"):
            ops.prepare_combine(None, out.expand_x, ids, out.assist_info_for_combine, out.ep_recv_counts, wts,
                                config=cfg(group_ep="g" * 200), stream=s)
    finally:
        d.close()


@pytest.mark.parametrize("gen", [3, 4])
def test_buffer_dynamic_shrink(gen: int) -> None:
    """CANN's dynamic shrink on A3 through MoeDistributeBuffer: rank 1 of 4 is left out and never
    calls; the other three run dispatch and combine with elastic_info, bit for bit against
    golden.dispatch_shrink / combine_shrink."""
    from aclnn_py import golden

    case = GenCase(gen=gen, W=4, quant=2, seed=80 + gen)
    phys = [0, 2, 3]
    info = np.array([1, 3, 0, 3, 0, -1, 1, 2, 0, 2, 3, 0], np.int32)
    inp = make_inputs(case)
    rng = np.random.default_rng(case.seed)
    ids = [np.stack([rng.permutation(3)[:case.K] for _ in range(case.BS)]).astype(np.int32) for _ in range(case.W)]
    world = World(case)
    got: dict[int, tuple[np.ndarray, ...]] = {}

    def rank(e: int) -> None:
        acl.Device(e).set_current()
        s = world.streams[e, 0]
        with MoeDistributeBuffer(world.ep[e, 0], generation=gen) as buf:
            out = buf.low_latency_dispatch(inp.x[0][e], ids[e], case.E, quant_mode=2, elastic_info=info,
                                           x_smooth_scale=inp.scales, stream=s)
            n = int(out.ep_recv_counts.numpy()[len(phys) - 1])
            y = np.zeros((out.expand_x.shape[0], case.H), case.dtype)
            y[:n] = expert(case, 0, out.expand_x.numpy()[:n], out.dynamic_scales.numpy()[:n])
            x_out = buf.low_latency_combine(y, ids[e], inp.weights[0][e], out.assist_info_for_combine,
                                            out.ep_recv_counts, num_experts=case.E, elastic_info=info, stream=s)
            got[e] = (out.expand_x.numpy()[:n], x_out.numpy())

    try:
        run_each(rank, [(e,) for e in phys])   # the rank left out never calls
    finally:
        world.close()
    kw: dict[str, Any] = dict(elastic_info=info, moe_expert_num=case.E)
    disp = golden.dispatch_shrink(inp.x[0], ids, scales=inp.scales, quant_mode=2, **kw)
    ys = [expert(case, 0, d.expand_x, d.dynamic_scales) if d is not None else None for d in disp]
    comb = golden.combine_shrink(ys, ids, [d.assist_info_for_combine if d else None for d in disp],
                                 [d.ep_recv_counts if d else None for d in disp], expert_scales=inp.weights[0], **kw)
    assert disp[1] is None and comb[1] is None
    for e in phys:
        d, c = disp[e], comb[e]
        assert d is not None and c is not None
        _same(got[e][0], d.expand_x, f"rank {e} expand_x")
        _same(got[e][1][c.written], c.x_out[c.written], f"rank {e} x_out")
