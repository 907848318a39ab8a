"""aclnnMoeDistributeDispatchV5 on the mock vs aclnn_py.golden, bit for bit, on both SoC profiles:
Ascend910_93 over 300 seeded configurations of its matrix, Ascend950 over 320 of its own (quant modes
1-5 with every output format, low-precision inputs with forwarded per-token scales, extreme MX rows,
elastic_info, performance_info; tests/helpers/moe_cases.py), in thread worlds and a subset in process
worlds; plus the two-phase contract, the all-zero-row and untouched-region rules, timeouts, call-order
and parameter mismatches, and the 950's buffer dtype arguments, performance_info timing and elastic_info
run-time errors."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.moe_cases import (
    A3,
    A950,
    COMM_ALGS,
    LOWP_X,
    PROFILES,
    SR_PAIRS,
    Y_FORMATS,
    Case,
    cases_for,
    make_inputs,
    on_profile,
    random_case,
    replace,
)
from helpers.moe_world import golden_dispatch, lonely_launch, run_world, world_body

# per profile: W -> configurations, configurations per world, seed base
MATRIX = {A3: ({2: 80, 3: 60, 4: 60, 8: 60, 16: 40}, 20, 40_000),
          A950: ({2: 100, 3: 70, 4: 70, 8: 50, 16: 30}, 35, 95_000)}


def _chunks():
    for soc in PROFILES:
        matrix, chunk, _ = MATRIX[soc]
        for w, n in matrix.items():
            for i in range(0, n, chunk):
                yield pytest.param(soc, w, i, min(chunk, n - i), id=f"{soc}-W{w}-{i // chunk}")


def _matrix_cases(soc: str) -> list[Case]:
    matrix, chunk, seed = MATRIX[soc]
    return [c for w, n in matrix.items() for i in range(0, n, chunk)
            for c in cases_for(soc, w, i, min(chunk, n - i), seed)]


@pytest.mark.parametrize("profile,w,start,count", list(_chunks()), indirect=["profile"])
def test_dispatch_matches_golden(acl, profile, w, start, count):
    run_world(cases_for(profile, w, start, count, MATRIX[profile][2]), combine=False)


def test_a3_matrix_covers_the_issue(acl):
    cases = _matrix_cases(A3)
    assert len(cases) >= 300
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    assert seen(lambda c: c.W) == {2, 3, 4, 8, 16}
    assert seen(lambda c: c.H) == {1024, 2048, 7168}
    assert seen(lambda c: (c.S, c.R)) == set(SR_PAIRS)
    assert seen(lambda c: c.mask) == {"none", "1d", "2d"}
    assert seen(lambda c: c.quant) == {0, 2} and seen(lambda c: c.smooth) == {False, True}
    assert seen(lambda c: c.dtype) == {"fp16", "bf16"}
    assert seen(lambda c: c.escales) == {False, True} and seen(lambda c: c.ent_type) == {0, 1}
    assert seen(lambda c: c.comm_alg) == set(COMM_ALGS)
    assert seen(lambda c: len(set(c.bss)) > 1) == {False, True}          # uneven BS with global_bs
    assert seen(lambda c: c.Z > 0) == {False, True} and seen(lambda c: c.C > 0) == {False, True}
    assert seen(lambda c: c.Q > 0) == {False, True}
    assert seen(lambda c: c.L) == set(range(1, 9))
    assert min(seen(lambda c: c.K)) == 1 and max(seen(lambda c: c.K)) == 16
    assert min(seen(lambda c: max(c.bss))) == 1 and max(seen(lambda c: max(c.bss))) >= 60


def test_950_matrix_covers_the_issue(acl):
    cases = _matrix_cases(A950)
    assert len(cases) >= 300
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    modes = seen(lambda c: (c.quant, c.yfmt))
    for q, fmts in Y_FORMATS.items():
        for f in fmts:
            assert (q, f) in modes, (q, f)
    assert seen(lambda c: c.xfmt) >= set(LOWP_X)
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
    assert seen(lambda c: c.mask) == {"none", "1d", "2d"} and seen(lambda c: (c.S, c.R)) == set(SR_PAIRS)
    assert seen(lambda c: c.comm_alg) == set(COMM_ALGS) and seen(lambda c: len(set(c.bss)) > 1) == {False, True}


@pytest.mark.parametrize("w", [2, 4])
def test_dispatch_in_processes(acl, profile, w):
    run_world(cases_for(profile, w, 0, 6, 41_000 if profile == A3 else 96_000), combine=False, processes=True)


def test_comm_algs_give_identical_outputs(acl, profile):
    rng = np.random.default_rng(5)
    base = random_case(rng, 4, seed=777)
    base = replace(base, K=min(base.K, 12), bss=[8] * 4, global_bs=0, quant=2, smooth=True, soc=profile)
    cases = [replace(base, comm_alg=a) for a in COMM_ALGS]
    inputs = [make_inputs(cases[0])] * 3
    from aclnn_py.worlds import run_threads

    res = run_threads(world_body, 4, cases, inputs, False)
    for r in range(4):
        for k in ("expand_x", "dynamic_scales", "assist", "recv", "tok_nums", "expand_scales"):
            assert res[r][0][k].tobytes() == res[r][1][k].tobytes() == res[r][2][k].tobytes(), k


# ---- the all-zero row and untouched regions ------------------------------------------------------------------
def _zero_row_body(rank, world_size, root):
    from aclnn_py import Device, Tensor
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import DispatchOutputs, prepare_dispatch

    bs, h = 4, 1024
    x = np.ones((bs, h), np.float16)
    x[1] = 0                      # all-zero row
    ids = np.array([[0, 1]] * bs, np.int32)   # experts 0 (rank 0) and 1 (rank 1)
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        a = bs * world_size * 1
        outs = DispatchOutputs(
            expand_x=Tensor.empty((a, h), np.int8), dynamic_scales=Tensor.empty((a,), np.float32),
            assist_info_for_combine=Tensor.empty((a * 128,), np.int32),
            expert_token_nums=Tensor.empty((1,), np.int64), ep_recv_counts=Tensor.empty((world_size,), np.int32),
            tp_recv_counts=Tensor.empty((0,), np.int32), expand_scales=Tensor.empty((0,), np.float32))
        for t in (outs.expand_x, outs.dynamic_scales, outs.assist_info_for_combine):
            t.fill_bytes(0x5A)    # not the allocation poison: the kernel must leave these bytes alone
        p = prepare_dispatch(ctx, x, ids, ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=2,
                             ccl_buffer_size=ccl, quant_mode=2, outputs=outs, stream=s)
        p.launch(s)
        s.synchronize()
        res = (outs.expand_x.numpy(), outs.dynamic_scales.numpy(), outs.assist_info_for_combine.numpy(),
               outs.ep_recv_counts.numpy())
        s.close()
    return res


def test_all_zero_row_and_untouched_regions(acl, profile):
    from aclnn_py.worlds import run_threads

    for ex, ds, ai, recv in run_threads(_zero_row_body, 2, timeout=60):
        n = int(recv[-1])
        assert n == 8                                   # 4 tokens from each of the 2 ranks
        tokens = ai[:3 * n].reshape(n, 3)[:, 1]
        zero = tokens == 1
        assert zero.sum() == 2
        assert np.all(ds[:n][zero] == 0.0) and not np.signbit(ds[:n][zero]).any()   # scale 1/inf = +0.0
        assert np.all(ex[:n][zero] == 0)
        assert np.all(ex[:n][~zero] == 127) and np.allclose(ds[:n][~zero], 1 / 127)
        assert np.all(ex[n:].view(np.uint8) == 0x5A)
        assert np.all(ds[n:].view(np.uint8) == 0x5A)
        assert np.all(ai[3 * n:].view(np.uint8) == 0x5A)


# ---- two-phase contract --------------------------------------------------------------------------------------
def _small_case(w=2, **kw):
    c = Case(seed=99, W=w, H=1024, K=2, L=2, S=1, R=0, bss=[6] * w, global_bs=0, mask="none", quant=2,
                escales=True)
    return replace(c, **kw)


def _two_phase_body(rank, world_size, root, c1, in1, in2):
    from aclnn_py import Device, Tensor
    from aclnn_py.errors import ClosedError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_dispatch

    out = {}
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        ffi, lib = acl_backend()

        def prep(inp, repeatable=False):
            return prepare_dispatch(ctx, inp.x[rank], inp.ids[rank], ep_world_size=world_size, ep_rank_id=rank,
                                    ccl_buffer_size=ccl, expert_scales=inp.escales[rank], quant_mode=c1.quant,
                                    stream=s, repeatable=repeatable, **c1.kwargs())

        # a normal executor is consumed by its launch
        p = prep(in1)
        p.launch(s)
        s.synchronize()
        try:
            p.launch(s)
            out["second_launch_py"] = None
        except ClosedError as e:  # the wrapper knows the executor was consumed
            out["second_launch_py"] = str(e)
        from aclnn_py import DeviceMemory

        ws = DeviceMemory(p.workspace_size)
        ret = lib.aclnnMoeDistributeDispatchV5(ffi.cast("void *", ws.ptr), p.workspace_size, p.executor,
                                               ffi.cast("void *", s.handle))  # and so does the C side
        out["second_launch"] = (ret, _msg())
        # NULL and too-small workspaces are refused (and consume the executor, launching nothing)
        p = prep(in1)
        assert p.workspace_size > 0
        ret = lib.aclnnMoeDistributeDispatchV5(ffi.NULL, p.workspace_size, p.executor, ffi.cast("void *", s.handle))
        out["null_ws"] = (ret, _msg())
        p = prep(in1)
        from aclnn_py import DeviceMemory

        small = DeviceMemory(p.workspace_size)
        ret = lib.aclnnMoeDistributeDispatchV5(ffi.cast("void *", small.ptr), p.workspace_size - 1, p.executor,
                                               ffi.cast("void *", s.handle))
        out["small_ws"] = (ret, _msg())
        out["ws_size"] = p.workspace_size
        # a repeatable executor: launch, rebind x / expert_ids / expert_scales and expand_x, launch again
        p = prep(in1, repeatable=True)
        p.launch(s)
        s.synchronize()
        first = {"expand_x": p.result.expand_x.numpy(), "recv": p.result.ep_recv_counts.numpy(),
                 "assist": p.result.assist_info_for_combine.numpy(), "scales": p.result.dynamic_scales.numpy()}
        p.rebind_input(1, Tensor.from_numpy(in2.x[rank], stream=s))
        p.rebind_input(2, Tensor.from_numpy(in2.ids[rank], stream=s))
        p.rebind_input(5, Tensor.from_numpy(in2.escales[rank], stream=s))
        new_ex = Tensor.empty(p.result.expand_x.shape, np.int8)
        p.rebind_output(0, new_ex)
        p.launch(s)
        s.synchronize()
        second = {"expand_x": new_ex.numpy(), "recv": p.result.ep_recv_counts.numpy(),
                  "assist": p.result.assist_info_for_combine.numpy(), "scales": p.result.dynamic_scales.numpy()}
        p.close()
        out["first"], out["second"] = first, second
        s.close()
    return out


def acl_backend():
    import aclnn_py

    b = aclnn_py.backend()
    return b.ffi, b.lib


def _msg():
    from aclnn_py.errors import _recent_message

    return _recent_message() or ""


def test_two_phase_contract(acl, profile):
    from aclnn_py.worlds import run_threads

    c = _small_case(soc=profile)
    in1 = make_inputs(c)
    in2 = make_inputs(replace(c, seed=100))
    g1, g2 = golden_dispatch(c, in1), golden_dispatch(c, in2)
    res = run_threads(_two_phase_body, 2, c, in1, in2, timeout=120)
    for r, o in enumerate(res):
        code, msg = o["second_launch"]
        assert code == 161002 and "executor" in msg
        assert "is closed: cannot launch it (a normal executor is consumed" in o["second_launch_py"]
        assert o["null_ws"][0] == 161002 and "workspace" in o["null_ws"][1]
        assert o["small_ws"][0] == 161002 and "workspace" in o["small_ws"][1]
        for out, g in ((o["first"], g1[r]), (o["second"], g2[r])):
            n = g.num_rows
            assert np.array_equal(out["recv"], g.ep_recv_counts)
            assert out["expand_x"][:n].tobytes() == g.expand_x.tobytes()
            assert np.array_equal(out["assist"][:3 * n], g.assist_info_for_combine)
            assert out["scales"][:n].tobytes() == g.dynamic_scales.tobytes()
        assert not np.array_equal(o["first"]["expand_x"][:8], o["second"]["expand_x"][:8])


# ---- timeouts, call order, parameter agreement ---------------------------------------------------------------
@on_profile(A3)
def test_peer_that_never_calls_times_out(acl, profile, monkeypatch):
    from aclnn_py.ops import prepare_dispatch
    from aclnn_py.worlds import run_threads

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "0.5")
    c = _small_case(quant=0, escales=False)
    inp = make_inputs(c)

    def prepare(ctx, ccl, s, rank, world_size):
        return prepare_dispatch(ctx, inp.x[rank], inp.ids[rank], ep_world_size=world_size, ep_rank_id=rank,
                                ccl_buffer_size=ccl, quant_mode=c.quant, stream=s, **c.kwargs())

    res = run_threads(lonely_launch, 2, 0.5, prepare, timeout=60)
    code, msg, dt = res[0]
    assert code == 507014
    assert "rank 0" in msg and "[1]" in msg and "Dispatch" in msg
    assert 0.45 <= dt < 3.5


def _mismatch_body(rank, world_size, root, cases, inputs, combine_on):
    """Rank r runs dispatch with cases[r] (or, when rank == combine_on, a combine)."""
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_combine, prepare_dispatch

    c, inp = cases[rank], inputs[rank]
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        if rank == combine_on:
            a = max(c.bss) * world_size * min(c.L, c.K)
            p = prepare_combine(ctx, np.zeros((a, c.H), np.float16), inp.ids[rank], np.zeros(a * 128, np.int32),
                                np.zeros(world_size * c.L, np.int32), ep_world_size=world_size, ep_rank_id=rank,
                                ccl_buffer_size=ccl, stream=s, **c.kwargs())
        else:
            p = prepare_dispatch(ctx, inp.x[rank], inp.ids[rank], ep_world_size=world_size, ep_rank_id=rank,
                                 ccl_buffer_size=ccl, quant_mode=c.quant, stream=s, **c.kwargs())
        p.launch(s)
        try:
            s.synchronize()
            res = None
        except AclError as e:
            res = (e.code, e.message)
        s.close()
    return res


def test_call_order_mismatch_is_detected(acl, profile, monkeypatch):
    from aclnn_py.worlds import run_threads

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "5")
    c = _small_case(quant=0, escales=False, dtype="fp16", soc=profile)
    inp = make_inputs(c)
    res = run_threads(_mismatch_body, 2, [c, c], [inp, inp], 1, timeout=60)
    for code, msg in res:
        assert code == 507015 and "call-order mismatch" in msg


@pytest.mark.parametrize("field,kw,text", [
    ("quant_mode", {"quant": 2}, "quant_mode: rank"),
    ("H", {"H": 2048}, "H (x dim 1): rank"),
    ("global_bs", {"bss": [7, 7]}, "maxBs (global_bs / ep_world_size): rank"),   # global_bs=0, unequal BS
])
def test_parameter_mismatch_names_the_field(acl, profile, monkeypatch, field, kw, text):
    from aclnn_py.worlds import run_threads

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "5")
    c0 = _small_case(quant=0, escales=False, soc=profile)
    c1 = replace(c0, **kw)
    inputs = [make_inputs(c0), make_inputs(c1)]
    res = run_threads(_mismatch_body, 2, [c0, c1], inputs, -1, timeout=60)
    for code, msg in res:
        assert code == 507015 and text in msg, msg


# ---- the Ascend950 profile only ------------------------------------------------------------------------------
@on_profile(A950)
def test_moderate_world_size(acl, profile):
    # W = 32 on the 950 (W up to 1024 is checked in tests/ops/test_moe_checks.py)
    rng = np.random.default_rng(32)
    cases = [random_case(rng, 32, seed=97_000 + i, soc=A950) for i in range(4)]
    cases = [replace(c, bss=[min(b, 4) for b in c.bss],
                     global_bs=max(min(b, 4) for b in c.bss) * 32 if c.global_bs else 0, mask="none", extreme=False,
                     perf=True) for c in cases]
    for c in cases:
        if len(set(c.bss)) == 1 and c.global_bs == 0:
            continue
        c.global_bs = max(c.bss) * 32
    run_world(cases, combine=False)


@on_profile(A950)
def test_widest_per_token_scales_match_golden(acl, profile):
    """Low-precision x with the widest per-token scales a window row holds (fp8 x, float32: H/4;
    fp4 x, float32: 3H/8; e8m0: H) and the narrowest (dim1 = 1), bit for bit."""
    base = Case(seed=31337, W=2, H=1024, K=2, L=2, S=1, R=0, bss=[5, 5], global_bs=0, mask="none", quant=0,
                soc=A950)
    cases = [replace(base, seed=31337 + i, xfmt=x, tok_dim1=d, tok_e8m0=e8)
             for i, (x, d, e8) in enumerate([("float8_e4m3fn", 256, False), ("float4_e2m1", 384, False),
                                             ("hifloat8", 1024, True), ("float8_e5m2", 1, False)])]
    run_world(cases, combine=False)


# ---- MoeDistributeBuffer: y_dtype, x_dtype, x_smooth_scales_dtype --------------------------------------------
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
@on_profile(A950)
def test_buffer_dtype_arguments(acl, profile, case):
    import ml_dtypes

    from aclnn_py import DataType, golden
    from aclnn_py.worlds import run_threads

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


# ---- performance_info: µs waited per source rank -------------------------------------------------------------
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


@on_profile(A950)
def test_performance_info_accumulates_wait_per_source_rank(acl, profile):
    from aclnn_py.worlds import run_threads

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


def _stamped_round(rank, world_size, root, hold, peak):
    from helpers.hccl_ranks import rss_kib

    from aclnn_py import Device, MoeDistributeBuffer
    from aclnn_py.hccl import Communicator

    x = np.ones((1, 1024), np.float16)
    ids = np.array([[rank]], np.int32)
    with Communicator(world_size, rank, root) as comm, MoeDistributeBuffer(comm) as buf:
        s = Device.current().create_stream()
        hold.wait()
        if rank == 0:
            peak["before"] = rss_kib()["RssShmem"]
        hold.wait()
        out = buf.low_latency_dispatch(x, ids, world_size, stream=s)
        buf.low_latency_combine(out.expand_x, ids, None, out.assist_info_for_combine, out.ep_recv_counts,
                                num_experts=world_size, stream=s)
        s.synchronize()
        hold.wait()
        if rank == 0:
            peak["after"] = rss_kib()["RssShmem"]
        hold.wait()
        s.close()


@on_profile(A950)
def test_a_round_without_performance_info_touches_one_stamp_page_per_rank(acl, profile):
    """The 950's senders stamp their arrival for performance_info in their own window: a round of W ranks
    makes a page or two of stamps resident per rank and call, not every receiver's W stamps (W x 512
    bytes each: 16 MiB at W = 128 for a dispatch and a combine)."""
    import threading

    from aclnn_py.worlds import run_threads

    w, peak = 128, {}
    run_threads(_stamped_round, w, threading.Barrier(w), peak, timeout=120)
    assert peak["after"] - peak["before"] < 8 * 1024, peak  # KiB (20 MiB with a stamp in every window)


# ---- elastic_info at run time (golden choice 10) -------------------------------------------------------------
def _dispatch_outcome(rank, world_size, root, enqueue):
    """(0, "") or the (code, message) of the AclError this rank's dispatch ends with; enqueue(ctx, ccl,
    stream) queues it."""
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        try:
            enqueue(ctx, ccl, s)
            s.synchronize()
            return 0, ""
        except AclError as e:
            return e.code, str(e)
        finally:
            s.close()


def _elastic_body(rank, world_size, root, info):
    from aclnn_py.ops import moe_distribute_dispatch

    x = np.ones((2, 1024), np.float16)
    ids = np.array([[0, 1], [1, 0]], np.int32)
    return _dispatch_outcome(rank, world_size, root, lambda ctx, ccl, s: moe_distribute_dispatch(
        ctx, x, ids, ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=2, ccl_buffer_size=ccl,
        elastic_info=info, stream=s))


@pytest.mark.parametrize("info,text", [
    ([1, 2, 0, 2, 0, 0, 0, 0], "elastic_info: the rank table [4+W, 4+2W) must be a permutation of 0..1 (entry 1 is 0)"),
    ([1, 2, 0, 2, 0, 0, 1, 5], "must be a permutation of 0..1 (entry 1 is 5)"),
    ([1, 3, 0, 2, 0, 0, 1, 0], "elastic_info: [1], [2], [3] must equal ep_world_size, shared_expert_rank_num, "
                               "moe_expert_num (got 3, 0, 2 vs 2, 0, 2"),
], ids=["not-a-permutation", "out-of-range", "other-world"])
@on_profile(A950)
def test_elastic_info_bad_table_fails_the_kernel(acl, profile, info, text):
    from aclnn_py.worlds import run_threads

    for code, msg in run_threads(_elastic_body, 2, np.array(info, np.int32), timeout=60):
        assert code == 507015 and text in msg, msg


@on_profile(A950)
def test_elastic_info_flag_zero_is_the_identity(acl, profile):
    from aclnn_py.worlds import run_threads

    info = np.array([0, 9, 9, 9, 0, 0, 1, 1], np.int32)   # flag 0: nothing else is read
    assert [code for code, _ in run_threads(_elastic_body, 2, info, timeout=60)] == [0, 0]


# ---- the context's window addresses at run time ---------------------------------------------------------------
def _context_edited_after_phase1_body(rank, world_size, root, edited_entry):
    """Rank 0 prepares its dispatch with a good context, then moves epHcclBuffer_[edited_entry] of it;
    every rank sends its two tokens to experts 0 and 1 (ranks 0 and 1)."""
    from aclnn_py.ops import prepare_dispatch

    x = np.ones((2, 1024), np.float16)
    ids = np.array([[0], [1]], np.int32)

    def enqueue(ctx, ccl, s):
        prepared = prepare_dispatch(ctx, x, ids, ep_world_size=world_size, ep_rank_id=rank,
                                    moe_expert_num=world_size, ccl_buffer_size=ccl, stream=s)
        if rank == 0:
            words = ctx.numpy(s)
            words[4 + 2 * edited_entry] += 4096   # the entry's low word: another address
            ctx.copy_from(words, s)
        prepared.launch(s)

    return _dispatch_outcome(rank, world_size, root, enqueue)


def test_a_context_entry_the_kernel_reaches_is_checked_at_launch(acl, profile):
    """Phase 1 checks every window address; a kernel checks those of the peers it reaches (a peer's
    entry is the address it writes through on hardware), and fails after the exchange, so that its
    peers finish the call."""
    from aclnn_py.worlds import run_threads

    res = run_threads(_context_edited_after_phase1_body, 3, 1, timeout=60)
    assert res[0][0] == 507015 and "context: epHcclBuffer_[1] must be rank 1's window address" in res[0][1], res[0]
    assert [code for code, _ in res[1:]] == [0, 0]
    own = run_threads(_context_edited_after_phase1_body, 3, 0, timeout=60)[0]   # its own window, read after
    assert own[0] == 507015 and "context: epHcclBuffer_[0] must be rank 0's window address" in own[1], own
    # rank 2 gets no row of rank 0: the kernel never reads its entry, as on hardware
    assert [code for code, _ in run_threads(_context_edited_after_phase1_body, 3, 2, timeout=60)] == [0, 0, 0]
