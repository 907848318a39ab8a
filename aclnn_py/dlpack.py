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

import ctypes
import math
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from .dtypes import DataType, to_numpy
from .runtime import initialized

if TYPE_CHECKING:
    from typing_extensions import CapsuleType

KDL_CPU = 1
DLPACK_VERSION = (1, 1)
FLAG_READ_ONLY = 1
FLAG_IS_COPIED = 2

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


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_NAME = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
_USED = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# ------------------------------------------------------------------------------------------ export

# Reentrant: the sweep a deleter schedules is a pending call, which CPython may run inside a sweep (or
# an export) this thread is running, at any point the interpreter checks for pending work.
_live_lock = threading.RLock()
_live: dict[int, Any] = {}   # address of the managed struct -> (done flag, what keeps it and the memory)


class _Deleters:
    """Addresses of the C deleters and capsule destructor compiled into the binding: they run no Python
    code (a consumer may call a deleter with an exception pending), they only set the export's done
    flag and schedule :func:`sweep`."""

    def __init__(self) -> None:
        import importlib

        mod = importlib.import_module(f"{__package__}._aclnn")
        self.ffi = mod.ffi

        def address(name: str) -> int:
            return int(mod.ffi.cast("uintptr_t", mod.ffi.addressof(mod.lib, name)))

        self.legacy = _Deleter(address("aclnnpy_dlpack_deleter"))
        self.versioned = _Deleter(address("aclnnpy_dlpack_deleter_versioned"))
        self.capsule = address("aclnnpy_dlpack_capsule_destructor")


_deleters: _Deleters | None = None


def _c_deleters() -> _Deleters:
    global _deleters
    if _deleters is None:
        _deleters = _Deleters()
    return _deleters


def sweep() -> int:
    """Release the exports their consumers are done with; returns how many exports are still live.
    Runs by itself shortly after a consumer calls the deleter."""
    with _live_lock:
        for addr in [a for a, entry in list(_live.items()) if entry[0][0]]:  # over a copy: a nested sweep
            _live.pop(addr, None)                                             # may remove entries meanwhile
        return len(_live)


def export(ptr: int, shape: tuple[int, ...], dtype: DataType, strides: tuple[int, ...], byte_offset: int,
           keep: object, max_version: tuple[int, int] | None = None, copied: bool = False) -> CapsuleType:
    """A DLPack capsule over the memory at `ptr` (+ `byte_offset`) as a kDLCPU tensor (mock memory is
    host memory). `keep` is held until the consumer is done (or the capsule is dropped unconsumed)."""
    code_bits = _TO_DL.get(dtype)
    if code_bits is None:
        raise BufferError(f"{dtype.name} has no DLPack type code")
    if dtype.packed and tuple(strides) != _contiguous(shape):
        raise BufferError("a strided packed 4-bit tensor cannot be exported")
    c = _c_deleters()
    done = c.ffi.new("int64_t *")
    n = len(shape)
    c_shape = (ctypes.c_int64 * max(n, 1))(*shape)
    c_strides = (ctypes.c_int64 * max(n, 1))(*strides)
    dl = _DLTensor(data=ptr, device=_DLDevice(KDL_CPU, 0), ndim=n,
                   dtype=_DLDataType(code_bits[0], code_bits[1], 1), shape=c_shape, strides=c_strides,
                   byte_offset=byte_offset)
    ctx = int(c.ffi.cast("uintptr_t", done))
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    managed: _DLManagedTensor | _DLManagedTensorVersioned
    if versioned:
        managed = _DLManagedTensorVersioned(version=_DLPackVersion(*DLPACK_VERSION), manager_ctx=ctx,
                                            deleter=c.versioned, flags=FLAG_IS_COPIED if copied else 0, dl_tensor=dl)
    else:
        managed = _DLManagedTensor(dl_tensor=dl, manager_ctx=ctx, deleter=c.legacy)
    addr = ctypes.addressof(managed)
    with _live_lock:
        _live[addr] = (done, managed, c_shape, c_strides, keep)
    capsule: CapsuleType = _api.PyCapsule_New(addr, _NAME_VERSIONED if versioned else _NAME, c.capsule)
    return capsule


# ------------------------------------------------------------------------------------------ import

class ImportedMemory:
    """Keeps a consumed DLPack tensor alive; calls the producer's deleter when collected."""

    __slots__ = ("_addr", "_deleter", "_producer")

    def __init__(self, addr: int, deleter: Any, producer: Any) -> None:
        self._addr = addr
        self._deleter = deleter
        self._producer = producer

    def release(self) -> None:
        d, self._deleter = self._deleter, None
        if d:
            d(self._addr)
        self._producer = None

    def __del__(self) -> None:
        self.release()


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
    capsule = _capsule_of(obj)
    if _api.PyCapsule_IsValid(capsule, _NAME_VERSIONED):
        addr = _api.PyCapsule_GetPointer(capsule, _NAME_VERSIONED)
        mv = _DLManagedTensorVersioned.from_address(addr)
        if mv.version.major > DLPACK_VERSION[0]:
            raise BufferError(f"DLPack {mv.version.major}.{mv.version.minor} is newer than this consumer")
        dl, deleter, used = mv.dl_tensor, mv.deleter, _USED_VERSIONED
    elif _api.PyCapsule_IsValid(capsule, _NAME):
        addr = _api.PyCapsule_GetPointer(capsule, _NAME)
        m = _DLManagedTensor.from_address(addr)
        dl, deleter, used = m.dl_tensor, m.deleter, _USED
    else:
        raise BufferError("not a DLPack capsule, or one already consumed")
    keep = ImportedMemory(addr, deleter if bool(deleter) else None, obj)
    _api.PyCapsule_SetName(capsule, used)  # now ours: the producer's capsule destructor leaves it alone
    if dl.dtype.lanes != 1:
        raise BufferError(f"DLPack tensors with {dl.dtype.lanes} lanes are not supported")
    dt = _FROM_DL.get((dl.dtype.code, dl.dtype.bits))
    if dt is None:
        raise BufferError(f"DLPack type (code {dl.dtype.code}, {dl.dtype.bits} bits) has no aclDataType")
    shape = tuple(int(dl.shape[i]) for i in range(dl.ndim))
    if dl.strides:
        strides = tuple(int(dl.strides[i]) for i in range(dl.ndim))
    else:
        strides = _contiguous(shape)
    ptr = int(dl.data or 0) + int(dl.byte_offset)
    return ptr, shape, dt, strides, int(dl.device.device_type), keep


def host_array(ptr: int, shape: tuple[int, ...], dt: DataType, strides: tuple[int, ...]) -> np.ndarray:
    """A numpy view of host memory described by a DLPack tensor (packed fp4: uint8 bytes)."""
    if dt.packed:
        if strides != _contiguous(shape):
            raise BufferError("a strided packed 4-bit DLPack tensor is not supported")
        nbytes = (math.prod(shape) + 1) // 2
        byte_shape = shape[:-1] + ((shape[-1] + 1) // 2,) if shape else ()
        raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
        return np.frombuffer(memoryview(raw).cast("B"), np.uint8, count=nbytes).reshape(byte_shape)
    try:
        nd = to_numpy(dt)
    except TypeError:  # a byte-sized type without a numpy type: its bytes
        nd = np.dtype(np.uint8)
    if math.prod(shape) == 0:
        return np.empty(shape, nd)
    lo, hi = _element_extent(shape, strides)
    item = nd.itemsize
    raw = (ctypes.c_uint8 * ((hi - lo + 1) * item)).from_address(ptr + lo * item)
    base = np.frombuffer(memoryview(raw).cast("B"), np.uint8).view(nd)
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


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


__all__ = ["DLPACK_VERSION", "KDL_CPU", "ImportedMemory", "export", "host_array", "import_capsule",
           "is_mock_device_memory", "sweep"]
