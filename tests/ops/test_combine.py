"""Round trips dispatch → a deterministic expert → aclnnMoeDistributeCombineV5 on the mock vs
aclnn_py.golden, bit for bit (const-expert rows within 1 ulp), on both SoC profiles: Ascend910_93 over
300 seeded configurations (comm quant 0 / 2), Ascend950 over 190 of its own (every dispatch mode and
input format, comm quant 0, 2, 3, 4, elastic_info, performance_info; tests/helpers/moe_cases.py), in
thread worlds and a subset in process worlds; plus comm quant 2 details, MXFP8 transport of extreme
rows, comm quant 2 giving the same bytes on both profiles, the two-phase contract, timeouts and rows
that never arrive."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.moe_cases import (
    A3,
    A950,
    COMM_ALGS,
    DTYPES,
    LOWP_X,
    PROFILES,
    SR_PAIRS,
    Case,
    cases_for,
    make_inputs,
    on_profile,
    random_case,
    replace,
)
from helpers.moe_world import (
    check_combine,
    expert_fn,
    golden_combine,
    golden_dispatch,
    lonely_launch,
    mock_dispatch,
    run_world,
    world_body,
)

# per profile: W -> configurations, configurations per world, seed base
MATRIX = {A3: ({2: 90, 3: 70, 4: 60, 8: 50, 16: 30}, 20, 50_000),
          A950: ({2: 60, 3: 50, 4: 50, 8: 30}, 25, 195_000)}


def _chunks():
    for soc in PROFILES:
        matrix, chunk, _ = MATRIX[soc]
        for w, n in matrix.items():
            for i in range(0, n, chunk):
                yield pytest.param(soc, w, i, min(chunk, n - i), id=f"{soc}-W{w}-{i // chunk}")


def _matrix_cases(soc: str) -> list[Case]:
    matrix, chunk, seed = MATRIX[soc]
    return [c for w, n in matrix.items() for i in range(0, n, chunk)
            for c in cases_for(soc, w, i, min(chunk, n - i), seed, combine=True)]


@pytest.mark.parametrize("profile,w,start,count", list(_chunks()), indirect=["profile"])
def test_round_trip_matches_golden(acl, profile, w, start, count):
    run_world(cases_for(profile, w, start, count, MATRIX[profile][2], combine=True), combine=True)


def test_a3_matrix_covers_combine_options(acl):
    cases = _matrix_cases(A3)
    assert len(cases) >= 300
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    assert seen(lambda c: c.comm_quant) == {0, 2}
    assert seen(lambda c: c.weights) == {False, True}
    assert seen(lambda c: c.shared_x) == {False, True}
    assert seen(lambda c: (c.S, c.R)) == set(SR_PAIRS)
    assert seen(lambda c: c.mask) == {"none", "1d", "2d"}
    assert seen(lambda c: c.C > 0 and c.Q > 0) == {False, True}
    assert seen(lambda c: c.dtype) == {"fp16", "bf16"} and seen(lambda c: c.comm_alg) == set(COMM_ALGS)
    assert seen(lambda c: len(set(c.bss)) > 1) == {False, True}


def test_950_matrix_covers_combine_options(acl):
    cases = _matrix_cases(A950)
    assert len(cases) >= 180
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    assert seen(lambda c: c.comm_quant) == {0, 2, 3, 4}
    assert seen(lambda c: (c.comm_quant, c.dtype)) >= {(q, d) for q in (3, 4) for d in ("fp16", "bf16")}
    assert seen(lambda c: c.quant) == {0, 1, 2, 3, 4, 5} and seen(lambda c: c.xfmt) >= set(LOWP_X)
    assert seen(lambda c: c.elastic) == {"none", "flag0", "perm"} and seen(lambda c: c.perf) == {False, True}
    assert seen(lambda c: c.weights) == {False, True} and seen(lambda c: c.shared_x) == {False, True}
    assert seen(lambda c: c.Q > 0) == {False, True} and seen(lambda c: c.C > 0) == {False, True}
    assert seen(lambda c: (c.S, c.R)) == set(SR_PAIRS) and seen(lambda c: c.mask) == {"none", "1d", "2d"}


@on_profile(A3)
@pytest.mark.parametrize("w", [2, 3])
def test_round_trip_in_processes(acl, profile, w):
    run_world(cases_for(A3, w, 0, 5, 51_000, combine=True), combine=True, processes=True)


@on_profile(A3)
def test_documented_example_configuration(acl, profile):
    """The operator documentation's example: W=16, BS=8, H=7168, 32 experts, K=8, one zero and one
    copy expert, quant mode 2, bf16 (here through the op wrappers, weighted)."""
    c = Case(seed=4242, W=16, H=7168, K=8, L=2, S=1, R=0, bss=[8] * 16, global_bs=0, mask="none", Z=1, C=1,
                quant=2, dtype="bf16", escales=True, weights=True)
    run_world([c], combine=True)


# ---- comm quant 2 --------------------------------------------------------------------------------------------
def test_comm_quant_zero_blocks_and_tail(acl, profile):
    """H not a multiple of 16 (a zero-padded tail block) and all-zero 8-element blocks: scale 0,
    dequantised 0."""
    c = Case(seed=7, W=2, H=1030, K=2, L=1, S=1, R=0, bss=[5, 5], global_bs=0, mask="none", quant=0,
             dtype="fp16", comm_quant=2, weights=True, soc=profile)
    inp = make_inputs(c)
    for x in inp.x:
        x[:, 16:40] = 0
        x[2] = 0
    from aclnn_py.worlds import run_threads

    res = run_threads(world_body, 2, [c], [inp], True, timeout=120)
    g = golden_dispatch(c, inp)
    ys = [expert_fn(c, g[r].expand_x, None) for r in range(2)]
    gc = golden_combine(c, inp, g, ys)
    for r in range(2):
        check_combine(c, inp, r, res[r][0]["x_out"], gc[r])
        xo = res[r][0]["x_out"]
        assert np.all(xo[:, 16:40].astype(np.float32) == 0) and np.all(xo[2].astype(np.float32) == 0)


# ---- contract, timeouts, order -------------------------------------------------------------------------------
def _combine_contract_body(rank, world_size, root, c, inp):
    from aclnn_py import Device, DeviceMemory, Tensor
    from aclnn_py.errors import ClosedError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_combine

    b = __import__("aclnn_py").backend()
    ffi, lib = b.ffi, b.lib
    out = {}
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        d = mock_dispatch(c, inp, rank, ctx, ccl, s)
        t = d["_tensors"]
        a = t.expand_x.shape[0]
        y1 = np.zeros((a, c.H), DTYPES[c.dtype])
        y1[:d["n"]] = expert_fn(c, d["expand_x"], d["dynamic_scales"])
        y2 = y1.copy()
        y2[:d["n"]] = (y1[:d["n"]].astype(np.float32) * -2).astype(y1.dtype)

        def prep(y, repeatable=False):
            return prepare_combine(ctx, y, inp.ids[rank], t.assist_info_for_combine, t.ep_recv_counts,
                                   inp.weights[rank], ep_world_size=world_size, ep_rank_id=rank, ccl_buffer_size=ccl,
                                   stream=s, repeatable=repeatable, **c.kwargs())

        p = prep(y1)
        p.launch(s)
        s.synchronize()
        try:
            p.launch(s)
            out["second_launch_py"] = None
        except ClosedError as e:  # the wrapper knows the executor was consumed
            out["second_launch_py"] = str(e)
        ws = DeviceMemory(p.workspace_size)
        out["second_launch"] = (lib.aclnnMoeDistributeCombineV5(ffi.cast("void *", ws.ptr), p.workspace_size,
                                                                p.executor, ffi.cast("void *", s.handle)),)
        p = prep(y1)
        out["null_ws"] = lib.aclnnMoeDistributeCombineV5(ffi.NULL, p.workspace_size, p.executor, ffi.cast("void *", s.handle))
        p = prep(y1)
        small = DeviceMemory(p.workspace_size)
        out["small_ws"] = lib.aclnnMoeDistributeCombineV5(ffi.cast("void *", small.ptr), p.workspace_size - 1,
                                                          p.executor, ffi.cast("void *", s.handle))
        p = prep(y1, repeatable=True)
        p.launch(s)
        s.synchronize()
        out["x1"] = p.result.numpy()
        p.rebind_input(1, Tensor.from_numpy(y2, stream=s))
        x_out2 = Tensor.empty(p.result.shape, p.result.dtype)
        p.rebind_output(0, x_out2)
        p.launch(s)
        s.synchronize()
        out["x2"] = x_out2.numpy()
        p.close()
        s.close()
    return out


def test_combine_two_phase_contract(acl, profile):
    from aclnn_py.worlds import run_threads

    c = Case(seed=31, W=2, H=1024, K=2, L=2, S=1, R=0, bss=[6, 6], global_bs=0, mask="none", quant=0,
             dtype="bf16", weights=True, soc=profile)
    inp = make_inputs(c)
    res = run_threads(_combine_contract_body, 2, c, inp, timeout=120)
    g = golden_dispatch(c, inp)
    ys = [expert_fn(c, g[r].expand_x, None) for r in range(2)]
    g1 = golden_combine(c, inp, g, ys)
    g2 = golden_combine(c, inp, g, [(y.astype(np.float32) * -2).astype(y.dtype) for y in ys])
    for r, o in enumerate(res):
        assert o["second_launch"][0] == 161002 and "consumed" in o["second_launch_py"]
        assert o["null_ws"] == 161002 and o["small_ws"] == 161002
        assert o["x1"].tobytes() == g1[r].x_out.tobytes()
        assert o["x2"].tobytes() == g2[r].x_out.tobytes()


@on_profile(A3)
def test_combine_peer_that_never_calls_times_out(acl, profile, monkeypatch):
    from aclnn_py.ops import prepare_combine
    from aclnn_py.worlds import run_threads

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "0.5")
    c = Case(seed=3, W=2, H=1024, K=2, L=2, S=1, R=0, bss=[4, 4], global_bs=0, mask="none", dtype="fp16")
    inp = make_inputs(c)

    def prepare(ctx, ccl, s, rank, world_size):
        a = max(c.bss) * world_size * min(c.L, c.K)
        return prepare_combine(ctx, np.zeros((a, c.H), np.float16), inp.ids[rank], np.zeros(a * 128, np.int32),
                               np.zeros(world_size * c.L, np.int32), ep_world_size=world_size, ep_rank_id=rank,
                               ccl_buffer_size=ccl, stream=s, **c.kwargs())

    code, msg, dt = run_threads(lonely_launch, 2, 0.5, prepare, timeout=60)[0]
    assert code == 507014 and "Combine" in msg and "[1]" in msg
    assert 0.45 <= dt < 3.5


def _missing_rows_body(rank, world_size, root, c, inp):
    """Rank 1 returns no rows (ep_send_counts all zero) although rank 0's tokens were dispatched to it."""
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_combine

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        d = mock_dispatch(c, inp, rank, ctx, ccl, s)
        t = d["_tensors"]
        y = np.zeros((t.expand_x.shape[0], c.H), np.float16)
        counts = t.ep_recv_counts if rank == 0 else np.zeros(world_size * c.L, np.int32)
        p = prepare_combine(ctx, y, inp.ids[rank], t.assist_info_for_combine, counts, ep_world_size=world_size,
                            ep_rank_id=rank, ccl_buffer_size=ccl, stream=s, **c.kwargs())
        p.launch(s)
        try:
            s.synchronize()
            res = None
        except AclError as e:
            res = (e.code, e.message)
        s.close()
    return res


def test_combine_detects_rows_that_never_arrived(acl, profile):
    from aclnn_py.worlds import run_threads

    c = Case(seed=5, W=2, H=1024, K=2, L=2, S=1, R=0, bss=[4, 4], global_bs=0, mask="none", dtype="fp16",
             soc=profile)
    inp = make_inputs(c)
    inp.ids = [np.array([[0, 2]] * 4, np.int32) for _ in range(2)]   # expert 0 on rank 0, expert 2 on rank 1
    res = run_threads(_missing_rows_body, 2, c, inp, timeout=60)
    for code, msg in res:
        assert code == 507015 and "expert rows" in msg, msg


# ---- MXFP8 transport of extreme rows: zero, tiny, huge (saturating), inf/NaN blocks (0xFF scale) -------------
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
@on_profile(A950)
def test_mxfp8_transport_of_extreme_rows(acl, profile, cq, dtype):
    from aclnn_py import golden
    from aclnn_py.worlds import run_threads

    dt = DTYPES[dtype]
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


@on_profile(A950)
def test_comm_quant_2_same_bytes_on_both_profiles(acl, mock, profile):
    rng = np.random.default_rng(2)
    base = random_case(rng, 4, seed=4242, combine=True)
    base = replace(base, quant=0, smooth=False, comm_quant=2, Q=0, shared_x=False)
    inp = make_inputs(base)
    from aclnn_py.worlds import run_threads

    out = {}
    for soc in PROFILES:
        mock.set_soc(soc)
        res = run_threads(world_body, 4, [replace(base, soc=soc)], [inp], True)
        out[soc] = [res[r][0]["x_out"] for r in range(4)]
    for a, b in zip(out["Ascend910_93"], out["Ascend950"]):
        assert a.tobytes() == b.tobytes()
