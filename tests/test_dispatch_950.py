"""aclnnMoeDistributeDispatchV5 on the mock's Ascend950 profile vs aclnn_py.golden (soc="Ascend950"),
bit for bit, over 320 seeded configurations of the issue 6 matrix: quant modes 1 (int8 / hifloat8;
scalar, (H,) and per-expert scales), 2 (int8, fp8 e4m3fn / e5m2), 3 (per-group 128), 4 (MX: fp8 and
packed fp4 e2m1 / e1m2), 5 (MX clip), quant 0 with hifloat8 / fp8 / fp4 inputs and forwarded per-token
scales (float32 or e8m0), extreme MX blocks (tiny, huge, inf/NaN), elastic_info (flag 0 and rank
permutations), performance_info; plus process worlds, MoeDistributeBuffer's dtype arguments,
performance_info timing and elastic_info run-time errors (SPEC §4.6, §4.7, §10, golden choices 1-11)."""

from __future__ import annotations

import moe_harness as mh
import moe_harness_950 as mh9
import numpy as np
import pytest

# W -> configurations; one world runs a chunk of them
MATRIX = {2: 100, 3: 70, 4: 70, 8: 50, 16: 30}
CHUNK = 35


@pytest.fixture(autouse=True)
def soc950(mock):
    mock.set_soc("Ascend950")
    yield
    mock.set_soc("Ascend910_93")


def cases_for(w: int, start: int, count: int, combine: bool = False, base_seed: int = 95_000) -> list[mh9.Case950]:
    rng = np.random.default_rng(base_seed + 131 * w + start)
    return [mh9.random_case(rng, w, seed=base_seed + 1000 * w + start + i, combine=combine) for i in range(count)]


def _chunks():
    for w, n in MATRIX.items():
        for i in range(0, n, CHUNK):
            yield pytest.param(w, i, min(CHUNK, n - i), id=f"W{w}-{i // CHUNK}")


@pytest.mark.parametrize("w,start,count", list(_chunks()))
def test_dispatch_950_matches_golden(acl, w, start, count):
    mh9.run_world(cases_for(w, start, count), combine=False)


def test_matrix_covers_the_issue(acl):
    cases = [c for w, n in MATRIX.items() for i in range(0, n, CHUNK) for c in cases_for(w, i, min(CHUNK, n - i))]
    assert len(cases) >= 300
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    modes = seen(lambda c: (c.quant, c.yfmt))
    for q, fmts in mh9.Y_FORMATS.items():
        for f in fmts:
            assert (q, f) in modes, (q, f)
    assert seen(lambda c: c.xfmt) >= set(mh9.LOWP_X)
    assert seen(lambda c: c.static_kind if c.quant == 1 else None) >= {"scalar", "row", "expert"}
    assert seen(lambda c: (c.quant, c.smooth) if c.quant in (2, 3) else None) >= {(2, True), (2, False), (3, True),
                                                                                 (3, False)}
    assert seen(lambda c: c.tok_e8m0 if c.xfmt else None) >= {True, False}
    assert seen(lambda c: c.extreme) == {False, True}
    assert seen(lambda c: c.elastic) == {"none", "flag0", "perm"}
    assert seen(lambda c: (c.elastic, c.R > 0)) >= {("perm", True), ("perm", False)}
    assert seen(lambda c: c.perf) == {False, True}
    assert seen(lambda c: c.dtype) == {"fp16", "bf16"}
    assert seen(lambda c: c.H % 2 == 1 and c.yfmt is not None and c.yfmt.startswith("float4")) == {False}
    assert seen(lambda c: c.mask) == {"none", "1d", "2d"} and seen(lambda c: (c.S, c.R)) == set(mh.SR_PAIRS)
    assert seen(lambda c: c.comm_alg) == set(mh.COMM_ALGS) and seen(lambda c: len(set(c.bss)) > 1) == {False, True}


@pytest.mark.parametrize("w", [2, 4])
def test_dispatch_950_in_processes(acl, w, monkeypatch):
    from aclnn_py.launch import spawn

    monkeypatch.setenv("ACLNN_MOCK_SOC", "Ascend950")
    cases = cases_for(w, 0, 6, base_seed=96_000)
    inputs = [mh9.make_inputs(c) for c in cases]
    results = spawn(mh9.world_body, w, cases, inputs, False, timeout=300)
    for i, (c, inp) in enumerate(zip(cases, inputs)):
        g = mh9.golden_dispatch(c, inp)
        for r in range(w):
            mh9.check_dispatch(c, r, results[r][i], g[r])


def test_moderate_world_size(acl):
    # W = 32 on the 950 (W up to 1024 is checked in tests/test_moe_checks_950.py)
    rng = np.random.default_rng(32)
    cases = [mh9.random_case(rng, 32, seed=97_000 + i) for i in range(4)]
    cases = [mh9.Case950(base=mh.replace(c.base, bss=[min(b, 4) for b in c.bss],
                                         global_bs=max(min(b, 4) for b in c.bss) * 32 if c.global_bs else 0,
                                         mask="none"),
                         yfmt=c.yfmt, xfmt=c.xfmt, static_kind=c.static_kind, tok_dim1=c.tok_dim1,
                         tok_e8m0=c.tok_e8m0, elastic=c.elastic, perf=True) for c in cases]
    for c in cases:
        if len(set(c.bss)) == 1 and c.global_bs == 0:
            continue
        c.base = mh.replace(c.base, global_bs=max(c.bss) * 32)
    mh9.run_world(cases, combine=False)


def test_widest_per_token_scales_match_golden(acl):
    """Low-precision x with the widest per-token scales a window row holds (fp8 x, float32: H/4;
    fp4 x, float32: 3H/8; e8m0: H) and the narrowest (dim1 = 1), bit for bit."""
    base = mh.Case(seed=31337, W=2, H=1024, K=2, L=2, S=1, R=0, bss=[5, 5], global_bs=0, mask="none", quant=0)
    cases = [mh9.Case950(base=mh.replace(base, seed=31337 + i), xfmt=x, tok_dim1=d, tok_e8m0=e8)
             for i, (x, d, e8) in enumerate([("float8_e4m3fn", 256, False), ("float4_e2m1", 384, False),
                                             ("hifloat8", 1024, True), ("float8_e5m2", 1, False)])]
    mh9.run_world(cases, combine=False)


# ---- MoeDistributeBuffer: y_dtype, x_dtype, x_smooth_scales_dtype (SPEC §10, §0) ---------------------------
def _buffer_body(rank, world_size, root, xs, ids, kw):
    from aclnn_py import Device, MoeDistributeBuffer
    from aclnn_py.hccl import Communicator

    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        s = Device.current().create_stream()
        out = buf.low_latency_dispatch(xs[rank], ids[rank], 4, stream=s,
                                       **{k: (v[rank] if isinstance(v, list) else v) for k, v in kw.items()})
        buf.synchronize(s)
        n = int(out.ep_recv_counts.numpy()[-1])
        res = (n, out.expand_x.numpy()[:n], out.dynamic_scales.numpy()[:n], out.expand_x.dtype,
               out.expand_x.shape, out.dynamic_scales.dtype, out.dynamic_scales.shape)
        s.close()
    return res


@pytest.mark.parametrize("case", ["fp8-q2", "fp4-q4", "hif8-q1", "e5m2-q5", "q3", "hif8-x", "fp4-x", "e8m0-scales"])
def test_buffer_dtype_arguments(acl, case):
    import ml_dtypes

    from aclnn_py import DataType, golden
    from aclnn_py.launch import run_threads

    rng = np.random.default_rng(len(case))
    w, bs, h = 2, 3, 1024
    xs = [(rng.standard_normal((bs, h), dtype=np.float32) * 3).astype(ml_dtypes.bfloat16) for _ in range(w)]
    ids = [np.array([[0, 1], [2, 3], [1, 2]], np.int32) for _ in range(w)]
    kw: dict = {}
    gkw: dict = {}
    if case == "fp8-q2":
        kw = dict(quant_mode=2, y_dtype=ml_dtypes.float8_e4m3fn)
        gkw = dict(quant_mode=2, y_dtype="float8_e4m3fn")
    elif case == "fp4-q4":
        kw = dict(quant_mode=4, y_dtype=DataType.FLOAT4_E2M1)
        gkw = dict(quant_mode=4, y_dtype="float4_e2m1")
    elif case == "hif8-q1":
        sc = np.array([2.5], np.float32)
        kw = dict(quant_mode=1, y_dtype=DataType.HIFLOAT8, x_smooth_scale=sc)
        gkw = dict(quant_mode=1, y_dtype="hifloat8", scales=sc)
    elif case == "e5m2-q5":
        kw = dict(quant_mode=5, y_dtype="float8_e5m2")
        gkw = dict(quant_mode=5, y_dtype="float8_e5m2")
    elif case == "q3":
        kw = dict(quant_mode=3, y_dtype=ml_dtypes.float8_e5m2)
        gkw = dict(quant_mode=3, y_dtype="float8_e5m2")
    else:
        fmt = {"hif8-x": DataType.HIFLOAT8, "fp4-x": DataType.FLOAT4_E1M2, "e8m0-scales": DataType.FLOAT8_E4M3FN}[case]
        width = h // 2 if fmt == DataType.FLOAT4_E1M2 else h
        xs = [rng.integers(0, 256, size=(bs, width), dtype=np.uint8) for _ in range(w)]
        if case == "e8m0-scales":
            sc = [rng.integers(0, 256, size=(bs, h // 32), dtype=np.uint8) for _ in range(w)]
            kw = dict(x_dtype=fmt, x_smooth_scale=sc, x_smooth_scales_dtype=DataType.FLOAT8_E8M0)
        else:
            sc = [rng.standard_normal((bs, 4), dtype=np.float32) for _ in range(w)]
            kw = dict(x_dtype=fmt, x_smooth_scale=sc, x_smooth_scales_dtype=np.float32)
        gkw = dict(x_dtype=int(fmt), scales=sc)
    res = run_threads(_buffer_body, w, xs, ids, kw, timeout=60)
    g = golden.dispatch(xs, ids, moe_expert_num=4, soc="Ascend950", **gkw)
    for r in range(w):
        n, ex, ds, ex_dt, ex_shape, ds_dt, ds_shape = res[r]
        assert n == g[r].num_rows
        assert ex.tobytes() == np.ascontiguousarray(g[r].expand_x).tobytes(), case
        assert ex_shape[1] == h   # logical elements; packed fp4 downloads as (A, H/2) bytes
        if g[r].dynamic_scales is not None:
            assert ds.tobytes() == np.ascontiguousarray(g[r].dynamic_scales).tobytes(), case
            assert ds_shape[1:] == g[r].dynamic_scales.shape[1:]


# ---- performance_info (SPEC §0, §3.1): µs waited per source rank ----------------------------------------------
def _perf_body(rank, world_size, root, rounds, delay):
    from aclnn_py import Device, Tensor, _mock
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import moe_distribute_dispatch

    x = np.ones((2, 1024), np.float16)
    ids = np.array([[0, 1], [1, 0]], np.int32)
    seen = []
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        perf = Tensor.zeros((world_size,), np.int64)
        for i in range(rounds):
            if delay and rank == 1 and i == 1:
                _mock.inject_fault("dispatch", rank=1, kind="delay", seconds=delay)
            moe_distribute_dispatch(ctx, x, ids, ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=2,
                                    ccl_buffer_size=ccl, performance_info=perf, stream=s)
            s.synchronize()
            seen.append(perf.numpy().copy())
        s.close()
    return seen


def test_performance_info_accumulates_wait_per_source_rank(acl):
    from aclnn_py.launch import run_threads

    res = run_threads(_perf_body, 2, 4, 0.3, timeout=60)
    for seen in res:
        for a, b in zip(seen, seen[1:]):
            assert (b >= a).all(), seen                       # only grows
        assert all(p.shape == (2,) and p.dtype == np.int64 for p in seen)
    # rank 1 arrived 0.3 s late in round 1: rank 0 waited for it that long (µs), not for itself
    r0 = res[0]
    assert r0[1][1] - r0[0][1] >= 250_000, r0
    assert r0[-1][0] < 100_000, r0
    assert res[1][-1][0] < 250_000, res[1]


# ---- elastic_info at run time (SPEC §4.7, golden choice 10) ----------------------------------------------------
def _elastic_body(rank, world_size, root, info):
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import moe_distribute_dispatch

    x = np.ones((2, 1024), np.float16)
    ids = np.array([[0, 1], [1, 0]], np.int32)
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        moe_distribute_dispatch(ctx, x, ids, ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=2,
                                ccl_buffer_size=ccl, elastic_info=info, stream=s)
        try:
            s.synchronize()
            return 0, ""
        except AclError as e:
            return e.code, str(e)
        finally:
            s.close()


@pytest.mark.parametrize("info,text", [
    ([1, 2, 0, 2, 0, 0, 0, 0], "elastic_info: the rank table [4+W, 4+2W) must be a permutation of 0..1 (entry 1 is 0)"),
    ([1, 2, 0, 2, 0, 0, 1, 5], "must be a permutation of 0..1 (entry 1 is 5)"),
    ([1, 3, 0, 2, 0, 0, 1, 0], "elastic_info: [1], [2], [3] must equal ep_world_size, shared_expert_rank_num, "
                               "moe_expert_num (got 3, 0, 2 vs 2, 0, 2"),
], ids=["not-a-permutation", "out-of-range", "other-world"])
def test_elastic_info_bad_table_fails_the_kernel(acl, info, text):
    from aclnn_py.launch import run_threads

    for code, msg in run_threads(_elastic_body, 2, np.array(info, np.int32), timeout=60):
        assert code == 507015 and text in msg, msg


def test_elastic_info_flag_zero_is_the_identity(acl):
    from aclnn_py.launch import run_threads

    info = np.array([0, 9, 9, 9, 0, 0, 1, 1], np.int32)   # flag 0: nothing else is read
    assert [code for code, _ in run_threads(_elastic_body, 2, info, timeout=60)] == [0, 0]
