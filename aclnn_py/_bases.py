"""The compiled bases of the hot objects (csrc/_core.pxd): their typed fields are what the compiled
core reads on every call. Without the compiled parts (a checkout that found no build) the package
still imports, with plain bases holding the same fields, and explains what is missing when used."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._core import BufferBase, ConfigBase, PackedBase, StreamBase, StreamStateBase, TensorBase
else:
    try:
        from ._core import BufferBase, ConfigBase, PackedBase, StreamBase, StreamStateBase, TensorBase
    except ImportError:  # the loader reports the missing compiled parts when the package is used

        class TensorBase:
            __slots__ = ("shape", "dtype", "_mem", "_owner", "_writer", "_ptr", "_offset_nbytes", "_open",
                         "_contiguous", "_shared", "_desc_addr", "device", "_span")

        class StreamBase:
            __slots__ = ("_open", "_key", "_handle", "_device")

        class StreamStateBase:
            __slots__ = ("current", "workspace")

        class ConfigBase:
            pass

        class BufferBase:
            _route_states = None

            def _forget_calls(self) -> None:
                pass

            kept_outputs = (0, 0)

        class PackedBase:
            __slots__ = ("layout", "ints_address", "strings_address")

__all__ = ["BufferBase", "ConfigBase", "PackedBase", "StreamBase", "StreamStateBase", "TensorBase"]
