"""The caching pool every :class:`~aclnn_py.DeviceMemory` takes its block from (docs/concepts.md,
"Device memory and the pool").

A block comes back to the pool only when its :class:`~aclnn_py.DeviceMemory` is really released —
after the owner was closed, every export claim was let go and every stream-ordered hold ended (a
synchronisation saw the stream pass the launch) — so a block handed out again is used by no queued
work on any stream. Handing one out is a dict and list operation under one lock; ``aclrtMalloc`` runs
only when no cached block of the request's size class exists. Giving one back takes no lock: the
garbage collector releases an unclosed DeviceMemory from a finalizer, and from CPython 3.12 it may
run one at any call, also while this thread is inside the pool's lock. Returned blocks are queued and
filed by the pool's next step under the lock.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import deque
from collections.abc import Callable

from .. import env_values
from ..errors import AclError, acl_error, check_acl
from ._init import initialized

ACL_ERROR_RT_MEMORY_ALLOCATION = 207001

# Size classes. A serving loop asks for the same sizes every step, and any deterministic rounding
# lets those requests find the blocks the previous step gave back; the rounding decides how well
# requests of *nearby* sizes (a varying token count) share blocks, against how many bytes are wasted.
# * Up to 1 MiB: powers of two from 512 bytes (CANN aligns device allocations to 512 bytes anyway), so
#   one class serves every size within a factor of two and a handful of classes covers all small
#   outputs (counts, scales, flags); the waste is below one small block each.
# * Above: multiples of 2 MiB, the huge page ``ACL_MEM_MALLOC_HUGE_FIRST`` allocates in, so finer
#   rounding would save no device memory; the waste stays below 2 MiB per block.
_MIN_BLOCK = 512
_exact_sizes: bool | None = None  # the backend is the mock (resolved at the first request)
_SMALL_LIMIT = 1 << 20
_LARGE_STEP = 2 << 20


def block_size(size: int) -> int:
    """The size class a request of `size` bytes (> 0) is served from. On the mock every size is its
    own class: the mock checks each tensor against the allocation it lies in, and a rounded-up block
    would let a tensor run past its request unnoticed. A serving loop repeats its sizes exactly, so
    its steady state is the same."""
    global _exact_sizes
    if _exact_sizes is None:
        _exact_sizes = initialized().is_mock
    if _exact_sizes:
        return size
    if size <= _SMALL_LIMIT:
        return _MIN_BLOCK if size <= _MIN_BLOCK else 1 << (size - 1).bit_length()
    return -(-size // _LARGE_STEP) * _LARGE_STEP


class _DeviceBlocks:
    """One device's share of the pool: free blocks by size class, and byte counts."""

    __slots__ = ("free", "used", "held")

    def __init__(self) -> None:
        self.free: dict[int, list[int]] = {}
        self.used = 0   # bytes of blocks handed out
        self.held = 0   # bytes of free blocks kept for reuse


class MemoryPool:
    """A caching allocator of device blocks, per device, with the limit applying to each device.

    Modelled on CuPy's ``MemoryPool``: :meth:`used_bytes` / :meth:`held_bytes` / :meth:`total_bytes`,
    :meth:`free_all_blocks`, :meth:`set_limit` / :meth:`get_limit`. :func:`get_memory_pool` returns the
    one the library uses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: dict[int, _DeviceBlocks] = {}
        # (address or 0, size class, device) of blocks given back and not yet filed; 0: only counted
        # (freed already, or by someone else). Appending needs no lock (see the module's docstring).
        self._returned: deque[tuple[int, int, int]] = deque()
        self._limit = 0  # 0: no limit
        self._closing = False  # set at interpreter exit: blocks are freed, no longer cached
        # checked mode (set_checked): blocks handed out, by (device, address) -> size class, and what
        # broke the pool's invariants since it was turned on
        self._live: dict[tuple[int, int], int] | None = None
        self._violations: list[str] = []
        _pools.add(self)

    # ---- the hot path (DeviceMemory) -----------------------------------------------------------------
    def malloc(self, nbytes: int, device: int) -> int:
        """The address of a block of exactly `nbytes` (a :func:`block_size`) on `device`, the calling
        thread's current device: a cached one, else a new ``aclrtMalloc``."""
        with self._lock:
            if self._returned:
                self._file_returned()
            blocks = self._devices.get(device)
            if blocks is None:
                blocks = self._devices[device] = _DeviceBlocks()
            free = blocks.free.get(nbytes)
            ptr = free.pop() if free else 0
            if ptr:
                blocks.held -= nbytes
                blocks.used += nbytes
                if self._live is not None:
                    self._hand_out(ptr, nbytes, device)
        if ptr:
            _refill_poison(ptr, nbytes)
            return ptr
        return self._malloc_new(nbytes, device, blocks)

    def free(self, ptr: int, nbytes: int, device: int) -> None:
        """Take back a block :meth:`malloc` handed out; no queued work may use it any more. Queued
        without the lock; once the pool is closing (interpreter exit) it is freed at once instead."""
        if self._closing:
            raw_free(ptr)
            ptr = 0
        self._returned.append((ptr, nbytes, device))

    def forget(self, nbytes: int, device: int) -> None:
        """A block handed out was freed by someone else (``aclrtFree`` behind the wrapper's back)."""
        self._returned.append((0, nbytes, device))

    def _file_returned(self) -> None:
        """File the queued blocks as free and cached (the caller holds the lock). A finalizer the
        collector runs meanwhile may queue more: the loop files those too."""
        returned = self._returned
        while returned:
            ptr, nbytes, device = returned.popleft()
            blocks = self._devices[device]
            blocks.used -= nbytes
            if ptr:
                if self._live is not None:
                    self._take_back(ptr, nbytes, device, blocks)
                blocks.held += nbytes
                blocks.free.setdefault(nbytes, []).append(ptr)

    def _malloc_new(self, nbytes: int, device: int, blocks: _DeviceBlocks) -> int:
        if self._limit:
            self._make_room(nbytes, device, blocks)
        try:
            ptr = raw_malloc(nbytes)
        except AclError as e:
            if e.code != ACL_ERROR_RT_MEMORY_ALLOCATION or not self.free_all_blocks(device):
                raise
            ptr = raw_malloc(nbytes)  # the cached blocks were in the way: once more without them
        with self._lock:
            blocks.used += nbytes
            if self._live is not None:
                self._hand_out(ptr, nbytes, device)
            if self._returned:
                self._file_returned()
        return ptr

    # ---- checked mode (tests) ------------------------------------------------------------------------
    def set_checked(self, on: bool) -> None:
        """Checked mode, for tests: the pool tracks the blocks it hands out and records every break of
        its invariants — a block handed out while another holder has it, a block given back twice —
        which :meth:`verify` reports. Blocks handed out before it was turned on are not tracked."""
        with self._lock:
            self._file_returned()
            self._live = {} if on else None
            self._violations = []

    def verify(self) -> None:
        """In checked mode: raise AssertionError naming what broke the invariants — no block both in use
        and free, no block twice on a free list, no two blocks in use overlapping."""
        with self._lock:
            self._file_returned()
            live = dict(self._live or {})
            problems = list(self._violations)
            for device, blocks in self._devices.items():
                seen: set[int] = set()
                for nbytes, ptrs in blocks.free.items():
                    for ptr in ptrs:
                        if ptr in seen:
                            problems.append(f"block 0x{ptr:x} ({nbytes} bytes, device {device}) is free twice")
                        seen.add(ptr)
                        if (device, ptr) in live:
                            problems.append(f"block 0x{ptr:x} (device {device}) is both in use and free")
        spans = sorted((device, ptr, ptr + size) for (device, ptr), size in live.items())
        for (d1, p1, end1), (d2, p2, _) in zip(spans, spans[1:]):
            if d1 == d2 and p2 < end1:
                problems.append(f"blocks 0x{p1:x} and 0x{p2:x} in use on device {d1} overlap")
        if problems:
            raise AssertionError("memory pool invariants broken: " + "; ".join(problems))

    def _hand_out(self, ptr: int, nbytes: int, device: int) -> None:
        live = self._live
        assert live is not None
        if (device, ptr) in live:
            self._violations.append(f"block 0x{ptr:x} ({nbytes} bytes, device {device}) handed out while in use")
        live[(device, ptr)] = nbytes

    def _take_back(self, ptr: int, nbytes: int, device: int, blocks: _DeviceBlocks) -> None:
        live = self._live
        assert live is not None
        if live.pop((device, ptr), None) is None and ptr in blocks.free.get(nbytes, ()):
            self._violations.append(f"block 0x{ptr:x} ({nbytes} bytes, device {device}) given back twice")

    def _make_room(self, nbytes: int, device: int, blocks: _DeviceBlocks) -> None:
        """Keep `device` within the limit: drop cached blocks first, then refuse like ``aclrtMalloc``
        does when HBM runs out. Read without the lock: threads allocating at the same moment may
        overshoot by their requests, which keeps the lock off the aclrtMalloc path."""
        limit = self._limit
        if limit and blocks.used + blocks.held + nbytes > limit:
            self.free_all_blocks(device)
        if limit and blocks.used + nbytes > limit:
            raise acl_error(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMalloc",
                            f"the memory pool's limit of {limit} bytes on device {device} would be exceeded: "
                            f"{blocks.used} bytes in use, {nbytes} more asked (MemoryPool.set_limit)")

    # ---- public API --------------------------------------------------------------------------------
    def used_bytes(self, device: int | None = None) -> int:
        """Bytes of blocks in use (handed out and not yet given back), on `device` or all devices."""
        with self._lock:
            self._file_returned()
            return sum(b.used for d, b in list(self._devices.items()) if device is None or d == device)

    def held_bytes(self, device: int | None = None) -> int:
        """Bytes of free blocks the pool keeps for reuse, on `device` or all devices."""
        with self._lock:
            self._file_returned()
            return sum(b.held for d, b in list(self._devices.items()) if device is None or d == device)

    def total_bytes(self, device: int | None = None) -> int:
        """:meth:`used_bytes` + :meth:`held_bytes`: what the pool has taken with ``aclrtMalloc``."""
        with self._lock:
            self._file_returned()
            return sum(b.used + b.held for d, b in list(self._devices.items()) if device is None or d == device)

    def free_all_blocks(self, device: int | None = None) -> int:
        """``aclrtFree`` every cached free block (of `device`, or of all devices); blocks in use are
        untouched. Returns how many blocks were freed."""
        with self._lock:
            self._file_returned()
            taken: list[int] = []
            for d, blocks in list(self._devices.items()):
                if device is None or d == device:
                    for ptrs in blocks.free.values():
                        taken.extend(ptrs)
                    blocks.free = {}
                    blocks.held = 0
        for ptr in taken:
            raw_free(ptr)
        return len(taken)

    def set_limit(self, size: int) -> None:
        """Limit the bytes the pool takes on each device (in use + cached) to `size`; 0 removes the
        limit. A request beyond it first frees cached blocks, then raises the
        :class:`~aclnn_py.AclError` ``ACL_ERROR_RT_MEMORY_ALLOCATION`` that ``aclrtMalloc`` raises when
        device memory runs out. Cached blocks above a lowered limit are freed now."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"set_limit: size must be an int >= 0 (bytes; 0 = no limit), got {size!r}")
        self._limit = size
        if size:
            for device in list(self._devices):
                if self.total_bytes(device) > size:
                    self.free_all_blocks(device)

    def get_limit(self) -> int:
        """The per-device limit set by :meth:`set_limit` (0: none)."""
        return self._limit

    def _close(self) -> None:
        """Interpreter exit: free what is cached, and free what comes back later instead of caching it."""
        self._closing = True
        self.free_all_blocks()

    def __repr__(self) -> str:
        return f"MemoryPool(used={self.used_bytes()} bytes, held={self.held_bytes()} bytes, limit={self._limit})"


def raw_malloc(nbytes: int) -> int:
    """``aclrtMalloc`` on the calling thread's device, bypassing the pool."""
    b = initialized()
    cell = b.ffi.new("void **")
    check_acl(b.lib.aclrtMalloc(cell, nbytes, b.lib.ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc")
    return int(b.ffi.cast("uintptr_t", cell[0]))


def raw_free(ptr: int) -> None:
    """``aclrtFree``, bypassing the pool."""
    b = initialized()
    check_acl(b.lib.aclrtFree(b.ffi.cast("void *", ptr)), "aclrtFree")


def _refill_poison(ptr: int, nbytes: int) -> None:
    """A reused block looks like a new one: on the mock with its poison fill on, it gets the poison
    byte again, so reading what an operator never wrote still shows up — whole, or with
    ``ACLNN_MOCK_POISON=stripe`` striped above 64 KiB (docs/testing_with_the_mock.md, "Memory checks
    and poison"). On CANN nothing is filled."""
    _memory_check("refill_poison")(ptr, nbytes)


def mark_written(ptr: int, nbytes: int) -> None:
    """Tell the mock that host code may have written ``[ptr, ptr + nbytes)`` of device memory behind its
    back (through a zero-copy view or a DLPack export): its refills restore the poison only where the
    mock saw writes. Nothing on CANN."""
    _memory_check("mark_written")(ptr, nbytes)


def _memory_check(name: str) -> Callable[[int, int], None]:
    """The mock's memory-check function `name` (it reads its own poison switches, which tests turn on
    and off), or one doing nothing on CANN. A process keeps its backend, so each is resolved once."""
    found = _memory_checks.get(name)
    if found is None:
        if initialized().is_mock:
            from .. import _mock  # only ever imported with the mock loaded

            found = getattr(_mock, name)
        else:
            found = _do_nothing
        _memory_checks[name] = found
    return found


def _do_nothing(ptr: int, nbytes: int) -> None:
    pass


_memory_checks: dict[str, Callable[[int, int], None]] = {}

_pools: weakref.WeakSet[MemoryPool] = weakref.WeakSet()  # every pool, for exit and device resets
_default_pool = MemoryPool()
#: The pool DeviceMemory allocates from, or None: plain aclrtMalloc / aclrtFree per object.
current: MemoryPool | None = _default_pool if env_values.flag("ACLNN_PY_POOL", True) else None


def get_memory_pool() -> MemoryPool:
    """The library's memory pool (also when :func:`set_allocator` turned pooling off)."""
    return _default_pool


def set_allocator(pool: MemoryPool | None) -> None:
    """Where new :class:`~aclnn_py.DeviceMemory` takes its block from: `pool` (normally
    :func:`get_memory_pool`), or ``None`` for a plain ``aclrtMalloc`` / ``aclrtFree`` per object (as
    with ``ACLNN_PY_POOL=0``). Memory allocated before the switch goes back where it came from."""
    global current
    if pool is not None and not isinstance(pool, MemoryPool):
        raise TypeError(f"set_allocator: pool must be a MemoryPool or None, got {type(pool).__name__}")
    current = pool


def free_device_blocks(device: int) -> None:
    """Free every pool's cached blocks of `device` (before the device is reset)."""
    for pool in list(_pools):
        pool.free_all_blocks(device)


def _close_at_exit() -> None:
    for pool in list(_pools):
        try:
            pool._close()
        except Exception:
            pass  # the backend may already be unusable at exit; the process's memory goes with it


atexit.register(_close_at_exit)
