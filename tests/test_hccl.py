"""aclnn_py.hccl on the mock: worlds of processes and of threads, the context tensor, data through
peer windows, timeouts, dead peers (noticed within about a second), cleanup of /dev/shm, lazily
backed windows."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import threading
import time

import pytest
from helpers import hccl_ranks as hr

MIB = 1 << 20


# ---- healthy worlds ------------------------------------------------------------------------------
@pytest.fixture
def small_windows(monkeypatch):
    monkeypatch.setenv("HCCL_BUFFSIZE", "2")


def test_process_world_of_4(acl, small_windows):
    from aclnn_py import worlds

    res = worlds.spawn(hr.rank_world, 4, timeout=60)
    assert len({r["pid"] for r in res}) == 4
    assert len({r["name"] for r in res}) == 4


def test_thread_world_of_8(acl, small_windows, mock):
    from aclnn_py import worlds

    before = mock.stats()
    res = worlds.run_threads(hr.rank_world, 8, timeout=60)
    assert len({r["name"] for r in res}) == 8
    # threads of one process share one mapping per window
    assert all(r["windows"] == res[0]["windows"] for r in res)
    after = mock.stats()
    assert after["communicators"] == before["communicators"]
    assert after["mapped_windows"] == before["mapped_windows"]


def test_thread_world_leaves_no_segments(acl, small_windows):
    from aclnn_py import hccl, worlds

    roots = []

    def fn(rank, world_size, root):
        roots.append(root)
        with hccl.Communicator(world_size, rank, root):
            pass

    worlds.run_threads(fn, 3, timeout=30)
    assert hr.shm_segments(roots[0]) == []


def _window_mappings() -> set[str]:
    """The paths of the windows this process maps (a rendezvous segment is not one)."""
    with open("/proc/self/maps") as f:
        paths = [line.split()[5] for line in f if "aclmock_hccl_" in line]  # "(deleted)" may follow
    return {p for p in paths if re.search(r"_w\d+_", p)}


def _cpus_of_thread(name: str) -> set[int] | None:
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            return os.sched_getaffinity(int(tid))
        except OSError:
            continue
    return None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux: /proc/self/maps and thread affinity")
def test_a_thread_worlds_windows_are_unmapped_off_the_cpu_its_ranks_share(acl, small_windows):
    """The last rank to let go of the windows leaves their unmapping to a thread of its own, which runs
    on the CPUs the process has, not the one the ranks were bound to; the mappings are gone soon after."""
    from aclnn_py import hccl, worlds

    before = _window_mappings()

    def fn(rank, world_size, root):
        with hccl.Communicator(world_size, rank, root):
            return _window_mappings() - before

    mapped = worlds.run_threads(fn, 4, timeout=30, share_one_cpu=True)
    assert len(mapped[0]) == 4  # one mapping per window, shared by the ranks
    deadline = time.monotonic() + 5
    while _window_mappings() & mapped[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _window_mappings() & mapped[0], "the windows are still mapped"
    assert _cpus_of_thread("aclmock-unmap") == os.sched_getaffinity(0)


# ---- errors --------------------------------------------------------------------------------------
def test_argument_errors(acl):
    from aclnn_py import hccl
    from aclnn_py.errors import HcclError

    root = hccl.RootInfo.create()
    assert len(bytes(root)) == 4108
    assert hccl.RootInfo.from_bytes(bytes(root)) == root
    with pytest.raises(ValueError):
        hccl.RootInfo(b"short")
    with pytest.raises(ValueError):
        hccl.Communicator(2, 2, root)
    with pytest.raises(HcclError) as ei:
        hccl.Communicator(2, 0, b"\0" * 4108)
    assert ei.value.code == 1 and "HcclGetRootInfo" in ei.value.message
    for code in list(range(25)) + [1041]:
        assert hccl.error_string(code)
    assert "TIMEOUT" in hccl.error_string(9)


def test_duplicate_rank_and_size_mismatch(acl, small_windows):
    from aclnn_py import hccl
    from aclnn_py.errors import HcclError

    root = hccl.RootInfo.create()
    comms = {}
    t = threading.Thread(target=lambda: comms.setdefault(0, hccl.Communicator(2, 0, root, device=0)))
    t.start()
    time.sleep(0.2)
    with pytest.raises(HcclError, match="duplicate rank 0"):
        hccl.Communicator(2, 0, root)
    with pytest.raises(HcclError, match="nRanks mismatch"):
        hccl.Communicator(3, 1, root)
    c1 = hccl.Communicator(2, 1, root, device=1)
    t.join()
    c1.close()
    c1.close()  # idempotent
    comms[0].close()
    with pytest.raises(ValueError, match="closed"):
        c1.barrier()


def test_a_context_names_the_kfc_call_that_failed(acl, small_windows):
    """The context's KFC sequence runs in one call into C; a failure still names the call it failed at,
    and a name that finds another rank's communicator is refused naming both ranks."""
    from aclnn_py import hccl, worlds
    from aclnn_py.errors import HcclError

    def fn(rank, world_size, root):
        with hccl.Communicator(world_size, rank, root) as comm:
            comm.barrier()  # the peer's communicator is registered under its name
            own = comm.name
            outcome = {}
            for label, name in (("unknown", "no_such_communicator"), ("peer", own.replace(f"rank_{rank}", f"rank_{1 - rank}"))):
                comm.name = name
                try:
                    hccl.build_context(comm)
                except HcclError as exc:
                    outcome[label] = (exc.func, str(exc))
                finally:
                    comm.name = own
            outcome["ok"] = hccl.build_context(comm)[1] == comm.window_size
            comm.barrier()
        return outcome

    for rank, out in enumerate(worlds.run_threads(fn, 2, timeout=60)):
        assert out["unknown"][0] == "HcclCommGetHandleWithName", out
        assert "no_such_communicator" in out["unknown"][1], out
        assert out["peer"][0] == "HcclCommGetHandleWithName", out
        assert f"is rank {1 - rank} of 2, expected rank {rank} of 2" in out["peer"][1], out
        assert out["ok"]


def test_destroyed_handle_is_an_error_not_a_crash(acl, raw, small_windows):
    from aclnn_py import hccl
    from aclnn_py.errors import HcclError, check_hccl

    ffi, lib = raw
    c = hccl.Communicator(1, 0, hccl.RootInfo.create())
    h = ffi.cast("void *", c.handle)
    c.close()
    cell = ffi.new("uint32_t *")
    with pytest.raises(HcclError, match="not a live communicator"):
        check_hccl(lib.HcclGetRankId(h, cell), "HcclGetRankId")
    assert lib.HcclCommDestroy(h) == 1
    assert lib.HcclBarrier(ffi.NULL, ffi.NULL) == 2


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_rank_that_never_joins(acl, small_windows, monkeypatch, mode):
    from aclnn_py import worlds

    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "1")
    run = worlds.spawn if mode == "processes" else worlds.run_threads
    res = run(hr.never_join, 4, 3, timeout=30)
    assert res[3] is None
    for r in res[:3]:
        assert r["code"] == 9, r
        assert r["elapsed"] < 1 + 2.0
        assert "[3]" in r["message"]
    assert hr.shm_segments(res[0]["root"]) == []


# ---- a rank SIGKILLed after joining, or while joining --------------------------------------------
PROMPT = 10.0   # "promptly": far below the 120 s default timeouts, with room for a loaded machine


@pytest.fixture
def default_timeouts(monkeypatch):
    monkeypatch.delenv("HCCL_EXEC_TIMEOUT", raising=False)
    monkeypatch.delenv("HCCL_CONNECT_TIMEOUT", raising=False)


def test_rank_killed_after_joining(acl, small_windows, default_timeouts):
    from aclnn_py import worlds

    W, victim = 4, 2
    res = worlds.spawn(hr.join_then_maybe_die, W, victim, timeout=60, on_rank_failure="wait")
    assert isinstance(res[victim], worlds.RankError) and "SIGKILL" in str(res[victim])
    pids = {r: out[4] for r, out in enumerate(res) if r != victim}
    for r, out in enumerate(res):
        if r == victim:
            continue
        message, code, elapsed, async_err, _pid = out
        assert code == 507014, message
        assert f"(rank {victim}: process" in message and "is dead)" in message, message
        assert "HCCL_EXEC_TIMEOUT=120 not reached" in message, message
        assert elapsed < PROMPT
        assert async_err == 21  # HCCL_E_REMOTE
    assert len(set(pids.values())) == W - 1


def test_waiting_ranks_share_the_liveness_probes(acl, small_windows, default_timeouts):
    """Half of a world waits 1.2 s for the other half: each waiting rank probes its share of the
    pending peers a period (about one here), not every pending peer (12), so a large world waiting for
    many peers makes O(W) system calls a period instead of O(W**2)."""
    from aclnn_py import worlds

    W = 24
    res = worlds.spawn(hr.wait_for_late_half, W, 1.2, timeout=60)
    for waited, probes, message in res[: W // 2]:
        assert message is None and waited > 0.9, res
        looks = waited / 0.2 + 1
        assert probes <= 2 * looks + 2, (waited, probes)   # the old rule probed 12 a look: > 60


def test_a_dead_peer_one_rank_finds_is_named_by_every_waiting_rank(acl, small_windows, default_timeouts):
    """The last rank dies while half the world waits for the other half: the waiting ranks share the
    probes, and every one of them gives up promptly naming the dead process, whether its own probe
    found it or a peer's."""
    from aclnn_py import worlds

    W = 16
    res = worlds.spawn(hr.wait_for_late_half, W, 3.0, True, timeout=60, on_rank_failure="wait")
    assert isinstance(res[W - 1], worlds.RankError) and "SIGKILL" in str(res[W - 1])
    for waited, probes, message in res[: W // 2]:
        assert message is not None and f"(rank {W - 1}: process" in message and "is dead)" in message, message
        assert waited < 2.0, (waited, message)   # before the late ranks come
        assert probes <= 2 * (waited / 0.2 + 1) + 2, (waited, probes)


def test_rank_killed_while_the_world_forms(acl, small_windows, default_timeouts, tmp_path):
    """Rank 3 never comes and rank 1 dies in the rendezvous: ranks 0 and 2 give up within seconds
    (HCCL_CONNECT_TIMEOUT is 120 s) naming rank 1's dead process, and nothing is left in /dev/shm."""
    from aclnn_py import worlds

    res = worlds.spawn(hr.join_or_die, 4, 1, 3, str(tmp_path), timeout=60, on_rank_failure="wait")
    assert isinstance(res[1], worlds.RankError) and "SIGKILL" in str(res[1])
    assert res[3] is None
    dead = int((tmp_path / "rank1").read_text())
    for r in (0, 2):
        code, message, elapsed = res[r]
        assert code == 9, message   # HCCL_E_TIMEOUT
        assert f"(rank 1: process {dead} is dead)" in message, message
        assert elapsed < 0.5 + PROMPT, res[r]


# ---- stale segments of a world that died while forming -------------------------------------------
def test_segments_of_a_dead_world_are_swept(acl, small_windows, monkeypatch):
    """A process that dies (SIGKILL: no exit handler) while its world forms leaves its rendezvous area
    and window behind; the next HcclGetRootInfo anywhere on the machine removes them. Another process
    forming worlds at the same time may sweep them first: the test only needs them gone."""
    from aclnn_py import hccl

    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "60")
    root = bytes(hccl.RootInfo.create())
    ctx = mp.get_context("forkserver")
    p = ctx.Process(target=hr.join_alone, args=(root, dict(os.environ)))
    p.start()
    try:
        deadline = time.monotonic() + 30
        while len(hr.shm_segments(root)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        left = set(hr.shm_segments(root))
        assert len(left) == 2, left  # rendezvous + rank 0's window: a live owner keeps them
    finally:
        p.kill()
        p.join()
    assert set(hr.shm_segments(root)) <= left
    hccl.RootInfo.create()  # any new world sweeps segments whose processes are all dead
    assert hr.shm_segments(root) == []


def test_the_sweep_keeps_a_forming_world(acl, small_windows, monkeypatch):
    """A world whose rank waits in the rendezvous (its process alive) keeps its segments through any
    number of sweeps, and then forms."""
    from aclnn_py import hccl, worlds

    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "60")
    root = bytes(hccl.RootInfo.create())
    formed = {}
    t = threading.Thread(target=lambda: formed.setdefault(0, hccl.Communicator(2, 0, root, device=0)))
    t.start()
    try:
        deadline = time.monotonic() + 30
        while len(hr.shm_segments(root)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(3):
            hccl.RootInfo.create()
            worlds.spawn(hr.sweep_in_a_new_process, 1, timeout=60)
        assert len(hr.shm_segments(root)) == 2
        c1 = hccl.Communicator(2, 1, root, device=1)
    finally:
        t.join(60)
    assert 0 in formed
    c1.close()
    formed[0].close()
    assert hr.shm_segments(root) == []


# ---- lazily backed windows -----------------------------------------------------------------------
def test_16_rank_world_with_default_windows_is_lazily_backed(acl, monkeypatch, mock):
    from aclnn_py import hccl, worlds

    monkeypatch.delenv("HCCL_BUFFSIZE", raising=False)
    before = hr.rss_kib()
    hold = threading.Barrier(16)
    peak = {}

    def fn(rank, world_size, root):
        with hccl.Communicator(world_size, rank, root) as comm:
            assert comm.window_size == 400 * MIB
            hccl.build_context(comm)
            comm.barrier()
            hold.wait()
            if rank == 0:
                peak.update(hr.rss_kib())
                peak["mapped"] = mock.stats()["mapped_window_bytes"]
            hold.wait()

    worlds.run_threads(fn, 16, timeout=60)
    assert peak["mapped"] >= 16 * 400 * MIB          # 6.25 GiB of windows mapped ...
    assert peak["RssShmem"] - before.get("RssShmem", 0) < 16 * 1024      # ... < 16 MiB of it resident
    assert peak["VmRSS"] - before["VmRSS"] < 64 * 1024


def test_16_process_world_with_default_windows(acl, monkeypatch):
    from aclnn_py import worlds

    monkeypatch.delenv("HCCL_BUFFSIZE", raising=False)
    res = worlds.spawn(hr.rss_rank, 16, timeout=120)
    for size, rss_growth, shmem in res:
        assert size == 400 * MIB
        assert rss_growth < 32 * 1024, res
        assert shmem < 8 * 1024, res
