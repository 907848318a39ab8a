"""Threads coming back from a stream synchronisation take the GIL back one at a time, in the order they
came (a queue in front of the GIL, csrc/core/gil_turnstile.h): the ranks of a thread world woken together
by one exchange do not all fight for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any


def _synchronizer(acl: Any, done: list[int], index: int) -> threading.Thread:
    def run() -> None:
        acl.Device(0).set_current()
        with acl.Device(0).create_stream() as s:
            s.synchronize()  # nothing queued: the wait ends at once, then the turnstile
        done.append(index)

    return threading.Thread(target=run, daemon=True)


def _wait_until(predicate: Any, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def test_a_thread_back_from_a_wait_queues_behind_the_turnstiles_holder(acl: Any) -> None:
    from aclnn_py import _core

    done: list[int] = []
    _core._turnstile_enter()
    try:
        t = _synchronizer(acl, done, 0)
        t.start()
        time.sleep(0.3)  # the GIL is free meanwhile: only the turnstile holds the thread
        held_back = not done and t.is_alive()
    finally:
        _core._turnstile_leave()
    assert held_back
    assert _wait_until(lambda: done == [0])
    t.join(10)


def test_threads_pass_the_turnstile_in_the_order_they_came(acl: Any) -> None:
    from aclnn_py import _core

    done: list[int] = []
    threads = []
    _core._turnstile_enter()
    try:
        for i in range(8):
            t = _synchronizer(acl, done, i)
            threads.append(t)
            t.start()
            time.sleep(0.1)  # each queues before the next starts
        held_back = len(done)
    finally:
        _core._turnstile_leave()
    assert held_back == 0
    assert _wait_until(lambda: len(done) == 8)
    assert done == list(range(8))
    for t in threads:
        t.join(10)


def test_many_threads_synchronising_at_once_all_come_back(acl: Any) -> None:
    rounds, width = 30, 64
    finished: list[int] = []
    barrier = threading.Barrier(width)

    def run(i: int) -> None:
        acl.Device(0).set_current()
        with acl.Device(0).create_stream() as s:
            x = acl.Tensor.zeros((256,), "float32")
            for _ in range(rounds):
                barrier.wait()
                x.copy_from(x.numpy(), stream=s)
                s.synchronize()
        finished.append(i)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(finished) == list(range(width))


def test_a_child_forked_while_the_turnstile_is_held_synchronises(acl: Any) -> None:
    """The child has only the forking thread, which holds the GIL: the queue of the parent's threads is
    not the child's to wait in."""
    code = textwrap.dedent("""
        import os, sys
        import aclnn_py as acl
        from aclnn_py import _core
        acl.init("mock")
        acl.Device(0).set_current()
        _core._turnstile_enter()
        pid = os.fork()
        if pid == 0:
            with acl.Device(0).create_stream() as s:
                s.synchronize()
            os._exit(7)
        _core._turnstile_leave()
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "ACLNN_PY_BACKEND": "mock"})
    assert "child exit 7" in r.stdout, r.stdout + r.stderr
