"""Devices (on the mock: ``ACLNN_MOCK_DEVICE_COUNT`` simulated NPUs)."""

from __future__ import annotations

from ..errors import check_acl
from ._init import initialized
from ._pool import free_device_blocks
from ._stream import Stream
from ._thread import current_device_id, out_cell


class Device:
    """An NPU. ``Device(i)`` names device i; :meth:`set_current` makes it the calling thread's."""

    __slots__ = ("id",)

    def __init__(self, device_id: int = 0):
        #: The device id, as ``aclrtSetDevice`` takes it.
        self.id = int(device_id)

    def set_current(self) -> Device:
        """``aclrtSetDevice``: make this the calling thread's device (reference counted)."""
        check_acl(initialized().lib.aclrtSetDevice(self.id), "aclrtSetDevice")
        return self

    def reset(self) -> None:
        """``aclrtResetDevice``: drop one reference taken by :meth:`set_current`. The memory pools'
        cached free blocks of this device are freed first: the last reset releases the device's
        memory, and a pool must not hand out blocks of a released device."""
        free_device_blocks(self.id)
        check_acl(initialized().lib.aclrtResetDevice(self.id), "aclrtResetDevice")

    def create_stream(self) -> Stream:
        """A new stream on this device (which becomes the calling thread's current device)."""
        self.set_current()
        return Stream._create(self.id)

    def default_stream(self) -> Stream:
        """This device's default stream."""
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
