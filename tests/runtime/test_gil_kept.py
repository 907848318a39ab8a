"""On the mock, calls that only read thread state or queue work keep the GIL: a thread world's hundreds
of rank threads would otherwise hand it over at each of them. A blocking call still releases it."""

from __future__ import annotations

import gc
import itertools
import operator
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any


def _other_thread_ran_during(fn: Callable[..., object], calls: list[tuple[object, ...]]) -> bool:
    """Whether a thread waiting for the GIL got it while ``fn(*args)`` ran for each of `calls`.

    The calls run from C (itertools.starmap), so the interpreter never offers the GIL between them.
    The waiting thread asks for it after one switch interval (1 ms); from then on, a call that releases
    the GIL must hand it over (CPython's forced switching) and the thread runs while calls remain. It
    records how many remained when it got the GIL: none, if no call released it."""
    gate = threading.Lock()
    gate.acquire()
    remaining: list[int] = []
    pending = iter(calls)
    ready = threading.Event()

    def other() -> None:
        ready.set()
        with gate:  # waits without the GIL; once the gate opens, it waits for the GIL
            remaining.append(operator.length_hint(pending))

    saved = sys.getswitchinterval()
    gc.collect()  # a finalizer run meanwhile might release the GIL (earlier tests' garbage)
    gc.disable()
    t = threading.Thread(target=other)
    try:
        t.start()
        ready.wait()
        time.sleep(0.05)  # the other thread now blocks on the gate
        sys.setswitchinterval(0.001)
        gate.release()
        deque(itertools.starmap(fn, pending), maxlen=0)
    finally:
        sys.setswitchinterval(saved)
        gc.enable()
        t.join(10)
    assert remaining, "the other thread never ran"
    return remaining[0] > 0


def test_the_probe_sees_a_call_that_releases_the_gil(acl: Any) -> None:
    lib = acl.runtime.initialized().lib
    cell = acl.runtime.initialized().ffi.new("uint32_t *")
    assert _other_thread_ran_during(lib.aclrtGetDeviceCount, [(cell,)] * 100_000)


def test_current_device_keeps_the_gil(acl: Any) -> None:
    from aclnn_py import _core

    acl.Device(0).set_current()
    assert _core.current_device() == (0, 0)
    assert not _other_thread_ran_during(_core.current_device, [()] * 100_000)


def test_barrier_queued_on_a_stream_keeps_the_gil(acl: Any) -> None:
    from aclnn_py import _core
    from aclnn_py.hccl import Communicator, RootInfo

    comm = Communicator(1, 0, RootInfo.create())
    stream = acl.Device.current().create_stream()
    try:
        assert not _other_thread_ran_during(_core.hccl_barrier, [(comm.handle, stream.handle)] * 20_000)
        stream.synchronize()  # a world of one: every barrier completes
    finally:
        comm.close()
        stream.close()


def test_destroying_an_executor_keeps_the_gil(acl: Any, mock: Any) -> None:
    import numpy as np

    from aclnn_py import _core

    src = acl.Tensor.from_numpy(np.arange(16, dtype=np.float32))
    dst = acl.Tensor.empty((16,), np.float32)
    ffi = acl.backend().ffi

    def address(cdata: Any) -> int:
        return int(ffi.cast("uintptr_t", cdata))

    executors = [mock.make_copy_executor(address(src.descriptor()), address(dst.descriptor()), 0) for _ in range(20_000)]
    assert not _other_thread_ran_during(_core.destroy_executor_at, [(e,) for e in executors])
    assert _core.destroy_executor_at(executors[0]) != 0  # destroyed: the mock refuses it now
