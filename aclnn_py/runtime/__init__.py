"""The ACL runtime tier: initialisation, devices, streams, events, device memory (and its pool) and the
stream-ordered lifetimes of what queued work uses (one module per concept).

Ownership follows cuda.core: objects created here own their handle and release it in ``close()`` (or
when collected); ``Stream.from_handle`` borrows a handle someone else owns; any use of a closed object
raises :class:`~aclnn_py.ClosedError` naming it.
"""

from . import ordered
from ._device import Device
from ._init import init, initialized, soc_name, version
from ._memory import DeviceMemory, MemoryExport, copy_on_device, copy_to_device, copy_to_host, fill
from ._pool import MemoryPool, get_memory_pool, set_allocator
from ._resource import Resource
from ._stream import (
    Event,
    Stream,
    StreamArg,
    StreamLike,
    current_stream,
    explicit_or_current,
    order_after_writes,
    resolve_stream,
)
from ._thread import out_cell

__all__ = [
    "Device", "DeviceMemory", "Event", "MemoryExport", "MemoryPool", "Resource", "Stream", "StreamArg", "StreamLike", "copy_on_device", "copy_to_device", "copy_to_host",
    "current_stream", "explicit_or_current", "fill", "get_memory_pool", "order_after_writes", "init", "initialized", "ordered", "out_cell", "resolve_stream",
    "set_allocator", "soc_name",
    "version",
]
