"""Rank functions of tests/mock/test_faults.py and tests/test_concurrency.py (light to import: every rank
process of a process world imports this module).

A round is one small dispatch → combine on a 2-rank world (W = 2, E = 2, BS = 2, H = 1024, K = 1)
whose expert output is the dispatch output itself, so the combine result is fully determined by
the inputs; every failure is caught and returned with the stage, code, message and time taken.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BS, H, K, E = 2, 1024, 1, 2


def inputs(rank: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from ml_dtypes import bfloat16

    rng = np.random.default_rng(1000 * seed + rank)
    x = rng.standard_normal((BS, H), dtype=np.float32).astype(bfloat16)
    ids = rng.integers(0, E, (BS, K), dtype=np.int32)
    w = rng.random((BS, K), dtype=np.float32)
    return x, ids, w


def round_trip(rank: int, comm: Any, ctx: Any, ccl: int, stream: Any, seed: int = 0, first: str = "dispatch",
               notify: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Dispatch then combine on `stream`. `first="barrier"` runs an HcclBarrier where the peers run
    dispatch (a call-order mismatch); `first="leave"` runs nothing (the caller then destroys the
    communicator while its peers wait for it). Returns {"ok": True, "expand_x", "x_out"} (bytes) or
    {"ok": False, "stage", "code", "message", "elapsed"}."""
    from aclnn_py.errors import AclnnPyError
    from aclnn_py.ops import prepare_combine, prepare_dispatch

    x, ids, w = inputs(rank, seed)
    stage, t0 = first, time.monotonic()
    try:
        if first == "barrier":
            comm.barrier(stream, wait=True)
            return {"ok": True}
        if first == "leave":
            return {"ok": True, "left": True}
        kw = dict(ep_world_size=2, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl, stream=stream)
        p = prepare_dispatch(ctx, x, ids, **kw)
        p.launch(stream)
        if notify:
            notify("dispatch")
        stream.synchronize()
        o = p.result
        n = int(o.ep_recv_counts.numpy()[-1])
        stage, t0 = "combine", time.monotonic()
        q = prepare_combine(ctx, o.expand_x, ids, o.assist_info_for_combine, o.ep_recv_counts, w, **kw)
        q.launch(stream)
        if notify:
            notify("combine")
        stream.synchronize()
        return {"ok": True, "expand_x": o.expand_x.numpy()[:n].tobytes(), "x_out": q.result.numpy().tobytes()}
    except AclnnPyError as e:
        return {"ok": False, "stage": stage, "code": e.code, "message": e.message or str(e),
                "elapsed": time.monotonic() - t0}


def world_round(rank: int, world_size: int, root: bytes, seed: int = 0, first: Any = "dispatch",
                notify: Callable[[str], None] | None = None,
                hold: Callable[[], Any] | None = None) -> dict[str, Any]:
    """One rank of a world: communicator, context, a round on its own stream, clean-up.
    `first` may be a per-rank list. `hold`, when given, is called after the round and before the
    communicator is destroyed (e.g. a barrier of the thread ranks, so that a rank that failed early
    stays in the world while its peers wait for it: they then see the timeout, not a peer gone)."""
    from aclnn_py import Device
    from aclnn_py.hccl import Communicator, build_context

    if isinstance(first, (list, tuple)):
        first = first[rank]
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        stream = Device.current().create_stream()
        try:
            res = round_trip(rank, comm, ctx, ccl, stream, seed, first, notify)
            if hold is not None:
                hold()
            return res
        finally:
            try:
                stream.synchronize()
            except Exception:  # noqa: BLE001 - the failure was reported by round_trip
                pass
            stream.close()


def new_thread_world(seed: int = 0) -> list[dict[str, Any]]:
    """A fresh 2-rank threads world in this process, one round: proves the process is usable."""
    from aclnn_py import worlds

    return worlds.run_threads(world_round, 2, seed, timeout=60)


# ---- process worlds (tests/mock/test_faults.py starts these with aclnn_py.worlds.spawn) -------------------
def killed_round(rank: int, world_size: int, root: bytes, plan: dict[str, Any], pid_dir: str) -> dict[str, Any]:
    """A rank of a process world whose victim dies inside an op. plan: {"victim": rank, "how":
    "crash" | "kill", "op": "dispatch" | "combine"}. crash: the victim SIGKILLs itself inside the
    kernel (injected fault, after its rows reached the peers); kill: the victim's kernel sleeps and
    a timer thread of the victim SIGKILLs the process 0.5 s after the launch. The survivors report
    their failure, the mock's live objects afterwards, and a new threads world run in the same
    process."""
    from aclnn_py import _mock

    Path(pid_dir, f"rank{rank}").write_text(str(os.getpid()))
    notify = None
    if rank == plan["victim"]:
        if plan["how"] == "crash":
            _mock.inject_fault(plan["op"], rank=rank, kind="crash")
        else:
            _mock.inject_fault(plan["op"], rank=rank, kind="delay", seconds=120.0)

            def notify(stage: str) -> None:
                if stage == plan["op"]:
                    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()

    res = world_round(rank, world_size, root, notify=notify)
    res["root"] = root
    res["exec_timeout"] = _mock.exec_timeout()
    stats = _mock.stats()
    res["after"] = {k: stats[k] for k in ("communicators", "mapped_windows", "executors", "pinned_blocks")}
    if not res["ok"]:
        res["new_world"] = new_thread_world(seed=1)
    return res


def spawn_round(rank: int, world_size: int, root: bytes, victim: int, op: str, root_dir: str) -> dict[str, Any]:
    """A rank of an aclnn_py.worlds.spawn world; the victim crashes inside `op`. Rank 0 leaves the
    root info in root_dir/root, so the test can find this world's segments."""
    from aclnn_py import _mock

    if rank == 0:
        Path(root_dir, "root").write_bytes(root)
    if rank == victim:
        _mock.inject_fault(op, rank=rank, kind="crash")
    return world_round(rank, world_size, root)
