"""Events (``aclrtCreateEvent``): ordering between streams and timing."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import check_acl
from ._device import out_cell
from ._init import initialized
from ._resource import Resource

if TYPE_CHECKING:
    from ._stream import Stream


class Event(Resource):
    """An ACL event on the calling thread's current device."""

    __slots__ = ("_cdata", "__weakref__")

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
        from ._stream import resolve_stream

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
