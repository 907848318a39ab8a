"""Who runs the mock's stream work (docs/reliability.md, "Streams"): a thread that synchronises a stream
runs the queued tasks itself, pausing at a collective's wait for its peers; work nobody synchronises is
started by the stream's worker within a few milliseconds; a thread that launched on several streams
starts the others' work when it blocks on one."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import ml_dtypes
import numpy as np

ROUNDS = 10


def _two_tokens(stream: Any) -> tuple[Any, Any]:
    """A rank's x (2 tokens of H 1024) and expert ids (token t to expert t), uploaded on `stream`."""
    import aclnn_py as acl

    x = acl.Tensor.from_numpy(np.ones((2, 1024), ml_dtypes.bfloat16), stream=stream)
    ids = acl.Tensor.from_numpy(np.array([[0], [1]], np.int32), stream=stream)
    stream.synchronize()
    return x, ids


def _rounds_body(rank: int, world_size: int, root: bytes) -> None:
    import aclnn_py as acl

    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device.current().create_stream()
        x, ids = _two_tokens(s)
        for _ in range(ROUNDS):
            out = buf.low_latency_dispatch(x, ids, world_size, stream=s)
            buf.low_latency_combine(out.expand_x, ids, None, out.assist_info_for_combine, out.ep_recv_counts,
                                    num_experts=world_size, stream=s)
            s.synchronize()
        s.close()


def test_a_synchronising_thread_runs_the_kernels_it_waits_for(acl: Any) -> None:
    from aclnn_py import _mock

    before = _mock.stats()
    acl.worlds.run_threads(_rounds_body, 2)
    after = _mock.stats()
    by_sync = after["tasks_run_by_synchronise"] - before["tasks_run_by_synchronise"]
    kernels = 2 * ROUNDS * 2
    # a rank thread held up between its launch and its synchronisation for longer than the lazy start
    # leaves a round to its worker: a loaded machine may do that a few times, never for most rounds
    assert by_sync >= kernels // 2, (by_sync, after)


def test_work_nobody_synchronises_still_runs(acl: Any, device0: Any) -> None:
    from aclnn_py import _mock

    t = acl.Tensor.from_numpy(np.zeros(64, np.uint8))  # a synchronous copy
    s = device0.create_stream()
    before = _mock.stats()
    late = before["late_starts"]
    t.fill_bytes(0x5A, stream=s)  # queued; this thread never synchronises s
    raw = np.frombuffer((ctypes.c_uint8 * 64).from_address(t.data_ptr), np.uint8)  # no wait, unlike numpy_view
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (raw == 0x5A).all():
        time.sleep(0.002)
    assert (raw == 0x5A).all(), "the queued memset never ran"
    after = _mock.stats()
    assert after["late_starts"] > late
    assert after["stream_workers_started"] > before["stream_workers_started"]  # made for that work
    t.close()
    s.close()


def test_streams_whose_work_their_synchronising_thread_runs_make_no_worker_thread(acl: Any, device0: Any) -> None:
    from aclnn_py import _mock

    before = _mock.stats()["stream_workers_started"]
    for _ in range(100):
        device0.create_stream().close()
    assert _mock.stats()["stream_workers_started"] == before
    streams = [device0.create_stream() for _ in range(20)]
    tensors = [acl.Tensor.from_numpy(np.zeros(64, np.uint8)) for _ in streams]  # one per stream: no cross-stream wait
    for i, (s, t) in enumerate(zip(streams, tensors)):
        t.fill_bytes(i, stream=s)
        s.synchronize()
        assert (t.numpy() == i).all()
    # a thread held up between its launch and its synchronisation for longer than the lazy start
    # (a loaded machine) leaves that stream's work to a worker: now and then, not for most streams
    assert _mock.stats()["stream_workers_started"] - before < len(streams) // 2
    for s, t in zip(streams, tensors):
        t.close()
        s.close()


def test_closing_a_stream_runs_what_is_queued_on_it_first(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.zeros(1 << 16, np.uint8))
    raw = np.frombuffer((ctypes.c_uint8 * t.nbytes).from_address(t.data_ptr), np.uint8)
    for value in (1, 2, 3):
        s = device0.create_stream()
        t.fill_bytes(value, stream=s)   # queued, never synchronised: no thread has run it yet
        s.close()
        assert (raw == value).all()
    t.close()


def test_one_thread_driving_two_ranks_starts_the_other_rank_when_it_blocks(acl: Any) -> None:
    """Launch on each rank's stream, then synchronise them in turn: the first synchronisation pauses at
    the exchange, and the thread starts the other rank's queued work instead of leaving it to wait for
    the lazy start."""
    from aclnn_py import _mock

    root = acl.hccl.RootInfo.create()
    comms: list[Any] = [None, None]

    def join(rank: int) -> None:
        acl.Device(rank).set_current()
        comms[rank] = acl.hccl.Communicator(2, rank, root)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    bufs = [acl.MoeDistributeBuffer(c) for c in comms]
    streams = [acl.Device(r).create_stream() for r in range(2)]
    x = np.ones((2, 1024), ml_dtypes.bfloat16)
    ids = np.array([[0], [1]], np.int32)
    late = _mock.stats()["late_starts"]
    for _ in range(ROUNDS):
        outs = []
        for r in range(2):
            acl.Device(r).set_current()
            outs.append(bufs[r].low_latency_dispatch(x, ids, 2, stream=streams[r]))
        for r in range(2):
            streams[r].synchronize()
        assert [o.ep_recv_counts.numpy().tolist() for o in outs] == [[1, 2], [1, 2]]
    # without the start, every round waits for the lazy starter once
    assert _mock.stats()["late_starts"] - late < ROUNDS // 2
    for r in range(2):
        acl.Device(r).set_current()
        bufs[r].close()
        comms[r].close()
        streams[r].close()


def _paused_then_resumed_body(rank: int, world_size: int, root: bytes, barrier: Any) -> tuple[int, list[int], int]:
    """Rank 0 synchronises its dispatch in short slices while rank 1 arrives late; (the slices that ran
    out, ep_recv_counts, the worker threads made meanwhile)."""
    import aclnn_py as acl
    from aclnn_py import _mock

    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device.current().create_stream()
        x, ids = _two_tokens(s)
        barrier.wait()
        workers = _mock.stats()["stream_workers_started"]
        timeouts = 0
        if rank == 1:
            # rank 0's dispatch waits for this rank meanwhile, less than a paused kernel's lazy start
            # (200 ms): only the synchronising thread can go on with it
            time.sleep(0.12)
        out = buf.low_latency_dispatch(x, ids, world_size, stream=s)
        if rank == 0:
            while True:   # short slices: the kernel pauses at its exchange each time one runs out
                try:
                    s.synchronize(timeout_ms=20)
                    break
                except acl.AclTimeoutError:
                    timeouts += 1
        s.synchronize()
        counts = out.ep_recv_counts.numpy().tolist()
        barrier.wait()
        workers = _mock.stats()["stream_workers_started"] - workers
        barrier.wait()   # both have read the count before either stream closes (which may make a worker)
        s.close()
        return timeouts, counts, workers


def test_a_kernel_paused_when_its_synchronisation_times_out_is_resumed_by_the_next_one(acl: Any) -> None:
    """The thread that comes back for the next slice goes on with the paused kernel: no worker thread
    is made for it (a world whose first exchange outlasts a slice made one on every rank's stream)."""
    res = acl.worlds.run_threads(_paused_then_resumed_body, 2, threading.Barrier(2))
    assert res[0][0] >= 3, res   # rank 0's slices ran out several times before rank 1 arrived
    assert [counts for _, counts, _ in res] == [[1, 2], [1, 2]]
    assert res[0][2] == 0, res


def _queued_beside_a_paused_kernel_body(rank: int, world_size: int, root: bytes, barrier: Any) -> float:
    """Rank 0's dispatch is paused (its synchronisation timed out, rank 1 not there yet); rank 0 then
    queues a fill on a second stream that nobody synchronises: how long until it ran (s)."""
    import aclnn_py as acl

    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device.current().create_stream()
        x, ids = _two_tokens(s)
        barrier.wait()
        took = 0.0
        if rank == 1:
            barrier.wait()   # rank 0 has measured
        out = buf.low_latency_dispatch(x, ids, world_size, stream=s)
        if rank == 0:
            try:
                s.synchronize(timeout_ms=10)
            except acl.AclTimeoutError:
                pass
            t = acl.Tensor.from_numpy(np.zeros(64, np.uint8))
            other = acl.Device.current().create_stream()
            raw = np.frombuffer((ctypes.c_uint8 * 64).from_address(t.data_ptr), np.uint8)
            t0 = time.monotonic()
            t.fill_bytes(0x5A, stream=other)
            while not (raw == 0x5A).all() and time.monotonic() - t0 < 5:
                time.sleep(0.001)
            took = time.monotonic() - t0
            barrier.wait()
            other.close()
            t.close()
        s.synchronize()
        assert out.ep_recv_counts.numpy().tolist() == [1, 2]
        s.close()
        return took


def test_work_nobody_synchronises_starts_at_its_lazy_start_beside_a_paused_kernel(acl: Any) -> None:
    """The lazy starter keeps two lists (queued work, 5 ms; paused kernels, 200 ms): an entry of the
    first is started when it is due, not when an earlier-listed paused kernel is."""
    took = acl.worlds.run_threads(_queued_beside_a_paused_kernel_body, 2, threading.Barrier(2))[0]
    assert took < 0.1, took
