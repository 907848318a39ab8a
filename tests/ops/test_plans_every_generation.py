"""Plans and prepare_dispatch / prepare_combine run every generation (the newest with its context tensor,
the group-string ones with the communicator's name), through the same compiled launch as the per-call
operators: a round of each route on a thread world, bit for bit against the golden."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers.group_gens import GenCase, World, expert, golden_round, make_inputs, run_ranks

import aclnn_py as acl
from aclnn_py import MoeDistributeBuffer, golden, ops

CASES = [GenCase(gen=5, W=4, quant=2, seed=51), GenCase(gen=4, W=3, quant=2, seed=52),
         GenCase(gen=3, W=2, quant=0, seed=53, weights=False), GenCase(gen=2, W=4, quant=2, R=1, seed=54),
         GenCase(gen=1, W=8, BS=2, quant=0, seed=55), GenCase(gen=1, W=8, BS=2, quant=2, R=1, seed=56)]


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    want = np.ascontiguousarray(np.asarray(want, dtype=got.dtype))
    assert got.shape == want.shape, f"{what}: shape {got.shape} != golden {want.shape}"
    assert got.tobytes() == want.tobytes(), f"{what}: differs from the golden"


def _read(case: GenCase, out: Any, x_out: Any) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    n = int(out.ep_recv_counts.numpy()[case.W - 1])
    dyn = out.dynamic_scales.numpy()[:n] if case.quant == 2 else None
    return out.expand_x.numpy()[:n], dyn, out.assist_info_for_combine.numpy(), x_out.numpy()


def _expert_out(case: GenCase, out: Any) -> np.ndarray:
    """The expert function on what dispatch wrote, in a (A, H) array of the plan's row count."""
    n = int(out.ep_recv_counts.numpy()[case.W - 1])
    dyn = out.dynamic_scales.numpy()[:n] if case.quant == 2 else None
    y = np.zeros((out.expand_x.shape[0], case.H), case.dtype)
    y[:n] = expert(case, 0, out.expand_x.numpy()[:n], dyn)
    return y


def _plan_round(case: GenCase, buf: Any, x: np.ndarray, ids: np.ndarray, w: np.ndarray | None, scales: Any,
                stream: Any) -> list[tuple[Any, ...]]:
    """Two steps of a dispatch plan and a combine plan made by the buffer."""
    common = dict(shared_expert_rank_num=case.R, shared_expert_num=case.S)
    dplan = buf.plan_dispatch(case.BS, case.H, case.E, case.K, x_dtype=case.dtype, quant_mode=case.quant,
                              smooth_scales_shape=None if scales is None else scales.shape, stream=stream, **common)
    cplan = buf.plan_combine(dplan, with_weights=w is not None, num_experts=case.E, stream=stream, **common)
    try:
        assert dplan.config.generation == case.gen and cplan.config.generation == case.gen
        rounds = []
        for _ in range(2):  # the second step rebinds nothing: the same bytes again
            out = dplan(x, ids, scales=scales, stream=stream)
            x_out = cplan(_expert_out(case, out), ids, out.assist_info_for_combine, out.ep_recv_counts, w,
                          stream=stream)
            rounds.append(_read(case, out, x_out))
        return rounds
    finally:
        cplan.close()
        dplan.close()


def _prepared_round(case: GenCase, buf: Any, e: int, x: np.ndarray, ids: np.ndarray, w: np.ndarray | None,
                    scales: Any, stream: Any) -> tuple[Any, ...]:
    """prepare_dispatch / prepare_combine with a config of the generation, each launched once."""
    named = case.gen != 5
    cfg = ops.MoeConfig(ep_world_size=case.W, ep_rank_id=e, moe_expert_num=case.E,
                        ccl_buffer_size=0 if named else buf.ccl_buffer_size, quant_mode=case.quant,
                        shared_expert_rank_num=case.R, shared_expert_num=case.S,
                        generation=case.gen, group_ep=buf.comm.name if named else "")
    d = ops.prepare_dispatch(buf.context, x, ids, config=cfg, scales=scales, stream=stream)
    d.launch(stream)
    out = d.result
    c = ops.prepare_combine(buf.context, _expert_out(case, out), ids, out.assist_info_for_combine,
                            out.ep_recv_counts, w, config=cfg, stream=stream)
    c.launch(stream)
    return _read(case, out, c.result)


@pytest.mark.parametrize("case", CASES, ids=[c.label() for c in CASES])
def test_plans_and_prepared_calls_of_every_generation_match_golden(case: GenCase) -> None:
    inp = make_inputs(case)
    world = World(case)
    got: dict[int, dict[str, list[tuple[Any, ...]]]] = {}

    def rank(e: int, t: int) -> None:
        acl.Device(e).set_current()
        s = world.streams[e, t]
        w = inp.weights[0][e] if case.weights else None
        with MoeDistributeBuffer(world.ep[e, t], generation=case.gen) as buf:
            assert buf.generation == case.gen
            got[e] = {"plan": _plan_round(case, buf, inp.x[0][e], inp.ids[0][e], w, inp.scales, s),
                      "prepared": [_prepared_round(case, buf, e, inp.x[0][e], inp.ids[0][e], w, inp.scales, s)]}

    try:
        run_ranks(case, rank)
    finally:
        world.close()
    disp, comb = golden_round(case, inp)
    for e, routes in got.items():
        d, c = disp[0][e], comb[0][e]
        for route, rounds in routes.items():
            for step, (rows, dyn, routing, x_out) in enumerate(rounds):
                where = f"{route} step {step} rank {e}"
                _same(rows, d.expand_x, f"{where} expand_x")
                if dyn is not None:
                    _same(dyn, d.dynamic_scales, f"{where} dynamic_scales")
                if case.gen == 1:  # the first generation's expand_idx travels as assist_info_for_combine
                    _same(routing, golden.expand_idx(inp.ids[0])[e], f"{where} expand_idx")
                else:
                    _same(routing[:d.assist_info_for_combine.size], d.assist_info_for_combine, f"{where} assist_info")
                _same(x_out[c.written], c.x_out[c.written], f"{where} x_out")
