"""The runtime and aclnn-meta C API through the raw cffi layer (aclnn_py._aclnn bound to the mock):
the documented behaviour of every call and its error codes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_REPEAT_INITIALIZE = 100002


def msg(ffi, lib) -> str | None:
    p = lib.aclGetRecentErrMsg()
    return None if p == ffi.NULL else ffi.string(p).decode()


def malloc(ffi, lib, size):
    cell = ffi.new("void **")
    assert lib.aclrtMalloc(cell, size, lib.ACL_MEM_MALLOC_HUGE_FIRST) == 0
    return cell[0]


def test_repeat_init_returns_100002(raw):
    ffi, lib = raw
    assert lib.aclInit(ffi.NULL) == ACL_ERROR_REPEAT_INITIALIZE  # the fixture initialised already


def test_error_message_is_thread_local_and_cleared_on_read(raw):
    ffi, lib = raw
    msg(ffi, lib)
    cell = ffi.new("void **")
    assert lib.aclrtMalloc(cell, 0, 0) == ACL_ERROR_INVALID_PARAM
    seen = []
    t = threading.Thread(target=lambda: seen.append(msg(ffi, lib)))
    t.start()
    t.join()
    assert seen == [None]  # another thread does not see this thread's message
    text = msg(ffi, lib)
    assert text is not None and "aclrtMalloc" in text and "size" in text
    assert msg(ffi, lib) is None  # cleared on read


def test_soc_and_device_count(raw):
    ffi, lib = raw
    assert ffi.string(lib.aclrtGetSocName()) == b"Ascend910_93"
    n = ffi.new("uint32_t *")
    assert lib.aclrtGetDeviceCount(n) == 0 and n[0] == 16


def test_current_device_is_per_thread(raw):
    ffi, lib = raw
    assert lib.aclrtSetDevice(3) == 0
    out = []

    def other():
        d = ffi.new("int32_t *")
        out.append(lib.aclrtGetDevice(d))
        lib.aclrtSetDevice(5)
        lib.aclrtGetDevice(d)
        out.append(d[0])
        msg(ffi, lib)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert out[0] != 0 and out[1] == 5  # no device set on a new thread → error
    d = ffi.new("int32_t *")
    assert lib.aclrtGetDevice(d) == 0 and d[0] == 3
    assert lib.aclrtSetDevice(16) != 0  # out of range
    assert "16" in msg(ffi, lib)
    lib.aclrtSetDevice(0)


def test_malloc_alignment_poison_and_free(raw, mock):
    ffi, lib = raw
    before = mock.stats()["allocations"]
    p = malloc(ffi, lib, 100)
    assert int(ffi.cast("uintptr_t", p)) % 64 == 0
    assert bytes(ffi.buffer(p, 100)) == b"\xa5" * 100
    assert mock.stats()["allocations"] == before + 1
    assert lib.aclrtFree(p) == 0
    assert mock.stats()["allocations"] == before
    assert lib.aclrtFree(p) != 0  # double free is an error, not a crash
    assert "aclrtFree" in msg(ffi, lib)


def test_poison_can_be_turned_off(raw, mock):
    ffi, lib = raw
    mock.set_poison(False)
    try:
        assert mock.poison() is False
    finally:
        mock.set_poison(True)
    p = malloc(ffi, lib, 64)
    assert bytes(ffi.buffer(p, 64)) == b"\xa5" * 64
    lib.aclrtFree(p)


def test_memcpy_bounds(raw):
    ffi, lib = raw
    dev = malloc(ffi, lib, 64)  # block is align32(64)+32 = 96 bytes
    host = np.arange(256, dtype=np.uint8)
    hp = ffi.cast("void *", host.ctypes.data)
    assert lib.aclrtMemcpy(dev, 64, hp, 64, lib.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    assert lib.aclrtMemcpy(dev, 32, hp, 64, lib.ACL_MEMCPY_HOST_TO_DEVICE) == ACL_ERROR_INVALID_PARAM  # > destMax
    assert "destMax" in msg(ffi, lib) or "dest" in msg(ffi, lib)
    assert lib.aclrtMemcpy(dev, 256, hp, 256, lib.ACL_MEMCPY_HOST_TO_DEVICE) != 0  # runs past the block
    msg(ffi, lib)
    # a host pointer where the kind says device
    assert lib.aclrtMemcpy(hp, 64, dev, 64, lib.ACL_MEMCPY_HOST_TO_DEVICE) != 0
    assert msg(ffi, lib)
    out = np.zeros(64, np.uint8)
    assert lib.aclrtMemcpy(ffi.cast("void *", out.ctypes.data), 64, dev, 64, lib.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    assert out.tolist() == list(range(64))
    assert lib.aclrtMemset(dev, 64, 7, 64) == 0
    assert bytes(ffi.buffer(dev, 64)) == b"\x07" * 64
    assert lib.aclrtMemset(dev, 8, 7, 64) != 0
    msg(ffi, lib)
    lib.aclrtFree(dev)


def test_stream_async_ordered_and_sync(raw):
    ffi, lib = raw
    s = ffi.new("aclrtStream *")
    assert lib.aclrtCreateStream(s) == 0
    dev = malloc(ffi, lib, 4096)
    for v in range(50):  # ordered: the last memset wins
        assert lib.aclrtMemsetAsync(dev, 4096, v, 4096, s[0]) == 0
    assert lib.aclrtSynchronizeStream(s[0]) == 0
    assert bytes(ffi.buffer(dev, 4096)) == bytes([49]) * 4096
    assert lib.aclrtSynchronizeStreamWithTimeout(s[0], 1000) == 0
    assert lib.aclrtDestroyStream(s[0]) == 0
    assert lib.aclrtDestroyStream(s[0]) != 0  # destroyed handle: an error, not a crash
    msg(ffi, lib)
    assert lib.aclrtSynchronizeStream(ffi.NULL) == 0  # default stream
    lib.aclrtFree(dev)


def test_stream_failure_reported_by_sync(raw):
    ffi, lib = raw
    s = ffi.new("aclrtStream *")
    lib.aclrtCreateStream(s)
    # enqueue an async copy whose source is bogus device memory: the enqueue itself fails fast
    dev = malloc(ffi, lib, 64)
    ret = lib.aclrtMemcpyAsync(dev, 64, ffi.cast("void *", 64), 64, lib.ACL_MEMCPY_DEVICE_TO_DEVICE, s[0])
    assert ret != 0
    assert msg(ffi, lib)
    assert lib.aclrtSynchronizeStream(s[0]) == 0
    lib.aclrtDestroyStream(s[0])
    lib.aclrtFree(dev)


def test_events_record_query_elapsed(raw):
    ffi, lib = raw
    s = ffi.new("aclrtStream *")
    lib.aclrtCreateStream(s)
    e1, e2 = ffi.new("aclrtEvent *"), ffi.new("aclrtEvent *")
    assert lib.aclrtCreateEvent(e1) == 0 and lib.aclrtCreateEvent(e2) == 0
    ms = ffi.new("float *")
    assert lib.aclrtEventElapsedTime(ms, e1[0], e2[0]) != 0  # never recorded
    msg(ffi, lib)
    assert lib.aclrtRecordEvent(e1[0], s[0]) == 0
    dev = malloc(ffi, lib, 1 << 20)
    lib.aclrtMemsetAsync(dev, 1 << 20, 1, 1 << 20, s[0])
    assert lib.aclrtRecordEvent(e2[0], s[0]) == 0
    assert lib.aclrtSynchronizeEvent(e2[0]) == 0
    st = ffi.new("aclrtEventRecordedStatus *")
    assert lib.aclrtQueryEventStatus(e2[0], st) == 0 and st[0] == lib.ACL_EVENT_RECORDED_STATUS_COMPLETE
    assert lib.aclrtEventElapsedTime(ms, e1[0], e2[0]) == 0 and ms[0] >= 0.0
    # a second stream waits for an event of the first
    s2 = ffi.new("aclrtStream *")
    lib.aclrtCreateStream(s2)
    assert lib.aclrtStreamWaitEvent(s2[0], e2[0]) == 0
    assert lib.aclrtSynchronizeStream(s2[0]) == 0
    for e in (e1, e2):
        assert lib.aclrtDestroyEvent(e[0]) == 0
    for st_ in (s, s2):
        lib.aclrtDestroyStream(st_[0])
    lib.aclrtFree(dev)


def test_tensor_create_getters_destroy(raw, mock):
    ffi, lib = raw
    dims = ffi.new("int64_t[]", [2, 3])
    strides = ffi.new("int64_t[]", [3, 1])
    storage = ffi.new("int64_t[]", [8])
    dev = malloc(ffi, lib, 64)
    before = mock.stats()["tensors"]
    t = lib.aclCreateTensor(dims, 2, lib.ACL_BF16, strides, 2, lib.ACL_FORMAT_ND, storage, 1, dev)
    assert t != ffi.NULL and mock.stats()["tensors"] == before + 1
    dt, fmt, off, addr = ffi.new("aclDataType *"), ffi.new("aclFormat *"), ffi.new("int64_t *"), ffi.new("void **")
    assert lib.aclGetDataType(t, dt) == 0 and dt[0] == lib.ACL_BF16
    assert lib.aclGetFormat(t, fmt) == 0 and fmt[0] == lib.ACL_FORMAT_ND
    assert lib.aclGetViewOffset(t, off) == 0 and off[0] == 2
    assert lib.aclGetRawTensorAddr(t, addr) == 0 and addr[0] == dev
    assert lib.aclSetRawTensorAddr(t, ffi.NULL) == 0
    assert lib.aclGetRawTensorAddr(t, addr) == 0 and addr[0] == ffi.NULL
    assert lib.aclGetDataType(t, ffi.NULL) == 161001
    assert lib.aclGetDataType(ffi.NULL, dt) == 161001
    msg(ffi, lib)
    assert lib.aclDestroyTensor(t) == 0
    assert mock.stats()["tensors"] == before
    assert lib.aclDestroyTensor(ffi.NULL) == 0
    # NULL dims with a count, negative dims → NULL and a message
    assert lib.aclCreateTensor(ffi.NULL, 2, lib.ACL_FLOAT, ffi.NULL, 0, lib.ACL_FORMAT_ND, storage, 1, dev) == ffi.NULL
    assert msg(ffi, lib)
    neg = ffi.new("int64_t[]", [-1, 3])
    assert lib.aclCreateTensor(neg, 2, lib.ACL_FLOAT, ffi.NULL, 0, lib.ACL_FORMAT_ND, storage, 1, dev) == ffi.NULL
    assert msg(ffi, lib)
    lib.aclrtFree(dev)


def test_datatype_size(raw):
    ffi, lib = raw
    assert lib.aclDataTypeSize(lib.ACL_BF16) == 2
    assert lib.aclDataTypeSize(lib.ACL_FLOAT) == 4
    assert lib.aclDataTypeSize(lib.ACL_INT64) == 8
    assert lib.aclDataTypeSize(lib.ACL_DT_UNDEFINED) == 0


def test_mem_info(raw):
    ffi, lib = raw
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    assert lib.aclrtGetMemInfo(lib.ACL_HBM_MEM, free, total) == 0
    assert 0 < free[0] <= total[0]
    p = malloc(ffi, lib, 1 << 20)
    free2 = ffi.new("size_t *")
    lib.aclrtGetMemInfo(lib.ACL_HBM_MEM, free2, total)
    assert free2[0] <= free[0] - (1 << 20)
    lib.aclrtFree(p)


def test_malloc_host(raw):
    ffi, lib = raw
    p = ffi.new("void **")
    assert lib.aclrtMallocHost(p, 128) == 0
    assert lib.aclrtFreeHost(p[0]) == 0
    assert lib.aclrtFreeHost(p[0]) != 0
    msg(ffi, lib)


@pytest.mark.parametrize("bad", ["freed", "interior"])
def test_free_of_unknown_pointer_is_an_error(raw, bad):
    ffi, lib = raw
    p = malloc(ffi, lib, 256)
    if bad == "freed":
        lib.aclrtFree(p)
        target = p
    else:
        target = ffi.cast("void *", int(ffi.cast("uintptr_t", p)) + 64)
    assert lib.aclrtFree(target) != 0
    assert "aclrtFree" in msg(ffi, lib)
    if bad == "interior":
        lib.aclrtFree(p)


def test_a_block_made_where_a_lookup_missed_is_found(raw):
    """The mock remembers the gaps between blocks that a thread's lookups fell in (a copy from host
    memory looks its source up) until a block is made or freed: a block made in a remembered gap is
    found at once."""
    ffi, lib = raw
    size = 1 << 23  # mapped, not from the heap: made again at the address just freed
    data = np.arange(64, dtype=np.uint8)
    first = malloc(ffi, lib, size)
    assert lib.aclrtFree(first) == 0
    refused = lib.aclrtMemcpy(first, 64, ffi.from_buffer(data), 64, lib.ACL_MEMCPY_HOST_TO_DEVICE)
    assert refused != 0 and "aclrtMemcpy" in msg(ffi, lib)  # nothing there now: the miss is remembered
    second = malloc(ffi, lib, size)
    assert second == first, "the test needs the new block at the freed one's address"
    assert lib.aclrtMemcpy(second, 64, ffi.from_buffer(data), 64, lib.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    back = np.zeros(64, np.uint8)
    assert lib.aclrtMemcpy(ffi.from_buffer(back), 64, second, 64, lib.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    assert (back == data).all()
    assert lib.aclrtFree(second) == 0
