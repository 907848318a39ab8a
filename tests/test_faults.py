"""Faults (issue 8 §4, docs/reliability.md): injected through aclnn_py._mock (skip, delay, crash,
consulted by the HCCL mailbox once per collective call) and real SIGKILLs of rank processes in the
middle of dispatch or combine. Every surviving rank gets the timeout (507014) or the order error
(507015) within HCCL_EXEC_TIMEOUT plus a small margin, with the missing peers named; no process
hangs; /dev/shm keeps nothing of the world; a new world works afterwards in the same processes."""

from __future__ import annotations

import glob
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import struct
import time

import fault_ranks as fr
import pytest

TIMEOUT = 1.0            # HCCL_EXEC_TIMEOUT of these tests (s)
MARGIN = 1.5             # what a survivor may take beyond it
AICORE_TIMEOUT, AICORE_EXCEPTION = 507014, 507015


@pytest.fixture(autouse=True)
def _short_timeout(monkeypatch, mock):
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", str(TIMEOUT))
    mock.clear_faults()
    yield
    mock.clear_faults()
    own = glob.glob(f"/dev/shm/aclmock_hccl_*_p{os.getpid()}")
    assert not own, f"segments left in /dev/shm: {own}"


def _run_threads(seed=0, first="dispatch"):
    from aclnn_py import launch

    t0 = time.monotonic()
    res = launch.run_threads(fr.world_round, 2, seed, first, timeout=60)
    return res, time.monotonic() - t0


def _assert_timeout(r, stage, missing):
    assert not r["ok"], r
    assert r["stage"] == stage and r["code"] == AICORE_TIMEOUT, r
    assert f"waiting for ranks [{missing}]" in r["message"], r["message"]
    assert TIMEOUT - 0.1 <= r["elapsed"] <= TIMEOUT + MARGIN, r


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
    assert wall < TIMEOUT + 3 * MARGIN
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
    r1 = res[1]
    assert not r1["ok"] and r1["code"] == AICORE_TIMEOUT and "waiting for ranks [0]" in r1["message"], r1
    assert wall < 2.0 + 2 * TIMEOUT + 2 * MARGIN
    _assert_fresh_world_works(mock)


def test_slow_rank_within_the_timeout(acl, mock, monkeypatch):
    """A delay shorter than HCCL_EXEC_TIMEOUT changes nothing: same bytes as an undisturbed round."""
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "5")
    ref, _ = _run_threads(seed=7)
    assert all(r["ok"] for r in ref), ref
    mock.inject_fault("dispatch", rank=0, kind="delay", seconds=0.4)
    mock.inject_fault("combine", rank=1, kind="delay", seconds=0.4)
    res, wall = _run_threads(seed=7)
    assert wall >= 0.8
    assert res == ref


def test_call_order_mismatch(acl, mock):
    res, wall = _run_threads(first=["dispatch", "barrier"])
    for r in res:
        assert not r["ok"] and r["code"] == AICORE_EXCEPTION and "call-order mismatch" in r["message"], r
    assert "rank 1 runs HcclBarrier" in res[0]["message"], res[0]["message"]
    assert wall < TIMEOUT   # detected at once, not by the timeout
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
def _world_id(root: bytes) -> str:
    return f"{struct.unpack_from('<Q', root, 16)[0]:016x}"


def _run_processes(plan: dict, limit: float = 30.0) -> tuple[dict[int, dict], dict[int, int], str]:
    """A 2-rank process world under a supervisor that, unlike aclnn_py.launch.spawn (which stops
    every rank as soon as one dies), lets the survivors finish and report. Returns the survivors'
    results, every rank's exit code and the world id."""
    from aclnn_py.hccl import RootInfo

    ctx = mp.get_context("forkserver")
    root = bytes(RootInfo.create())
    env = {k: v for k, v in os.environ.items()}
    procs, conns = [], []
    for r in range(2):
        a, b = ctx.Pipe(duplex=True)
        p = ctx.Process(target=fr.proc_main, args=(r, 2, root, b, env, plan), daemon=True)
        p.start()
        b.close()
        procs.append(p)
        conns.append(a)
    results: dict[int, dict] = {}
    deadline = time.monotonic() + limit
    open_ = {0, 1}
    try:
        while open_ and time.monotonic() < deadline:
            ready = mpc.wait([conns[r] for r in open_], timeout=max(deadline - time.monotonic(), 0))
            for c in ready:
                r = conns.index(c)
                try:
                    msg = c.recv()
                except EOFError:
                    open_.discard(r)
                    continue
                if msg[0] == "launched" and plan["how"] == "kill" and msg[1] == plan["op"]:
                    time.sleep(0.2)              # let the kernel start (it sleeps inside the op)
                    os.kill(msg[2], signal.SIGKILL)
                elif msg[0] == "result":
                    results[r] = msg[1]
                    open_.discard(r)
        codes = {}
        for r, p in enumerate(procs):
            p.join(max(deadline - time.monotonic(), 0.1))
            assert not p.is_alive(), f"rank {r} hangs"
            codes[r] = p.exitcode
        return results, codes, _world_id(root)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        for c in conns:
            c.close()


@pytest.mark.parametrize("how", ["crash", "kill"])
@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_rank_process_killed_mid_op(acl, op, how):
    t0 = time.monotonic()
    results, codes, wid = _run_processes({"victim": 1, "how": how, "op": op})
    assert codes[1] == -signal.SIGKILL, codes
    assert codes[0] == 0, codes
    r0 = results[0]
    _assert_timeout(r0, op, 1)
    assert "(rank 1: process" in r0["message"] and "is dead)" in r0["message"], r0["message"]
    assert r0["after"] == {"communicators": 0, "mapped_windows": 0, "executors": 0, "pinned_blocks": 0}, r0
    assert all(r["ok"] for r in r0["new_world"]), r0["new_world"]     # same process, new world
    assert not glob.glob(f"/dev/shm/aclmock_hccl_{wid}*"), "the dead world left segments in /dev/shm"
    assert time.monotonic() - t0 < 20


def test_spawn_world_with_a_crashing_rank(acl):
    """aclnn_py.launch.spawn reports the killed rank (and stops the others at once); nothing is left
    behind and the next spawn world runs."""
    from aclnn_py import launch

    before = set(glob.glob("/dev/shm/aclmock_hccl_*"))
    t0 = time.monotonic()
    with pytest.raises(launch.RankError, match="rank 1.*SIGKILL"):
        launch.spawn(fr.spawn_round, 2, 1, "dispatch", timeout=60)
    assert time.monotonic() - t0 < 20
    res = launch.spawn(fr.world_round, 2, timeout=60)
    assert all(r["ok"] for r in res), res
    time.sleep(0.2)
    left = set(glob.glob("/dev/shm/aclmock_hccl_*")) - before
    assert not left, left
