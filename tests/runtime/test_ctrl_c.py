"""Ctrl-C while blocked: a wait for a missing peer (stream synchronisation, a communicator join, a
timed synchronisation) raises KeyboardInterrupt within about 100 ms, and closing the objects afterwards
returns promptly (real processes receive a real SIGINT)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from conftest import package_pythonpath

# The child: rank 0 runs on the main thread and blocks in `WAIT`; rank 1 (a thread) joins but never
# takes part. It reports when the KeyboardInterrupt arrived and how long cleaning up took.
CHILD = r"""
import json, sys, threading, time
import numpy as np, ml_dtypes
import aclnn_py as acl

wait = sys.argv[1]
acl.init("mock")
acl.Device(0).set_current()
root = acl.hccl.RootInfo.create()
peer_joined, stop = threading.Event(), threading.Event()

def rank1():
    acl.Device(1).set_current()
    comm = acl.hccl.Communicator(2, 1, root)
    peer_joined.set()
    stop.wait(120)
    comm.close()

if wait != "join":
    threading.Thread(target=rank1, daemon=True).start()
report = {}
comm = buf = s = None
try:
    if wait == "join":
        print("ready", flush=True)
        comm = acl.hccl.Communicator(2, 0, root)  # rank 1 never joins
    else:
        comm = acl.hccl.Communicator(2, 0, root)
        peer_joined.wait(60)
        s = acl.Device(0).create_stream()
        if wait == "dispatch":
            buf = acl.MoeDistributeBuffer(comm)
            buf.low_latency_dispatch(np.ones((2, 1024), ml_dtypes.bfloat16), np.array([[0], [1]]), 2, stream=s)
            print("ready", flush=True)
            buf.synchronize(s)
        else:
            comm.barrier(s, wait=False)
            print("ready", flush=True)
            s.synchronize(timeout_ms=100_000)
    report["outcome"] = "returned"
except KeyboardInterrupt:
    report["interrupted_at"] = time.monotonic()
    t0 = time.monotonic()
    for obj in (buf, comm, s):
        if obj is not None:
            obj.close()
    report["close_s"] = time.monotonic() - t0
    report["outcome"] = "interrupted"
stop.set()
print(json.dumps(report), flush=True)
"""


@pytest.mark.parametrize("wait", ["dispatch", "barrier", "join"])
def test_ctrl_c_interrupts_a_blocked_wait(acl: Any, wait: str, tmp_path: Any) -> None:
    env = dict(os.environ)
    env.update(PYTHONPATH=package_pythonpath(env), HCCL_EXEC_TIMEOUT="100", HCCL_CONNECT_TIMEOUT="100")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = subprocess.Popen([sys.executable, str(script), wait], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # the wait has begun
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["outcome"] == "interrupted", report
    delay = report["interrupted_at"] - sent
    # about 100 ms on an idle machine; the bound leaves room for a loaded CI box, far below the 100 s timeouts
    assert delay < 3.0, f"KeyboardInterrupt arrived {delay:.2f} s after SIGINT"
    assert report["close_s"] < 10.0, f"cleaning up took {report['close_s']:.2f} s"
