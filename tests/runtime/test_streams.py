"""Streams as users of CuPy and cuda.core expect them: reads wait for the stream that wrote a Tensor,
``with stream:`` makes a stream current, handles are integers, streams come from factories."""

from __future__ import annotations

import threading
import time
from typing import Any

import ml_dtypes
import numpy as np
import pytest


def test_streams_come_from_factories(acl: Any, device0: Any) -> None:
    with pytest.raises(TypeError, match=r"Device.create_stream\(\)"):
        acl.Stream()
    s = device0.create_stream()
    assert s.owned and s.device == 0 and isinstance(s.handle, int) and int(s.handle) == s.handle != 0
    borrowed = acl.Stream.from_handle(s.handle)
    assert not borrowed.owned and borrowed == s and hash(borrowed) == hash(s)
    assert acl.Stream.from_handle(0) == acl.Stream.default(0) == device0.default_stream()
    assert acl.Stream.default(0).handle == 0 and acl.Stream.default(0) != acl.Stream.default(1)
    s.close()


def test_with_stream_makes_it_current(acl: Any, device0: Any) -> None:
    s, t = device0.create_stream(), device0.create_stream()
    assert acl.current_stream() == acl.Stream.default(0)
    with s:
        assert acl.current_stream() is s
        up = acl.Tensor.from_numpy(np.arange(4, dtype=np.float32))  # queued on the current stream
        assert up.writer is s
        with t:
            assert acl.current_stream() is t
        assert acl.current_stream() is s
    assert acl.current_stream() == acl.Stream.default(0)
    assert up.numpy().tolist() == [0, 1, 2, 3]
    sync = acl.Tensor.from_numpy(np.zeros(2, np.float32))  # no current stream: a synchronous copy
    assert sync.writer is None
    seen: list[Any] = []
    with s:  # the current stream is per thread
        th = threading.Thread(target=lambda: (acl.Device(0).set_current(), seen.append(acl.current_stream())))
        th.start()
        th.join()
    assert seen == [acl.Stream.default(0)]
    s.close()
    t.close()


def test_with_stream_does_not_close_it(acl: Any, device0: Any) -> None:
    s = device0.create_stream()
    with s:
        pass
    assert not s.closed
    s.synchronize()
    s.close()


def _blocked(acl: Any, rank: int, world_size: int, root: bytes, gate: threading.Event) -> Any:
    """Rank 0 queues a barrier (rank 1 enters it only once `gate` is set), then a write behind it."""
    comm = acl.hccl.Communicator(world_size, rank, root)
    s = acl.Device.current().create_stream()
    if rank == 1:
        gate.wait(30)
    comm.barrier(s, wait=False)
    return comm, s


def test_numpy_waits_for_the_stream_that_wrote_the_tensor(acl: Any) -> None:
    gate = threading.Event()
    got: dict[str, Any] = {}

    def rank_body(rank: int, world_size: int, root: bytes) -> None:
        comm, s = _blocked(acl, rank, world_size, root, gate)
        if rank == 0:
            t = acl.Tensor.from_numpy(np.zeros(8, np.int32))
            t.fill_bytes(7, stream=s)  # queued behind the barrier
            assert t.writer is s
            threading.Timer(0.5, gate.set).start()
            t0 = time.monotonic()
            got["values"] = t.numpy()  # no stream given: waits for the writer
            got["waited"] = time.monotonic() - t0
        s.synchronize()
        s.close()
        comm.close()

    acl.worlds.run_threads(rank_body, 2)
    assert got["waited"] >= 0.3 and (got["values"] == 0x07070707).all()


def _dispatch_read_body(rank: int, world_size: int, root: bytes) -> list[int]:
    import aclnn_py as acl
    from aclnn_py import _mock

    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device.current().create_stream()
        _mock.inject_fault("dispatch", rank, "delay", 0.3)  # a slow kernel: a read that does not wait sees poison
        x = np.ones((2, 1024), ml_dtypes.bfloat16)
        out = buf.low_latency_dispatch(x, np.array([[0], [1]]), 2, stream=s)
        counts = out.ep_recv_counts.numpy().tolist()  # waits for `s`, the stream that wrote it
        s.close()
        return counts


def test_outputs_read_right_after_dispatch_are_complete(acl: Any) -> None:
    for counts in acl.worlds.run_threads(_dispatch_read_body, 2):
        assert counts == [1, 2]
