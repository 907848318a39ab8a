"""On the mock, calls that only read thread state or queue work keep the GIL: a thread world's hundreds
of rank threads would otherwise hand it over at each of them. A blocking call still releases it."""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def _other_thread_ran_during(calls: Callable[[], None]) -> bool:
    """Whether a thread that waits for the GIL got it while `calls` ran. The switch interval is made
    far longer than the test, so only a call that releases the GIL lets the other thread in."""
    gate = threading.Lock()
    gate.acquire()
    ran: list[int] = []
    ready = threading.Event()

    def other() -> None:
        ready.set()
        with gate:  # waits without the GIL; once the gate opens, it waits for the GIL
            ran.append(1)

    saved = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    # earlier tests' garbage: a finalizer the collector ran meanwhile might free memory (a call that
    # releases the GIL) in the middle of the probe
    gc.collect()
    gc.disable()
    t = threading.Thread(target=other)
    try:
        t.start()
        ready.wait()
        time.sleep(0.05)  # the other thread now blocks on the gate
        gate.release()
        calls()
        seen = bool(ran)
    finally:
        gc.enable()
        sys.setswitchinterval(saved)
        t.join(10)
    assert ran, "the other thread never ran"
    return seen


def test_the_probe_sees_a_call_that_releases_the_gil(acl: Any) -> None:
    """A cffi call releases the GIL; one that lasts (a 32 MiB copy) gives the waiting thread time to
    take it."""
    import numpy as np

    host = np.ones(32 << 20, np.uint8)
    t = acl.Tensor.empty((32 << 20,), np.uint8)
    try:
        assert _other_thread_ran_during(lambda: t.copy_from(host))
    finally:
        t.close()


def test_current_device_keeps_the_gil(acl: Any) -> None:
    acl.Device(0).set_current()

    def calls() -> None:
        for _ in range(200):
            assert acl.Device.current().id == 0

    assert not _other_thread_ran_during(calls)


def test_barrier_queued_on_a_stream_keeps_the_gil(acl: Any) -> None:
    from aclnn_py.hccl import Communicator, RootInfo

    comm = Communicator(1, 0, RootInfo.create())
    stream = acl.Device.current().create_stream()
    try:
        assert not _other_thread_ran_during(lambda: [comm.barrier(stream) for _ in range(20)])
        stream.synchronize()  # a world of one: every barrier completes
    finally:
        comm.close()
        stream.close()
