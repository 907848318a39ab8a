"""DLPack exchange at the level of raw memory (the producer and consumer sides of
:class:`~aclnn_py.Tensor`'s ``__dlpack__`` / ``from_dlpack``).

Export (``Tensor.__dlpack__`` / ``__dlpack_device__``): on the mock, device memory is host memory,
so a Tensor is exported zero-copy as a ``kDLCPU`` tensor — legacy ``"dltensor"`` capsules, or
DLPack 1.x ``"dltensor_versioned"`` ones when the consumer passes ``max_version >= (1, 0)``. Every
aclDataType with a DLPack code travels with its own type: bf16 as ``kDLBfloat``, fp8 e4m3fn / e5m2 /
e8m0 and packed fp4 e2m1 with the DLPack 1.1 codes (numpy itself cannot hold some of these; torch,
jax and ml_dtypes-aware consumers can). Real NPU memory raises BufferError: DLPack has no device
type for Ascend NPUs yet.

Import (``Tensor.from_dlpack``): when the producer's memory is device memory of the loaded mock (a
Tensor's export, or memory from aclrtMalloc by C code in this process), the Tensor borrows it
zero-copy and keeps the producer's capsule alive; any other CPU memory is copied into new device
memory (on real CANN: always, with ``aclrtMemcpy``).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ._core import HostView, ImportedMemory, dlpack_export, dlpack_import, live_exports
from .dtypes import DataType, to_numpy
from .runtime import initialized

if TYPE_CHECKING:
    from typing_extensions import CapsuleType

KDL_CPU = 1
DLPACK_VERSION = (1, 1)

# (DLDataTypeCode, bits) <-> aclDataType
_TO_DL: dict[DataType, tuple[int, int]] = {
    DataType.INT8: (0, 8), DataType.INT16: (0, 16), DataType.INT32: (0, 32), DataType.INT64: (0, 64),
    DataType.UINT8: (1, 8), DataType.UINT16: (1, 16), DataType.UINT32: (1, 32), DataType.UINT64: (1, 64),
    DataType.FLOAT16: (2, 16), DataType.FLOAT: (2, 32), DataType.DOUBLE: (2, 64),
    DataType.BF16: (4, 16), DataType.COMPLEX64: (5, 64), DataType.COMPLEX128: (5, 128), DataType.BOOL: (6, 8),
    DataType.FLOAT8_E4M3FN: (10, 8), DataType.FLOAT8_E5M2: (12, 8), DataType.FLOAT8_E8M0: (14, 8),
    DataType.FLOAT4_E2M1: (17, 4),
}
_FROM_DL: dict[tuple[int, int], DataType] = {v: k for k, v in _TO_DL.items()}


# ------------------------------------------------------------------------------------------ export

def export(ptr: int, shape: tuple[int, ...], dtype: DataType, strides: tuple[int, ...], byte_offset: int,
           keep: object, max_version: tuple[int, int] | None = None, copied: bool = False) -> CapsuleType:
    """A DLPack capsule over the memory at `ptr` (+ `byte_offset`) as a kDLCPU tensor (mock memory is
    host memory). `keep` is held until the consumer is done (or the capsule is dropped unconsumed):
    the consumer's deleter lets it go, from whichever thread it runs on."""
    code_bits = _TO_DL.get(dtype)
    if code_bits is None:
        raise BufferError(f"{dtype.name} has no DLPack type code")
    if dtype.packed and tuple(strides) != row_major(tuple(shape)):
        raise BufferError("a strided packed 4-bit tensor cannot be exported")
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    capsule: CapsuleType = dlpack_export(ptr, tuple(shape), code_bits[0], code_bits[1], tuple(strides),
                                         byte_offset, keep, versioned, copied)
    return capsule


# ------------------------------------------------------------------------------------------ import

def _capsule_of(obj: Any) -> Any:
    if type(obj).__name__ == "PyCapsule":
        return obj
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"{type(obj).__name__} does not implement the DLPack protocol (__dlpack__)")
    try:
        return obj.__dlpack__(max_version=DLPACK_VERSION)
    except TypeError:  # a producer of the pre-1.0 protocol
        return obj.__dlpack__()


def _element_extent(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int]:
    """(lowest, highest) element offset the view reaches."""
    lo = sum((d - 1) * s for d, s in zip(shape, strides) if s < 0)
    hi = sum((d - 1) * s for d, s in zip(shape, strides) if s > 0)
    return lo, hi


def import_capsule(obj: Any) -> tuple[int, tuple[int, ...], DataType, tuple[int, ...], int, ImportedMemory]:
    """Consume `obj`'s DLPack capsule: (address of element 0, shape, dtype, element strides,
    DLPack device type, keep-alive)."""
    ptr, shape, code_bits, strides, device_type, keep = dlpack_import(_capsule_of(obj), obj)
    dt = _FROM_DL.get(code_bits)
    if dt is None:
        keep.release()
        raise BufferError(f"DLPack type (code {code_bits[0]}, {code_bits[1]} bits) has no aclDataType")
    return ptr, shape, dt, strides if strides is not None else row_major(tuple(shape)), device_type, keep


def host_array(ptr: int, shape: tuple[int, ...], dt: DataType, strides: tuple[int, ...],
               keep: object = None) -> np.ndarray:
    """A numpy view of host memory described by a DLPack tensor (packed fp4: uint8 bytes); `keep` lives as
    long as the view."""
    if dt.packed:
        if strides != row_major(tuple(shape)):
            raise BufferError("a strided packed 4-bit DLPack tensor is not supported")
        nbytes = (math.prod(shape) + 1) // 2
        byte_shape = shape[:-1] + ((shape[-1] + 1) // 2,) if shape else ()
        raw = np.frombuffer(memoryview(HostView(ptr, max(nbytes, 1), keep)), np.uint8, count=nbytes)
        return raw.reshape(byte_shape)
    try:
        nd = to_numpy(dt)
    except TypeError:  # a byte-sized type without a numpy type: its bytes
        nd = np.dtype(np.uint8)
    if math.prod(shape) == 0:
        return np.empty(shape, nd)
    lo, hi = _element_extent(shape, strides)
    item = nd.itemsize
    base = np.frombuffer(memoryview(HostView(ptr + lo * item, (hi - lo + 1) * item, keep)), np.uint8).view(nd)
    view: np.ndarray = np.lib.stride_tricks.as_strided(base[-lo:], shape, tuple(s * item for s in strides))
    return view


def is_mock_device_memory(ptr: int, nbytes: int) -> bool:
    """Whether [ptr, ptr + nbytes) lies in device memory of the loaded mock (never true on real CANN).

    The mock validates both ends of every device-side copy against its memory registry, so a one-byte
    device-to-host copy from the first and from the last byte answers the question through the
    ordinary C ABI; a refused probe's error message is cleared."""
    b = initialized()
    if not b.is_mock or ptr == 0:
        return False
    cell = b.ffi.new("unsigned char[1]")
    for p in {ptr, ptr + max(nbytes, 1) - 1}:
        ret = b.lib.aclrtMemcpy(cell, 1, b.ffi.cast("void *", p), 1, b.lib.ACL_MEMCPY_DEVICE_TO_HOST)
        if ret != 0:
            b.lib.aclGetRecentErrMsg()  # clear-on-read
            return False
    return True


@functools.lru_cache(maxsize=1024)
def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a C-contiguous array of `shape`; cached: operator outputs of a
    serving loop repeat a handful of shapes every step."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


__all__ = ["DLPACK_VERSION", "KDL_CPU", "ImportedMemory", "export", "host_array", "import_capsule",
           "is_mock_device_memory", "live_exports"]
