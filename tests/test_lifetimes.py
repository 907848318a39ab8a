"""Object lifetimes in a user's hands: memory stays allocated under live exports, closed objects refuse
every use with an error naming them, and nothing leaks from repeated rounds (docs/reliability.md,
"Lifetimes")."""

from __future__ import annotations

import gc
import sys
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import run_python

N_LARGE = 8 << 20  # 32 MiB of float32: freed memory would be unmapped, so a stale view would crash


def live_allocations(mock: Any) -> int:
    """Allocations in use: the memory pool's cached free blocks are freed first."""
    from aclnn_py.runtime import get_memory_pool, ordered

    gc.collect()
    ordered.reap()
    get_memory_pool().free_all_blocks()
    return int(mock.stats()["allocations"])


# ---- memory under live exports ---------------------------------------------------------------------------
@pytest.mark.parametrize("export", ["numpy_view", "asarray", "from_dlpack", "borrower"])
def test_memory_outlives_the_tensor_while_an_export_lives(acl: Any, device0: Any, mock: Any, export: str) -> None:
    base = live_allocations(mock)
    t = acl.Tensor.from_numpy(np.arange(N_LARGE, dtype=np.float32))
    if export == "numpy_view":
        view: Any = t.numpy_view()
    elif export == "asarray":
        view = np.asarray(t)
    elif export == "from_dlpack":
        view = np.from_dlpack(t)
    else:
        view = acl.Tensor.from_address(t.ptr, t.shape, t.dtype, owner=t)
    t.close()
    assert live_allocations(mock) == base + 1  # the export keeps the block
    # reuse pressure: new allocations must not land on the exported block
    others = [acl.Tensor.from_numpy(np.full(1024, -1.0, np.float32)) for _ in range(4)]
    values = view.numpy() if export == "borrower" else view
    assert values[123456] == 123456.0 and values[-1] == N_LARGE - 1
    del view, values, others
    assert live_allocations(mock) == base  # the last export freed it


def test_small_tensor_view_never_reads_another_allocation(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.arange(8, dtype=np.int32))
    v = t.numpy_view()
    t.close()
    newer = [acl.Tensor.from_numpy(np.full(8, 77, np.int32)) for _ in range(16)]
    assert v.tolist() == list(range(8))
    assert all(n.ptr != v.ctypes.data for n in newer)


def test_device_memory_close_waits_for_its_borrowers(acl: Any, device0: Any, mock: Any) -> None:
    base = live_allocations(mock)
    mem = acl.DeviceMemory(64)
    u = acl.Tensor.from_address(mem.ptr, (16,), np.float32, owner=mem)
    u.copy_from(np.arange(16, dtype=np.float32))
    mem.close()
    assert mem.closed and mem.exports == 1
    with pytest.raises(acl.ClosedError, match=r"DeviceMemory\(0x[0-9a-f]+, 64 bytes\) is closed"):
        _ = mem.ptr
    assert u.numpy().tolist() == list(range(16)) and live_allocations(mock) == base + 1
    del u
    assert live_allocations(mock) == base


def test_a_closed_tensor_refuses_every_use(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.zeros((2, 3), np.float32))
    t.close()
    t.close()  # idempotent
    assert t.closed and "closed" in repr(t)
    name = r"Tensor\(shape=\(2, 3\), dtype=FLOAT\) is closed: cannot "
    for use in (lambda: t.ptr, t.numpy, t.numpy_view, t.descriptor, lambda: np.asarray(t), t.__dlpack__,
                lambda: t.copy_from(np.zeros((2, 3), np.float32)), lambda: t.fill_bytes(0),
                lambda: acl.Tensor.from_address(0, (1,), np.float32, owner=t)):
        with pytest.raises(acl.ClosedError, match=name):
            use()


def test_a_closed_tensor_is_refused_by_the_operators(acl: Any, device0: Any) -> None:
    from aclnn_py.ops import moe_distribute_dispatch

    ctx = acl.Tensor.zeros((4100,), np.int32)
    x = acl.Tensor.from_numpy(np.zeros((2, 1024), ml_dtypes.bfloat16))
    x.close()
    with pytest.raises(acl.ClosedError, match="is closed: cannot pass it to an operator"):
        moe_distribute_dispatch(ctx, x, np.zeros((2, 1), np.int32), ep_world_size=2, ep_rank_id=0,
                                moe_expert_num=2, ccl_buffer_size=1 << 30, precheck=False)


# ---- closed streams, events, communicators ---------------------------------------------------------------
def test_a_closed_stream_is_never_the_default_stream(acl: Any, device0: Any) -> None:
    s = device0.create_stream()
    s.close()
    label = r"Stream\(0x[0-9a-f]+, owned, device 0\) is closed: cannot "
    with pytest.raises(acl.ClosedError, match=label + "synchronize"):
        s.synchronize()
    with pytest.raises(acl.ClosedError, match=label + "queue work"):
        acl.Tensor.from_numpy(np.zeros(4, np.float32), stream=s)
    with pytest.raises(acl.ClosedError, match=label + "record an event"):
        s.record_event()
    with pytest.raises(acl.ClosedError, match=label + "queue work"):
        acl.Event().record(s)
    with pytest.raises(acl.ClosedError, match=label + "make it current"):
        with s:
            pass
    with pytest.raises(acl.ClosedError):
        _ = s.handle


def test_a_closed_event_refuses_every_use(acl: Any, device0: Any) -> None:
    ev = acl.Event()
    ev.close()
    for use in (ev.record, ev.query, ev.synchronize, lambda: ev.handle, lambda: ev.elapsed_ms(ev),
                lambda: acl.Stream.default().wait_event(ev)):
        with pytest.raises(acl.ClosedError, match=r"Event\(0x[0-9a-f]+\) is closed"):
            use()


def _closed_comm_body(rank: int, world_size: int, root: bytes) -> list[str]:
    import aclnn_py as acl

    comm = acl.hccl.Communicator(world_size, rank, root)
    buf = acl.MoeDistributeBuffer(comm)
    comm.barrier()
    comm.close()
    errors = []
    x = np.zeros((2, 1024), ml_dtypes.bfloat16)
    ids = np.zeros((2, 1), np.int32)
    for use in (comm.barrier, lambda: comm.handle, lambda: acl.hccl.build_context(comm),
                lambda: buf.low_latency_dispatch(x, ids, 2),
                lambda: buf.low_latency_combine(x, ids, None, np.zeros(256, np.int32), np.zeros(2, np.int32),
                                                num_experts=2)):
        try:
            use()
        except acl.ClosedError as e:
            errors.append(str(e))
    buf.close()
    return errors


def test_a_closed_communicator_refuses_every_use(acl: Any) -> None:
    for errors in acl.worlds.run_threads(_closed_comm_body, 2):
        assert len(errors) == 5
        assert all(e.startswith("Communicator(rank ") and " is closed: cannot " in e for e in errors)


# ---- plans check host arrays like the per-call path ------------------------------------------------------
def _plan_body(rank: int, world_size: int, root: bytes) -> dict[str, str]:
    import aclnn_py as acl

    out: dict[str, str] = {}
    with acl.hccl.Communicator(world_size, rank, root) as comm:
        buf = acl.MoeDistributeBuffer(comm)
        plan = buf.plan_dispatch(2, 1024, 2, 1, x_dtype=ml_dtypes.bfloat16)
        x = np.ones((2, 1024), ml_dtypes.bfloat16)
        ids = np.array([[0], [1]], np.int64)  # numpy's default integer type is accepted and converted
        for name, args in (("x_fp16", (x.astype(np.float16), ids)), ("ids_float", (x, ids.astype(np.float32))),
                           ("ids_range", (x, ids + 2**40)), ("x_shape", (x[:1], ids))):
            try:
                plan(*args)
            except (acl.AclnnParamInvalid, TypeError) as e:
                out[name] = str(e)
        out["ok"] = str(plan(x, ids).ep_recv_counts.numpy().tolist())
        plan.close()
        buf.close()
    return out


def test_plans_check_host_dtypes(acl: Any) -> None:
    for out in acl.worlds.run_threads(_plan_body, 2):
        assert "x: dtype must be BF16 (got float16)" in out["x_fp16"]
        assert "topk_idx: dtype must be INT32 (got float32)" in out["ids_float"]  # the buffer's plan: its names
        assert "topk_idx: values must fit in int32" in out["ids_range"]
        assert "x: the plan is fixed to shape (2, 1024) (got (1, 1024))" in out["x_shape"]
        assert out["ok"].startswith("[")


# ---- a closed plan's memory outlives its last launch -----------------------------------------------------
def _closed_plan_body(rank: int, world_size: int, root: bytes) -> dict[str, tuple[bool, ...]]:
    """Close a plan right after a launch (not synchronised): its Tensors refuse use at once, but the
    executor and the memory stay until the stream has passed the launch (aclrtFree would not wait).
    Per way of calling: (alive after close, outputs refused, released after the synchronisation)."""
    import weakref

    import aclnn_py as acl

    report: dict[str, tuple[bool, ...]] = {}
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        stream = acl.Device.current().create_stream()
        x = np.ones((2, 1024), ml_dtypes.bfloat16)
        ids = np.array([[0], [1]], np.int32)
        on_device = (acl.Tensor.from_numpy(x), acl.Tensor.from_numpy(ids))
        for way, args in (("device Tensors (compiled call)", on_device), ("host arrays (Python call)", (x, ids)),
                          ("never launched", None)):
            plan = buf.plan_dispatch(2, 1024, 2, 1, x_dtype=ml_dtypes.bfloat16)
            if args is not None:
                plan(*args, stream=stream)
            prepared, outputs = plan.prepared, list(plan.outputs)
            blocks = [t._mem if t._mem is not None else t._anchor().memory for t in outputs]  # own or exported
            memory = [weakref.ref(m) for m in blocks + [plan.workspace_memory] if m is not None]
            del blocks
            plan.close()
            gc.collect()
            alive = all(m() is not None for m in memory) and not prepared.closed
            refused = all(t.closed for t in outputs)
            stream.synchronize()
            gc.collect()
            released = all(m() is None or m().closed for m in memory) and prepared.closed
            report[way] = (alive, refused, released)
        stream.close()
    return report


def test_a_closed_plan_keeps_its_memory_until_the_stream_passes_its_last_launch(acl: Any, mock: Any) -> None:
    before = live_allocations(mock)
    for report in acl.worlds.run_threads(_closed_plan_body, 2):
        assert report == {"device Tensors (compiled call)": (True, True, True),
                          "host arrays (Python call)": (True, True, True),
                          "never launched": (False, True, True)}  # nothing queued: released at close
    assert live_allocations(mock) == before


# ---- a plan keeps the memory of the Tensors bound to it ---------------------------------------------------
PLAN_BS, PLAN_H, PLAN_E, PLAN_K = 4, 1024, 4, 2


def _plan_step(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.uniform(-2, 2, (PLAN_BS, PLAN_H)).astype(np.float32).astype(ml_dtypes.bfloat16)
    ids = np.stack([rng.choice(PLAN_E, PLAN_K, replace=False) for _ in range(PLAN_BS)]).astype(np.int32)
    return x, ids


def _dispatch_result(d: Any) -> tuple[bytes, bytes, bytes]:
    """The rows dispatch received (the others are not written), their assist entries, the counts."""
    n = int(d.ep_recv_counts.numpy()[-1])
    return (d.expand_x.numpy()[:n].tobytes(), d.assist_info_for_combine.numpy()[:3 * n].tobytes(),
            d.ep_recv_counts.numpy().tobytes())


def _close_right_after_a_plan_call(rank: int, world_size: int, root: bytes, handoff: Any,
                                   ranks: Any) -> dict[str, Any]:
    """Rank 0 calls the plan and closes the Tensors it passed while its launch waits for rank 1, which
    launches only once rank 0's close() returned (a host-side hand-off). Then the Tensors' memory:
    kept while bound, held after a call replaces them until the stream passes, let go of with the
    plan. Allocations are counted while both ranks wait at the same point."""
    import time
    import weakref

    import aclnn_py as acl
    from aclnn_py import _mock

    def allocations() -> int:
        ranks.wait()
        gc.collect()
        ranks.wait()  # both ranks collected: what they freed is in the pool
        acl.get_memory_pool().free_all_blocks()  # cached there, it is still allocated to the mock
        ranks.wait()
        n = int(_mock.stats()["allocations"])
        ranks.wait()
        return n

    report: dict[str, Any] = {}
    rng = np.random.default_rng([11, rank])
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        stream = acl.Device.current().create_stream()
        plan = buf.plan_dispatch(PLAN_BS, PLAN_H, PLAN_E, PLAN_K, x_dtype=ml_dtypes.bfloat16)
        plan(*(acl.Tensor.from_numpy(a) for a in _plan_step(rng)), stream=stream)  # warm-up
        stream.synchronize()
        host = _plan_step(rng)
        x, ids = (acl.Tensor.from_numpy(a) for a in host)
        memory = [weakref.ref(x._mem), weakref.ref(ids._mem)]
        others = [(acl.Tensor.from_numpy(a) for a in _plan_step(rng)) for _ in range(3)]
        later, latest, at_close = ([*pair] for pair in others)
        ranks.wait()
        if rank == 0:
            plan(x, ids, stream=stream)
            start = time.monotonic()
            x.close()
            ids.close()
            report["close took"] = time.monotonic() - start
            handoff.set()
        else:
            handoff.wait(timeout=5)  # without the plan's keep-alive rank 0's close() waits for this launch
            plan(x, ids, stream=stream)
            x.close()
            ids.close()
        stream.synchronize()  # raises if the round failed
        got = _dispatch_result(plan.outputs)
        want = buf.low_latency_dispatch(host[0], host[1], PLAN_E, stream=stream)
        stream.synchronize()
        report["right bytes"] = got == _dispatch_result(want)
        del want
        bound = allocations()
        report["kept while bound"] = all(m() is not None for m in memory)
        plan(*later, stream=stream)  # replaces them: kept by the plan as the inputs bound before
        plan(*latest, stream=stream)  # pushes them out: held until the stream passes this launch
        gc.collect()
        report["held until the stream passes"] = all(m() is not None for m in memory)
        stream.synchronize()
        report["freed after two later calls and a synchronisation"] = (all(m() is None for m in memory),
                                                                       bound - allocations())
        last = [weakref.ref(t._mem) for t in at_close]
        plan(*at_close, stream=stream)
        for t in at_close:
            t.close()
        del t
        plan.close()
        gc.collect()
        report["kept by a closed plan until the stream passes"] = all(m() is not None for m in last)
        stream.synchronize()
        gc.collect()
        report["freed after the plan's close and a synchronisation"] = all(m() is None for m in last)
        stream.close()
    return report


def test_closing_a_tensor_right_after_a_plan_call_returns_at_once(acl: Any, mock: Any) -> None:
    """``plan(x, ids, stream=s); x.close()`` while the launch is queued: the close returns at once (the
    plan keeps x's memory; aclrtFree would wait for the launch, or on CANN free memory under it), the
    round succeeds, and the memory is freed once two later calls pushed x out and the stream passed, or
    the plan is closed and the stream passed."""
    import threading

    before = live_allocations(mock)
    handoff, ranks = threading.Event(), threading.Barrier(2)
    reports = acl.worlds.run_threads(_close_right_after_a_plan_call, 2, handoff, ranks, timeout=120)
    assert reports[0].pop("close took") < 1.0
    for report in reports:
        assert report == {
            "right bytes": True,
            "kept while bound": True,
            "held until the stream passes": True,
            # x and ids of both ranks, and the warm-up's inputs, which the plan kept as the ones bound before
            "freed after two later calls and a synchronisation": (True, 8),
            "kept by a closed plan until the stream passes": True,
            "freed after the plan's close and a synchronisation": True,
        }
    assert live_allocations(mock) == before


# ---- typed errors that name the parameter ---------------------------------------------------------------
def _type_error_body(rank: int, world_size: int, root: bytes) -> list[str]:
    import aclnn_py as acl

    msgs = []
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        x = np.ones((2, 1024), ml_dtypes.bfloat16)
        ids = np.zeros((2, 1), np.int32)
        for kw in ({"num_experts": "8"}, {"num_experts": 8.0}, {"num_experts": 2, "quant_mode": None},
                   {"num_experts": 2, "num_max_dispatch_tokens_per_rank": "8"}, {"num_experts": 2, "comm_alg": 1}):
            try:
                buf.low_latency_dispatch(x, ids, **kw)
            except TypeError as e:
                msgs.append(str(e))
        try:
            buf.low_latency_dispatch("not an array", ids, 2)
        except TypeError as e:
            msgs.append(str(e))
        comm.barrier()
    return msgs


def test_type_errors_name_the_parameter(acl: Any) -> None:
    msgs = acl.worlds.run_threads(_type_error_body, 2)[0]
    assert msgs == [
        "low_latency_dispatch(): num_experts: expected an int, got str '8'",
        "low_latency_dispatch(): num_experts: expected an int, got float 8.0",
        "low_latency_dispatch(): quant_mode: expected an int, got NoneType None",
        "low_latency_dispatch(): num_max_dispatch_tokens_per_rank: expected an int, got str '8'",
        "low_latency_dispatch(): comm_alg: expected a str, got int 1",
        "x: expected a Tensor or a numeric array, got str of dtype <U12",
    ]


# ---- nothing leaks from the README's round ---------------------------------------------------------------
def _readme_round(rank: int, world_size: int, root: bytes) -> bool:
    import aclnn_py as acl

    with acl.hccl.Communicator(world_size, rank, root) as comm:
        buf = acl.MoeDistributeBuffer(comm)
        s = acl.Device(rank).create_stream()
        rng = np.random.default_rng(rank)
        x = rng.uniform(-1, 1, (8, 1024)).astype(acl.dtypes.bfloat16)
        topk_idx = np.stack([rng.choice(8, 4, replace=False) for _ in range(8)])
        topk_weights = rng.uniform(0, 1, (8, 4)).astype(np.float32)
        out = buf.low_latency_dispatch(x, topk_idx, 8, topk_weights=topk_weights, stream=s)
        y = buf.low_latency_combine(out.expand_x.numpy(), topk_idx, topk_weights, out.assist_info_for_combine,
                                    out.ep_recv_counts, num_experts=8, stream=s)
        want = x.astype(np.float32) * topk_weights.sum(1, keepdims=True)
        return bool(np.allclose(y.numpy().astype(np.float32), want, rtol=2**-7, atol=1e-6))


def test_repeated_rounds_leave_nothing_behind(acl: Any, mock: Any) -> None:
    from aclnn_py.runtime import ordered

    assert all(acl.worlds.run_threads(_readme_round, 2))  # warm-up: per-thread caches
    before = live_allocations(mock), mock.stats()["tensors"], mock.stats()["streams"], ordered.workspace_bytes()
    for _ in range(60):
        assert all(acl.worlds.run_threads(_readme_round, 2))
    after = live_allocations(mock), mock.stats()["tensors"], mock.stats()["streams"], ordered.workspace_bytes()
    assert after == before, f"allocations/tensors/streams/workspace bytes grew from {before} to {after}"


# ---- interop -----------------------------------------------------------------------------------------------
def test_numpy_from_dlpack_of_bf16_is_exact_or_refused_cleanly(acl: Any) -> None:
    """numpy before 2.5 cannot hold bf16 through DLPack: its own clean error (it calls the producer's
    deleter with that exception pending, which must not replace it), no stray 'Exception ignored'.
    Later numpy imports it (ml_dtypes' bfloat16): the exact values. Either way the export is released."""
    code = ("import numpy as np, ml_dtypes, aclnn_py as acl\n"
            "acl.init('mock'); acl.Device(0).set_current()\n"
            "t = acl.Tensor.from_numpy(np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16))\n"
            "try:\n    a = np.from_dlpack(t)\nexcept (BufferError, RuntimeError) as e:\n    print('refused:', e)\n"
            "else:\n    print('imported:', a.dtype, a.astype(np.float32).tolist()); del a\n"
            "from aclnn_py import dlpack\nprint('live exports:', dlpack.live_exports())\n"
            "print(t.numpy_view().astype(np.float32).tolist())\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    refused = np.lib.NumpyVersion(np.__version__) < "2.5.0"
    want = "refused: Unsupported dtype" if refused else "imported: bfloat16 [0.0, 1.0, 2.0, 3.0]"
    assert want in r.stdout and "live exports: 0" in r.stdout, r.stdout
    assert "[0.0, 1.0, 2.0, 3.0]" in r.stdout.splitlines()[-1]
    assert "Exception ignored" not in r.stderr and "SystemError" not in r.stderr + r.stdout


def test_a_failed_deferred_release_is_reported_as_unraisable(acl: Any, device0: Any, monkeypatch: Any) -> None:
    """A release that runs when the stream is found past it (a closed plan's) has no caller to raise to:
    its error goes to sys.unraisablehook ("Exception ignored in ..."), not into the synchronisation and
    not into silence."""
    from aclnn_py.runtime import ordered

    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(f"{type(u.exc_value).__name__}: {u.exc_value}"))
    s = device0.create_stream()

    def failing_release() -> None:
        raise RuntimeError("aclDestroyAclOpExecutor failed")

    ordered.state(s).launches += 1  # a launch queued that no synchronisation has seen complete
    ordered.release_after(s, failing_release)
    assert seen == []  # pending until the stream is found past it
    s.synchronize()    # does not raise
    assert seen == ["RuntimeError: aclDestroyAclOpExecutor failed"]
    with pytest.raises(RuntimeError, match="failed"):  # every launch seen complete: released at once
        ordered.release_after(s, failing_release)
    s.close()
    with pytest.raises(RuntimeError, match="failed"):  # a closed stream: released at once, to the caller
        ordered.release_after(s, failing_release)


def _clean_run(code: str, timeout: float) -> list[str]:
    """`code` run in a child interpreter, which must exit cleanly (a hang fails at `timeout` instead of
    stalling the suite) and report no ignored exception: its output lines."""
    r = run_python(code, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Exception ignored" not in r.stderr, r.stderr
    return r.stdout.splitlines()


def test_finalizers_run_by_a_release_may_hold_and_close_streams() -> None:
    """Dropping what a stream held runs finalizers: a closed plan's release, or the __del__ of an
    unclosed object (a plan, a stream) that was only kept by the hold. They take the holds' lock
    themselves, so what a synchronisation, a checkpoint or a stream's destruction releases is dropped
    after that lock is let go (before, the synchronisation hung). In a subprocess: a hang there
    cannot stall the suite."""
    code = ("import aclnn_py as acl\n"
            "from aclnn_py.runtime import ordered\n"
            "acl.init('mock'); dev = acl.Device(0).set_current()\n"
            "s, other = dev.create_stream(), dev.create_stream()\n"
            "class HoldsWhenDropped:\n"
            "    def __del__(self):\n"
            "        ordered.hold(s, 'held by a finalizer')\n"
            "ordered.hold(s, HoldsWhenDropped())\n"
            "ordered.hold(s, other); del other  # an unclosed stream, closed when the hold goes\n"
            "s.synchronize()\n"
            "print('held after the synchronisation:', ordered.held(s))\n"
            "s.close()\n"
            "print('done')\n")
    assert _clean_run(code, timeout=60) == ["held after the synchronisation: 1", "done"]


def test_the_collector_may_finalize_objects_inside_the_librarys_locks() -> None:
    """With a collection at almost every allocation, garbage cycles holding unclosed DeviceMemory,
    streams and objects that hold on a stream when finalized are collected while this thread allocates,
    frees, copies and synchronises: inside the memory pool's and the holds' locks too (CPython 3.12+
    collects at any call; before, the pool's lock deadlocked there). In a subprocess: a hang there
    cannot stall the suite."""
    code = ("import gc\n"
            "import numpy as np\n"
            "import aclnn_py as acl\n"
            "from aclnn_py.runtime import get_memory_pool, ordered\n"
            "acl.init('mock'); dev = acl.Device(0).set_current()\n"
            "s = dev.create_stream()\n"
            "host = np.ones(64, np.float32)\n"
            "class Cycle:\n"
            "    def __del__(self):\n"
            "        ordered.hold(s, 'held by a finalizer')\n"
            "gc.set_threshold(1)\n"
            "for i in range(1500):\n"
            "    c = Cycle(); c.me = c\n"
            "    c.mem = acl.DeviceMemory(256 * (1 + i % 7))  # unclosed: the collector closes it\n"
            "    c.stream = dev.create_stream() if i % 50 == 0 else None\n"
            "    t = acl.Tensor.empty((64,), 'float32')\n"
            "    t.copy_from(host, s)\n"
            "    t.close()\n"
            "    acl.DeviceMemory(512).close()\n"
            "    if i % 100 == 0:\n"
            "        s.synchronize()\n"
            "gc.set_threshold(700); del c; gc.collect()\n"
            "s.synchronize(); ordered.reap()\n"
            "print('in use:', get_memory_pool().used_bytes())\n")
    assert _clean_run(code, timeout=120) == ["in use: 0"]


def test_exports_finished_on_another_thread_are_released_there() -> None:
    """A consumer finishing with DLPack exports (their deleters, here called from another thread while
    this thread makes and counts exports): each is released once, none is lost. In a subprocess: a hang
    there cannot stall the suite."""
    code = ("import ctypes, sys, threading\n"
            "import numpy as np\n"
            "import aclnn_py as acl\n"
            "from aclnn_py import dlpack\n"
            "sys.setswitchinterval(1e-5)\n"
            "acl.init('mock'); acl.Device(0).set_current()\n"
            "t = acl.Tensor.from_numpy(np.ones(4, np.float32))\n"
            "get, rename = ctypes.pythonapi.PyCapsule_GetPointer, ctypes.pythonapi.PyCapsule_SetName\n"
            "get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]\n"
            "rename.restype, rename.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]\n"
            "class Managed(ctypes.Structure):  # DLManagedTensor: the tensor, manager_ctx, deleter\n"
            "    _fields_ = [('dl', ctypes.c_byte * 48), ('ctx', ctypes.c_void_p),\n"
            "                ('deleter', ctypes.CFUNCTYPE(None, ctypes.c_void_p))]\n"
            "kept = [t.__dlpack__() for _ in range(300)]  # live until the end\n"
            "finished = [t.__dlpack__() for _ in range(1500)]\n"
            "addresses = [get(c, b'dltensor') for c in finished]\n"
            "for c in finished:\n"
            "    rename(c, b'used_dltensor')  # consumed, as a consumer marks it\n"
            "def consumer():\n"
            "    for a in addresses:\n"
            "        Managed.from_address(a).deleter(a)\n"
            "th = threading.Thread(target=consumer); th.start()\n"
            "while th.is_alive():\n"
            "    t.__dlpack__()  # made and dropped at once\n"
            "th.join()\n"
            "print('live:', dlpack.live_exports())\n"
            "del kept\n"
            "print('live:', dlpack.live_exports())\n")
    assert _clean_run(code, timeout=60) == ["live: 300", "live: 0"]


def test_a_launch_is_held_from_after_it_was_queued(acl: Any, device0: Any) -> None:
    """A synchronisation by another thread that began before a launch was queued cannot release what
    the launch uses (the hold is taken after queueing)."""
    from aclnn_py._binding.prototypes import RunLayout
    from aclnn_py._core import Launcher, _mark_synchronisation, _synchronisation_passed
    from aclnn_py.ops import MoeConfig
    from aclnn_py.runtime import ordered

    s = device0.create_stream()
    t_in = acl.Tensor.from_numpy(np.zeros(8, np.float32))
    t_out = acl.Tensor.empty((8,), np.float32)
    marks = []
    b = acl.backend()

    # a run helper standing for an operator's: it records the mark and says it launched
    @b.ffi.callback("aclnnStatus(aclTensor *const *, const int64_t *, const char *const *, uintptr_t, uint64_t, "
                    "aclrtStream, uint64_t *, aclOpExecutor **, int, int *)")
    def run_helper(table, ints, strings, ws, cap, stream, ws_size, ex, launch, launched):
        marks.append(_mark_synchronisation(s))  # the other thread's synchronisation starts as this launch is queued
        launched[0] = 1
        return 0

    def address(fn):
        return int(b.ffi.cast("uintptr_t", fn))

    layout = RunLayout("phase1", "phase2", ("x",), ("yOut",), (), (), (("t", 0), ("t", 1)))
    launcher = Launcher(layout, address(run_helper), address(b.function_pointer("aclnnMoeDistributeDispatchV5")),
                        (0,), (0,), ("x",), ("y_out",), 5)
    launcher.run([t_in], [t_out], MoeConfig(ep_world_size=2, ep_rank_id=0, moe_expert_num=2, ccl_buffer_size=1 << 20), s)
    _synchronisation_passed(s, *marks[0])  # ... and ends: it did not wait for this launch
    assert ordered.held(s) == 1
    assert t_out._writer is s
    s.synchronize()
    assert ordered.held(s) == 0
    for obj in (t_in, t_out, s):
        obj.close()


def _held_across_a_timed_out_synchronisation(rank: int, world_size: int, root: bytes,
                                             barrier: Any) -> tuple[int, bool, int, int] | None:
    """Rank 0 dispatches host arrays (their uploads are held) while rank 1 stays away; its
    synchronisation times out, then rank 1 comes and the next one completes: (holds before, whether it
    timed out, holds after the timeout, holds after the completion)."""
    import aclnn_py as acl
    from aclnn_py.runtime import ordered

    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device.current().create_stream()
        x, ids = np.ones((2, 1024), np.float16), np.array([[0], [1]], np.int32)
        if rank == 1:
            barrier.wait()  # rank 0's synchronisation has timed out
        acl.ops.moe_distribute_dispatch(buf.context, x, ids, ep_world_size=world_size, ep_rank_id=rank,
                                        moe_expert_num=world_size, ccl_buffer_size=buf.ccl_buffer_size, stream=s)
        report = None
        if rank == 0:
            before = ordered.held(s)
            try:
                s.synchronize(timeout_ms=20)
                timed_out = False
            except acl.AclTimeoutError:
                timed_out = True
            after_timeout = ordered.held(s)
            barrier.wait()
            s.synchronize()
            report = (before, timed_out, after_timeout, ordered.held(s))
        s.synchronize()
        s.close()
        return report


def test_a_synchronisation_that_times_out_releases_nothing_and_the_next_one_releases_all(acl: Any) -> None:
    """What a stream holds stays held while its work has not finished — a synchronisation that runs out
    of time raises and lets nothing go — and goes with the first synchronisation that sees it finish."""
    import threading

    before, timed_out, after_timeout, after = acl.worlds.run_threads(
        _held_across_a_timed_out_synchronisation, 2, threading.Barrier(2), timeout=120)[0]
    assert timed_out
    assert before > 0 and after_timeout == before
    assert after == 0


def test_a_resource_class_without_release_or_label_is_refused_when_defined() -> None:
    from aclnn_py.runtime._resource import Resource

    with pytest.raises(TypeError, match="Partial derives from Resource and must define _release, _label"):
        class Partial(Resource):
            pass
