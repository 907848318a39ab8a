"""Device, Stream, Event and DeviceMemory objects, and typed errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest


def test_device_current_count_soc(acl, device0):
    assert acl.Device.count() == 16
    assert acl.Device.current() == acl.Device(0)
    assert acl.soc_name() == "Ascend910_93"
    free, total = device0.mem_info()
    assert 0 < free <= total


def test_invalid_device_raises_typed_error(acl):
    with pytest.raises(acl.AclError) as ei:
        acl.Device(99).set_current()
    e = ei.value
    assert e.code != 0 and e.func == "aclrtSetDevice" and "99" in e.message
    assert e.name.startswith("ACL_ERROR")


def test_zero_size_allocation_error(acl):
    with pytest.raises(acl.AclError) as ei:
        acl.DeviceMemory(0)
    assert ei.value.code == 100000 and ei.value.name == "ACL_ERROR_INVALID_PARAM"
    assert "size" in str(ei.value)


def test_device_memory_close_and_context_manager(acl, mock):
    pool = acl.get_memory_pool()
    pool.free_all_blocks()
    before = mock.stats()["allocations"]
    with acl.DeviceMemory(1000) as m:
        assert m.ptr % 64 == 0 and m.size == 1000
        assert mock.stats()["allocations"] == before + 1
    # closed: the block went back to the pool, which frees it on demand
    assert m.closed and mock.stats()["allocations"] == before + 1
    pool.free_all_blocks()
    assert mock.stats()["allocations"] == before
    with pytest.raises(acl.ClosedError, match=r"DeviceMemory\(0x[0-9a-f]+, 1000 bytes\) is closed"):
        _ = m.ptr
    m.close()  # idempotent


def test_stream_owned_borrowed_protocol(acl, device0):
    s = device0.create_stream()
    v, h = s.__acl_stream__()
    assert v == 0 and h == s.handle == int(s.handle) and h != 0
    b = acl.Stream.from_handle(h)
    b.synchronize()
    b.close()  # borrowed: does not destroy
    s.synchronize(timeout_ms=1000)

    class Foreign:
        def __acl_stream__(self):
            return (0, h)

    from aclnn_py.runtime import resolve_stream

    assert resolve_stream(Foreign()).handle == h == acl.Stream.from_handle(Foreign()).handle
    s.close()
    with pytest.raises(acl.AclError):
        acl.Stream.from_handle(h).synchronize()  # destroyed handle → error, not a crash
    with pytest.raises(TypeError, match="stream: expected a Stream"):
        resolve_stream(3.5)


def test_events_time_work(acl, device0):
    with device0.create_stream() as s:
        start = s.record_event()
        t = acl.Tensor.empty((1 << 20,), np.uint8)
        t.fill_bytes(3, stream=s)
        end = s.record_event()
        end.synchronize()
        assert end.query() and start.query()
        assert start.elapsed_ms(end) >= 0.0
        other = device0.create_stream()
        other.wait_event(end)
        other.synchronize()
        other.close()
        assert t.numpy()[:4].tolist() == [3, 3, 3, 3]
        with pytest.raises(acl.AclError):
            acl.Event().elapsed_ms(acl.Event())  # never recorded


def test_threads_drive_different_devices(acl):
    results = {}

    def work(dev):
        acl.Device(dev).set_current()
        with acl.Device(dev).create_stream() as s:
            t = acl.Tensor.from_numpy(np.full(1000, dev, np.int32), stream=s)
            s.synchronize()
            results[dev] = (acl.Device.current().id, int(t.numpy().sum()))

    threads = [threading.Thread(target=work, args=(d,)) for d in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {d: (d, 1000 * d) for d in range(4)}


def test_version(acl):
    from aclnn_py.runtime import version

    major, minor, patch = version()
    assert major >= 1 and minor >= 0 and patch >= 0
