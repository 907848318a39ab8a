"""MoeDistributeBuffer in a serving loop: with device Tensors and a Stream, each
``low_latency_dispatch`` / ``low_latency_combine`` after the first of its shape takes its outputs from
the memory pool and reaches the operators' compiled call; host inputs, and the first call of a shape,
keep going through the operators' Python functions. Either way the bytes are the same."""

from __future__ import annotations

import threading
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers.routes import PythonOpCalls

E, BS, H, K = 4, 8, 1024, 2
STEPS = 6


def _inputs(rank: int, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(300 * rank + i)
    x = rng.uniform(-1, 1, (BS, H)).astype(ml_dtypes.bfloat16)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    return x, ids, rng.uniform(0, 1, (BS, K)).astype(np.float32)


def _loop(rank: int, world_size: int, root: bytes, counter: PythonOpCalls, ready: threading.Barrier,
          device_inputs: bool) -> dict[str, Any]:
    """STEPS steps over two input sets in turn: per step the routes taken (Python calls of dispatch,
    combine) and a digest of x_out and of the rows dispatch received."""
    import aclnn_py as acl

    ready.wait()  # the counter is installed before any rank calls
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device(rank).create_stream()
        sets = [_inputs(rank, i) for i in range(2)]
        routes, results = [], []
        for step in range(STEPS):
            x, ids, w = sets[step % 2]
            if device_inputs:  # new Tensors every step, as a model's activations are
                x, ids, w = (acl.Tensor.from_numpy(a) for a in (x, ids, w))
            before = counter.seen()
            out = buf.low_latency_dispatch(x, ids, E, topk_weights=w, stream=s)
            y = buf.low_latency_combine(out.expand_x, ids, w, out.assist_info_for_combine, out.ep_recv_counts,
                                        num_experts=E, stream=s)
            routes.append(tuple(n - b for n, b in zip(counter.seen(), before)))
            buf.synchronize(s)
            received = int(out.ep_recv_counts.numpy()[-1])
            results.append((out.expand_x.numpy()[:received].tobytes(), y.numpy().tobytes()))
        comm.barrier()
        s.close()
    return {"routes": routes, "results": results}


def _run(acl: Any, counter: PythonOpCalls, device_inputs: bool) -> list[dict[str, Any]]:
    ready = threading.Barrier(2)
    result: list[dict[str, Any]] = acl.launch.run_threads(_loop, 2, counter, ready, device_inputs, timeout=120)
    return result


def test_device_tensors_and_a_stream_reach_the_compiled_call(acl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = PythonOpCalls(monkeypatch)
    for rank in _run(acl, counter, device_inputs=True):
        # the first call of a shape checks it in Python; every later one is the compiled call
        assert rank["routes"] == [(1, 1)] + [(0, 0)] * (STEPS - 1), rank["routes"]
        results = rank["results"]
        assert all(results[i] == results[i % 2] for i in range(STEPS))  # no step read another's outputs


def test_host_inputs_keep_the_python_path_and_give_the_same_bytes(acl: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    counter = PythonOpCalls(monkeypatch)
    host = _run(acl, counter, device_inputs=False)
    device = _run(acl, counter, device_inputs=True)
    for on_host, on_device in zip(host, device):
        assert on_host["routes"] == [(1, 1)] * STEPS  # uploads happen in the operators' Python functions
        assert on_host["results"] == on_device["results"]


def test_the_switch_to_the_python_path_holds_for_the_buffer(acl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the compiled path off the pooled outputs go to the Python functions, same bytes."""
    from aclnn_py.ops import set_compiled_path

    counter = PythonOpCalls(monkeypatch)
    previous = set_compiled_path(False)
    try:
        python = _run(acl, counter, device_inputs=True)
    finally:
        set_compiled_path(previous)
    compiled = _run(acl, counter, device_inputs=True)
    for p, c in zip(python, compiled):
        assert p["routes"] == [(1, 1)] * STEPS
        assert p["results"] == c["results"]
