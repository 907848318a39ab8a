"""Devices, streams, events and device memory over the ACL runtime (ABI.md §3.1).

Ownership follows cuda.core: objects created here own their handle and release it in ``close()``
(or when collected); ``Stream.from_handle`` borrows a handle someone else owns. Anything with an
``__acl_stream__()`` method returning ``(version, handle_int)`` is accepted where a stream is.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np

from . import _loader
from .errors import check_acl

_STREAM_PROTOCOL_VERSION = 0


class StreamLike(Protocol):
    def __acl_stream__(self) -> tuple[int, int]: ...


def init(backend: Any = None) -> _loader.Backend:
    """Load a backend (see :func:`aclnn_py._loader.load`) and call ``aclInit`` once per process.
    ``aclInit``'s ACL_ERROR_REPEAT_INITIALIZE is expected and ignored."""
    b = _loader.load(backend)
    _init_once(b)
    return b


_init_lock = threading.Lock()
_initialized = False


def _init_once(b: _loader.Backend) -> None:
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        ret = b.lib.aclInit(b.ffi.NULL)
        if ret not in (0, 100002):
            check_acl(ret, "aclInit")
        ret = b.lib.aclnnInit(b.ffi.NULL)
        if ret not in (0, 100002):
            from .errors import check_aclnn

            check_aclnn(ret, "aclnnInit")
        _initialized = True


def _b() -> _loader.Backend:
    b = _loader.backend()
    if not _initialized:
        _init_once(b)
    return b


_tls = threading.local()


def _int_cell(ctype: str = "int32_t *") -> Any:
    """A per-thread reusable out-parameter cell (no ffi.new per call)."""
    cells = getattr(_tls, "cells", None)
    if cells is None:
        cells = _tls.cells = {}
    cell = cells.get(ctype)
    if cell is None:
        cell = cells[ctype] = _b().ffi.new(ctype)
    return cell


class Device:
    """An NPU (on the mock: one of ``ACLNN_MOCK_DEVICE_COUNT`` simulated devices)."""

    __slots__ = ("id",)

    def __init__(self, device_id: int = 0):
        self.id = int(device_id)

    def set_current(self) -> Device:
        """``aclrtSetDevice``: make this the calling thread's device (reference counted)."""
        check_acl(_b().lib.aclrtSetDevice(self.id), "aclrtSetDevice")
        return self

    def reset(self) -> None:
        """``aclrtResetDevice``: drop one reference taken by set_current."""
        check_acl(_b().lib.aclrtResetDevice(self.id), "aclrtResetDevice")

    def create_stream(self) -> Stream:
        """A new stream on this device (made current first)."""
        self.set_current()
        return Stream()

    def synchronize(self) -> None:
        """Wait for this device's default stream."""
        self.set_current()
        Stream.default().synchronize()

    @staticmethod
    def count() -> int:
        """``aclrtGetDeviceCount``."""
        cell = _int_cell("uint32_t *")
        check_acl(_b().lib.aclrtGetDeviceCount(cell), "aclrtGetDeviceCount")
        return int(cell[0])

    @staticmethod
    def current() -> Device:
        """``aclrtGetDevice``: the calling thread's device."""
        cell = _int_cell()
        check_acl(_b().lib.aclrtGetDevice(cell), "aclrtGetDevice")
        return Device(int(cell[0]))

    def mem_info(self) -> tuple[int, int]:
        """(free, total) HBM bytes — ``aclrtGetMemInfo(ACL_HBM_MEM)``."""
        b = _b()
        self.set_current()
        free, total = b.ffi.new("size_t *"), b.ffi.new("size_t *")
        check_acl(b.lib.aclrtGetMemInfo(b.lib.ACL_HBM_MEM, free, total), "aclrtGetMemInfo")
        return int(free[0]), int(total[0])

    def __repr__(self) -> str:
        return f"Device({self.id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Device", self.id))


def soc_name() -> str:
    """``aclrtGetSocName``."""
    b = _b()
    p = b.lib.aclrtGetSocName()
    return "" if p == b.ffi.NULL else b.ffi.string(p).decode()


def version() -> tuple[int, int, int]:
    """``aclrtGetVersion``."""
    b = _b()
    cells = b.ffi.new("int32_t[3]")
    check_acl(b.lib.aclrtGetVersion(cells, cells + 1, cells + 2), "aclrtGetVersion")
    return int(cells[0]), int(cells[1]), int(cells[2])


class Stream:
    """An ACL stream. ``Stream()`` creates one on the current device; ``Stream.default()`` is the
    current device's default stream (the NULL handle); ``Stream.from_handle(h)`` borrows."""

    __slots__ = ("handle", "_owned", "_addr", "__weakref__")

    def __init__(self, _handle: Any = None, _owned: bool = True):
        b = _b()
        if _handle is None:
            cell = b.ffi.new("aclrtStream *")
            check_acl(b.lib.aclrtCreateStream(cell), "aclrtCreateStream")
            _handle = cell[0]
        self.handle = _handle
        self._owned = _owned
        self._addr = int(b.ffi.cast("uintptr_t", _handle))

    @classmethod
    def default(cls) -> Stream:
        """The current device's default stream (NULL handle, never destroyed)."""
        return cls(_b().ffi.NULL, _owned=False)

    @classmethod
    def from_handle(cls, handle: int) -> Stream:
        """Borrow a stream created elsewhere (e.g. by a C++ server); never destroyed by us."""
        return cls(_b().ffi.cast("aclrtStream", int(handle)), _owned=False)

    @property
    def address(self) -> int:
        return self._addr

    def __acl_stream__(self) -> tuple[int, int]:
        return (_STREAM_PROTOCOL_VERSION, self.address)

    def synchronize(self, timeout_ms: int | None = None) -> None:
        """``aclrtSynchronizeStream[WithTimeout]``: wait for queued work; raises the first failure
        that happened on the stream (e.g. a kernel timeout naming the missing peer ranks)."""
        lib = _b().lib
        if timeout_ms is None:
            check_acl(lib.aclrtSynchronizeStream(self.handle), "aclrtSynchronizeStream")
        else:
            check_acl(lib.aclrtSynchronizeStreamWithTimeout(self.handle, int(timeout_ms)),
                      "aclrtSynchronizeStreamWithTimeout")

    def wait_event(self, event: Event) -> None:
        """``aclrtStreamWaitEvent``: later work on this stream waits for the event."""
        check_acl(_b().lib.aclrtStreamWaitEvent(self.handle, event.handle), "aclrtStreamWaitEvent")

    def record_event(self, event: Event | None = None) -> Event:
        """Record an event (a new one when None) on this stream."""
        ev = event if event is not None else Event()
        ev.record(self)
        return ev

    def close(self) -> None:
        """``aclrtDestroyStream`` for an owned stream (queued work finishes first)."""
        if self._owned and self.handle is not None:
            h, self.handle = self.handle, None
            check_acl(_b().lib.aclrtDestroyStream(h), "aclrtDestroyStream")

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_owned", False) and getattr(self, "handle", None) is not None:
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "borrowed"
        return f"Stream(0x{self.address:x}, {kind})" if self.handle is not None else "Stream(closed)"


def stream_key(stream: Any) -> int:
    """The handle of `stream` (as :func:`as_stream` takes it) as an int, 0 for the default stream."""
    if isinstance(stream, Stream):
        return stream._addr if stream.handle is not None else 0
    if stream is None:
        return 0
    return int(_b().ffi.cast("uintptr_t", as_stream(stream)))


def as_stream(stream: Any) -> Any:
    """The aclrtStream cdata for None (default stream), a Stream, an int handle or any object with
    ``__acl_stream__``."""
    b = _b()
    if stream is None:
        return b.ffi.NULL
    if isinstance(stream, Stream):
        return stream.handle if stream.handle is not None else b.ffi.NULL
    if isinstance(stream, int):
        return b.ffi.cast("aclrtStream", stream)
    proto = getattr(stream, "__acl_stream__", None)
    if proto is not None:
        _version, handle = proto()
        return b.ffi.cast("aclrtStream", int(handle))
    raise TypeError(f"expected a Stream, an int handle or an object with __acl_stream__, got {type(stream)!r}")


class Event:
    """An ACL event (``aclrtCreateEvent``), usable for ordering and timing."""

    __slots__ = ("handle",)

    def __init__(self) -> None:
        b = _b()
        cell = b.ffi.new("aclrtEvent *")
        check_acl(b.lib.aclrtCreateEvent(cell), "aclrtCreateEvent")
        self.handle = cell[0]

    def record(self, stream: Any = None) -> None:
        check_acl(_b().lib.aclrtRecordEvent(self.handle, as_stream(stream)), "aclrtRecordEvent")

    def synchronize(self) -> None:
        check_acl(_b().lib.aclrtSynchronizeEvent(self.handle), "aclrtSynchronizeEvent")

    def query(self) -> bool:
        """True when the latest record has completed."""
        b = _b()
        cell = b.ffi.new("aclrtEventRecordedStatus *")
        check_acl(b.lib.aclrtQueryEventStatus(self.handle, cell), "aclrtQueryEventStatus")
        return int(cell[0]) == int(b.lib.ACL_EVENT_RECORDED_STATUS_COMPLETE)

    def elapsed_ms(self, end: Event) -> float:
        """``aclrtEventElapsedTime(ms, self, end)``."""
        b = _b()
        cell = b.ffi.new("float *")
        check_acl(b.lib.aclrtEventElapsedTime(cell, self.handle, end.handle), "aclrtEventElapsedTime")
        return float(cell[0])

    def close(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            check_acl(_b().lib.aclrtDestroyEvent(h), "aclrtDestroyEvent")

    def __del__(self) -> None:
        if getattr(self, "handle", None) is not None:
            try:
                self.close()
            except Exception:
                pass


class DeviceMemory:
    """A device allocation (``aclrtMalloc``), freed by ``close()`` or when collected."""

    __slots__ = ("ptr", "size", "device", "__weakref__")

    def __init__(self, size: int, device: int | None = None):
        b = _b()
        if device is not None:
            Device(device).set_current()
        self.device = device
        cell = b.ffi.new("void **")
        check_acl(b.lib.aclrtMalloc(cell, int(size), b.lib.ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc")
        self.ptr = int(b.ffi.cast("uintptr_t", cell[0]))
        self.size = int(size)

    def close(self) -> None:
        """``aclrtFree``. Make sure no queued work still uses the memory."""
        if self.ptr:
            p, self.ptr = self.ptr, 0
            b = _b()
            check_acl(b.lib.aclrtFree(b.ffi.cast("void *", p)), "aclrtFree")

    def __enter__(self) -> DeviceMemory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "ptr", 0):
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"DeviceMemory(0x{self.ptr:x}, {self.size} bytes)"


def memcpy_h2d(dst: int, dst_max: int, src: np.ndarray, stream: Any = None) -> None:
    """Copy a C-contiguous host array to device address `dst` (async on `stream` when given; the
    array must then stay alive until the stream is synchronised)."""
    b = _b()
    n = src.nbytes
    srcp = b.ffi.cast("void *", src.ctypes.data)
    if stream is None:
        check_acl(b.lib.aclrtMemcpy(b.ffi.cast("void *", dst), dst_max, srcp, n,
                                    b.lib.ACL_MEMCPY_HOST_TO_DEVICE), "aclrtMemcpy")
    else:
        check_acl(b.lib.aclrtMemcpyAsync(b.ffi.cast("void *", dst), dst_max, srcp, n,
                                         b.lib.ACL_MEMCPY_HOST_TO_DEVICE, as_stream(stream)), "aclrtMemcpyAsync")


def memcpy_d2h(dst: np.ndarray, src: int, count: int) -> None:
    """Copy `count` bytes from device address `src` into a C-contiguous host array."""
    b = _b()
    check_acl(b.lib.aclrtMemcpy(b.ffi.cast("void *", dst.ctypes.data), dst.nbytes, b.ffi.cast("void *", src),
                                count, b.lib.ACL_MEMCPY_DEVICE_TO_HOST), "aclrtMemcpy")


def memset(dst: int, dst_max: int, value: int, count: int, stream: Any = None) -> None:
    """``aclrtMemset`` / ``aclrtMemsetAsync``."""
    b = _b()
    if stream is None:
        check_acl(b.lib.aclrtMemset(b.ffi.cast("void *", dst), dst_max, value, count), "aclrtMemset")
    else:
        check_acl(b.lib.aclrtMemsetAsync(b.ffi.cast("void *", dst), dst_max, value, count, as_stream(stream)),
                  "aclrtMemsetAsync")
