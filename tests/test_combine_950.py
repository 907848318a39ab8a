"""aclnnMoeDistributeCombineV5 on the mock's Ascend950 profile vs aclnn_py.golden (soc="Ascend950"):
dispatch (every 950 quant mode / input format) → a deterministic expert → combine with comm quant 0,
2 (int8, the 950's fused dequantisation order), 3 (MXFP8 e5m2) and 4 (MXFP8 e4m3fn), elastic_info and
performance_info, bit for bit (const-expert rows within 1 ulp, SPEC §0); plus MXFP8 transport of
non-finite and extreme rows, and comm quant 2 giving the same bytes on both profiles (golden choice 9)."""

from __future__ import annotations

import moe_harness as mh
import moe_harness_950 as mh9
import numpy as np
import pytest

MATRIX = {2: 60, 3: 50, 4: 50, 8: 30}
CHUNK = 25


@pytest.fixture(autouse=True)
def soc950(mock):
    mock.set_soc("Ascend950")
    yield
    mock.set_soc("Ascend910_93")


def cases_for(w: int, start: int, count: int, base_seed: int = 195_000) -> list[mh9.Case950]:
    rng = np.random.default_rng(base_seed + 131 * w + start)
    return [mh9.random_case(rng, w, seed=base_seed + 1000 * w + start + i, combine=True) for i in range(count)]


def _chunks():
    for w, n in MATRIX.items():
        for i in range(0, n, CHUNK):
            yield pytest.param(w, i, min(CHUNK, n - i), id=f"W{w}-{i // CHUNK}")


@pytest.mark.parametrize("w,start,count", list(_chunks()))
def test_round_trip_950_matches_golden(acl, w, start, count):
    mh9.run_world(cases_for(w, start, count), combine=True)


def test_matrix_covers_the_issue(acl):
    cases = [c for w, n in MATRIX.items() for i in range(0, n, CHUNK) for c in cases_for(w, i, min(CHUNK, n - i))]
    assert len(cases) >= 180
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    assert seen(lambda c: c.comm_quant) == {0, 2, 3, 4}
    assert seen(lambda c: (c.comm_quant, c.dtype)) >= {(q, d) for q in (3, 4) for d in ("fp16", "bf16")}
    assert seen(lambda c: c.quant) == {0, 1, 2, 3, 4, 5} and seen(lambda c: c.xfmt) >= set(mh9.LOWP_X)
    assert seen(lambda c: c.elastic) == {"none", "flag0", "perm"} and seen(lambda c: c.perf) == {False, True}
    assert seen(lambda c: c.weights) == {False, True} and seen(lambda c: c.shared_x) == {False, True}
    assert seen(lambda c: c.Q > 0) == {False, True} and seen(lambda c: c.C > 0) == {False, True}
    assert seen(lambda c: (c.S, c.R)) == set(mh.SR_PAIRS) and seen(lambda c: c.mask) == {"none", "1d", "2d"}


# ---- MXFP8 transport of extreme rows: zero, tiny, huge (saturating), inf/NaN blocks (0xFF scale) -----------------
def _routing(rank, bs):
    """assist_info (A*128,) and ep_recv_counts (W*L,) of a dispatch where every token of rank r went to
    expert r, i.e. to rank r itself (W=2, E=2, L=1, K=1)."""
    assist = np.zeros(bs * 2 * 128, np.int32)
    assist[:3 * bs] = np.stack([np.full(bs, rank), np.arange(bs), np.zeros(bs, int)], 1).reshape(-1)
    counts = np.array([bs, bs] if rank == 0 else [0, bs], np.int32)
    return assist, counts


def _mx_body(rank, world_size, root, ys, ids, cq):
    from aclnn_py import Device
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import moe_distribute_combine

    # two ranks, E=2, K=1: token t of rank r goes to expert r (itself); expand_x row t comes back as-is
    bs, h = ys[rank].shape
    assist, counts = _routing(rank, bs)
    ex = np.zeros((bs * 2, h), ys[rank].dtype)
    ex[:bs] = ys[rank]
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        out = moe_distribute_combine(ctx, ex, ids[rank], assist, counts, None, ep_world_size=world_size,
                                     ep_rank_id=rank, moe_expert_num=2, ccl_buffer_size=ccl, comm_quant_mode=cq,
                                     stream=s)
        s.synchronize()
        res = out.numpy()
        s.close()
    return res


@pytest.mark.parametrize("cq", [3, 4])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_mxfp8_transport_of_extreme_rows(acl, cq, dtype):
    from aclnn_py import golden
    from aclnn_py.launch import run_threads

    dt = mh.DTYPES[dtype]
    rng = np.random.default_rng(cq * 10 + len(dtype))
    bs, h = 6, 1056                       # 33 blocks of 32: a tail and an odd block count
    ys = []
    for _ in range(2):
        y = rng.standard_normal((bs, h), dtype=np.float32)
        y[0] = 0                                              # all-zero blocks: scale 0
        y[1] *= 2.0**-20 if dtype == "fp16" else 2.0**-110    # subnormal products
        y[2] *= 8000.0 if dtype == "fp16" else 2.0**100       # large blocks
        y[3, 5] = np.inf                                      # a 0xFF block: NaN after dequantisation
        y[4, 40] = np.nan
        y[5, 1050] = -np.inf                                  # in the tail block
        ys.append(y.astype(dt))
    ids = [np.full((bs, 1), r, np.int32) for r in range(2)]
    res = run_threads(_mx_body, 2, ys, ids, cq, timeout=60)
    routes = [_routing(r, bs) for r in range(2)]
    g = golden.combine(ys, ids, [a[:3 * bs] for a, _ in routes], [c for _, c in routes], moe_expert_num=2,
                       comm_quant_mode=cq, soc="Ascend950")
    for r in range(2):
        assert res[r].view(np.uint16).tobytes() == g[r].x_out.view(np.uint16).tobytes(), (r, cq, dtype)
        assert np.isnan(res[r][3, :32].astype(np.float32)).all() and not np.isnan(res[r][3, 32:].astype(np.float32)).any()


def test_comm_quant_2_same_bytes_on_both_profiles(acl, mock):
    rng = np.random.default_rng(2)
    base = mh.random_case(rng, 4, seed=4242, combine=True)
    base = mh.replace(base, quant=0, smooth=False, comm_quant=2, Q=0, shared_x=False)
    inp = mh.make_inputs(base)
    from aclnn_py.launch import run_threads

    out = {}
    for soc in ("Ascend910_93", "Ascend950"):
        mock.set_soc(soc)
        res = run_threads(mh.world_body, 4, [base], [inp], True)
        out[soc] = [res[r][0]["x_out"] for r in range(4)]
    for a, b in zip(out["Ascend910_93"], out["Ascend950"]):
        assert a.tobytes() == b.tobytes()
