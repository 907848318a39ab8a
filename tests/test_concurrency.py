"""Concurrency (docs/reliability.md): Python threads driving different devices and
streams at once give the same bytes as one thread driving them in turn (cffi releases the GIL in
every C call), and back-to-back dispatch+combine rounds leave nothing behind — mock allocations,
tensors, executors, streams, events, communicators, open file descriptors, OS threads and RSS.

ACLNN_SOAK_ROUNDS sets the number of rounds of the soak test (default 1000)."""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest
from helpers import fault_ranks as fr

ROUNDS = int(os.environ.get("ACLNN_SOAK_ROUNDS", "1000"))


def _rank_thread(root: bytes, rank: int, device: int, seed: int, out: dict, key: tuple) -> None:
    from aclnn_py import Device

    try:
        Device(device).set_current()
        out[key] = fr.world_round(rank, 2, root, seed)
    except BaseException as e:  # noqa: BLE001
        out[key] = {"ok": False, "exception": repr(e)}


def _concurrent(seeds: list[int]) -> dict:
    """One 2-rank world per seed, all at once: 2 * len(seeds) Python threads, one device each."""
    from aclnn_py.hccl import RootInfo

    out: dict = {}
    threads = []
    for w, seed in enumerate(seeds):
        root = bytes(RootInfo.create())
        for r in range(2):
            threads.append(threading.Thread(target=_rank_thread, args=(root, r, 2 * w + r, seed, out, (w, r))))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    return out


def _form_world(acl):
    from aclnn_py import worlds
    from aclnn_py.hccl import Communicator, build_context

    def body(rank, ws, root):
        comm = Communicator(ws, rank, root)
        return comm, *build_context(comm)

    return worlds.run_threads(body, 2)


def _serial(acl, seed: int) -> dict:
    """The same round with both ranks driven from this one thread (phase 1 and launch of rank 0, then
    of rank 1; the kernels meet on the stream workers)."""
    from aclnn_py.ops import prepare_combine, prepare_dispatch

    world = _form_world(acl)
    streams = []
    for r in range(2):
        acl.Device(r).set_current()
        streams.append(acl.Device(r).create_stream())
    acl.Device(0).set_current()
    try:
        disp = []
        for r, (_comm, ctx, ccl) in enumerate(world):
            x, ids, w = fr.inputs(r, seed)
            p = prepare_dispatch(ctx, x, ids, ep_world_size=2, ep_rank_id=r, moe_expert_num=fr.E,
                                 ccl_buffer_size=ccl, stream=streams[r])
            p.launch(streams[r])
            disp.append((p, ids, w))
        for s in streams:
            s.synchronize()
        comb = []
        for r, (_comm, ctx, ccl) in enumerate(world):
            p, ids, w = disp[r]
            o = p.result
            q = prepare_combine(ctx, o.expand_x, ids, o.assist_info_for_combine, o.ep_recv_counts, w,
                                ep_world_size=2, ep_rank_id=r, moe_expert_num=fr.E, ccl_buffer_size=ccl,
                                stream=streams[r])
            q.launch(streams[r])
            comb.append(q)
        for s in streams:
            s.synchronize()
        out = {}
        for r in range(2):
            o = disp[r][0].result
            n = int(o.ep_recv_counts.numpy()[-1])
            out[r] = {"ok": True, "expand_x": o.expand_x.numpy()[:n].tobytes(),
                      "x_out": comb[r].result.numpy().tobytes()}
        return out
    finally:
        for s in streams:
            s.close()
        for comm, _, _ in world:
            comm.close()


def test_threads_on_several_devices_match_a_serial_run(acl, mock):
    seeds = [11, 12, 13]
    conc = _concurrent(seeds)
    for w, seed in enumerate(seeds):
        ser = _serial(acl, seed)
        for r in range(2):
            assert conc[(w, r)]["ok"], conc[(w, r)]
            assert conc[(w, r)] == ser[r], f"world {w} rank {r}: concurrent and serial bytes differ"
    # and the worlds with different inputs did give different bytes (the comparison has teeth)
    assert conc[(0, 0)]["x_out"] != conc[(1, 0)]["x_out"]


def test_the_gil_is_released_while_c_waits(acl):
    """A thread blocked in aclrtSynchronizeStream (a barrier waiting for its peer) does not stop
    Python code in other threads."""
    world = _form_world(acl)
    b = acl.backend()
    try:
        s0 = acl.Device(0).create_stream()
        assert b.lib.HcclBarrier(b.ffi.cast("void *", world[0][0].handle), b.ffi.cast("void *", s0.handle)) == 0
        done = threading.Event()
        t = threading.Thread(target=lambda: (b.lib.aclrtSynchronizeStream(b.ffi.cast("void *", s0.handle)), done.set()))
        t.start()
        time.sleep(0.05)
        n, end = 0, time.monotonic() + 0.3
        while time.monotonic() < end:   # pure Python work while the other thread sits in C
            n += 1
        assert not done.is_set() and n > 10_000, n
        s1 = acl.Device(1).create_stream()
        assert b.lib.HcclBarrier(b.ffi.cast("void *", world[1][0].handle), b.ffi.cast("void *", s1.handle)) == 0
        s1.synchronize()
        assert done.wait(10)
        t.join()
        s0.close()
        s1.close()
        acl.Device(0).set_current()
    finally:
        for comm, _, _ in world:
            comm.close()


# ---- soak ---------------------------------------------------------------------------------------------
def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _handles() -> dict:
    return {"fds": len(os.listdir("/proc/self/fd")), "os_threads": len(os.listdir("/proc/self/task"))}


def _soak_body(rank, world_size, root, rounds, samples):
    from aclnn_py import Device, _mock
    from aclnn_py.hccl import Communicator, build_context

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        stream = Device.current().create_stream()
        try:
            for i in range(rounds):
                r = fr.round_trip(rank, comm, ctx, ccl, stream, seed=i % 7)
                if not r["ok"]:
                    return r
                if rank == 0 and i in samples:
                    gc.collect()
                    samples[i] = (_rss_kib(), _mock.stats(), _handles())
            return {"ok": True}
        finally:
            stream.synchronize()
            stream.close()


def test_back_to_back_rounds_do_not_grow(acl, mock):
    from aclnn_py import worlds
    from aclnn_py.runtime import ordered

    gc.collect()
    start = mock.stats()
    warm = min(100, ROUNDS // 4)
    samples = {warm: None, ROUNDS // 2: None, ROUNDS - 1: None}
    t0 = time.monotonic()
    res = worlds.run_threads(_soak_body, 2, ROUNDS, samples, timeout=300)
    elapsed = time.monotonic() - t0
    assert all(r["ok"] for r in res), res
    print(f"\nsoak: {ROUNDS} rounds of dispatch+combine (2 thread ranks) in {elapsed:.1f} s; samples {samples}")
    (rss_a, st_a, h_a), (rss_b, st_b, h_b) = samples[warm], samples[ROUNDS - 1]
    # Objects of the last few rounds may still be held until their stream passes (KeepAlive), so
    # the counts may differ by what a few rounds hold; a leak grows with the number of rounds.
    slack = 48
    for k in ("allocations", "tensors", "executors", "streams", "events", "communicators", "mapped_windows"):
        assert st_b[k] <= st_a[k] + slack, f"{k} grew from round {warm} to {ROUNDS - 1}: {st_a[k]} -> {st_b[k]}"
    assert h_b["fds"] <= h_a["fds"], (h_a, h_b)
    # a stream makes its worker thread when work first needs one (a lazy start), which a slow machine
    # may bring after the warm-up: at most one per stream of the world (the ranks' two and the devices'
    # two default streams), never one per round
    made = st_b["stream_workers_started"] - st_a["stream_workers_started"]
    assert h_b["os_threads"] - h_a["os_threads"] <= made <= 4, (h_a, h_b, made)
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):   # ASan keeps freed memory in quarantine
        assert rss_b - rss_a < 16 * 1024, f"RSS grew by {rss_b - rss_a} KiB over {ROUNDS - 1 - warm} rounds"
    # after the world is gone and the per-stream caches are dropped, everything is back to the start
    ordered.reap()
    gc.collect()
    end = mock.stats()
    for k in ("tensors", "executors", "streams", "communicators", "mapped_windows", "pinned_blocks"):
        assert end[k] <= start[k], f"{k}: {start[k]} -> {end[k]}"


def test_a_workspace_block_read_before_it_grew_stays_allocated_while_the_stream_lives(acl, device0, mock):
    """Another thread sharing the stream may have read its workspace address and be queueing a launch
    with it (launches run without the GIL) when a call needs a larger block: the old block is retired,
    not freed, until the stream is destroyed; blocks grow twofold, so the retired ones stay below the
    live one."""
    import weakref

    from aclnn_py.runtime import ordered

    s = device0.create_stream()
    before = ordered.workspace_bytes()
    first = ordered.workspace(s, 1000)
    old = weakref.ref(ordered._states[s._key].workspace)
    read_by_another_thread = ordered.workspace_block(s)
    grown = ordered.workspace(s, 1500)
    assert read_by_another_thread == (first, 1000)
    assert ordered.workspace_block(s) == (grown, 2000) and grown != first
    assert old() is not None and not old().closed  # still allocated: the other launch may use it
    assert ordered.workspace(s, 1800) == grown      # fits: no growth
    assert ordered.workspace_bytes() - before == 3000
    pool = acl.get_memory_pool()
    pool.free_all_blocks()
    allocations = mock.stats()["allocations"]
    s.close()
    gc.collect()
    assert old() is None or old().closed
    pool.free_all_blocks()  # the stream's blocks went back to the pool
    assert mock.stats()["allocations"] == allocations - 2 and ordered.workspace_bytes() == before


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])
