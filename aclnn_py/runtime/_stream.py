"""Streams and events: creation and borrowing, the per-thread current stream, interruptible
synchronisation, events ordering streams. One module, as in CuPy's ``cupy.cuda.stream``: a stream
records events and an event records on a stream.

``Device.create_stream()`` makes an owned stream (destroyed by ``close()``), ``Stream.from_handle()``
borrows one someone else owns (a C++ server's), ``Stream.default()`` names a device's default stream.
As in CuPy, ``with stream:`` makes `stream` the calling thread's *current* stream: calls that take a
``stream=`` argument and get none use it (without one, operators run on the default stream and
copies are synchronous). Anything with ``__acl_stream__()`` returning ``(version, handle)`` is
accepted wherever a stream is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .. import _core
from .._core import StreamBase
from ..errors import acl_error, check_acl, recent_message
from . import ordered
from ._init import initialized
from ._resource import Resource
from ._thread import current_device_id, out_cell

STREAM_PROTOCOL_VERSION = 0
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046


@runtime_checkable
class StreamLike(Protocol):
    """Any object naming an ACL stream: ``__acl_stream__()`` returns ``(version, handle)``."""

    def __acl_stream__(self) -> tuple[int, int]: ...


class Stream(Resource, StreamBase):
    """An ACL stream (``aclrtStream``). Made by :meth:`Device.create_stream`, :meth:`from_handle` or
    :meth:`default`, not by calling the class."""

    # _open, _handle, _device and _key (names the stream in this process; the NULL handle is per device)
    # are typed fields of StreamBase (csrc/_core.pxd), which the compiled core reads
    __slots__ = ("_cdata", "_owned", "_order_event")
    _cdata: Any          # the aclrtStream
    _owned: bool
    _device: int | None
    _order_event: Event | None  # recorded here when another stream must wait for this one's writes

    def __init__(self) -> None:
        raise TypeError("Stream() cannot be called: use Device.create_stream(), Stream.from_handle(handle) "
                        "or Stream.default(device)")

    @classmethod
    def _wrap(cls, cdata: Any, handle: int, owned: bool, device: int | None) -> Stream:
        s: Stream = StreamBase.__new__(cls)
        s._cdata = cdata
        s._handle = handle
        s._owned = owned
        s._device = device
        # the NULL handle is each device's own default stream, so the device is part of its key
        s._key = handle if handle else -1 - (device if device is not None else current_device_id())
        s._order_event = None
        s._open = True
        return s

    @classmethod
    def _create(cls, device: int) -> Stream:
        b = initialized()
        cell = b.ffi.new("aclrtStream *")
        check_acl(b.lib.aclrtCreateStream(cell), "aclrtCreateStream")
        return cls._wrap(cell[0], int(b.ffi.cast("uintptr_t", cell[0])), True, device)

    @classmethod
    def default(cls, device: int | None = None) -> Stream:
        """The default stream of `device` (default: the calling thread's current device)."""
        dev = current_device_id() if device is None else int(device)
        s = _defaults.get(dev)
        if s is None:
            s = _defaults.setdefault(dev, cls._wrap(initialized().ffi.NULL, 0, False, dev))
        return s

    @classmethod
    def from_handle(cls, handle: int | StreamLike) -> Stream:
        """Borrow a stream created elsewhere (an ``aclrtStream`` as an int, or a stream-like object);
        ``close()`` does not destroy it."""
        h = _protocol_handle(handle) if isinstance(handle, StreamLike) else _handle_value(handle, "handle")
        if h == 0:
            return cls.default()
        return cls._wrap(initialized().ffi.cast("aclrtStream", h), h, False, None)

    # ---- identity -------------------------------------------------------------------------------------
    @property
    def handle(self) -> int:
        """The ``aclrtStream`` as an integer (0 for a default stream)."""
        if not self._open:
            raise self._closed("use its handle")
        return self._handle

    @property
    def owned(self) -> bool:
        """Whether ``close()`` destroys the stream (streams from :meth:`Device.create_stream`)."""
        return self._owned

    @property
    def device(self) -> int | None:
        """The device the stream belongs to (None for a borrowed handle)."""
        return self._device

    def __acl_stream__(self) -> tuple[int, int]:
        return (STREAM_PROTOCOL_VERSION, self.handle)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._key == self._key

    def __hash__(self) -> int:
        return hash(("Stream", self._key))

    def _label(self) -> str:
        kind = "owned" if self._owned else "borrowed"
        where = "default" if not self._handle else f"0x{self._handle:x}"
        dev = f", device {self._device}" if self._device is not None else ""
        return f"Stream({where}, {kind}{dev})"

    # ---- work ---------------------------------------------------------------------------------------------
    def synchronize(self, timeout_ms: int | None = None) -> None:
        """Wait for the work queued on this stream and raise the first failure on it (e.g. a kernel
        timeout naming the peers that never arrived). `timeout_ms` bounds the wait
        (:class:`~aclnn_py.AclTimeoutError` when it runs out). The wait is interruptible: Ctrl-C
        raises KeyboardInterrupt within about 100 ms, leaving the queued work in place. Threads coming
        back from their waits take the GIL one at a time, in the order they came."""
        if not self._open:
            raise self._closed("synchronize it")
        _core.synchronize(self, timeout_ms, _synchronize_failed)

    def wait_event(self, event: Event) -> None:
        """``aclrtStreamWaitEvent``: later work on this stream waits for `event`."""
        if not self._open:
            raise self._closed("make it wait for an event")
        if event.closed:
            raise event._closed("wait for it")
        check_acl(initialized().lib.aclrtStreamWaitEvent(self._cdata, event._cdata), "aclrtStreamWaitEvent")

    def record_event(self, event: Event | None = None) -> Event:
        """Record `event` (a new :class:`~aclnn_py.Event` when None) on this stream and return it."""
        if not self._open:
            raise self._closed("record an event")
        ev = event if event is not None else Event()
        ev.record(self)
        return ev

    def _release(self) -> None:
        if self._order_event is not None:
            self._order_event.close()
        # aclrtDestroyStream lets queued work finish first; then nothing held for it is in use
        if self._owned:
            check_acl(initialized().lib.aclrtDestroyStream(self._cdata), "aclrtDestroyStream")
            ordered.forget(self._key)

    # ---- current stream ----------------------------------------------------------------------------------
    def __enter__(self) -> Stream:
        """Make this the calling thread's current stream until the ``with`` block ends."""
        if not self._open:
            raise self._closed("make it current")
        _current_stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        stack = _current_stack()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                del stack[i]
                break


_defaults: dict[int, Stream] = {}
_tls = threading.local()


#: What ``stream=`` parameters accept: a Stream, a stream-like object, an ``aclrtStream`` as an int, or
#: None for the current stream.
StreamArg = Stream | StreamLike | int | None


def _current_stack() -> list[Stream]:
    stack: list[Stream] | None = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    return stack


def current_stream() -> Stream:
    """The calling thread's current stream: the innermost ``with stream:`` block's, else the current
    device's default stream."""
    stack: list[Stream] | None = getattr(_tls, "stack", None)
    return stack[-1] if stack else Stream.default()


def explicit_or_current(stream: StreamArg) -> Stream | None:
    """`stream` resolved, else the thread's current stream if a ``with`` block set one, else None
    (copies are then synchronous)."""
    if stream is None:
        stack: list[Stream] | None = getattr(_tls, "stack", None)
        return stack[-1] if stack else None
    return resolve_stream(stream)


def _protocol_handle(obj: StreamLike) -> int:
    version, handle = obj.__acl_stream__()
    if version != STREAM_PROTOCOL_VERSION:
        raise TypeError(f"__acl_stream__ version {version} is not supported (expected {STREAM_PROTOCOL_VERSION})")
    return _handle_value(handle, "__acl_stream__() handle")


def _handle_value(handle: object, param: str) -> int:
    """An ``aclrtStream`` given as an int: an address, so in [0, 2**64) — a larger one would be cut to
    its low bits by the cast to a pointer (2**64 is the NULL default stream)."""
    h = int(handle)  # type: ignore[call-overload]
    if not 0 <= h < 2**64:
        raise ValueError(f"{param}: an aclrtStream handle is an address in [0, 2**64) (got {h})")
    return h


def resolve_stream(stream: StreamArg, param: str = "stream") -> Stream:
    """The Stream a ``stream=`` argument names: a Stream, an int handle, a stream-like object, or
    None for the current stream. A closed Stream is refused."""
    if stream.__class__ is Stream:
        s: Stream = stream
        if not s._open:
            raise s._closed("queue work on it")
        return s
    if stream is None:
        return current_stream()
    if isinstance(stream, bool):
        raise TypeError(f"{param}: expected a Stream, an int handle or an object with __acl_stream__, got bool")
    if isinstance(stream, int):
        return Stream.from_handle(_handle_value(stream, param))
    if isinstance(stream, StreamLike):
        return Stream.from_handle(_protocol_handle(stream))
    raise TypeError(f"{param}: expected a Stream, an int handle or an object with __acl_stream__, "
                    f"got {type(stream).__name__}")


def order_after_writes(stream: Stream, tensors: Iterable[object]) -> None:
    """Make the work queued on `stream` from now on wait for the queued writes of `tensors` made on
    other streams (``aclrtRecordEvent`` on the writer, ``aclrtStreamWaitEvent`` on `stream`), so that
    a launch reads what work queued before it wrote, whichever stream that was, with no event in the
    caller's code. Entries without a writer (None, host arrays, Tensors written synchronously or on
    `stream` itself) cost an attribute read. A Tensor read on another stream than its writer's is
    marked shared: a MoeDistributeBuffer does not hand out its memory again."""
    for t in tensors:
        w: Stream | None = getattr(t, "_writer", None)
        if w is None or w._key == stream._key:
            continue
        t._shared = True  # type: ignore[attr-defined]
        if not w._open:
            continue
        ev = w._order_event
        if ev is None:
            ev = w._order_event = Event()
        ev.record(w)
        stream.wait_event(ev)


def _synchronize_failed(status: int, timed_out: bool, timeout_ms: int | None) -> Exception | None:
    """What a slice of a synchronisation that returned `status` (not 0) raises: the failure of the work
    on the stream, or once `timed_out` the timeout; None: wait another slice (``_core.synchronize``)."""
    message = recent_message()  # read (and clear) the slice's message
    if status != ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:
        return acl_error(status, "aclrtSynchronizeStream", message)
    if timed_out:
        return acl_error(status, "aclrtSynchronizeStreamWithTimeout",
                         f"the stream did not finish within {timeout_ms} ms")
    return None


class Event(Resource):
    """An ACL event on the calling thread's current device."""

    __slots__ = ("_open", "_cdata", "__weakref__")

    def __init__(self) -> None:
        b = initialized()
        cell = b.ffi.new("aclrtEvent *")
        check_acl(b.lib.aclrtCreateEvent(cell), "aclrtCreateEvent")
        self._cdata = cell[0]
        self._open = True

    @property
    def handle(self) -> int:
        """The ``aclrtEvent`` as an integer."""
        if not self._open:
            raise self._closed("use its handle")
        return int(initialized().ffi.cast("uintptr_t", self._cdata))

    def record(self, stream: Stream | None = None) -> None:
        """``aclrtRecordEvent`` on `stream` (default: the calling thread's current stream)."""
        if not self._open:
            raise self._closed("record it")
        s = resolve_stream(stream)
        check_acl(initialized().lib.aclrtRecordEvent(self._cdata, s._cdata), "aclrtRecordEvent")

    def query(self) -> bool:
        """True when the latest record has completed (``aclrtQueryEventStatus``)."""
        if not self._open:
            raise self._closed("query it")
        b = initialized()
        cell = out_cell("aclrtEventRecordedStatus *")
        check_acl(b.lib.aclrtQueryEventStatus(self._cdata, cell), "aclrtQueryEventStatus")
        return int(cell[0]) == int(b.lib.ACL_EVENT_RECORDED_STATUS_COMPLETE)

    def synchronize(self) -> None:
        """Wait until the latest record completed. The wait polls, so Ctrl-C (KeyboardInterrupt)
        interrupts it within a few milliseconds; ``aclrtSynchronizeEvent`` then reports the result."""
        if not self._open:
            raise self._closed("synchronize it")
        pause = 1e-5
        while not self.query():
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        check_acl(initialized().lib.aclrtSynchronizeEvent(self._cdata), "aclrtSynchronizeEvent")

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to `end` (``aclrtEventElapsedTime``)."""
        if not self._open or not end._open:
            raise (self if not self._open else end)._closed("time it")
        b = initialized()
        cell = b.ffi.new("float *")
        check_acl(b.lib.aclrtEventElapsedTime(cell, self._cdata, end._cdata), "aclrtEventElapsedTime")
        return float(cell[0])

    def _release(self) -> None:
        check_acl(initialized().lib.aclrtDestroyEvent(self._cdata), "aclrtDestroyEvent")

    def _label(self) -> str:
        return f"Event(0x{int(initialized().ffi.cast('uintptr_t', self._cdata)):x})"
