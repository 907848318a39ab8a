"""Tensor: device memory + shape/dtype/strides, and the aclTensor descriptor handed to ops.

A Tensor either owns its memory (``empty``, ``from_numpy``) or borrows it (``from_address``, keeping
an optional ``owner`` alive). Shapes count elements; strides and offset are in elements, as
``aclCreateTensor`` takes them (ABI.md §3.2). Packed 4-bit types hold two elements per byte.

On the mock backend device memory is host memory, so a Tensor is also visible zero-copy through
numpy (``numpy_view``, ``__array_interface__``) and DLPack as a CPU array; on real CANN those raise.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _loader
from .dtypes import DataType, as_datatype, pack_nibbles, to_numpy, unpack_nibbles
from .runtime import DeviceMemory, _b, memcpy_d2h, memcpy_h2d, memset

ShapeLike = Sequence[int]

_MIN_ALLOC = 32  # aclrtMalloc refuses size 0; empty tensors still get a valid address


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


class Tensor:
    """A typed view of device memory."""

    __slots__ = ("ptr", "shape", "dtype", "strides", "offset", "device", "_owner", "_desc", "__weakref__")

    def __init__(self, ptr: int, shape: ShapeLike, dtype: Any, strides: ShapeLike | None = None,
                 offset: int = 0, owner: Any = None, device: int | None = None):
        self.ptr = int(ptr)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = as_datatype(dtype)
        self.strides = tuple(int(s) for s in strides) if strides is not None else contiguous_strides(self.shape)
        if len(self.strides) != len(self.shape):
            raise ValueError(f"strides {self.strides} do not match shape {self.shape}")
        self.offset = int(offset)
        self.device = device
        self._owner = owner
        self._desc: Any = None

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape: ShapeLike, dtype: Any, device: int | None = None) -> Tensor:
        """Uninitialised device memory (the mock fills new memory with 0xA5 poison)."""
        dt = as_datatype(dtype)
        shape = tuple(int(d) for d in shape)
        mem = DeviceMemory(max(_nbytes(dt, shape), _MIN_ALLOC), device)
        return cls(mem.ptr, shape, dt, owner=mem, device=device)

    @classmethod
    def zeros(cls, shape: ShapeLike, dtype: Any, device: int | None = None) -> Tensor:
        t = cls.empty(shape, dtype, device)
        t.fill_bytes(0)
        return t

    @classmethod
    def from_numpy(cls, array: Any, stream: Any = None, device: int | None = None,
                   dtype: Any = None) -> Tensor:
        """Upload a host array. With `stream`, the copy is queued on it (the host array is kept
        alive by the Tensor until then). `dtype` records an element type the array cannot hold, e.g.
        DataType.HIFLOAT8 for uint8 bytes, or a packed 4-bit type for already-packed uint8 bytes
        (logical last dimension = 2 × bytes)."""
        arr = np.asarray(array, order="C")  # (ascontiguousarray would turn a 0-d array into 1-d)
        if dtype is None:
            dt = as_datatype(arr.dtype)
            shape = arr.shape
            if dt.packed:
                arr = pack_nibbles(arr)
        else:
            dt = as_datatype(dtype)
            shape = arr.shape
            if dt.packed:
                if arr.dtype == np.uint8:
                    shape = arr.shape[:-1] + (arr.shape[-1] * 2,)
                else:
                    arr = pack_nibbles(arr)
            elif arr.dtype.itemsize * 8 != dt.bits:
                raise TypeError(f"a {arr.dtype} array cannot hold {dt.name} elements")
        t = cls.empty(shape, dt, device)
        memcpy_h2d(t.ptr, t.nbytes, arr, stream)
        if stream is not None:
            t._owner = (t._owner, arr)  # keep the source alive for the queued copy
        return t

    @classmethod
    def from_address(cls, ptr: int, shape: ShapeLike, dtype: Any, strides: ShapeLike | None = None,
                     offset: int = 0, owner: Any = None) -> Tensor:
        """Borrow device memory someone else owns (e.g. a C++ server's buffer); `owner` is kept
        alive as long as the Tensor."""
        return cls(ptr, shape, dtype, strides, offset, owner)

    # ---- properties ----------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the view spans from element 0 (contiguous: size × element size)."""
        return _nbytes(self.dtype, self.shape) if self.is_contiguous else self._extent_bytes() - self._offset_bytes()

    @property
    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape)

    @property
    def data_ptr(self) -> int:
        """Address of element 0 (storage base + offset)."""
        return self.ptr + self._offset_bytes()

    def _offset_bytes(self) -> int:
        return (self.offset * self.dtype.bits) // 8

    def _extent_bytes(self) -> int:
        """Bytes from the storage base to one past the last reachable element."""
        if self.size == 0:
            return self._offset_bytes()
        last = self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.strides))
        return ((last + 1) * self.dtype.bits + 7) // 8

    # ---- descriptor ----------------------------------------------------------------------------
    def descriptor(self) -> Any:
        """The ``aclTensor *`` for this view (created once, destroyed with the Tensor). The storage
        is described as 1-D, as torch_npu does."""
        d = self._desc
        if d is None:
            b = _b()
            ffi = b.ffi
            n = len(self.shape)
            dims = ffi.new("int64_t[]", self.shape) if n else ffi.NULL
            strides = ffi.new("int64_t[]", self.strides) if n else ffi.NULL
            storage_elems = max(self.offset + (sum((d - 1) * s for d, s in zip(self.shape, self.strides)) + 1
                                               if self.size else 0), 0)
            storage = ffi.new("int64_t[1]", [storage_elems])
            d = b.lib.aclCreateTensor(dims, n, int(self.dtype), strides, self.offset, b.lib.ACL_FORMAT_ND,
                                      storage, 1, ffi.cast("void *", self.ptr))
            if d == ffi.NULL:
                from .errors import aclnn_error

                raise aclnn_error(161002, "aclCreateTensor")
            self._desc = d
        return d

    def release_descriptor(self) -> None:
        d, self._desc = self._desc, None
        if d is not None:
            b = _loader.loaded()
            if b is not None:
                b.lib.aclDestroyTensor(d)

    def close(self) -> None:
        """Destroy the descriptor and release owned memory now (borrowed memory is untouched)."""
        self.release_descriptor()
        owner, self._owner = self._owner, None
        if isinstance(owner, DeviceMemory):
            owner.close()

    def __del__(self) -> None:
        if getattr(self, "_desc", None) is not None:
            try:
                self.release_descriptor()
            except Exception:
                pass

    # ---- host transfer --------------------------------------------------------------------------
    def numpy(self, stream: Any = None) -> np.ndarray:
        """Download to a new host array (synchronising `stream` first when given). Packed 4-bit
        types come back as uint8 bytes, (…, last/2); HIFLOAT8 and other types without a numpy type
        as uint8."""
        if stream is not None:
            from .errors import check_acl
            from .runtime import as_stream

            check_acl(_b().lib.aclrtSynchronizeStream(as_stream(stream)), "aclrtSynchronizeStream")
        if self.dtype.packed:
            if not self.is_contiguous:
                raise ValueError("downloading a strided packed tensor is not supported")
            out = np.empty(self.shape[:-1] + ((self.shape[-1] * self.dtype.bits + 7) // 8,), np.uint8)
            if out.nbytes:
                memcpy_d2h(out, self.data_ptr, out.nbytes)
            return out
        nd = to_numpy(self.dtype)
        if self.is_contiguous:
            out = np.empty(self.shape, nd)
            if out.nbytes:
                memcpy_d2h(out, self.data_ptr, out.nbytes)
            return out
        raw = np.empty(self._extent_bytes(), np.uint8)
        if raw.nbytes:
            memcpy_d2h(raw, self.ptr, raw.nbytes)
        # np.ndarray keeps ml_dtypes types (as_strided would turn them into plain '<f1' etc.)
        view = np.ndarray(self.shape, dtype=nd, buffer=raw, offset=self._offset_bytes(),
                          strides=tuple(s * nd.itemsize for s in self.strides))
        return np.array(view)

    def unpack(self) -> np.ndarray:
        """Download a packed 4-bit tensor as one element per byte (ml_dtypes type or uint8 codes)."""
        if not self.dtype.packed:
            return self.numpy()
        return unpack_nibbles(self.numpy(), to_numpy(self.dtype))

    def copy_from(self, array: Any, stream: Any = None) -> None:
        """Upload a host array of the same bytes into this tensor."""
        arr = np.ascontiguousarray(array)
        if self.dtype.packed and arr.dtype != np.uint8:
            arr = pack_nibbles(arr)
        if arr.nbytes != self.nbytes or not self.is_contiguous:
            raise ValueError(f"copy_from: {arr.nbytes} bytes into a {self.nbytes}-byte view {self!r}")
        memcpy_h2d(self.data_ptr, self.nbytes, arr, stream)

    def fill_bytes(self, value: int, stream: Any = None) -> None:
        """Set every byte of a contiguous view (``aclrtMemset[Async]``)."""
        n = self.nbytes
        if n:
            memset(self.data_ptr, n, int(value), n, stream)

    # ---- zero-copy host views (mock only) -----------------------------------------------------------
    def _require_host_visible(self) -> None:
        b = _b()
        if not b.is_mock:
            raise BufferError("device memory of a real NPU is not host-accessible; use Tensor.numpy()")

    def numpy_view(self) -> np.ndarray:
        """A zero-copy numpy array over the tensor's memory (mock backend only). The array keeps the
        Tensor alive."""
        self._require_host_visible()
        nd = np.dtype(np.uint8) if self.dtype.packed else to_numpy(self.dtype)
        extent = max(self._extent_bytes(), 1)
        raw = (ctypes.c_char * extent).from_address(self.ptr)
        raw._aclnn_owner = self  # type: ignore[attr-defined]  # numpy keeps `raw` as base
        flat = np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint8)
        if self.dtype.packed:
            shape = self.shape[:-1] + ((self.shape[-1] + 1) // 2,)
            return flat[self._offset_bytes():self._offset_bytes() + math.prod(shape)].reshape(shape)
        # np.ndarray keeps ml_dtypes types (as_strided would turn them into plain '<f1' etc.); its
        # base is `flat`, whose base is `raw`, which holds the Tensor
        view: np.ndarray = np.ndarray(self.shape, dtype=nd, buffer=flat, offset=self._offset_bytes(),
                                      strides=tuple(s * nd.itemsize for s in self.strides))
        return view

    @property
    def __array_interface__(self) -> dict[str, Any]:
        self._require_host_visible()
        nd = to_numpy(self.dtype)
        if self.dtype.packed or nd.kind == "V":
            raise BufferError(f"{self.dtype.name} has no array-interface type string; use numpy_view()")
        return {
            "version": 3,
            "shape": self.shape,
            "typestr": nd.str,
            "data": (self.data_ptr, False),
            "strides": None if self.is_contiguous else tuple(s * nd.itemsize for s in self.strides),
        }

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """DLPack export (mock only: a zero-copy kDLCPU tensor over the device memory; versioned
        capsule when ``max_version >= (1, 0)``). bf16, fp8 and packed fp4 keep their DLPack 1.1 type
        codes. ``copy=True`` exports a fresh copy. `stream` must be None or -1 (CPU semantics: the
        caller synchronises the streams that write the tensor before exporting)."""
        from . import dlpack

        self._require_host_visible()
        if stream not in (None, -1):
            raise BufferError("a kDLCPU export takes no stream (synchronise the producing stream first)")
        if dl_device is not None and tuple(dl_device) != (dlpack.KDL_CPU, 0):
            raise BufferError(f"cannot export to DLPack device {tuple(dl_device)} (only (kDLCPU, 0))")
        if copy:
            clone = Tensor.from_numpy(self.numpy(), dtype=self.dtype)
            return dlpack.export(clone, max_version, copied=True)
        return dlpack.export(self, max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        self._require_host_visible()
        return (1, 0)  # kDLCPU

    @classmethod
    def from_dlpack(cls, obj: Any, device: int | None = None) -> Tensor:
        """Import any DLPack producer (or a capsule).

        Zero-copy when the producer's memory is device memory of the loaded mock — another Tensor's
        export, or aclrtMalloc memory of C code in this process: the result borrows it and keeps the
        producer alive. Otherwise (any other host memory, and always on real CANN) the data is
        copied into new device memory on `device`'s current context. Only kDLCPU producers are
        accepted (DLPack has no Ascend device type)."""
        from . import dlpack

        if isinstance(obj, Tensor):
            return cls(obj.ptr, obj.shape, obj.dtype, obj.strides, obj.offset, owner=obj, device=obj.device)
        ptr, shape, dt, strides, dev_type, keep = dlpack.import_capsule(obj)
        if dev_type != dlpack.KDL_CPU:
            keep.release()
            raise BufferError(f"DLPack device type {dev_type} is not supported (only kDLCPU = 1)")
        lo = sum((d - 1) * st for d, st in zip(shape, strides) if st < 0)
        contiguous_ok = not dt.packed or tuple(strides) == contiguous_strides(shape)
        nbytes = _nbytes(dt, shape) if dt.packed else (
            (sum((d - 1) * st for d, st in zip(shape, strides) if st > 0) + 1) * dt.bits // 8 if all(shape) else 0)
        if lo == 0 and contiguous_ok and nbytes and dlpack.is_mock_device_memory(ptr, nbytes):
            return cls(ptr, shape, dt, strides, owner=keep, device=device)
        try:
            host = np.asarray(dlpack.host_array(ptr, shape, dt, strides), order="C")
            return cls.from_numpy(host, device=device, dtype=dt)
        finally:
            keep.release()

    def __repr__(self) -> str:
        return (f"Tensor(0x{self.ptr:x}, shape={self.shape}, dtype={self.dtype.name}"
                + (f", strides={self.strides}" if not self.is_contiguous else "")
                + (f", offset={self.offset}" if self.offset else "") + ")")


def _nbytes(dt: DataType, shape: Sequence[int]) -> int:
    return (math.prod(shape) * dt.bits + 7) // 8


def as_tensor(value: Any, stream: Any = None, dtype: Any = None) -> Tensor:
    """A Tensor as is, or a host array uploaded (optional-input helper for the op wrappers)."""
    if isinstance(value, Tensor):
        return value
    return Tensor.from_numpy(value, stream=stream, dtype=dtype)
