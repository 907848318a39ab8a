"""Devices (on the mock: ``ACLNN_MOCK_DEVICE_COUNT`` simulated NPUs)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..errors import check_acl
from ._init import initialized

if TYPE_CHECKING:
    from ._stream import Stream

_tls = threading.local()


def out_cell(ctype: str) -> Any:
    """A per-thread reusable out-parameter cell, so queries allocate nothing per call."""
    cells: dict[str, Any] | None = getattr(_tls, "cells", None)
    if cells is None:
        cells = _tls.cells = {}
    cell = cells.get(ctype)
    if cell is None:
        cell = cells[ctype] = initialized().ffi.new(ctype)
    return cell


def current_device_id() -> int:
    """``aclrtGetDevice``: the calling thread's device."""
    cell = out_cell("int32_t *")
    check_acl(initialized().lib.aclrtGetDevice(cell), "aclrtGetDevice")
    return int(cell[0])


class Device:
    """An NPU. ``Device(i)`` names device i; :meth:`set_current` makes it the calling thread's."""

    __slots__ = ("id",)

    def __init__(self, device_id: int = 0):
        self.id = int(device_id)

    def set_current(self) -> Device:
        """``aclrtSetDevice``: make this the calling thread's device (reference counted)."""
        check_acl(initialized().lib.aclrtSetDevice(self.id), "aclrtSetDevice")
        return self

    def reset(self) -> None:
        """``aclrtResetDevice``: drop one reference taken by :meth:`set_current`."""
        check_acl(initialized().lib.aclrtResetDevice(self.id), "aclrtResetDevice")

    def create_stream(self) -> Stream:
        """A new stream on this device (which becomes the calling thread's current device)."""
        from ._stream import Stream

        self.set_current()
        return Stream._create(self.id)

    def default_stream(self) -> Stream:
        """This device's default stream."""
        from ._stream import Stream

        return Stream.default(self.id)

    def synchronize(self) -> None:
        """Wait for this device's default stream."""
        self.set_current()
        self.default_stream().synchronize()

    @staticmethod
    def count() -> int:
        """``aclrtGetDeviceCount``."""
        cell = out_cell("uint32_t *")
        check_acl(initialized().lib.aclrtGetDeviceCount(cell), "aclrtGetDeviceCount")
        return int(cell[0])

    @staticmethod
    def current() -> Device:
        """The calling thread's device (``aclrtGetDevice``)."""
        return Device(current_device_id())

    def mem_info(self) -> tuple[int, int]:
        """(free, total) HBM bytes — ``aclrtGetMemInfo(ACL_HBM_MEM)``."""
        b = initialized()
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
