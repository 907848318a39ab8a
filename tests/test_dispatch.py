"""aclnnMoeDistributeDispatchV5 on the mock vs aclnn_py.golden, bit for bit (SPEC §4, §0), over 300+
seeded random configurations of the issue 4 matrix (threads, and a subset in real processes), plus
the two-phase contract, timeouts, call-order/parameter mismatches, the all-zero-row rule and the
untouched-region rule."""

from __future__ import annotations

import time

import moe_harness as mh
import numpy as np
import pytest

# 300 configurations in worlds of 20 (one world runs many calls): W -> number of configurations
MATRIX = {2: 80, 3: 60, 4: 60, 8: 60, 16: 40}
CHUNK = 20


def _chunks():
    for w, n in MATRIX.items():
        for i in range(0, n, CHUNK):
            yield pytest.param(w, i, min(CHUNK, n - i), id=f"W{w}-{i // CHUNK}")


def cases_for(w: int, start: int, count: int, combine: bool = False, base_seed: int = 40_000) -> list[mh.Case]:
    rng = np.random.default_rng(base_seed + 97 * w + start)
    return [mh.random_case(rng, w, seed=base_seed + 1000 * w + start + i, combine=combine) for i in range(count)]


@pytest.mark.parametrize("w,start,count", list(_chunks()))
def test_dispatch_matches_golden(acl, w, start, count):
    mh.run_world(cases_for(w, start, count), combine=False)


def test_matrix_covers_the_issue(acl):
    cases = [c for w, n in MATRIX.items() for i in range(0, n, CHUNK) for c in cases_for(w, i, min(CHUNK, n - i))]
    assert len(cases) >= 300
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    assert seen(lambda c: c.W) == {2, 3, 4, 8, 16}
    assert seen(lambda c: c.H) == {1024, 2048, 7168}
    assert seen(lambda c: (c.S, c.R)) == set(mh.SR_PAIRS)
    assert seen(lambda c: c.mask) == {"none", "1d", "2d"}
    assert seen(lambda c: c.quant) == {0, 2} and seen(lambda c: c.smooth) == {False, True}
    assert seen(lambda c: c.dtype) == {"fp16", "bf16"}
    assert seen(lambda c: c.escales) == {False, True} and seen(lambda c: c.ent_type) == {0, 1}
    assert seen(lambda c: c.comm_alg) == set(mh.COMM_ALGS)
    assert seen(lambda c: len(set(c.bss)) > 1) == {False, True}          # uneven BS with global_bs
    assert seen(lambda c: c.Z > 0) == {False, True} and seen(lambda c: c.C > 0) == {False, True}
    assert seen(lambda c: c.Q > 0) == {False, True}
    assert seen(lambda c: c.L) == set(range(1, 9))
    assert min(seen(lambda c: c.K)) == 1 and max(seen(lambda c: c.K)) == 16
    assert min(seen(lambda c: max(c.bss))) == 1 and max(seen(lambda c: max(c.bss))) >= 60


@pytest.mark.parametrize("w", [2, 4])
def test_dispatch_in_processes(acl, w):
    mh.run_world(cases_for(w, 0, 6, base_seed=41_000), combine=False, processes=True)


def test_comm_algs_give_identical_outputs(acl):
    rng = np.random.default_rng(5)
    base = mh.random_case(rng, 4, seed=777)
    base = mh.replace(base, K=min(base.K, 12), bss=[8] * 4, global_bs=0, quant=2, smooth=True)
    cases = [mh.replace(base, comm_alg=a) for a in mh.COMM_ALGS]
    inputs = [mh.make_inputs(cases[0])] * 3
    from aclnn_py.launch import run_threads

    res = run_threads(mh.world_body, 4, cases, inputs, False)
    for r in range(4):
        for k in ("expand_x", "dynamic_scales", "assist", "recv", "tok_nums", "expand_scales"):
            assert res[r][0][k].tobytes() == res[r][1][k].tobytes() == res[r][2][k].tobytes(), k


# ---- the all-zero row and untouched regions (SPEC §0) ---------------------------------------------------
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


def test_all_zero_row_and_untouched_regions(acl):
    from aclnn_py.launch import run_threads

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


# ---- two-phase contract ----------------------------------------------------------------------------------
def _small_case(w=2, **kw):
    c = mh.Case(seed=99, W=w, H=1024, K=2, L=2, S=1, R=0, bss=[6] * w, global_bs=0, mask="none", quant=2,
                escales=True)
    return mh.replace(c, **kw)


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
        ret = lib.aclnnMoeDistributeDispatchV5(ffi.cast("void *", ws.ptr), p.workspace_size, p._executor,
                                               ffi.cast("void *", s.handle))  # and so does the C side
        out["second_launch"] = (ret, _msg())
        # NULL and too-small workspaces are refused (and consume the executor, launching nothing)
        p = prep(in1)
        assert p.workspace_size > 0
        ret = lib.aclnnMoeDistributeDispatchV5(ffi.NULL, p.workspace_size, p._executor, ffi.cast("void *", s.handle))
        out["null_ws"] = (ret, _msg())
        p = prep(in1)
        from aclnn_py import DeviceMemory

        small = DeviceMemory(p.workspace_size)
        ret = lib.aclnnMoeDistributeDispatchV5(ffi.cast("void *", small.ptr), p.workspace_size - 1, p._executor,
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


def test_two_phase_contract(acl):
    from aclnn_py.launch import run_threads

    c = _small_case()
    in1 = mh.make_inputs(c)
    in2 = mh.make_inputs(mh.replace(c, seed=100))
    g1, g2 = mh.golden_dispatch(c, in1), mh.golden_dispatch(c, in2)
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


# ---- timeouts, call order, parameter agreement --------------------------------------------------------
def _lonely_body(rank, world_size, root, c, inp, timeout_s):
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_dispatch

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        if rank == 1:
            time.sleep(timeout_s + 1.5)     # never calls dispatch; keeps its window alive meanwhile
            return None
        s = Device.current().create_stream()
        p = prepare_dispatch(ctx, inp.x[rank], inp.ids[rank], ep_world_size=world_size, ep_rank_id=rank,
                             ccl_buffer_size=ccl, quant_mode=c.quant, stream=s, **c.kwargs())
        t0 = time.monotonic()
        p.launch(s)
        try:
            s.synchronize()
            return None
        except AclError as e:
            return (e.code, e.message, time.monotonic() - t0)
        finally:
            s.close()


def test_peer_that_never_calls_times_out(acl, monkeypatch):
    from aclnn_py.launch import run_threads

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "1")
    c = _small_case(quant=0, escales=False)
    res = run_threads(_lonely_body, 2, c, mh.make_inputs(c), 1.0, timeout=60)
    code, msg, dt = res[0]
    assert code == 507014
    assert "rank 0" in msg and "[1]" in msg and "Dispatch" in msg
    assert 0.9 <= dt < 4.0


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


def test_call_order_mismatch_is_detected(acl, monkeypatch):
    from aclnn_py.launch import run_threads

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "5")
    c = _small_case(quant=0, escales=False, dtype="fp16")
    inp = mh.make_inputs(c)
    res = run_threads(_mismatch_body, 2, [c, c], [inp, inp], 1, timeout=60)
    for code, msg in res:
        assert code == 507015 and "call-order mismatch" in msg


@pytest.mark.parametrize("field,kw,text", [
    ("quant_mode", {"quant": 2}, "quant_mode: rank"),
    ("H", {"H": 2048}, "H (x dim 1): rank"),
    ("global_bs", {"bss": [7, 7]}, "maxBs (global_bs / ep_world_size): rank"),   # global_bs=0, unequal BS
])
def test_parameter_mismatch_names_the_field(acl, monkeypatch, field, kw, text):
    from aclnn_py.launch import run_threads

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "5")
    c0 = _small_case(quant=0, escales=False)
    c1 = mh.replace(c0, **kw)
    inputs = [mh.make_inputs(c0), mh.make_inputs(c1)]
    res = run_threads(_mismatch_body, 2, [c0, c1], inputs, -1, timeout=60)
    for code, msg in res:
        assert code == 507015 and text in msg, msg
