"""Host waits that a user can interrupt (the C side of Ctrl-C), through the raw cffi layer.

A Python layer that wants Ctrl-C to work waits in short slices
(``aclrtSynchronizeStreamWithTimeout(stream, ~100 ms)`` in a loop, checking signals in between) and
runs ``HcclCommInitRootInfo`` on a helper thread. The mock must support that: a timed-out slice
returns 507046 promptly and leaves the queued kernel alone; after the user abandons a wait,
``HcclCommDestroy`` makes the kernel that waits for a missing peer fail at once, and synchronising or
destroying the stream returns promptly; a process whose main thread ends while another thread is
blocked in the rendezvous or a kernel wait exits promptly and leaves /dev/shm clean."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import package_pythonpath
from helpers import fault_ranks as fr

SYNC_TIMEOUT, AICORE_TIMEOUT, AICORE_EXCEPTION = 507046, 507014, 507015
PROMPT = 10.0   # far below the 120 s default timeout, with room for a loaded machine
HELPER = Path(__file__).resolve().parents[1] / "helpers" / "exit_while_blocked.py"


@pytest.fixture
def default_timeouts(monkeypatch, mock):
    monkeypatch.delenv("HCCL_EXEC_TIMEOUT", raising=False)
    monkeypatch.delenv("HCCL_CONNECT_TIMEOUT", raising=False)
    assert mock.exec_timeout() == 120


def _form_world(acl, n=2):
    from aclnn_py import worlds
    from aclnn_py.hccl import Communicator, build_context

    def body(rank, ws, root):
        comm = Communicator(ws, rank, root)
        ctx, ccl = build_context(comm)
        return comm, ctx, ccl, acl.Device.current().create_stream()

    return worlds.run_threads(body, n, timeout=60)


def _prepare_dispatch(rank, world, seed=5):
    """Phase 1 (inputs uploaded now: an upload from pageable memory waits for the stream, so it must
    not come after a kernel that waits for a peer)."""
    from aclnn_py.ops import prepare_dispatch

    comm, ctx, ccl, stream = world[rank]
    x, ids, _ = fr.inputs(rank, seed)
    return prepare_dispatch(ctx, x, ids, ep_world_size=len(world), ep_rank_id=rank, moe_expert_num=fr.E,
                            ccl_buffer_size=ccl, stream=stream)


def _launch_dispatch(rank, world, seed=5):
    p = _prepare_dispatch(rank, world, seed)
    p.launch(world[rank][3])
    return p


def _slice(lib, stream, ms=100):
    t0 = time.monotonic()
    rc = lib.aclrtSynchronizeStreamWithTimeout(stream._cdata, ms)
    return rc, time.monotonic() - t0


def _close(world):
    for comm, _, _, stream in world:
        stream.close()
        comm.close()


def test_timed_out_slices_leave_the_kernel_intact(acl, raw, default_timeouts):
    """Rank 0's dispatch waits for rank 1; three 100 ms slices time out (507046, each about 100 ms);
    then rank 1 launches and a plain synchronise reports success: rank 0's outputs are the bytes of
    an undisturbed round."""
    ffi, lib = raw
    ref = fr.new_thread_world(seed=5)
    world = _form_world(acl)
    try:
        acl.Device(0).set_current()
        p0 = _launch_dispatch(0, world)
        for _ in range(3):
            rc, took = _slice(lib, world[0][3])
            assert rc == SYNC_TIMEOUT, rc
            assert 0.099 <= took < PROMPT, took
        acl.Device(1).set_current()
        _launch_dispatch(1, world)
        acl.Device(0).set_current()
        assert lib.aclrtSynchronizeStream(world[0][3]._cdata) == 0
        o = p0.result
        n = int(o.ep_recv_counts.numpy()[-1])
        assert o.expand_x.numpy()[:n].tobytes() == ref[0]["expand_x"]
        world[1][3].synchronize()
    finally:
        _close(world)
        acl.Device(0).set_current()


def test_abandoned_kernel_fails_promptly_once_the_communicator_is_destroyed(acl, raw, default_timeouts):
    """Rank 1 never launches (alive, holding its communicator). The user abandons rank 0's wait after a
    slice and destroys rank 0's communicator: that returns promptly, the dispatch waiting inside fails
    (507015, 'destroyed'), a combine queued behind it fails too, and synchronising and destroying the
    stream return promptly, all with HCCL_EXEC_TIMEOUT at 120 s."""

    ffi, lib = raw
    world = _form_world(acl)
    comm0, ctx0, ccl0, s0 = world[0]
    try:
        acl.Device(0).set_current()
        # a second kernel queued behind the first; both kept referenced (their inputs stay allocated,
        # so no free has to wait for them)
        launched = [_prepare_dispatch(0, world), _prepare_dispatch(0, world, seed=6)]
        for p in launched:
            p.launch(s0)
        rc, _ = _slice(lib, s0)
        assert rc == SYNC_TIMEOUT
        t0 = time.monotonic()
        comm0.close()                           # HcclCommDestroy, once
        assert time.monotonic() - t0 < PROMPT
        t0 = time.monotonic()
        rc = lib.aclrtSynchronizeStream(s0._cdata)
        assert rc == AICORE_EXCEPTION, rc
        assert "destroyed" in ffi.string(lib.aclGetRecentErrMsg()).decode()
        s0.close()
        assert time.monotonic() - t0 < PROMPT
        del launched
    finally:
        _close(world)
        acl.Device(0).set_current()


@pytest.mark.parametrize("blocked_in", ["join", "kernel"])
@pytest.mark.parametrize("how", ["sys.exit", "main ends"])
def test_process_exits_promptly_while_a_thread_is_blocked(acl, blocked_in, how):
    """A child interpreter blocks a daemon thread in HcclCommInitRootInfo (its peer never comes), or
    leaves a barrier waiting on a stream, then its main thread calls sys.exit or simply ends: the
    process is gone within seconds (the timeouts are 120 s) and /dev/shm holds nothing of its world."""
    env = dict(os.environ, ACLNN_PY_BACKEND="mock", HCCL_BUFFSIZE="2", HCCL_EXEC_TIMEOUT="120",
               HCCL_CONNECT_TIMEOUT="120")
    env["PYTHONPATH"] = package_pythonpath(env)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(HELPER), blocked_in, how], capture_output=True, text=True,
                         timeout=60, env=env)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert "blocked" in res.stdout, res.stdout
    world = res.stdout.split("world ", 1)[1].split()[0]
    assert took < PROMPT + 5, took
    assert [n for n in os.listdir("/dev/shm") if world in n] == []
