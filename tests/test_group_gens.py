"""The group-string generations (aclnnMoeDistributeDispatch/Combine and V2, V3, V4) on the mock, bit for
bit against aclnn_py.golden: seeded configurations of every generation, without and with a TP domain
of two ranks, each quant mode and comm quant mode the generation has on Atlas A3, EP 2 to 4 thread
ranks per domain (up to 8 threads)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.group_gens import GenCase, World, golden_round, make_inputs, run_round

from aclnn_py import golden


def _cases() -> list[GenCase]:
    cases = []
    seed = 0
    for gen in (2, 3, 4):
        for tp in (1, 2):
            for quant in (0, 2):
                for comm_quant in ((0, 2) if tp == 1 else (0,)):
                    seed += 1
                    W = 2 + seed % 3
                    R = 1 if seed % 4 == 0 and W > 2 else 0
                    cases.append(GenCase(gen=gen, W=W, tp=tp, quant=quant, comm_quant=comm_quant, R=R, seed=seed,
                                         ent_type=seed % 2, weights=seed % 3 != 0,
                                         dtype=np.float16 if seed % 5 == 0 else GenCase.__dataclass_fields__["dtype"].default))
    # the first generation: H 7168, ep_world_size from its list (8 ranks per EP domain)
    for tp, quant, comm_quant in ((1, 0, 0), (1, 2, 2), (2, 2, 0), (2, 0, 0)):
        seed += 1
        cases.append(GenCase(gen=1, W=8, tp=tp, quant=quant, comm_quant=comm_quant, BS=2, seed=seed,
                             ent_type=seed % 2, weights=seed % 3 != 0))
    # the first generation takes expert_scales (BS, K) and returns expand_scales, as CANN's sample does
    cases.append(GenCase(gen=1, W=8, tp=1, quant=2, BS=2, seed=301, escales=True))
    cases.append(GenCase(gen=1, W=8, tp=2, quant=0, BS=2, seed=302, escales=True))
    cases.append(GenCase(gen=2, W=4, tp=1, quant=0, seed=303, escales=True))
    # the first generation with a shared-expert rank, as CANN's sample runs it (EP 8 x TP 2, R = 1)
    cases.append(GenCase(gen=1, W=8, tp=1, quant=2, BS=2, R=1, seed=311, escales=True))
    cases.append(GenCase(gen=1, W=8, tp=2, quant=0, BS=2, R=1, seed=312, escales=True))
    cases.append(GenCase(gen=1, W=8, tp=1, quant=0, comm_quant=2, BS=3, R=2, seed=313))
    # masks (1-D, 2-D) and, from the third generation, zero and copy experts; with and without TP
    cases.append(GenCase(gen=2, W=3, tp=2, quant=2, mask=1, seed=201))
    cases.append(GenCase(gen=3, W=2, tp=2, quant=0, mask=2, special=1, seed=202))
    cases.append(GenCase(gen=4, W=4, tp=1, quant=2, comm_quant=2, mask=2, special=2, seed=203, ent_type=0))
    cases.append(GenCase(gen=3, W=3, tp=1, quant=0, mask=1, special=1, seed=204, weights=False))
        # a TP domain with a shared-expert rank (its one local expert is the shared expert)
    cases.append(GenCase(gen=2, W=4, tp=2, quant=2, R=1, seed=101))
    cases.append(GenCase(gen=4, W=3, tp=2, quant=0, R=1, seed=102, ent_type=0))
    return cases


CASES = _cases()


def _same(mock: np.ndarray, gold: np.ndarray, what: str) -> None:
    m, g = np.ascontiguousarray(mock), np.ascontiguousarray(np.asarray(gold, dtype=mock.dtype))
    assert m.shape == g.shape, f"{what}: shape {m.shape} != golden {g.shape}"
    assert m.tobytes() == g.tobytes(), f"{what}: differs from the golden"


@pytest.mark.parametrize("case", CASES, ids=[c.label() for c in CASES])
def test_round_matches_golden(case: GenCase) -> None:
    inp = make_inputs(case)
    world = World(case)
    try:
        got = run_round(case, world, inp)
    finally:
        world.close()
    disp, comb = golden_round(case, inp)
    for (e, t), r in sorted(got.items()):
        d, cmb = disp[t][e], comb[t][e]
        where = f"rank ({e}, {t})"
        assert r.num_rows == d.num_rows, f"{where}: {r.num_rows} rows, golden {d.num_rows}"
        _same(r.expand_x, d.expand_x, f"{where} expand_x")
        if case.quant == 2:
            _same(r.dynamic_scales, d.dynamic_scales, f"{where} dynamic_scales")
        if case.gen == 1:
            _same(r.assist_info, golden.expand_idx(inp.ids[t])[e], f"{where} expand_idx")
        else:
            _same(r.assist_info, d.assist_info_for_combine, f"{where} assist_info_for_combine")
        _same(r.expert_token_nums, d.expert_token_nums, f"{where} expert_token_nums")
        _same(r.ep_recv_counts, d.ep_recv_counts, f"{where} ep_recv_counts")
        if case.escales and e >= case.R:   # shared-expert rows of expand_scales are not written
            n_own = int(d.ep_recv_counts[case.W - 1]) if case.tp == 2 else d.num_rows
            _same(r.expand_scales, d.expand_scales[:n_own], f"{where} expand_scales")
        if case.tp == 2:
            _same(r.tp_recv_counts, d.tp_recv_counts, f"{where} tp_recv_counts")
        _same(r.x_out[cmb.written], cmb.x_out[cmb.written], f"{where} x_out")


def test_processes_match_golden() -> None:
    """EP 2 x TP 2 as four real processes (aclnn_py.worlds.spawn), V2, quant mode 2."""
    from helpers.group_gens import process_rank

    from aclnn_py.hccl import RootInfo
    from aclnn_py.worlds import spawn

    case = GenCase(gen=2, W=2, tp=2, quant=2, seed=7)
    roots = [bytes(RootInfo.create()) for _ in range(case.tp + case.W)]
    outs = spawn(process_rank, case.W * case.tp, case, roots, timeout=120)
    disp, comb = golden_round(case, make_inputs(case))
    for rank, r in enumerate(outs):
        e, t = divmod(rank, case.tp)
        _same(r.expand_x, disp[t][e].expand_x, f"process {rank} expand_x")
        _same(r.dynamic_scales, disp[t][e].dynamic_scales, f"process {rank} dynamic_scales")
        _same(r.tp_recv_counts, disp[t][e].tp_recv_counts, f"process {rank} tp_recv_counts")
        written = comb[t][e].written
        _same(r.x_out[written], comb[t][e].x_out[written], f"process {rank} x_out")
