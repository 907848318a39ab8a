"""Tensor: device memory + shape/dtype/strides, and the aclTensor descriptor handed to operators.

A Tensor either owns its memory (``empty``, ``zeros``, ``from_numpy``) or borrows it
(``from_address``, ``from_dlpack``), keeping the owner alive. Shapes count elements; strides and offset
are in elements, as ``aclCreateTensor`` takes them. Packed 4-bit types hold two elements per byte.

Lifetimes: ``close()`` releases the Tensor's own claim on its memory and refuses any later use. The
memory itself stays allocated while something still uses it — a numpy view, a DLPack export, a
borrowing Tensor, or work queued on a stream — and is freed when the last of them goes.

Reads wait for writes: each Tensor remembers the stream that last wrote it (an operator's output, an
asynchronous upload), and ``numpy()`` synchronises that stream first, as CuPy's ``get()`` does.

On the mock backend device memory is host memory, so a Tensor is also visible zero-copy through numpy
(``numpy_view``, ``np.asarray``) and DLPack as a CPU array; on real CANN those refuse (BufferError) and
``numpy()`` copies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core, dlpack
from ._core import HostView, TensorBase
from ._core import destroy_descriptor as _destroy_descriptor_address
from .dlpack import row_major
from .dtypes import DataType, DTypeLike, as_datatype, pack_nibbles, to_numpy, unpack_nibbles
from .runtime import (
    DeviceMemory,
    Stream,
    StreamArg,
    copy_on_device,
    copy_to_device,
    copy_to_host,
    explicit_or_current,
    fill,
    initialized,
    order_after_writes,
    ordered,
)

if TYPE_CHECKING:
    from typing_extensions import CapsuleType

ShapeLike = Sequence[int]

_MIN_ALLOC = 32  # aclrtMalloc refuses size 0; empty tensors still get a valid address
# A download that copies only a part is made over fresh pages from this size on (_core.ZeroPages): the
# rest reads as zero and takes no memory (np.zeros would clear memory a freed array left, touching every
# page).
_FRESH_PAGES_MIN = 1 << 16


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    return row_major(tuple(shape))


def _nbytes(dt: DataType, shape: Sequence[int]) -> int:
    return (math.prod(shape) * dt.bits + 7) // 8


def device_layout(array: object, dtype: DTypeLike | None = None) -> tuple[np.ndarray, tuple[int, ...], DataType]:
    """What uploading host data makes: its bytes as a C-contiguous array (4-bit values packed two to a
    byte), the device Tensor's shape and its type (`dtype`: an element type the array cannot hold, as
    :meth:`Tensor.from_numpy` takes it)."""
    arr = np.asarray(array, order="C")  # (ascontiguousarray would turn a 0-d array into 1-d)
    shape = arr.shape
    if dtype is None:
        dt = as_datatype(arr.dtype)
        if dt.packed:
            arr = pack_nibbles(arr)
    else:
        dt = as_datatype(dtype)
        if dt.packed:
            if arr.dtype == np.uint8:
                shape = arr.shape[:-1] + (arr.shape[-1] * 2,)
            else:
                arr = pack_nibbles(arr)
        elif arr.dtype.itemsize * 8 != dt.bits:
            raise TypeError(f"a {arr.dtype} array cannot hold {dt.name} elements")
    return arr, shape, dt


class Tensor(TensorBase):
    """A typed view of device memory.

    ``device`` is the id of the device the memory lives on: the one given, else the calling thread's
    current device when the Tensor allocated it (``empty``, ``zeros``, ``from_numpy``), the owner's
    for a borrowed Tensor; None when the Tensor cannot know it (:meth:`from_address`, or a zero-copy
    :meth:`from_dlpack` of memory that is not a Tensor's, without `device`)."""

    # every field is TensorBase's (csrc/_core.pxd), which the compiled core reads: this class adds methods
    __slots__ = ()

    def __init__(self, ptr: int, shape: ShapeLike, dtype: DTypeLike, strides: ShapeLike | None = None,
                 offset: int = 0, owner: object = None, device: int | None = None):
        """A view of `ptr` (the storage base) — prefer :meth:`from_address`, which documents `owner`."""
        shape = tuple(int(d) for d in shape)
        strides = tuple(int(s) for s in strides) if strides is not None else row_major(shape)
        if len(strides) != len(shape):
            raise ValueError(f"strides {strides} do not match shape {shape}")
        #: Elements per dimension.
        self.shape = shape
        #: The element type, an aclDataType.
        self.dtype = as_datatype(dtype)
        #: Elements between neighbours of each dimension (contiguous unless given).
        self.strides = strides
        #: Elements from the storage base to element 0.
        self.offset = int(offset)
        #: The device the memory lives on (see the class description); None when unknown.
        self.device = device
        self._set_state(int(ptr), None)
        self._owner = _claim(owner)

    def _set_state(self, ptr: int, mem: DeviceMemory | None) -> None:
        """The private slots of a new Tensor whose layout is set (`_owner` aside, the caller's)."""
        self._ptr = ptr
        # a Tensor's layout never changes, and the operator paths ask for these on every call
        self._contiguous = self.strides == row_major(self.shape)
        self._offset_nbytes = (self.offset * self.dtype.bits) // 8
        self._span = self.nbytes if self.size else 0
        self._mem = mem
        self._writer = None
        self._shared = False  # exported or read on another stream: a MoeDistributeBuffer never reuses it
        self._open = True

    # ---- construction ------------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape: ShapeLike, dtype: DTypeLike, device: int | None = None) -> Tensor:
        """Uninitialised device memory (the mock fills new memory with 0xA5 poison)."""
        dt = dtype if dtype.__class__ is DataType else as_datatype(dtype)
        shape = tuple(int(d) for d in shape)
        mem = DeviceMemory(max(_nbytes(dt, shape), _MIN_ALLOC), device)
        # operators allocate their outputs here on every call: what __init__ converts and checks holds
        t = cls.__new__(cls)
        t.shape, t.dtype, t.strides, t.offset, t.device = shape, dt, row_major(shape), 0, mem.device
        t._set_state(mem._ptr, mem)
        t._owner = None
        return t

    @classmethod
    def zeros(cls, shape: ShapeLike, dtype: DTypeLike, device: int | None = None) -> Tensor:
        t = cls.empty(shape, dtype, device)
        t.fill_bytes(0)
        return t

    @classmethod
    def from_numpy(cls, array: object, stream: StreamArg = None, device: int | None = None,
                   dtype: DTypeLike | None = None) -> Tensor:
        """Upload a host array: synchronously, or queued on `stream` (default: the current stream of a
        ``with stream:`` block) — the host array is then kept alive until the stream passes the copy.
        `dtype` records an element type the array cannot hold, e.g. DataType.HIFLOAT8 for uint8 bytes,
        or a packed 4-bit type for already-packed uint8 bytes (logical last dimension = 2 × bytes)."""
        arr, shape, dt = device_layout(array, dtype)
        t = cls.empty(shape, dt, device)
        t._upload(arr, explicit_or_current(stream))
        return t

    @classmethod
    def _from_leading_rows(cls, array: np.ndarray, rows: int, stream: Stream) -> Tensor:
        """A Tensor of a C-contiguous host array's shape and type holding only its first `rows` rows,
        queued on `stream`: the rest of its memory is left as allocated (for an input whose reader
        reads no other row)."""
        t = cls.empty(array.shape, as_datatype(array.dtype))
        t._upload(array[:rows], stream)
        return t

    @classmethod
    def from_address(cls, ptr: int, shape: ShapeLike, dtype: DTypeLike, strides: ShapeLike | None = None,
                     offset: int = 0, owner: object = None) -> Tensor:
        """Borrow device memory someone else owns (e.g. a C++ server's buffer). `owner` is kept alive
        as long as this Tensor; when it is a :class:`~aclnn_py.DeviceMemory` or a Tensor, its memory
        stays allocated while this Tensor exists, even if the owner is closed."""
        return cls(ptr, shape, dtype, strides, offset, owner)

    # ---- lifetime ------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return not self._open

    def __enter__(self) -> Tensor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # a Tensor collected with a descriptor has it destroyed by its compiled base (csrc/_core.pyx), also
    # when an operator's compiled call made it

    # ---- copies --------------------------------------------------------------------------------------
    def clone(self, stream: StreamArg = None) -> Tensor:
        """A new Tensor with a copy of this one's elements in new device memory on the same device
        (contiguous): the copy is queued on `stream` (default: the current stream of a ``with stream:``
        block, else synchronous) after the pending writes of this Tensor. Costs an allocation from the
        memory pool and a device-to-device copy of :attr:`nbytes`. ``copy.copy(t)`` and
        ``copy.deepcopy(t)`` make the same copy, as numpy's and CuPy's arrays do (a second view of the
        same memory is ``Tensor.from_dlpack(t)``); a Tensor cannot be pickled (pickle its ``numpy()``)."""
        self._check_open("copy it")
        s = explicit_or_current(stream)
        if not self.is_contiguous:  # the elements are gathered on the host, then uploaded
            return Tensor.from_numpy(self.numpy(stream), stream=s, device=self.device, dtype=self.dtype)
        out = Tensor.empty(self.shape, self.dtype, device=self.device)
        n = self.nbytes
        if s is None:
            self._wait_for_writes(None)
        else:
            order_after_writes(s, (self,))
        if n:
            copy_on_device(out.data_ptr, n, self.data_ptr, n, s)
        if s is not None:
            ordered.hold(s, (self._anchor(), out._anchor()))  # the queued copy reads and writes them later
            out._writer = s
        return out

    def __copy__(self) -> Tensor:
        """``copy.copy(t)``: :meth:`clone`."""
        return self.clone()

    def __deepcopy__(self, memo: dict[int, object]) -> Tensor:
        """``copy.deepcopy(t)``: a real copy (:meth:`clone`)."""
        return self.clone()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(f"{self._label()} holds device memory and cannot be pickled; pickle its numpy() "
                        "download instead")

    def _check_open(self, operation: str) -> None:
        """ClosedError once closed; RecycledError for a buffer result whose memory a later call took."""
        self._check_readable(operation)

    def _anchor(self) -> object:
        """What keeps this Tensor's memory valid (for stream-ordered holds)."""
        return self._mem if self._mem is not None else self._owner

    def _export(self) -> object:
        """A claim that keeps the memory allocated for an export (a view, a DLPack capsule)."""
        self._shared = True
        if self._mem is not None:
            return self._mem.export()
        return _claim(self._owner) if self._owner is not None else self

    # ---- properties ----------------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """The storage base address."""
        self._check_readable("use its address")
        return self._ptr

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
        return self._contiguous

    @property
    def data_ptr(self) -> int:
        """Address of element 0 (storage base + offset)."""
        self._check_readable("use its address")
        return self._ptr + self._offset_nbytes

    @property
    def writer(self) -> Stream | None:
        """The stream whose queued work last wrote this Tensor (None: no asynchronous write known)."""
        return self._writer

    def _offset_bytes(self) -> int:
        return self._offset_nbytes

    def _extent_bytes(self) -> int:
        """Bytes from the storage base to one past the last reachable element."""
        if self.size == 0:
            return self._offset_bytes()
        last = self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.strides))
        return ((last + 1) * self.dtype.bits + 7) // 8

    # ---- descriptor ----------------------------------------------------------------------------------
    def descriptor(self) -> Any:
        """The ``aclTensor *`` for this view (created once, destroyed with the Tensor). The storage is
        described as 1-D, as torch_npu does."""
        self._describe()
        return initialized().ffi.cast("aclTensor *", self._desc_addr)

    def release_descriptor(self) -> None:
        """Destroy the descriptor now (``aclDestroyTensor``); the next :meth:`descriptor` makes another."""
        self._drop_descriptor()

    def detach_descriptor(self) -> Any:
        """The descriptor, no longer this Tensor's to destroy (None when it has none): for an executor
        that refers to it and outlives the Tensor. Pass it to :func:`destroy_descriptor` once the
        executor is destroyed."""
        address = self._take_descriptor()
        return initialized().ffi.cast("aclTensor *", address) if address else None

    # ---- host transfer -------------------------------------------------------------------------------
    def _wait_for_writes(self, stream: StreamArg) -> None:
        """Synchronise the stream that last wrote this Tensor and `stream` (when given; with neither, the
        current stream)."""
        w = self._writer
        s = explicit_or_current(stream) if stream is not None or w is None else None
        if w is not None and not w.closed and w != s:
            w.synchronize()
        if s is not None and not s.closed:
            s.synchronize()

    def numpy(self, stream: StreamArg = None) -> np.ndarray:
        """Download to a new host array, after the stream that last wrote this Tensor (and `stream`,
        when given) finished. Packed 4-bit types come back as uint8 bytes, (…, last/2); HIFLOAT8 and
        other types without a numpy type as uint8."""
        self._check_open("download it")
        self._wait_for_writes(stream)
        if self.dtype.packed:
            if not self.is_contiguous:
                raise ValueError("downloading a strided packed tensor is not supported")
            return self._download(self.shape[:-1] + ((self.shape[-1] * self.dtype.bits + 7) // 8,), np.dtype(np.uint8))
        nd = to_numpy(self.dtype)
        if self.is_contiguous:
            return self._download(self.shape, nd)
        raw = np.empty(self._extent_bytes(), np.uint8)
        if raw.nbytes:
            copy_to_host(raw, self._ptr, raw.nbytes)
        # np.ndarray keeps ml_dtypes types (as_strided would turn them into plain '<f1' etc.)
        view = np.ndarray(self.shape, dtype=nd, buffer=raw, offset=self._offset_bytes(),
                          strides=tuple(s * nd.itemsize for s in self.strides))
        return np.array(view)

    def _download(self, shape: tuple[int, ...], nd: np.dtype) -> np.ndarray:
        """A contiguous view's bytes in a new host array of `shape`. For an output of a buffer's dispatch,
        only the rows its call received are copied (no other row is written, docs/concepts.md, "Buffer
        results"): the rest of the array reads as zero."""
        nbytes = math.prod(shape) * nd.itemsize
        written = self._written_nbytes()
        if 0 <= written < nbytes:
            if nbytes >= _FRESH_PAGES_MIN:
                out = np.frombuffer(memoryview(_core.ZeroPages(nbytes)), nd).reshape(shape)
            else:
                out = np.zeros(shape, nd)
            if written:
                copy_to_host(out, self.data_ptr, written)
            return out
        out = np.empty(shape, nd)
        if nbytes:
            copy_to_host(out, self.data_ptr, nbytes)
        return out

    def unpack(self, stream: StreamArg = None) -> np.ndarray:
        """Download a packed 4-bit tensor as one element per byte (ml_dtypes type or uint8 codes)."""
        if not self.dtype.packed:
            return self.numpy(stream)
        return unpack_nibbles(self.numpy(stream), to_numpy(self.dtype))

    def _upload(self, arr: np.ndarray, stream: Stream | None) -> None:
        """Copy a C-contiguous host array's bytes into this Tensor from element 0: queued on `stream`
        (the compiled core's upload: the array is held until the stream passes the copy), else
        synchronously."""
        if stream is None:
            self._rewritten = True
            copy_to_device(self.data_ptr, self.nbytes, arr, None)
            return
        w = self._writer
        if w is not None and w._key != stream._key:
            order_after_writes(stream, (self,))  # the new bytes land after a pending write on another stream
        _core.upload(self, arr, stream)

    def copy_from(self, array: object, stream: StreamArg = None) -> None:
        """Upload a host array of the same bytes into this tensor (queued on `stream` / the current
        stream when there is one, else synchronous)."""
        self._check_open("copy into it")
        arr = np.ascontiguousarray(array)
        if self.dtype.packed and arr.dtype != np.uint8:
            arr = pack_nibbles(arr)
        if arr.nbytes != self.nbytes or not self.is_contiguous:
            raise ValueError(f"copy_from: {arr.nbytes} bytes into a {self.nbytes}-byte view {self!r}")
        self._upload(arr, explicit_or_current(stream))

    def fill_bytes(self, value: int, stream: StreamArg = None) -> None:
        """Set every byte of a contiguous view (``aclrtMemset[Async]``)."""
        self._check_open("fill it")
        self._rewritten = True
        n = self.nbytes
        if n:
            s = explicit_or_current(stream)
            if s is not None:
                order_after_writes(s, (self,))
            fill(self.data_ptr, n, int(value), n, s)
            if s is not None:
                self._writer = s

    # ---- zero-copy host views (mock only) ----------------------------------------------------------------
    def _require_host_visible(self) -> None:
        if not initialized().is_mock:
            raise BufferError("device memory of a real NPU is not host-accessible; use Tensor.numpy()")

    def numpy_view(self, stream: StreamArg = None) -> np.ndarray:
        """A zero-copy numpy array over the tensor's memory (mock backend only), after the stream that
        last wrote it finished. The array keeps the memory allocated, even if this Tensor is closed."""
        self._check_open("view it")
        self._require_host_visible()
        self._wait_for_writes(stream)
        nd = np.dtype(np.uint8) if self.dtype.packed else to_numpy(self.dtype)
        extent = max(self._extent_bytes(), 1)
        # the view's base holds the HostView, which holds the export: the memory stays while a view lives
        flat = np.frombuffer(memoryview(HostView(self._ptr, extent, self._export())), dtype=np.uint8)
        if self.dtype.packed:
            shape = self.shape[:-1] + ((self.shape[-1] + 1) // 2,)
            return flat[self._offset_bytes():self._offset_bytes() + math.prod(shape)].reshape(shape)
        # np.ndarray keeps ml_dtypes types (as_strided would turn them into plain '<f1' etc.)
        view: np.ndarray = np.ndarray(self.shape, dtype=nd, buffer=flat, offset=self._offset_bytes(),
                                      strides=tuple(s * nd.itemsize for s in self.strides))
        return view

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(tensor)``: a zero-copy view on the mock (a download with ``copy=True`` or on real
        CANN, where ``copy=False`` raises ValueError)."""
        if copy or not initialized().is_mock:
            if copy is False:
                raise ValueError("a Tensor on a real NPU cannot be viewed without a copy; use Tensor.numpy()")
            out = self.numpy()
        else:
            out = self.numpy_view()
        return out if dtype is None else out.astype(to_numpy(dtype), copy=False)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> CapsuleType:
        """DLPack export (mock only): a zero-copy kDLCPU tensor over the device memory, after the
        stream that last wrote it finished; a versioned capsule when ``max_version >= (1, 0)``. bf16,
        fp8 and packed fp4 keep their DLPack type codes, which not every numpy can take
        (docs/concepts.md, "Reading results on the host"; :meth:`numpy_view` reads every type); a
        type without a DLPack code raises BufferError. ``copy=True`` exports a fresh copy. `stream`
        must be None or -1."""
        self._check_open("export it")
        self._require_host_visible()
        if stream not in (None, -1):
            raise BufferError("a kDLCPU export takes no stream (the producing stream is synchronised first)")
        if dl_device is not None and tuple(dl_device) != (dlpack.KDL_CPU, 0):
            raise BufferError(f"cannot export to DLPack device {tuple(dl_device)} (only (kDLCPU, 0))")
        self._wait_for_writes(None)
        if copy:
            clone = Tensor.from_numpy(self.numpy(), dtype=self.dtype)
            return dlpack.export(clone._ptr, clone.shape, clone.dtype, clone.strides, clone._offset_bytes(),
                                 clone._export(), max_version, copied=True)
        return dlpack.export(self._ptr, self.shape, self.dtype, self.strides, self._offset_bytes(),
                             self._export(), max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        self._require_host_visible()
        return (dlpack.KDL_CPU, 0)

    @classmethod
    def from_dlpack(cls, obj: object, device: int | None = None) -> Tensor:
        """Import any DLPack producer (or a capsule).

        Zero-copy when the producer's memory is device memory of the loaded mock — another Tensor's
        export, or aclrtMalloc memory of C code in this process: the result borrows it and keeps the
        producer alive. Otherwise (any other host memory, and always on real CANN) the data is copied
        into new device memory on `device`. Only kDLCPU producers are accepted (DLPack has no Ascend
        device type)."""
        if isinstance(obj, Tensor):
            obj._check_open("borrow it")
            return cls(obj._ptr, obj.shape, obj.dtype, obj.strides, obj.offset, owner=obj, device=obj.device)
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

    def _label(self) -> str:
        return (f"Tensor(shape={self.shape}, dtype={self.dtype.name}"
                + (f", strides={self.strides}" if not self.is_contiguous else "")
                + (f", offset={self.offset}" if self.offset else "") + ")")

    def __repr__(self) -> str:
        label = self._label()
        return f"{label[:-1]}, closed)" if not self._open else f"Tensor(0x{self._ptr:x}, {label[7:]}"


#: What operator wrappers accept for a tensor argument: a device Tensor, or host data (uploaded).
TensorArg = Tensor | np.ndarray | Sequence[object]


def _claim(owner: object) -> object:
    """What a borrower keeps: an export of a DeviceMemory's or a Tensor's memory (so closing the owner
    cannot free it), or the owner object itself."""
    if isinstance(owner, DeviceMemory):
        return owner.export()
    if isinstance(owner, Tensor):
        owner._check_open("borrow its memory")
        return owner._export()
    return owner


def destroy_descriptor(descriptor: Any) -> None:
    """``aclDestroyTensor`` of a descriptor from :meth:`Tensor.detach_descriptor` (None: nothing)."""
    if descriptor is not None:
        _destroy_descriptor_address(int(initialized().ffi.cast("uintptr_t", descriptor)))
