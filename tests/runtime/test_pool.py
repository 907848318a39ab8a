"""The caching memory pool under every DeviceMemory: steady state without aclrtMalloc / aclrtFree,
no reuse of a block that an export still claims, accounting, limit, switching it off, poison refill
and concurrent use."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import run_python
from helpers.pool import pool_off

E, BS, H, K = 4, 8, 1024, 2  # experts, tokens per rank, hidden, experts per token
WARMUP, STEPS = 4, 20

_steady = threading.local()  # set on a rank thread once its warm-up is over


@pytest.fixture(autouse=True)
def checked_pool(acl: Any) -> Iterator[Any]:
    """Every test of this suite runs with the pool in checked mode and ends with its invariants checked:
    no block both in use and free, none free twice, no two blocks in use overlapping."""
    pool = acl.get_memory_pool()
    pool.set_checked(True)
    try:
        yield pool
        pool.verify()
    finally:
        pool.set_checked(False)


@pytest.fixture
def rounded_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The size classes of real CANN (on the mock every size is its own class), for the tests of
    the rounding and the byte counts that follow from it."""
    from aclnn_py.runtime import _pool

    monkeypatch.setattr(_pool, "_exact_sizes", False)


@contextmanager
def counted_runtime_calls(acl: Any) -> Iterator[dict[str, int]]:
    """Count the library's aclrtMalloc / aclrtFree calls made by threads that set ``_steady.on``
    (all threads when none does: ``counts["all"]`` then counts every call)."""
    lib = acl.backend().lib
    counts = {"aclrtMalloc": 0, "aclrtFree": 0}
    lock = threading.Lock()
    originals = {name: getattr(lib, name) for name in counts}

    def wrap(name: str) -> Any:
        real = originals[name]

        def counting(*args: Any) -> Any:
            if getattr(_steady, "on", True):
                with lock:
                    counts[name] += 1
            return real(*args)
        return counting

    for name in counts:
        setattr(lib, name, wrap(name))
    try:
        yield counts
    finally:
        for name, real in originals.items():
            setattr(lib, name, real)


def _inputs(acl: Any, rank: int, i: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(100 * rank + i)
    x = rng.uniform(-1, 1, (BS, H)).astype(ml_dtypes.bfloat16)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    w = rng.uniform(0, 1, (BS, K)).astype(np.float32)
    return acl.Tensor.from_numpy(x), acl.Tensor.from_numpy(ids), acl.Tensor.from_numpy(w)


def _serving_loop(rank: int, world_size: int, root: bytes, keep: bool = False) -> list[bool]:
    import aclnn_py as acl

    _steady.on = False
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device(rank).create_stream()
        # two input sets in turn: a step that read the outputs of the step before gives a wrong answer
        sets = [_inputs(acl, rank, i) for i in range(2)]
        want: list[bytes] = []
        right = []
        for step in range(STEPS):
            _steady.on = step >= WARMUP
            x, ids, w = sets[step % 2]
            out = buf.low_latency_dispatch(x, ids, E, topk_weights=w, stream=s, keep=keep)
            y = buf.low_latency_combine(out.expand_x, ids, w, out.assist_info_for_combine, out.ep_recv_counts,
                                        num_experts=E, stream=s, keep=keep)
            buf.synchronize(s)
            got = y.numpy(stream=s).tobytes()
            if step < 2:
                want.append(got)
            else:
                right.append(got == want[step % 2])
        _steady.on = False
        del out, y
        comm.barrier()
        s.close()
        return right


def test_serving_loop_through_the_buffer_makes_no_malloc_or_free_in_steady_state(acl: Any) -> None:
    with counted_runtime_calls(acl) as counts:
        right = acl.worlds.run_threads(_serving_loop, 2, timeout=120)
    assert all(all(r) and len(r) == STEPS - 2 for r in right), right
    assert counts == {"aclrtMalloc": 0, "aclrtFree": 0}, f"steady-state steps called the allocator: {counts}"


def test_kept_results_take_their_memory_from_the_pool(acl: Any) -> None:
    """keep=True gives every call outputs of their own: the pool serves them in steady state."""
    with counted_runtime_calls(acl) as counts:
        right = acl.worlds.run_threads(_serving_loop, 2, True, timeout=120)
    assert all(all(r) and len(r) == STEPS - 2 for r in right), right
    assert counts == {"aclrtMalloc": 0, "aclrtFree": 0}, f"steady-state steps called the allocator: {counts}"


def test_without_the_pool_kept_results_allocate_every_step(acl: Any) -> None:
    """The counter above sees the allocations the pool avoids."""
    with pool_off(acl), counted_runtime_calls(acl) as counts:
        acl.worlds.run_threads(_serving_loop, 2, True, timeout=120)
    assert counts["aclrtMalloc"] >= 2 * (STEPS - WARMUP) and counts["aclrtFree"] >= 2 * (STEPS - WARMUP - 1)


def test_without_the_pool_the_buffer_writes_into_its_result_sets(acl: Any) -> None:
    """The buffer's ring of result sets: a call writes into the memory of a set two calls old, so no
    allocation in steady state even with the pool off."""
    with pool_off(acl), counted_runtime_calls(acl) as counts:
        right = acl.worlds.run_threads(_serving_loop, 2, timeout=120)
    assert all(all(r) and len(r) == STEPS - 2 for r in right), right
    assert counts == {"aclrtMalloc": 0, "aclrtFree": 0}, f"steady-state steps called the allocator: {counts}"


# ---- exports keep a pooled block out of reuse --------------------------------------------------------------
def _view(t: Any, kind: str) -> object:
    if kind == "numpy_view":
        return t.numpy_view()
    if kind == "asarray":
        return np.asarray(t)
    return t.__dlpack__()


@pytest.mark.parametrize("kind", ["numpy_view", "asarray", "dlpack_capsule"])
def test_a_block_with_a_live_export_is_not_reused(acl: Any, device0: Any, kind: str) -> None:
    t = acl.Tensor.from_numpy(np.arange(300, dtype=np.float32))
    addr = t.ptr
    view = _view(t, kind)
    t.close()
    del t
    gc.collect()
    other = acl.Tensor.empty((300,), np.float32)
    assert other.ptr != addr, "a block still claimed by an export was handed out again"
    other.fill_bytes(0xFF)
    if kind != "dlpack_capsule":
        assert np.asarray(view).tolist() == list(range(300))  # the exported memory is untouched
    del view
    gc.collect()
    again = acl.Tensor.empty((300,), np.float32)
    assert again.ptr == addr  # released: the pool hands the most recently returned block out first


def test_a_closed_device_memory_with_an_export_claim_is_not_reused(acl: Any, device0: Any) -> None:
    mem = acl.DeviceMemory(5000)
    addr, claim = mem.ptr, mem.export()
    mem.close()
    other = acl.DeviceMemory(5000)
    assert other.ptr != addr
    claim.release()
    assert acl.DeviceMemory(5000).ptr == addr


# ---- accounting, free_all_blocks, limit ------------------------------------------------------------------
def test_used_and_held_bytes_and_free_all_blocks(acl: Any, device0: Any, mock: Any, rounded_classes: None) -> None:
    pool = acl.get_memory_pool()
    pool.free_all_blocks()
    used0, live0 = pool.used_bytes(), mock.stats()["allocations"]
    assert pool.held_bytes() == 0
    ts = [acl.Tensor.empty((250,), np.float32) for _ in range(3)]  # 1000 bytes: the 1024-byte class
    assert pool.used_bytes() == used0 + 3 * 1024 and pool.held_bytes() == 0
    assert mock.stats()["allocations"] == live0 + 3
    for t in ts:
        t.close()
    del ts, t
    gc.collect()
    assert pool.used_bytes() == used0 and pool.held_bytes() == 3 * 1024
    assert pool.total_bytes() == used0 + 3 * 1024 and pool.held_bytes(device=1) == 0
    assert mock.stats()["allocations"] == live0 + 3  # cached, not freed
    assert pool.free_all_blocks() == 3
    assert pool.held_bytes() == 0 and mock.stats()["allocations"] == live0


def test_size_classes(rounded_classes: None) -> None:
    from aclnn_py.runtime._pool import block_size

    mib = 1 << 20
    assert [block_size(n) for n in (1, 512, 513, 1000, 4096, 4097, mib)] == [512, 512, 1024, 1024, 4096, 8192, mib]
    assert [block_size(n) for n in (mib + 1, 2 * mib, 3 * mib, 5 * mib + 1)] == [2 * mib, 2 * mib, 4 * mib, 6 * mib]


def test_limit_frees_cached_blocks_then_raises_the_out_of_memory_error(acl: Any, device0: Any) -> None:
    pool = acl.get_memory_pool()
    pool.free_all_blocks()
    base = pool.used_bytes(0)
    mib = 1 << 20
    pool.set_limit(base + 4 * mib)
    try:
        assert pool.get_limit() == base + 4 * mib
        a = acl.DeviceMemory(2 * mib)
        b = acl.DeviceMemory(2 * mib)
        with pytest.raises(acl.AclError) as ei:
            acl.DeviceMemory(512)
        assert ei.value.code == 207001 and ei.value.name == "ACL_ERROR_RT_MEMORY_ALLOCATION"
        assert "limit" in ei.value.message and "aclrtMalloc" in str(ei.value)
        b.close()
        assert pool.held_bytes(0) == 2 * mib
        small = acl.DeviceMemory(512)  # fits once the cached block is freed
        assert pool.held_bytes(0) == 0 and small.ptr and a.ptr
    finally:
        pool.set_limit(0)
    assert pool.get_limit() == 0
    with pytest.raises(ValueError, match="set_limit: size must be an int >= 0"):
        pool.set_limit(-1)


def test_blocks_are_cached_per_device(acl: Any, device0: Any, rounded_classes: None) -> None:
    pool = acl.get_memory_pool()
    try:
        on_1 = acl.DeviceMemory(6000, device=1)
        addr_1 = on_1.ptr
        on_1.close()
        assert pool.held_bytes(1) >= 8192
        acl.Device(0).set_current()
        on_0 = acl.DeviceMemory(6000)
        assert on_0.device == 0 and on_0.ptr != addr_1  # device 1's block is not device 0's memory
        again_1 = acl.DeviceMemory(6000, device=1)
        assert again_1.ptr == addr_1
    finally:
        acl.Device(0).set_current()


def test_at_exit_cached_blocks_are_freed_and_later_ones_not_cached(acl: Any, device0: Any, mock: Any, rounded_classes: None) -> None:
    from aclnn_py.runtime._pool import MemoryPool

    own = MemoryPool()
    acl.set_allocator(own)
    try:
        acl.DeviceMemory(3000).close()
        live = mock.stats()["allocations"]
        assert own.held_bytes() == 4096
        later = acl.DeviceMemory(3000)
        own._close()  # what the interpreter's exit runs for the library's pool
        assert own.held_bytes() == 0 and mock.stats()["allocations"] == live  # `later` is in use
        later.close()
        assert own.held_bytes() == 0 and mock.stats()["allocations"] == live - 1
    finally:
        acl.set_allocator(acl.get_memory_pool())


def test_out_of_memory_from_acl_frees_cached_blocks_and_retries(acl: Any, device0: Any, rounded_classes: None) -> None:
    pool = acl.get_memory_pool()
    acl.DeviceMemory(9000).close()
    assert pool.held_bytes(0) > 0
    lib = acl.backend().lib
    real = lib.aclrtMalloc
    refusals = []

    def full_until_the_cache_is_freed(cell: Any, size: int, policy: int) -> int:
        if pool.held_bytes(0):
            refusals.append(size)
            return 207001  # ACL_ERROR_RT_MEMORY_ALLOCATION
        return int(real(cell, size, policy))

    lib.aclrtMalloc = full_until_the_cache_is_freed
    try:
        mem = acl.DeviceMemory(40000)
    finally:
        lib.aclrtMalloc = real
    assert mem.ptr and refusals == [65536] and pool.held_bytes(0) == 0


def test_device_reset_frees_the_devices_cached_blocks(acl: Any, device0: Any) -> None:
    pool = acl.get_memory_pool()
    acl.DeviceMemory(4096).close()
    assert pool.held_bytes(0) > 0
    acl.Device(0).set_current()
    acl.Device(0).reset()
    assert pool.held_bytes(0) == 0


# ---- turning it off ----------------------------------------------------------------------------------------
def test_set_allocator_none_makes_every_allocation_an_aclrtmalloc(acl: Any, device0: Any) -> None:
    acl.DeviceMemory(3000).close()  # one cached block of the class
    with pool_off(acl), counted_runtime_calls(acl) as counts:
        for _ in range(3):
            acl.Tensor.empty((750,), np.float32).close()
    assert counts == {"aclrtMalloc": 3, "aclrtFree": 3}
    with counted_runtime_calls(acl) as counts:
        for _ in range(3):
            acl.Tensor.empty((750,), np.float32).close()
    assert counts == {"aclrtMalloc": 0, "aclrtFree": 0}
    with pytest.raises(TypeError, match="set_allocator: pool must be a MemoryPool or None"):
        acl.set_allocator("pool")


def test_environment_variable_turns_the_pool_off() -> None:
    code = (
        "import aclnn_py as acl\n"
        "acl.init('mock'); acl.Device(0).set_current()\n"
        "acl.Tensor.empty((1000,), 'float32').close()\n"
        "print(acl.get_memory_pool().held_bytes(), acl.get_memory_pool().used_bytes())\n"
    )
    off = run_python(code, ACLNN_PY_POOL="0")
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["0", "0"]
    on = run_python(code, ACLNN_PY_POOL="1")
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["4000", "0"]  # cached; on the mock each size is its own class


def test_on_the_mock_a_reused_block_is_bounded_by_its_request(acl: Any, device0: Any) -> None:
    """The mock keeps catching a tensor that runs past its allocation with the pool on: a reused
    block is exactly the size asked for, so a write past the request is refused."""
    from aclnn_py.runtime import DeviceMemory, fill

    first = DeviceMemory(4000)
    ptr = first.ptr
    first.close()
    again = DeviceMemory(4000)
    assert again.ptr == ptr  # served from the pool
    fill(again.ptr, 4000, 0, 4000)
    with pytest.raises(acl.AclError):
        fill(again.ptr, 4096, 0, 4096)  # past the 4000 bytes asked for
    again.close()


# ---- poison, threads --------------------------------------------------------------------------------------
def test_reused_block_is_refilled_with_poison_on_the_mock(acl: Any, device0: Any, mock: Any) -> None:
    t = acl.Tensor.zeros((700,), np.uint8)
    addr = t.ptr
    t.close()
    again = acl.Tensor.empty((700,), np.uint8)
    assert again.ptr == addr
    assert set(again.numpy().tolist()) == {0xA5}
    again.fill_bytes(0)
    again.close()
    mock.set_poison(False)
    try:
        third = acl.Tensor.empty((700,), np.uint8)
        assert third.ptr == addr and set(third.numpy().tolist()) == {0}  # no fill asked: none made
    finally:
        mock.set_poison(True)


def test_a_large_reused_block_is_refilled_whole_or_striped_on_request(acl: Any, device0: Any, mock: Any) -> None:
    """Whole by default; with the stripe, one 64-byte line in every 512 bytes and the last line get the
    poison above 64 KiB (the rest keeps what the last user wrote), and small blocks stay whole."""
    n, small = 256 << 10, 700

    def reused(nbytes: int) -> np.ndarray:
        t = acl.Tensor.empty((nbytes,), np.uint8)
        address = t.ptr
        t.fill_bytes(0)
        t.close()
        again = acl.Tensor.empty((nbytes,), np.uint8)
        assert again.ptr == address
        got = again.numpy()
        again.close()
        return got

    assert set(reused(n).tolist()) == {0xA5}
    mock.set_poison_stripe(True)
    try:
        lines = reused(n).reshape(-1, 512)
        small_block = reused(small)
    finally:
        mock.set_poison_stripe(False)
    assert (lines[:, :64] == 0xA5).all() and (lines[:-1, 64:] == 0).all()
    assert (lines[-1, 64:-64] == 0).all() and (lines[-1, -64:] == 0xA5).all()
    assert set(small_block.tolist()) == {0xA5}


def test_the_stripe_is_chosen_by_the_environment_and_refill_checks_its_block(acl: Any, device0: Any,
                                                                            mock: Any) -> None:
    code = "import aclnn_py as acl; acl.init('mock'); from aclnn_py import _mock; print(_mock.poison_stripe())"
    assert run_python(code, ACLNN_MOCK_POISON="stripe").stdout.split() == ["True"]
    assert run_python(code).stdout.split() == ["False"]
    t = acl.Tensor.empty((100,), np.uint8)
    with pytest.raises(ValueError, match="not inside one device block"):
        mock.refill_poison(t.ptr, 200)  # runs past the block
    with pytest.raises(ValueError, match="not inside one device block"):
        mock.refill_poison(np.zeros(8, np.uint8).ctypes.data, 8)  # host memory
    t.close()


def test_two_threads_never_get_the_same_block(acl: Any, device0: Any) -> None:
    pool = acl.get_memory_pool()
    gc.collect()  # blocks of earlier tests that only a reference cycle kept
    used0 = pool.used_bytes(0)
    live: dict[int, int] = {}
    lock = threading.Lock()
    errors: list[str] = []
    sizes = (100, 600, 3000, 70000)

    def churn(seed: int) -> None:
        acl.Device(0).set_current()
        rng = np.random.default_rng(seed)
        mine: list[Any] = []
        for _ in range(1500):
            if mine and rng.random() < 0.5:
                mem = mine.pop(int(rng.integers(len(mine))))
                with lock:
                    del live[mem.ptr]
                mem.close()
            else:
                mem = acl.DeviceMemory(int(rng.choice(sizes)))
                with lock:
                    if mem.ptr in live:
                        errors.append(f"0x{mem.ptr:x} handed out twice")
                    live[mem.ptr] = seed
                mine.append(mem)
        for mem in mine:
            with lock:
                del live[mem.ptr]
            mem.close()

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(2)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: inside the pool's steps too
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(switch)
    assert errors == [] and live == {}
    gc.collect()
    assert pool.used_bytes(0) == used0  # every block handed out was counted back in


class _OtherThreadFirst:
    """A stand-in for the exports' lock that, the first time the calling thread enters it, first lets
    `action` run to its end on another thread: the interleaving where a last export is released just as
    its memory is closed."""

    def __init__(self, lock: Any, action: Any):
        self.lock, self.action, self.owner = lock, action, threading.get_ident()

    def __enter__(self) -> None:
        action, self.action = self.action, None
        if action is not None and threading.get_ident() == self.owner:
            t = threading.Thread(target=action)
            t.start()
            t.join(10)
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_close_racing_the_last_export_frees_the_block_once(acl: Any, device0: Any,
                                                           monkeypatch: pytest.MonkeyPatch, checked_pool: Any) -> None:
    from aclnn_py.runtime import _memory

    mem = acl.DeviceMemory(4096 + 32)  # a size class of its own on the mock
    export = mem.export()
    monkeypatch.setattr(_memory, "_exports_lock", _OtherThreadFirst(_memory._exports_lock, export.release))
    mem.close()
    monkeypatch.undo()
    a, b = acl.DeviceMemory(4096 + 32), acl.DeviceMemory(4096 + 32)
    assert a.ptr != b.ptr, "two live allocations got the same block"
    checked_pool.verify()


def test_checked_mode_reports_a_block_given_back_twice(acl: Any, device0: Any) -> None:
    """The invariant check itself, on a pool of its own: a block returned twice is named."""
    from aclnn_py.runtime import _pool

    pool = acl.MemoryPool()
    pool.set_checked(True)
    ptr = pool.malloc(8192, 0)
    pool.free(ptr, 8192, 0)
    pool.free(ptr, 8192, 0)
    with pytest.raises(AssertionError, match=f"block 0x{ptr:x} .* given back twice"):
        pool.verify()
    pool._devices.clear()  # the block is on its free list twice: freed here once
    _pool.raw_free(ptr)
