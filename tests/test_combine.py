"""Round trips dispatch → expert → aclnnMoeDistributeCombineV5 on the mock vs aclnn_py.golden, bit for bit
(const-expert rows within 1 ulp, SPEC §0), over 300+ seeded random configurations of the issue 4/5
matrix (threads, and a subset in real processes); comm quant 2 details, the two-phase contract,
timeouts and call order for combine."""

from __future__ import annotations

import time

import moe_harness as mh
import numpy as np
import pytest

MATRIX = {2: 90, 3: 70, 4: 60, 8: 50, 16: 30}
CHUNK = 20


def _chunks():
    for w, n in MATRIX.items():
        for i in range(0, n, CHUNK):
            yield pytest.param(w, i, min(CHUNK, n - i), id=f"W{w}-{i // CHUNK}")


def cases_for(w: int, start: int, count: int, base_seed: int = 50_000) -> list[mh.Case]:
    rng = np.random.default_rng(base_seed + 97 * w + start)
    return [mh.random_case(rng, w, seed=base_seed + 1000 * w + start + i, combine=True) for i in range(count)]


@pytest.mark.parametrize("w,start,count", list(_chunks()))
def test_round_trip_matches_golden(acl, w, start, count):
    mh.run_world(cases_for(w, start, count), combine=True)


def test_matrix_covers_combine_options(acl):
    cases = [c for w, n in MATRIX.items() for i in range(0, n, CHUNK) for c in cases_for(w, i, min(CHUNK, n - i))]
    assert len(cases) >= 300
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    assert seen(lambda c: c.comm_quant) == {0, 2}
    assert seen(lambda c: c.weights) == {False, True}
    assert seen(lambda c: c.shared_x) == {False, True}
    assert seen(lambda c: (c.S, c.R)) == set(mh.SR_PAIRS)
    assert seen(lambda c: c.mask) == {"none", "1d", "2d"}
    assert seen(lambda c: c.C > 0 and c.Q > 0) == {False, True}
    assert seen(lambda c: c.dtype) == {"fp16", "bf16"} and seen(lambda c: c.comm_alg) == set(mh.COMM_ALGS)
    assert seen(lambda c: len(set(c.bss)) > 1) == {False, True}


@pytest.mark.parametrize("w", [2, 3])
def test_round_trip_in_processes(acl, w):
    mh.run_world(cases_for(w, 0, 5, base_seed=51_000), combine=True, processes=True)


def test_documented_example_configuration(acl):
    """The operator documentation's example: W=16, BS=8, H=7168, 32 experts, K=8, one zero and one
    copy expert, quant mode 2, bf16 (here through the op wrappers, weighted)."""
    c = mh.Case(seed=4242, W=16, H=7168, K=8, L=2, S=1, R=0, bss=[8] * 16, global_bs=0, mask="none", Z=1, C=1,
                quant=2, dtype="bf16", escales=True, weights=True)
    mh.run_world([c], combine=True)


# ---- comm quant 2 (SPEC §6.3) -------------------------------------------------------------------------
def test_comm_quant_zero_blocks_and_tail(acl):
    """H not a multiple of 16 (a zero-padded tail block) and all-zero 8-element blocks: scale 0,
    dequantised 0 (SPEC §0)."""
    c = mh.Case(seed=7, W=2, H=1030, K=2, L=1, S=1, R=0, bss=[5, 5], global_bs=0, mask="none", quant=0,
                dtype="fp16", comm_quant=2, weights=True)
    inp = mh.make_inputs(c)
    for x in inp.x:
        x[:, 16:40] = 0
        x[2] = 0
    from aclnn_py.launch import run_threads

    res = run_threads(mh.world_body, 2, [c], [inp], True, timeout=120)
    g = mh.golden_dispatch(c, inp)
    ys = [mh.expert_fn(c, g[r].expand_x, None) for r in range(2)]
    gc = mh.golden_combine(c, inp, g, ys)
    for r in range(2):
        mh.check_combine(c, inp, r, res[r][0]["x_out"], gc[r])
        xo = res[r][0]["x_out"]
        assert np.all(xo[:, 16:40].astype(np.float32) == 0) and np.all(xo[2].astype(np.float32) == 0)


# ---- contract, timeouts, order ------------------------------------------------------------------------
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
        d = mh.mock_dispatch(c, inp, rank, ctx, ccl, s)
        t = d["_tensors"]
        a = t.expand_x.shape[0]
        y1 = np.zeros((a, c.H), mh.DTYPES[c.dtype])
        y1[:d["n"]] = mh.expert_fn(c, d["expand_x"], d["dynamic_scales"])
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
                                                                p._executor, ffi.cast("void *", s.handle)),)
        p = prep(y1)
        out["null_ws"] = lib.aclnnMoeDistributeCombineV5(ffi.NULL, p.workspace_size, p._executor, ffi.cast("void *", s.handle))
        p = prep(y1)
        small = DeviceMemory(p.workspace_size)
        out["small_ws"] = lib.aclnnMoeDistributeCombineV5(ffi.cast("void *", small.ptr), p.workspace_size - 1,
                                                          p._executor, ffi.cast("void *", s.handle))
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


def test_combine_two_phase_contract(acl):
    from aclnn_py.launch import run_threads

    c = mh.Case(seed=31, W=2, H=1024, K=2, L=2, S=1, R=0, bss=[6, 6], global_bs=0, mask="none", quant=0,
                dtype="bf16", weights=True)
    inp = mh.make_inputs(c)
    res = run_threads(_combine_contract_body, 2, c, inp, timeout=120)
    g = mh.golden_dispatch(c, inp)
    ys = [mh.expert_fn(c, g[r].expand_x, None) for r in range(2)]
    g1 = mh.golden_combine(c, inp, g, ys)
    g2 = mh.golden_combine(c, inp, g, [(y.astype(np.float32) * -2).astype(y.dtype) for y in ys])
    for r, o in enumerate(res):
        assert o["second_launch"][0] == 161002 and "consumed" in o["second_launch_py"]
        assert o["null_ws"] == 161002 and o["small_ws"] == 161002
        assert o["x1"].tobytes() == g1[r].x_out.tobytes()
        assert o["x2"].tobytes() == g2[r].x_out.tobytes()


def _combine_lonely_body(rank, world_size, root, c, inp, timeout_s):
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_combine

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        if rank == 1:
            time.sleep(timeout_s + 1.5)
            return None
        s = Device.current().create_stream()
        a = max(c.bss) * world_size * min(c.L, c.K)
        p = prepare_combine(ctx, np.zeros((a, c.H), np.float16), inp.ids[rank], np.zeros(a * 128, np.int32),
                            np.zeros(world_size * c.L, np.int32), ep_world_size=world_size, ep_rank_id=rank,
                            ccl_buffer_size=ccl, stream=s, **c.kwargs())
        t0 = time.monotonic()
        p.launch(s)
        try:
            s.synchronize()
            return None
        except AclError as e:
            return (e.code, e.message, time.monotonic() - t0)
        finally:
            s.close()


def test_combine_peer_that_never_calls_times_out(acl, monkeypatch):
    from aclnn_py.launch import run_threads

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "1")
    c = mh.Case(seed=3, W=2, H=1024, K=2, L=2, S=1, R=0, bss=[4, 4], global_bs=0, mask="none", dtype="fp16")
    code, msg, dt = run_threads(_combine_lonely_body, 2, c, mh.make_inputs(c), 1.0, timeout=60)[0]
    assert code == 507014 and "Combine" in msg and "[1]" in msg
    assert 0.9 <= dt < 4.0


def _missing_rows_body(rank, world_size, root, c, inp):
    """Rank 1 returns no rows (ep_send_counts all zero) although rank 0's tokens were dispatched to it."""
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_combine

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        d = mh.mock_dispatch(c, inp, rank, ctx, ccl, s)
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


def test_combine_detects_rows_that_never_arrived(acl):
    from aclnn_py.launch import run_threads

    c = mh.Case(seed=5, W=2, H=1024, K=2, L=2, S=1, R=0, bss=[4, 4], global_bs=0, mask="none", dtype="fp16")
    inp = mh.make_inputs(c)
    inp.ids = [np.array([[0, 2]] * 4, np.int32) for _ in range(2)]   # expert 0 on rank 0, expert 2 on rank 1
    res = run_threads(_missing_rows_body, 2, c, inp, timeout=60)
    for code, msg in res:
        assert code == 507015 and "expert rows" in msg, msg
