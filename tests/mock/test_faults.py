"""Faults (docs/reliability.md): injected through aclnn_py._mock (skip, delay, crash, consulted by the
HCCL mailbox once per collective call), real SIGKILLs of rank processes in the middle of dispatch or
combine, and peers that destroy their communicator while others wait for them.

A peer that is alive but absent makes the survivors fail with the timeout (507014) after
HCCL_EXEC_TIMEOUT; a peer that is gone (its process died, or it destroyed its communicator) makes
them fail with the same code within about a second, whatever the timeout; a call-order mismatch is
507015 at once. The missing peers are named; no process hangs; /dev/shm keeps nothing of the world;
a new world works afterwards in the same processes."""

from __future__ import annotations

import os
import struct
import threading
import time

import pytest
from helpers import fault_ranks as fr

TIMEOUT = 1.0            # HCCL_EXEC_TIMEOUT of the timeout tests (s)
SLACK = 8.0              # what a survivor may take beyond it on a loaded machine
PROMPT = 10.0            # "promptly": a bound far below the 120 s default timeout
AICORE_TIMEOUT, AICORE_EXCEPTION = 507014, 507015


@pytest.fixture(autouse=True)
def _short_timeout(monkeypatch, mock):
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", str(TIMEOUT))
    mock.clear_faults()
    yield
    mock.clear_faults()
    own = [n for n in os.listdir("/dev/shm") if n.startswith("aclmock_hccl_") and n.endswith(f"_p{os.getpid()}")]
    assert not own, f"segments left in /dev/shm: {own}"


@pytest.fixture
def default_timeout(monkeypatch, mock):
    """The mock's own default HCCL_EXEC_TIMEOUT (120 s), so only liveness can end a wait early."""
    monkeypatch.delenv("HCCL_EXEC_TIMEOUT")
    assert mock.exec_timeout() == 120


def _world_id(root: bytes) -> str:
    return f"{struct.unpack_from('<Q', root, 16)[0]:016x}"


def _segments_of(root: bytes) -> list[str]:
    wid = _world_id(root)
    return [n for n in os.listdir("/dev/shm") if n.startswith("aclmock_hccl_") and wid in n]


def _run_threads(seed=0, first="dispatch", hold=True):
    """A 2-rank threads world. With `hold`, both ranks keep their communicator until both reported
    (a rank that failed early stays in the world, so its peer sees the timeout)."""
    from aclnn_py import worlds

    barrier = threading.Barrier(2, timeout=60).wait if hold else None
    t0 = time.monotonic()
    res = worlds.run_threads(fr.world_round, 2, seed, first, None, barrier, timeout=60)
    return res, time.monotonic() - t0


def _assert_timeout(r, stage, missing):
    assert not r["ok"], r
    assert r["stage"] == stage and r["code"] == AICORE_TIMEOUT, r
    assert f"waiting for ranks [{missing}]" in r["message"], r["message"]
    assert "timed out" in r["message"], r["message"]
    assert TIMEOUT - 0.1 <= r["elapsed"] <= TIMEOUT + SLACK, r


def _assert_gone(r, stage, missing, why):
    """A survivor that gave up because peer `missing` is gone (same code as the timeout)."""
    assert not r["ok"], r
    assert r["stage"] == stage and r["code"] == AICORE_TIMEOUT, r
    # the gone peer is named with the verdict, apart from the ranks that had merely not arrived yet
    assert f"waiting for ranks [{missing}]: a peer is gone {why}, so collective call" in r["message"], r["message"]
    assert "HCCL_EXEC_TIMEOUT=120 not reached" in r["message"], r["message"]
    assert r["elapsed"] < PROMPT, r


def _assert_fresh_world_works(mock, seed=3):
    res, _ = _run_threads(seed)
    assert all(r["ok"] for r in res), res
    s = mock.stats()
    assert s["communicators"] == 0 and s["mapped_windows"] == 0 and s["executors"] == 0, s


# ---- injected faults, threads worlds -----------------------------------------------------------------
def test_rank_that_never_calls_dispatch(acl, mock):
    mock.inject_fault("dispatch", rank=1, kind="skip")
    res, wall = _run_threads()
    _assert_timeout(res[0], "dispatch", 1)
    assert res[1]["code"] == AICORE_EXCEPTION and "injected fault" in res[1]["message"]
    assert wall < TIMEOUT + 3 * SLACK
    assert mock.fault_stats() == {"armed": 0, "fired": mock.fault_stats()["fired"]}
    _assert_fresh_world_works(mock)


def test_rank_that_never_calls_combine(acl, mock):
    mock.inject_fault("combine", rank=0, kind="skip")
    res, _ = _run_threads()
    assert res[0]["stage"] == "combine" and "injected fault" in res[0]["message"]
    _assert_timeout(res[1], "combine", 0)
    _assert_fresh_world_works(mock)


def test_slow_rank_beyond_the_timeout(acl, mock):
    """Rank 1 reaches dispatch 2 s late (timeout 1 s): rank 0 times out naming it; rank 1 then
    finds rank 0's dispatch entry, finishes dispatch and times out in combine naming rank 0."""
    mock.inject_fault("dispatch", rank=1, kind="delay", seconds=2.0)
    res, wall = _run_threads()
    _assert_timeout(res[0], "dispatch", 1)
    _assert_timeout(res[1], "combine", 0)
    assert wall < 2.0 + 2 * TIMEOUT + 2 * SLACK
    _assert_fresh_world_works(mock)


def test_slow_rank_within_the_timeout(acl, mock, monkeypatch):
    """A delay shorter than HCCL_EXEC_TIMEOUT changes nothing: same bytes as an undisturbed round."""
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "30")
    ref, _ = _run_threads(seed=7)
    assert all(r["ok"] for r in ref), ref
    mock.inject_fault("dispatch", rank=0, kind="delay", seconds=0.4)
    mock.inject_fault("combine", rank=1, kind="delay", seconds=0.4)
    res, wall = _run_threads(seed=7)
    assert wall >= 0.8
    assert res == ref


def test_call_order_mismatch(acl, mock, monkeypatch):
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "60")
    res, wall = _run_threads(first=["dispatch", "barrier"])
    for r in res:
        assert not r["ok"] and r["code"] == AICORE_EXCEPTION and "call-order mismatch" in r["message"], r
    assert "rank 1 runs HcclBarrier" in res[0]["message"], res[0]["message"]
    assert wall < PROMPT   # detected at once, not by the 60 s timeout
    _assert_fresh_world_works(mock)


def test_peer_that_destroys_its_communicator(acl, mock, default_timeout):
    """Rank 1 destroys its communicator instead of dispatching: rank 0 gives up within a second or
    so, naming it, although HCCL_EXEC_TIMEOUT is 120 s."""
    res, wall = _run_threads(first=["dispatch", "leave"], hold=False)
    assert res[1] == {"ok": True, "left": True}
    _assert_gone(res[0], "dispatch", 1, "(rank 1 destroyed its communicator)")
    assert wall < PROMPT
    _assert_fresh_world_works(mock)


def _barrier_or_leave(rank: int, world_size: int, root: bytes) -> dict:
    """Rank 0 runs a barrier; the others destroy their communicator at once."""
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator

    with Communicator(world_size, rank, root) as comm, Device.current().create_stream() as stream:
        if rank != 0:
            return {"left": True}
        try:
            comm.barrier(stream)
            stream.synchronize()
        except AclError as e:
            return {"code": e.code, "message": e.message}
        return {"ok": True}


def test_peers_that_destroy_their_communicators_are_named_together(acl, mock, default_timeout):
    """Ranks 1 and 2 leave while rank 0, late to its barrier, waits for both: one verdict names both."""
    from aclnn_py import worlds

    mock.inject_fault("barrier", rank=0, kind="delay", seconds=0.5)
    res = worlds.run_threads(_barrier_or_leave, 3, timeout=60)
    assert res[1] == res[2] == {"left": True}
    message = res[0].get("message", "")
    assert res[0].get("code") == AICORE_TIMEOUT and "waiting for ranks [1, 2]: peers are gone (rank 1 destroyed " \
        "its communicator) (rank 2 destroyed its communicator), so collective call #" in message, res[0]
    _assert_fresh_world_works(mock)


def test_inject_fault_arguments(mock):
    with pytest.raises(ValueError, match="op must be"):
        mock.inject_fault("alltoall", kind="skip")
    with pytest.raises(ValueError, match="kind must be"):
        mock.inject_fault("dispatch", kind="explode")
    with pytest.raises(ValueError, match="seconds"):
        mock.inject_fault("dispatch", kind="delay")
    mock.inject_fault("dispatch", rank=5, kind="skip", count=-1)
    assert mock.fault_stats()["armed"] == 1
    mock.clear_faults()
    assert mock.fault_stats()["armed"] == 0


# ---- real process kills ------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["crash", "kill"])
@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_rank_process_killed_mid_op(acl, default_timeout, tmp_path, op, how):
    """The victim's process is SIGKILLed inside `op`; the survivor fails within seconds (not the
    120 s timeout) naming the dead process, cleans up, and runs a new world in the same process."""
    from aclnn_py import worlds

    t0 = time.monotonic()
    res = worlds.spawn(fr.killed_round, 2, {"victim": 1, "how": how, "op": op}, str(tmp_path),
                       timeout=60, on_rank_failure="wait")
    assert time.monotonic() - t0 < 3 * PROMPT
    victim = res[1]
    assert isinstance(victim, worlds.RankError) and victim.rank == 1, victim
    assert "SIGKILL" in str(victim)
    r0 = res[0]
    assert r0["exec_timeout"] == 120
    pid = int((tmp_path / "rank1").read_text())
    _assert_gone(r0, op, 1, f"(rank 1: process {pid} is dead)")
    assert r0["after"] == {"communicators": 0, "mapped_windows": 0, "executors": 0, "pinned_blocks": 0}, r0
    assert all(r["ok"] for r in r0["new_world"]), r0["new_world"]     # same process, new world
    assert _segments_of(r0["root"]) == [], "the dead world left segments in /dev/shm"


def test_spawn_world_with_a_crashing_rank(acl, tmp_path):
    """aclnn_py.worlds.spawn reports the killed rank (and stops the others at once); nothing of its
    world is left behind and the next spawn world runs."""
    from aclnn_py import worlds

    t0 = time.monotonic()
    with pytest.raises(worlds.RankError, match="rank 1.*SIGKILL"):
        worlds.spawn(fr.spawn_round, 2, 1, "dispatch", str(tmp_path), timeout=60)
    assert time.monotonic() - t0 < 3 * PROMPT
    res = worlds.spawn(fr.world_round, 2, timeout=60)
    assert all(r["ok"] for r in res), res
    assert _segments_of((tmp_path / "root").read_bytes()) == []


def test_killed_rank_in_a_wait_world_is_a_rank_error(acl, tmp_path, default_timeout):
    """on_rank_failure="wait" with the victim killed by a signal and the survivor failing on its own:
    both outcomes come back in rank order, nothing is raised."""
    from aclnn_py import worlds

    res = worlds.spawn(fr.killed_round, 2, {"victim": 0, "how": "crash", "op": "dispatch"}, str(tmp_path),
                       timeout=60, on_rank_failure="wait")
    assert isinstance(res[0], worlds.RankError) and res[0].rank == 0
    assert "signal 9 (SIGKILL)" in str(res[0])
    pid = int((tmp_path / "rank0").read_text())
    _assert_gone(res[1], "dispatch", 0, f"(rank 0: process {pid} is dead)")
