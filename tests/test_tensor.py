"""Tensor: upload/download, borrowed memory, descriptors, zero-copy numpy and DLPack on the mock."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from aclnn_py.dtypes import DataType


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int8, np.int32, np.int64,
                                   np.bool_, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu])
def test_round_trip(acl, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(dtype)
    t = acl.Tensor.from_numpy(a)
    assert t.shape == (3, 5) and t.dtype == acl.dtypes.from_numpy(dtype)
    assert t.numpy().tobytes() == a.tobytes()


def test_upload_on_stream(acl, device0):
    with device0.create_stream() as s:
        a = np.arange(100000, dtype=np.float32)
        t = acl.Tensor.from_numpy(a, stream=s)
        assert np.array_equal(t.numpy(stream=s), a)


def test_empty_is_poisoned_and_zeros(acl):
    t = acl.Tensor.empty((4, 4), np.uint8)
    assert (t.numpy() == 0xA5).all()
    z = acl.Tensor.zeros((4, 4), np.float32)
    assert (z.numpy() == 0).all()
    assert acl.Tensor.empty((0, 3), np.float32).numpy().shape == (0, 3)



@pytest.mark.parametrize("device_id", [0, 1])
def test_device_is_the_device_the_memory_was_allocated_on(acl, device_id):
    acl.Device(device_id).set_current()
    try:
        tensors = [acl.Tensor.empty((4,), np.float32), acl.Tensor.zeros((4,), np.float32),
                   acl.Tensor.from_numpy(np.arange(4, dtype=np.int32)), acl.DeviceMemory(64)]
        assert [t.device for t in tensors] == [device_id] * 4
        assert acl.Tensor.from_dlpack(tensors[0]).device == device_id  # a borrower knows its owner's device
        other = 1 - device_id
        assert acl.Tensor.zeros((2,), np.float32, device=other).device == other  # an explicit device wins
    finally:
        acl.Device(0).set_current()


def test_from_address_borrowed_strided_view(acl):
    base = acl.Tensor.from_numpy(np.arange(24, dtype=np.int32).reshape(4, 6))
    col = acl.Tensor.from_address(base.ptr, (4, 2), np.int32, strides=(6, 1), offset=2, owner=base)
    assert not col.is_contiguous
    assert col.numpy().tolist() == [[2, 3], [8, 9], [14, 15], [20, 21]]
    assert col.numpy_view().tolist() == [[2, 3], [8, 9], [14, 15], [20, 21]]
    del base
    assert col.numpy()[0, 0] == 2  # the owner is kept alive by the borrowed view


def test_descriptor_cached_and_destroyed(acl, mock):
    t = acl.Tensor.from_numpy(np.ones((2, 2), np.float32))
    before = mock.stats()["tensors"]
    d = t.descriptor()
    assert t.descriptor() == d  # made once: the same descriptor
    assert mock.stats()["tensors"] == before + 1
    ffi, lib = acl.backend().ffi, acl.backend().lib
    dt = ffi.new("aclDataType *")
    assert lib.aclGetDataType(d, dt) == 0 and dt[0] == int(DataType.FLOAT)
    t.close()
    assert mock.stats()["tensors"] == before


def test_numpy_view_is_zero_copy(acl):
    t = acl.Tensor.from_numpy(np.zeros(8, ml_dtypes.bfloat16))
    v = t.numpy_view()
    v[3] = 2.5
    assert t.numpy()[3] == 2.5
    del t
    v[0] = 1.0  # the view keeps the memory alive
    assert v[0] == 1.0


def test_array_interface_and_dlpack(acl):
    t = acl.Tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    a = np.asarray(t)
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    a[0, 0] = 9
    assert t.numpy()[0, 0] == 9
    assert t.__dlpack_device__() == (1, 0)
    d = np.from_dlpack(t)
    assert d.tolist() == [[9, 1, 2], [3, 4, 5]]


def test_packed_fp4_upload(acl):
    vals = np.array([[0.5, 1.0, -2.0, 6.0]], dtype=ml_dtypes.float4_e2m1fn)
    t = acl.Tensor.from_numpy(vals)
    assert t.dtype == DataType.FLOAT4_E2M1 and t.shape == (1, 4) and t.nbytes == 2
    assert t.numpy().shape == (1, 2) and t.numpy().dtype == np.uint8
    assert t.unpack().astype(np.float32).tolist() == [[0.5, 1.0, -2.0, 6.0]]
    raw = acl.Tensor.from_numpy(t.numpy(), dtype=DataType.FLOAT4_E2M1)
    assert raw.shape == (1, 4) and raw.numpy().tobytes() == t.numpy().tobytes()


def test_hifloat8_bytes(acl):
    t = acl.Tensor.from_numpy(np.arange(4, dtype=np.uint8), dtype=DataType.HIFLOAT8)
    assert t.dtype == DataType.HIFLOAT8 and t.numpy().tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError):
        acl.Tensor.from_numpy(np.zeros(4, np.float32), dtype=DataType.HIFLOAT8)


def test_copy_from_size_mismatch(acl):
    t = acl.Tensor.empty((4,), np.float32)
    t.copy_from(np.arange(4, dtype=np.float32))
    assert t.numpy().tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        t.copy_from(np.arange(5, dtype=np.float32))


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu,
                                   ml_dtypes.bfloat16])
def test_low_precision_views_keep_their_dtype(acl, dtype):
    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(dtype)
    t = acl.Tensor.from_numpy(a)
    v = t.numpy_view()
    assert v.dtype == np.dtype(dtype) and v.tobytes() == a.tobytes()
    col = acl.Tensor.from_address(t.ptr, (3, 2), t.dtype, strides=(4, 1), offset=1, owner=t)
    assert col.numpy().dtype == np.dtype(dtype)
    assert col.numpy().tobytes() == np.ascontiguousarray(a[:, 1:3]).tobytes()
    assert col.numpy_view().tobytes() == np.ascontiguousarray(a[:, 1:3]).tobytes()


def _raw_tensor(acl, addr):
    """aclCreateTensor of a (4,) float32 ND view whose storage starts at `addr` (NULL on refusal)."""
    b = acl.backend()
    ffi = b.ffi
    dims = ffi.new("int64_t[]", [4])
    return b.lib.aclCreateTensor(dims, 1, int(DataType.FLOAT), ffi.NULL, 0, b.lib.ACL_FORMAT_ND, dims, 1,
                                 ffi.cast("void *", addr))


def test_create_tensor_needs_a_32_byte_aligned_storage_base(acl):
    from aclnn_py.errors import _recent_message

    ffi, lib = acl.backend().ffi, acl.backend().lib
    mem = acl.DeviceMemory(256)
    assert mem.ptr % 64 == 0
    for off in (1, 2, 4, 8, 16, 48):
        assert _raw_tensor(acl, mem.ptr + off) == ffi.NULL, off
        m = _recent_message()
        assert "aclCreateTensor: tensorData (the storage base) must be 32-byte aligned, or NULL" in m, m
        assert hex(mem.ptr + off) in m, m
    for addr in (0, mem.ptr, mem.ptr + 32, mem.ptr + 96):     # NULL and aligned bases are fine
        t = _raw_tensor(acl, addr)
        assert t != ffi.NULL, _recent_message()
        assert lib.aclDestroyTensor(t) == 0
    # an element further in is addressed with the offset, not the base
    t = acl.Tensor.from_address(mem.ptr, (4,), np.float32, offset=3, owner=mem)
    assert t.descriptor() != ffi.NULL


def test_set_raw_tensor_addr_needs_a_32_byte_aligned_base(acl):
    from aclnn_py.errors import _recent_message

    lib, ffi = acl.backend().lib, acl.backend().ffi
    mem = acl.DeviceMemory(256)
    t = _raw_tensor(acl, mem.ptr)
    assert lib.aclSetRawTensorAddr(t, ffi.cast("void *", mem.ptr + 16)) == 161002
    assert "aclSetRawTensorAddr: addr (the storage base) must be 32-byte aligned" in _recent_message()
    assert lib.aclSetRawTensorAddr(t, ffi.cast("void *", mem.ptr + 64)) == 0
    cell = ffi.new("void **")
    assert lib.aclGetRawTensorAddr(t, cell) == 0 and int(ffi.cast("uintptr_t", cell[0])) == mem.ptr + 64
    assert lib.aclDestroyTensor(t) == 0


# ---- copies ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("copier", ["copy", "deepcopy", "clone"])
def test_a_copy_is_a_tensor_of_its_own(acl, mock, copier):
    """copy.copy / copy.deepcopy / clone(): new memory with the same bytes and a descriptor of its own;
    either survives the other's close and changes."""
    import copy

    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = acl.Tensor.from_numpy(a)
    t.descriptor()
    c = {"copy": copy.copy, "deepcopy": copy.deepcopy, "clone": lambda x: x.clone()}[copier](t)
    assert isinstance(c, acl.Tensor) and c.ptr != t.ptr and (c.shape, c.dtype) == (t.shape, t.dtype)
    assert c._desc_addr is None or c._desc_addr != t._desc_addr
    assert c.numpy().tobytes() == a.tobytes()
    t.copy_from(a + 1)
    assert c.numpy().tobytes() == a.tobytes()  # the original's later writes do not reach the copy
    before = mock.stats()["tensors"]
    t.close()
    assert c.numpy().tobytes() == a.tobytes()
    c.descriptor()
    c.close()  # a complete Tensor: closing it destroys its own descriptor
    assert mock.stats()["tensors"] == before - 1
    assert c.closed


def test_clone_on_a_stream_follows_pending_writes(acl, device0):
    with device0.create_stream() as s:
        a = np.arange(1 << 16, dtype=np.int32)
        t = acl.Tensor.from_numpy(a, stream=s)  # queued
        c = t.clone(stream=s)
        assert c.writer is s
        del t  # the queued copy still reads the source's memory
        assert np.array_equal(c.numpy(), a)


def test_a_strided_view_clones_to_a_contiguous_tensor(acl):
    base = acl.Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    view = acl.Tensor.from_address(base.ptr, (3, 2), np.float32, strides=(4, 2), owner=base)
    c = view.clone()
    assert c.is_contiguous and np.array_equal(c.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2])


def test_a_tensor_is_not_pickled(acl):
    import pickle

    with pytest.raises(TypeError, match=r"cannot be pickled; pickle its numpy\(\)"):
        pickle.dumps(acl.Tensor.from_numpy(np.zeros(3, np.float32)))


def test_making_a_tensor_on_another_device_keeps_the_callers_device(acl, device0):
    """Tensor.from_numpy(..., device=d) / Tensor.empty / DeviceMemory on another device: the calling
    thread's device (and current stream's device) stays what it was, as with CuPy's device context."""
    t = acl.Tensor.from_numpy(np.ones(8, np.float32), device=1)
    assert t.device == 1
    assert acl.Device.current().id == 0
    e = acl.Tensor.empty((4,), np.float32, device=2)
    m = acl.DeviceMemory(64, device=3)
    assert (e.device, m.device, acl.Device.current().id) == (2, 3, 0)
    assert acl.Stream.default().device == 0
    np.testing.assert_array_equal(t.numpy(), np.ones(8, np.float32))


def test_a_partial_downloads_pages_read_zero_when_handed_out_again(acl):
    """A download that copies part of a Tensor is made over fresh pages (aclnn_py._core.ZeroPages): the
    mapping is kept when its array dies and handed out to the next one of its size, reading zero again
    whatever was written into it; one still in use is never handed out."""
    from aclnn_py import _core

    n = 3 * 4096 + 100
    first = np.frombuffer(_core.ZeroPages(n), np.uint8)
    assert first.size == n and not first.any()
    address = first.ctypes.data
    first[:] = 0xFF  # the caller writes every byte
    other = np.frombuffer(_core.ZeroPages(n), np.uint8)
    assert other.ctypes.data != address
    kept = _core.zero_pages_held()
    del first
    assert _core.zero_pages_held() == (kept[0] + 1, kept[1] + 4 * 4096)
    again = np.frombuffer(_core.ZeroPages(n), np.uint8)
    assert again.ctypes.data == address and not again.any()
    assert _core.zero_pages_held() == kept
    with pytest.raises(ValueError, match="nbytes must be > 0"):
        _core.ZeroPages(0)
