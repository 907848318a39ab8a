"""CANN's dynamic shrink on Atlas A3 (elastic_info of generations 3 and 4, docs/operators.md, "Dynamic
shrink"): ranks left out of the EP communicator after it was made never call the operators, and the
ranks still in it finish their round without waiting for them, bit for bit against
aclnn_py.golden.dispatch_shrink / combine_shrink. Phase 1 accepts elastic_info there and keeps
refusing it where CANN does (with a TP domain, on the context generation of A3), and a rank the table
leaves out that calls anyway fails at run time naming elastic_info."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers.group_gens import GenCase, World, expert, make_inputs, phase1, rank_round, run_each

from aclnn_py import AclError, golden

INVALID = 161002


def elastic(W: int, left_out: list[int], shared: int) -> tuple[np.ndarray, list[int]]:
    """elastic_info of a W-rank world without the ranks `left_out`, the first `shared` survivors
    serving the shared expert: (the tensor, the physical rank of each new id)."""
    phys = [r for r in range(W) if r not in left_out]
    info = np.zeros(4 + 2 * W, np.int32)
    info[:4] = [1, len(phys), shared, len(phys) - shared]   # one local expert per MoE rank
    info[4:4 + W] = -1
    for logical, ph in enumerate(phys):
        info[4 + ph] = logical
        info[4 + W + logical] = ph
    return info, phys


CASES = [  # (generation, W, R, ranks left out, R after the shrink, quant)
    (3, 4, 0, [2], 0, 0),
    (4, 4, 0, [0, 3], 0, 2),
    (3, 4, 1, [3], 1, 2),
    (4, 4, 1, [0], 1, 0),     # the shared-expert rank goes: physical rank 1 takes its role
]


@pytest.mark.parametrize("gen,W,R,out,R2,quant", CASES, ids=[f"V{g}-W{w}-R{r}-out{o}-R'{r2}-q{q}"
                                                             for g, w, r, o, r2, q in CASES])
def test_shrunk_round_matches_golden(gen, W, R, out, R2, quant):
    c = GenCase(gen=gen, W=W, R=R, quant=quant, seed=400 + 10 * W + len(out), escales=False)
    info, phys = elastic(W, out, R2)
    e2 = len(phys) - R2
    inp = make_inputs(c)
    rng = np.random.default_rng(c.seed)
    for r in range(W):   # expert ids name the experts of the shrunk world
        inp.ids[0][r] = np.stack([rng.permutation(e2)[:min(c.K, e2)] for _ in range(c.BS)]).astype(np.int32)
    c.K = min(c.K, e2)
    world = World(c)
    got: dict[int, Any] = {}

    def rank(e: int) -> None:
        got[e] = rank_round(c, inp, e, 0, world.ep[e, 0].name, "", world.streams[e, 0], elastic_info=info)

    try:
        run_each(rank, [(e,) for e in phys])   # the ranks left out never call
    finally:
        world.close()
    kw: dict[str, Any] = dict(elastic_info=info, moe_expert_num=c.E, shared_expert_num=c.S,
                              shared_expert_rank_num=R)
    disp = golden.dispatch_shrink(inp.x[0], inp.ids[0], scales=inp.scales, quant_mode=quant,
                                  expert_token_nums_type=c.ent_type, **kw)
    ys = [expert(c, 0, d.expand_x, d.dynamic_scales) if d is not None else None for d in disp]
    comb = golden.combine_shrink(ys, inp.ids[0], [d.assist_info_for_combine if d else None for d in disp],
                                 [d.ep_recv_counts if d else None for d in disp], expert_scales=inp.weights[0], **kw)
    for e in range(W):
        d, cb = disp[e], comb[e]
        if e in out:
            assert d is None and cb is None and e not in got
            continue
        r = got[e]
        assert d is not None and cb is not None
        assert r.num_rows == d.num_rows, (e, r.num_rows, d.num_rows)
        for name, m, g in (("expand_x", r.expand_x, d.expand_x), ("assist_info", r.assist_info,
                                                                   d.assist_info_for_combine),
                           ("expert_token_nums", r.expert_token_nums, d.expert_token_nums),
                           ("ep_recv_counts", r.ep_recv_counts[:d.ep_recv_counts.size], d.ep_recv_counts),
                           ("x_out", r.x_out[cb.written], cb.x_out[cb.written])):
            g = np.ascontiguousarray(np.asarray(g, dtype=m.dtype))
            assert m.shape == g.shape and m.tobytes() == g.tobytes(), f"rank {e} {name} differs from the golden"
        if quant == 2:
            assert r.dynamic_scales.tobytes() == d.dynamic_scales.astype(np.float32).tobytes()


@pytest.fixture(scope="module")
def world4() -> Any:
    c = GenCase(gen=3, W=4)
    w = World(c)
    yield c, w
    w.close()


@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_phase1_rules(world4, op):
    c, w = world4
    info, _ = elastic(c.W, [2], 0)
    for gen in (3, 4):
        cg = GenCase(gen=gen, W=c.W)
        assert phase1(cg, w, make_inputs(cg), op, tensors={"elastic_info": info}) == (0, "")
    got = phase1(c, w, make_inputs(c), op, tensors={"elastic_info": info[:-1]})
    assert got[0] == INVALID and f"elastic_info: shape must be (4 + 2 * ep_world_size,) = ({4 + 2 * c.W},)" in got[1]
    got = phase1(c, w, make_inputs(c), op, tensors={"elastic_info": info}, attrs={"Z": 1})
    assert got[0] == INVALID and "elastic_info: a dynamic shrink together with zero / copy / const experts" in got[1]


def test_phase1_refused_with_a_tp_domain():
    c = GenCase(gen=3, W=2, tp=2)
    w = World(c)
    try:
        info, _ = elastic(c.W, [], 0)
        got = phase1(c, w, make_inputs(c), "dispatch", tensors={"elastic_info": info})
        assert got[0] == INVALID and "elastic_info: a dynamic shrink is not supported with a TP domain" in got[1]
    finally:
        w.close()


def test_a_rank_left_out_that_calls_fails_naming_elastic_info(world4):
    """Rank 2 is left out but calls anyway: its kernel fails (507015) without waiting for anyone."""
    c, w = world4
    info, _ = elastic(c.W, [2], 0)
    inp = make_inputs(c)
    with pytest.raises(AclError) as ex:
        rank_round(c, inp, 2, 0, w.ep[2, 0].name, "", w.streams[2, 0], elastic_info=info)
    assert ex.value.code == 507015
    assert "elastic_info: this rank is left out of the communicator" in str(ex.value)
