"""Device memory (``aclrtMalloc`` / ``aclrtFree``) and host ↔ device copies.

A :class:`DeviceMemory` is freed by ``close()`` or when collected — but never while an *export* of it
is alive: a numpy view, a DLPack capsule or consumer, a Tensor borrowing it. Those hold a
:class:`MemoryExport`, and the block is freed when the last of them goes (as CuPy and DLPack producers
do), so closing an owner can never leave a view pointing at freed or reused memory. The block comes
from the memory pool (:mod:`aclnn_py.runtime._pool`) and goes back to it instead of ``aclrtFree``.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext

import numpy as np

from .. import _core
from ..errors import check_acl
from . import _pool
from ._init import initialized
from ._queue import QueueingStream
from ._resource import Resource
from ._thread import current_device_id, on_device

_exports_lock = threading.Lock()


class DeviceMemory(Resource):
    """A device allocation of `size` bytes on `device` (default: the calling thread's device)."""

    __slots__ = ("_ptr", "size", "device", "_open", "_exports", "_source", "_block", "__weakref__")

    def __init__(self, size: int, device: int | None = None):
        size = int(size)
        #: The id of the device the memory was allocated on.
        self.device = int(device) if device is not None else current_device_id()
        pool = _pool.current if size > 0 else None  # aclrtMalloc itself refuses a size <= 0
        #: The pool the block came from (None: a plain aclrtMalloc), and the block's size class.
        self._source: _pool.MemoryPool | None = pool
        self._block = size if pool is None else _pool.block_size(size)
        # aclrtMalloc allocates on the calling thread's device
        with nullcontext() if device is None else on_device(self.device):
            self._ptr = _pool.raw_malloc(size) if pool is None else pool.malloc(self._block, self.device)
        #: Bytes asked for (on CANN the block may be larger: its size class).
        self.size = size
        self._exports = 0
        self._open = True

    @property
    def ptr(self) -> int:
        """The device address."""
        if not self._open:
            raise self._closed("use its address")
        return self._ptr

    def export(self) -> MemoryExport:
        """A claim that keeps the memory allocated until it is released or collected, even after
        :meth:`close`."""
        with _exports_lock:  # not between a close's decision and its free
            if not self._open:
                raise self._closed("export it")
            self._exports += 1
        return MemoryExport(self)

    @property
    def exports(self) -> int:
        """How many exports keep this memory allocated."""
        return self._exports

    def close(self) -> None:
        """Release the memory now, or, while exports claim it, when the last of them goes. Idempotent;
        any later use raises :class:`~aclnn_py.ClosedError`."""
        # closing and the release of the last export decide under one lock which of them frees: a
        # close that cleared `_open` outside it could free a block the export's release freed too
        with _exports_lock:
            if not self._open:
                return
            self._open = False
            free_now = not self._exports
        if free_now:
            self._free()

    def _release(self) -> None:  # close() decides and frees itself
        self._free()

    def _free(self) -> None:
        # runs once: from close() without exports, or from the release of the last export after it;
        # stream-ordered holds kept this object alive until no queued work used the block
        pool = self._source
        if pool is None:
            if self._ptr:
                _pool.raw_free(self._ptr)
        elif self._ptr:
            pool.free(self._ptr, self._block, self.device)
        else:  # freed behind the wrapper's back
            pool.forget(self._block, self.device)

    def _label(self) -> str:
        return f"DeviceMemory(0x{self._ptr:x}, {self.size} bytes)"


class MemoryExport:
    """Keeps a :class:`DeviceMemory` allocated while it lives (made by :meth:`DeviceMemory.export`,
    which counts it)."""

    __slots__ = ("memory",)

    def __init__(self, memory: DeviceMemory):
        self.memory: DeviceMemory | None = memory

    def release(self) -> None:
        mem, self.memory = self.memory, None
        if mem is None:
            return
        if mem._ptr:  # the holder of the export could write any of it
            _pool.mark_written(mem._ptr, mem._block)
        with _exports_lock:
            mem._exports -= 1
            last = mem._exports == 0 and not mem._open
        if last:
            mem._free()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


def copy_to_device(dst: int, dst_max: int, src: np.ndarray, stream: QueueingStream | None = None) -> None:
    """Copy a C-contiguous host array to device address `dst`: synchronous without `stream`;
    queued on `stream` otherwise (the caller keeps `src` alive until the stream passes the copy)."""
    _core.copy_host_to_device(dst, dst_max, src, stream)


def copy_on_device(dst: int, dst_max: int, src: int, count: int, stream: QueueingStream | None = None) -> None:
    """Copy `count` bytes between device addresses: synchronous without `stream`, else queued on it
    (the caller keeps both blocks allocated until the stream passes the copy)."""
    b = initialized()
    d, s = b.ffi.cast("void *", dst), b.ffi.cast("void *", src)
    kind = b.lib.ACL_MEMCPY_DEVICE_TO_DEVICE
    if stream is None:
        check_acl(b.lib.aclrtMemcpy(d, dst_max, s, count, kind), "aclrtMemcpy")
    else:
        check_acl(b.lib.aclrtMemcpyAsync(d, dst_max, s, count, kind, stream._cdata), "aclrtMemcpyAsync")


def copy_to_host(dst: np.ndarray, src: int, count: int) -> None:
    """Copy `count` bytes from device address `src` into a C-contiguous host array (synchronous,
    ``aclrtMemcpy``)."""
    _core.download(dst, src, count)


def fill(dst: int, dst_max: int, value: int, count: int, stream: QueueingStream | None = None) -> None:
    """``aclrtMemset`` (synchronous) or ``aclrtMemsetAsync`` on `stream`."""
    b = initialized()
    if stream is None:
        check_acl(b.lib.aclrtMemset(b.ffi.cast("void *", dst), dst_max, value, count), "aclrtMemset")
    else:
        check_acl(b.lib.aclrtMemsetAsync(b.ffi.cast("void *", dst), dst_max, value, count, stream._cdata),
                  "aclrtMemsetAsync")
