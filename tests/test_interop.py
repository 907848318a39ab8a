"""Interop: DLPack export/import, numpy's ``__array__`` protocol and the ``__acl_stream__`` protocol."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from aclnn_py import dlpack
from aclnn_py.dtypes import DataType

REPO = Path(__file__).resolve().parents[1]

# The DLPack structures as dlpack.h lays them out, read here with ctypes: a check of the capsules the
# compiled core makes by a description of the ABI independent of it.
_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
FLAG_IS_COPIED = 2


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


def _allocs(mock: Any) -> int:
    """Allocations in use (the memory pool's cached free blocks are freed first)."""
    from aclnn_py.runtime import get_memory_pool, ordered

    ordered.reap()  # objects earlier tests left to the stream-ordered holds
    gc.collect()
    get_memory_pool().free_all_blocks()
    return int(mock.stats()["allocations"])


# ------------------------------------------------------------------------------------------ export

def test_export_is_zero_copy_for_numpy(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert t.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.ptr and a.shape == (3, 4)
    a[1, 2] = -7.0  # writes through to the device memory
    assert t.numpy()[1, 2] == -7.0


@pytest.mark.parametrize("max_version", [None, (1, 0), (1, 1)])
def test_capsule_kinds(acl: Any, device0: Any, max_version: Any) -> None:
    t = acl.Tensor.from_numpy(np.arange(4, dtype=np.int32))
    cap = t.__dlpack__(max_version=max_version)
    name = b"dltensor_versioned" if max_version else b"dltensor"
    assert _api.PyCapsule_IsValid(cap, name)
    if max_version:
        m = _DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(cap, name))
        assert (m.version.major, m.version.minor) == dlpack.DLPACK_VERSION and m.flags == 0
        dl = m.dl_tensor
    else:
        dl = _DLManagedTensor.from_address(_api.PyCapsule_GetPointer(cap, name)).dl_tensor
    assert dl.data == t.ptr and dl.ndim == 1 and (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (0, 32, 1)
    assert (dl.device.device_type, dl.device.device_id) == (1, 0)


@pytest.mark.parametrize(("np_dtype", "acl_dtype", "code"), [
    (np.float32, DataType.FLOAT, 2), (np.float16, DataType.FLOAT16, 2), (ml_dtypes.bfloat16, DataType.BF16, 4),
    (np.int8, DataType.INT8, 0), (np.uint8, DataType.UINT8, 1), (np.int64, DataType.INT64, 0),
    (np.bool_, DataType.BOOL, 6), (ml_dtypes.float8_e4m3fn, DataType.FLOAT8_E4M3FN, 10),
    (ml_dtypes.float8_e5m2, DataType.FLOAT8_E5M2, 12),
])
def test_round_trip_zero_copy_every_dtype(acl: Any, device0: Any, np_dtype: Any, acl_dtype: DataType,
                                          code: int) -> None:
    host = (np.arange(24) % 5).astype(np.float32).astype(np_dtype).reshape(2, 3, 4)
    t = acl.Tensor.from_numpy(host)
    assert t.dtype == acl_dtype and dlpack._TO_DL[acl_dtype][0] == code
    for mv in (None, (1, 0)):
        u = acl.Tensor.from_dlpack(t.__dlpack__(max_version=mv))
        assert u.ptr == t.ptr and u.shape == t.shape and u.dtype == t.dtype and u.strides == t.strides
        assert u.numpy().tobytes() == host.tobytes()


def test_packed_fp4_round_trip(acl: Any, device0: Any) -> None:
    vals = np.array([0.5, -1.0, 6.0, 0.0, 1.5, -3.0], ml_dtypes.float4_e2m1fn).reshape(3, 2)
    t = acl.Tensor.from_numpy(vals, dtype=DataType.FLOAT4_E2M1)
    u = acl.Tensor.from_dlpack(t)
    v = acl.Tensor.from_dlpack(t.__dlpack__(max_version=(1, 1)))
    assert v.ptr == t.ptr and v.dtype == DataType.FLOAT4_E2M1 and v.shape == t.shape
    assert u.unpack().tobytes() == v.unpack().tobytes() == vals.tobytes()


def test_export_keeps_the_tensor_alive(acl: Any, device0: Any, mock: Any) -> None:
    base = _allocs(mock)
    t = acl.Tensor.from_numpy(np.full(1000, 3.0, np.float32))
    a = np.from_dlpack(t)
    del t
    assert _allocs(mock) == base + 1  # the consumer still holds the producer
    assert float(a.sum()) == 3000.0
    del a
    assert _allocs(mock) == base


def test_unconsumed_capsule_releases(acl: Any, device0: Any, mock: Any) -> None:
    base = _allocs(mock)
    t = acl.Tensor.from_numpy(np.zeros(16, np.float32))
    caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0))]
    del t
    assert _allocs(mock) == base + 1
    del caps
    assert _allocs(mock) == base
    assert dlpack.live_exports() == 0


def test_export_copy_and_argument_checks(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.arange(6, dtype=np.float32))
    cap = t.__dlpack__(max_version=(1, 0), copy=True)
    m = _DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(cap, b"dltensor_versioned"))
    assert m.flags & FLAG_IS_COPIED and m.dl_tensor.data != t.ptr
    c = acl.Tensor.from_dlpack(cap)
    assert c.numpy().tolist() == list(range(6))
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="no DLPack type"):
        acl.Tensor.from_numpy(np.zeros(4, np.uint8), dtype=DataType.HIFLOAT8).__dlpack__()



# the rows of docs/concepts.md's table of what np.from_dlpack does with each low-precision type
DLPACK_TABLE_ROWS = {"bf16": "| bf16, fp8", "fp8_e4m3fn": "| bf16, fp8", "fp8_e8m0": "| bf16, fp8",
                     "fp4_e2m1": "| packed fp4 e2m1", "hifloat8": "| HiFloat8"}


def _documented_outcome(kind: str) -> str:
    """The table's cell for `kind` under the running numpy's version ("the same": the cell before)."""
    lines = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| `np.from_dlpack(t)` with `t` of type"))
    row = next(line for line in lines[header:] if line.startswith(DLPACK_TABLE_ROWS[kind]))
    cells = [c.strip() for c in row.strip("|").split("|")]
    column = 2 if np.lib.NumpyVersion(np.__version__) >= "2.5.0" else 1
    return cells[column] if cells[column] != "the same" else cells[column - 1]


def _low_precision_tensor(acl: Any, kind: str) -> tuple[Any, np.ndarray]:
    values = np.array([0.5, 1.0, 2.0, 4.0], np.float32)
    host, dtype = {
        "bf16": (values.astype(ml_dtypes.bfloat16), None),
        "fp8_e4m3fn": (values.astype(ml_dtypes.float8_e4m3fn), None),
        "fp8_e8m0": (values.astype(ml_dtypes.float8_e8m0fnu), None),
        "fp4_e2m1": (values.astype(ml_dtypes.float4_e2m1fn), DataType.FLOAT4_E2M1),
        "hifloat8": (np.arange(4, dtype=np.uint8), DataType.HIFLOAT8),
    }[kind]
    return acl.Tensor.from_numpy(host, dtype=dtype), host


@pytest.mark.parametrize("kind", sorted(DLPACK_TABLE_ROWS))
def test_numpy_from_dlpack_of_low_precision_types_is_as_documented(acl: Any, device0: Any, kind: str) -> None:
    """What docs/concepts.md says for the running numpy: the exact values, the refusal by numpy
    (exception type and text), or the refusal by Tensor.__dlpack__; no export is left behind."""
    t, host = _low_precision_tensor(acl, kind)
    live = dlpack.live_exports()
    documented = _documented_outcome(kind)
    if documented.startswith("an ml_dtypes array"):
        a = np.from_dlpack(t)
        assert a.dtype == host.dtype and a.tobytes() == host.tobytes()
        del a
    else:
        with pytest.raises((BufferError, RuntimeError)) as caught:
            np.from_dlpack(t)
        if documented == "`BufferError` from `Tensor.__dlpack__`":
            assert type(caught.value) is BufferError and "has no DLPack type code" in str(caught.value)
        else:
            assert documented == f"`{type(caught.value).__name__}: {caught.value}`"
    gc.collect()
    assert dlpack.live_exports() == live


# ------------------------------------------------------------------------------------------ import

def test_import_host_memory_copies(acl: Any, device0: Any) -> None:
    host = np.arange(20, dtype=np.int32).reshape(4, 5)
    t = acl.Tensor.from_dlpack(host)
    assert t.ptr != host.ctypes.data and t.is_contiguous
    assert t.numpy().tolist() == host.tolist()
    host[0, 0] = 99  # a copy: the Tensor does not see it
    assert t.numpy()[0, 0] == 0


@pytest.mark.parametrize("view", ["columns", "reversed", "transposed", "empty", "scalar"])
def test_import_strided_host_views(acl: Any, device0: Any, view: str) -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = {"columns": a[:, 1::2], "reversed": a[::-1, ::-2], "transposed": a.T, "empty": a[:0],
         "scalar": np.array(5.0, np.float32)}[view]
    t = acl.Tensor.from_dlpack(v)
    assert t.shape == v.shape
    np.testing.assert_array_equal(t.numpy(), v)


def test_import_registered_device_memory_is_zero_copy(acl: Any, device0: Any, raw: Any) -> None:
    """Memory a C program got from aclrtMalloc, exposed through any DLPack producer (here numpy over
    the address), is borrowed, not copied."""
    ffi, lib = raw
    cell = ffi.new("void **")
    assert lib.aclrtMalloc(cell, 256, lib.ACL_MEM_MALLOC_HUGE_FIRST) == 0
    addr = int(ffi.cast("uintptr_t", cell[0]))
    try:
        view = np.frombuffer((ctypes.c_float * 64).from_address(addr), np.float32)
        view[:] = np.arange(64, dtype=np.float32)
        t = acl.Tensor.from_dlpack(view[8:40].reshape(4, 8))
        assert t.ptr == addr + 32 and t.shape == (4, 8)
        assert t.numpy().ravel().tolist() == list(range(8, 40))
        assert dlpack.is_mock_device_memory(addr, 256)
        assert not dlpack.is_mock_device_memory(addr, 10_000_000)  # runs past the allocation
        del t, view
        gc.collect()
    finally:
        assert lib.aclrtFree(cell[0]) == 0
    assert lib.aclGetRecentErrMsg() == ffi.NULL  # the probes leave no stale error message


def test_import_rejects_consumed_and_foreign_capsules(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.zeros(4, np.float32))
    cap = t.__dlpack__()
    acl.Tensor.from_dlpack(cap)
    with pytest.raises(BufferError, match="already consumed"):
        acl.Tensor.from_dlpack(cap)
    cap = t.__dlpack__()
    m = _DLManagedTensor.from_address(_api.PyCapsule_GetPointer(cap, b"dltensor"))
    m.dl_tensor.device.device_type = 2  # pretend kDLCUDA
    with pytest.raises(BufferError, match="device type 2"):
        acl.Tensor.from_dlpack(cap)
    with pytest.raises(TypeError, match="DLPack"):
        acl.Tensor.from_dlpack(object())


def test_import_deleter_runs(acl: Any, device0: Any, mock: Any) -> None:
    """The imported Tensor holds the producer's capsule; dropping it releases the producer."""
    base = _allocs(mock)
    t = acl.Tensor.from_numpy(np.ones(8, np.float32))
    u = acl.Tensor.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    del t
    assert _allocs(mock) == base + 1 and u.numpy().sum() == 8
    del u
    assert _allocs(mock) == base and dlpack.live_exports() == 0


# ------------------------------------------------------------------------------------------ numpy's array protocol

def test_array_protocol_round_trip(acl: Any, device0: Any) -> None:
    host = np.arange(12, dtype=np.int16).reshape(3, 4)
    t = acl.Tensor.from_numpy(host)
    a = np.asarray(t)
    assert a.ctypes.data == t.ptr and a.dtype == np.int16 and a.tolist() == host.tolist()
    a *= 2
    assert t.numpy().tolist() == (host * 2).tolist()
    back = acl.Tensor.from_numpy(np.asarray(t))  # a copy through the array protocol
    assert back.ptr != t.ptr and back.numpy().tolist() == (host * 2).tolist()


def test_array_protocol_strided_view(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    col = acl.Tensor.from_address(t.ptr, (3,), DataType.FLOAT, strides=(4,), offset=1, owner=t)
    a = np.asarray(col)
    assert a.tolist() == [1.0, 5.0, 9.0] and a.strides == (16,)
    assert np.asarray(t, dtype=np.float64).dtype == np.float64  # a converted copy
    copied = np.array(t, copy=True)
    copied[0, 0] = 99
    assert t.numpy()[0, 0] == 0


def test_array_protocol_keeps_ml_dtypes_types(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.arange(4).astype(ml_dtypes.bfloat16))
    a = np.asarray(t)
    assert a.dtype == ml_dtypes.bfloat16 and a.ctypes.data == t.ptr
    assert a.astype(np.float32).tolist() == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------ stream protocol

class ForeignStream:
    """Any object exposing ``__acl_stream__`` (e.g. another framework's stream wrapper)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.calls = 0

    def __acl_stream__(self) -> tuple[int, int]:
        self.calls += 1
        return (0, self.handle)


def test_acl_stream_protocol(acl: Any, device0: Any) -> None:
    from aclnn_py.runtime import resolve_stream

    owner = device0.create_stream()
    foreign = ForeignStream(owner.handle)
    assert resolve_stream(foreign).handle == owner.handle
    t = acl.Tensor.from_numpy(np.arange(5, dtype=np.float32), stream=foreign)
    assert t.numpy(stream=foreign).tolist() == [0, 1, 2, 3, 4]
    ev = acl.Event()
    ev.record(foreign)
    ev.synchronize()
    assert foreign.calls >= 3
    assert owner.__acl_stream__() == (0, owner.handle)
    borrowed = acl.Stream.from_handle(owner.handle)
    assert borrowed.__acl_stream__() == owner.__acl_stream__()
    borrowed.close()  # borrowed: does not destroy the handle
    owner.synchronize()
    owner.close()
    with pytest.raises(TypeError, match="__acl_stream__"):
        resolve_stream("not a stream")
