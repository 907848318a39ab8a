"""Atlas A2 (``Ascend910B``) dispatch → combine rounds on the mock, bit for bit against the golden with
``soc="Ascend910B"``: seeded configurations of 16 ranks as threads (quant 0 and 2, with and without
expert_scales, comm_alg "", "fullmesh" and "hierarchy", comm quant 2 with "hierarchy", uneven BS, 1-D
masks), one world as processes, and the output sizes A2 gives (ep_recv_counts' extra entries when
expert_scales are given)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.moe_cases import A2, Case, on_profile
from helpers.moe_world import run_world

W = 16


def a2_case(rng: np.random.Generator, seed: int, combine: bool, W: int = W) -> Case:
    """One A2 configuration of W ranks: no shared or special experts, small H (a multiple of 32) and BS
    so that 16 ranks stay fast; "hierarchy" only where its worlds (16, 32, 64) allow it."""
    comm_alg = ["", "fullmesh", "hierarchy"][rng.integers(3 if W >= 16 else 2)]
    L = int(rng.integers(1, 4))
    K = int(rng.integers(1, min(6, L * W) + 1))
    H = int(rng.choice([32, 64, 96, 256]))
    bs = int(rng.integers(1, 5))
    if rng.random() < 0.25:      # uneven BS
        bss = [int(rng.integers(1, bs + 1)) for _ in range(W)]
        global_bs, mask = (max(bss) + int(rng.integers(0, 2))) * W, "none"
    else:
        bss = [bs] * W
        global_bs = 0 if rng.random() < 0.6 else bs * W
        mask = "1d" if rng.random() < 0.4 else "none"
    quant = int(rng.choice([0, 2]))
    return Case(seed=seed, W=W, H=H, K=K, L=L, S=1, R=0, bss=bss, global_bs=global_bs, mask=mask, quant=quant,
                smooth=bool(quant == 2 and comm_alg != "hierarchy" and rng.random() < 0.5),
                dtype=["fp16", "bf16"][rng.integers(2)], escales=bool(rng.random() < 0.6),
                ent_type=int(rng.integers(2)), comm_alg=comm_alg,
                comm_quant=int(rng.choice([0, 2])) if combine and comm_alg == "hierarchy" else 0,
                weights=bool(rng.random() < 0.6), zero_row=bool(rng.random() < 0.3), soc=A2,
                perf=bool(rng.random() < 0.5))


def a2_cases(count: int, base_seed: int, combine: bool) -> list[Case]:
    rng = np.random.default_rng(base_seed)
    return [a2_case(rng, base_seed + i, combine) for i in range(count)]


@on_profile(A2)
def test_a2_rounds_bit_for_bit_threads(profile):
    cases = a2_cases(10, 2300, combine=True)
    # the matrix covers what the A2 rules allow, not one corner of it
    assert {c.comm_alg for c in cases} == {"", "fullmesh", "hierarchy"}
    assert {c.quant for c in cases} == {0, 2} and {c.escales for c in cases} == {False, True}
    assert any(c.comm_quant == 2 for c in cases)
    run_world(cases, combine=True)


@on_profile(A2)
@pytest.mark.parametrize("w", [2, 5, 8])
def test_a2_one_server_worlds(profile, w):
    """The newest documents' "fullmesh" worlds of one server (2 ... 8 ranks), with performance_info on
    some calls: bit for bit against the golden (the refusal under 8.3.RC1: tests/ops/test_a2_profile.py)."""
    rng = np.random.default_rng(2700 + w)
    cases = [a2_case(rng, 2700 + 10 * w + i, True, W=w) for i in range(3)]
    assert any(c.perf for c in cases)
    run_world(cases, combine=True)


@on_profile(A2)
def test_a2_dispatch_only_threads(profile):
    run_world(a2_cases(6, 2400, combine=False), combine=False)


@on_profile(A2)
def test_a2_round_processes(profile):
    run_world(a2_cases(2, 2500, combine=True), combine=True, processes=True)


@on_profile(A2)
@pytest.mark.parametrize("comm_alg", ["fullmesh", "hierarchy"])
@pytest.mark.parametrize("escales", [False, True])
def test_a2_ep_recv_counts_size(profile, comm_alg, escales):
    """The wrapper allocates ep_recv_counts as the A2 algorithm writes it: W * L counts, plus
    2 * G * K * (W / 8) entries of reduce information with "hierarchy"; the counts are the golden's,
    the rest opaque."""
    from aclnn_py import golden

    c = replace_case(a2_cases(1, 2600, combine=False)[0], comm_alg=comm_alg, escales=escales, smooth=False,
                     mask="none")
    res = run_world([c], combine=False)
    g = c.global_bs or c.bss[0] * W
    want = golden.ep_recv_counts_size(W, c.L, g, c.K, comm_alg=comm_alg, soc=A2)
    assert want == W * c.L + (2 * g * c.K * 2 if comm_alg == "hierarchy" else 0)
    for r in range(W):
        assert res[r][0]["recv_len"] == want


def replace_case(c: Case, **changes: object) -> Case:
    from dataclasses import replace

    return replace(c, **changes)  # type: ignore[arg-type]


def _buffer_round(rank: int, world_size: int, root: bytes, comm_alg: str) -> tuple[np.ndarray, ...]:
    """One MoeDistributeBuffer round on this rank (CANN's Python names): dispatch with quant 2 and
    topk_weights, an identity "expert" on the dequantised rows, combine. Returns x, ids, the weights
    and x_out."""
    import ml_dtypes

    from aclnn_py import MoeDistributeBuffer, _mock
    from aclnn_py.hccl import Communicator

    if _mock.soc() != A2:
        _mock.set_soc("Ascend910B2")
    rng = np.random.default_rng(70 + rank)
    x = rng.standard_normal((3, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
    ids = np.stack([rng.choice(W * 2, size=2, replace=False) for _ in range(3)]).astype(np.int32)
    w = rng.random((3, 2), dtype=np.float32)
    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        d = buf.low_latency_dispatch(x, ids, W * 2, quant_mode=2, comm_alg=comm_alg, topk_weights=w)
        y = (d.expand_x.numpy().astype(np.float32) * d.dynamic_scales.numpy()[:, None]).astype(ml_dtypes.bfloat16)
        out = buf.low_latency_combine(y, ids, w, d.assist_info_for_combine, d.ep_recv_counts, num_experts=W * 2,
                                      comm_alg=comm_alg, expand_scales=d.expand_scales).numpy()
    return x, ids, w, out


@on_profile(A2)
@pytest.mark.parametrize("comm_alg", ["fullmesh", "hierarchy"])
def test_a2_buffer_round_matches_golden(profile, comm_alg):
    """MoeDistributeBuffer, as an A2 user calls it, bit for bit against the golden's dispatch → the
    same expert → combine."""
    import ml_dtypes

    from aclnn_py import golden
    from aclnn_py.worlds import run_threads

    res = run_threads(_buffer_round, W, comm_alg)
    xs, ids, ws = [r[0] for r in res], [r[1] for r in res], [r[2] for r in res]
    g = golden.dispatch(xs, ids, moe_expert_num=W * 2, quant_mode=2, expert_scales=ws, comm_alg=comm_alg, soc=A2)
    ys = [(d.expand_x[:d.num_rows].astype(np.float32) * d.dynamic_scales[:d.num_rows, None]).astype(ml_dtypes.bfloat16)
          for d in g]
    gc = golden.combine(ys, ids, [d.assist_info_for_combine for d in g], [d.ep_recv_counts for d in g],
                        expert_scales=ws, moe_expert_num=W * 2, comm_alg=comm_alg, soc=A2)
    for r in range(W):
        assert np.array_equal(res[r][3].view(np.uint16), gc[r].x_out.view(np.uint16)), f"rank {r}"
