"""Host overhead: µs per dispatch / combine call spent in Python and the C API, with the mock's
kernels switched off (``_mock.set_skip_kernels``: phase 2 still checks everything and queues a task,
the task does nothing). Seven paths per op, measured in the same process on the same tensors,
attributes and stream, their batches interleaved so that drift of a shared machine hits all alike:

* ``ctypes`` — a plain ctypes binding (descriptors created per call, as ctypes users do);
* ``per_call`` — aclnn-py's ``moe_distribute_dispatch`` / ``moe_distribute_combine`` with
  caller-provided outputs (cached descriptors, phase 1 every call);
* ``c_per_call`` — the C floor of that: phase 1 + phase 2 in a C loop, descriptors made once;
* ``plan`` — a :class:`~aclnn_py.ops.DispatchPlan` / ``CombinePlan`` called with new activations each
  step (two input sets alternate, so every call rebinds the plan's activation inputs);
* ``c_plan`` — the C floor of that: ``aclSetInputTensorAddr`` of the same inputs + phase 2 in a C
  loop on one repeatable executor;
* ``plan_reuse`` / ``c_plan_reuse`` — the same with the same input tensors every call: the plan
  rebinds nothing, the C loop only launches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from .c_floor import COMBINE, DISPATCH, CFloor, address
from .ctypes_baseline import CtypesBinding
from .progress import SILENT, Progress
from .stats import batch_us, ratio, summary_us

PATHS = ("ctypes", "per_call", "c_per_call", "plan", "c_plan", "plan_reuse", "c_plan_reuse")
WORKSPACE_BYTES = 1 << 24  # the C per-call loop's workspace; phase 1 asks for far less

# Inputs a plan call rebinds in this bench (C parameter indices, names as in aclnn_py.ops).
DISPATCH_REBOUND = {1: "x", 2: "expert_ids"}
COMBINE_REBOUND = {1: "expand_x", 2: "expert_ids", 3: "assist_info_for_combine", 4: "ep_send_counts"}

Runner = Callable[[int], float]  # runs a batch of n calls, returns µs per call


def _executor_of(prepared: Any) -> Any:
    """The aclOpExecutor* of a prepared op (aclnn_py.ops keeps it on the Prepared object)."""
    return prepared._executor


def _input_descriptors(prepared: Any, slots: dict[int, str]) -> list[int]:
    """Addresses of the aclTensor descriptors of a prepared op's inputs `slots` (all present)."""
    return [address(prepared.inputs[i].descriptor()) for i in slots]


def interleaved(runners: dict[str, Runner], calls: int, repeats: int,
                between: Callable[[], None]) -> dict[str, dict[str, float]]:
    """Median / min / max µs per call of every runner over `repeats` batches of `calls` calls; each
    repeat runs every runner once, starting one further along each time; `between` runs after each
    batch, outside the timing."""
    names = list(runners)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(runners[name](calls))
            between()
    return {n: summary_us(samples[n]) for n in names}


def _ratios(row: dict[str, Any]) -> None:
    med = {p: row[p]["median_us"] for p in PATHS}
    row["ctypes_over_plan"] = ratio(med["ctypes"], med["plan"])
    row["per_call_over_plan"] = ratio(med["per_call"], med["plan"])
    row["plan_over_c_plan"] = ratio(med["plan"], med["c_plan"])
    row["per_call_over_c_per_call"] = ratio(med["per_call"], med["c_per_call"])
    row["plan_reuse_over_c_plan_reuse"] = ratio(med["plan_reuse"], med["c_plan_reuse"])


def _measure_rank0(ctx: Any, stream: Any, world_size: int, ccl: int, d: Any, y: Any, x: Any, ids: Any,
                   calls: int, repeats: int, progress: Progress) -> dict[str, Any]:
    import aclnn_py as acl
    from aclnn_py.ops import (
        CombinePlan,
        DispatchPlan,
        moe_distribute_combine,
        moe_distribute_dispatch,
        prepare_combine,
        prepare_dispatch,
    )
    from aclnn_py.ops._common import keepalive

    bf16 = acl.dtypes.bfloat16
    rank, e = 0, world_size
    bs, h = x.shape
    k = ids.shape[1]
    attrs: dict[str, Any] = dict(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=e, ccl_buffer_size=ccl)
    assist, counts = d.assist_info_for_combine, d.ep_recv_counts
    # a second set of activations at other addresses: a plan call each step sees new tensors
    x2, ids2, y2 = (acl.Tensor.from_numpy(t.numpy()) for t in (x, ids, y))
    assist2, counts2 = (acl.Tensor.from_numpy(t.numpy()) for t in (assist, counts))
    dplan = DispatchPlan(ctx, bs=bs, hidden=h, topk=k, x_dtype=bf16, **attrs)
    cplan = CombinePlan(ctx, a=y.shape[0], bs=bs, hidden=h, topk=k, dtype=bf16, assist_len=assist.shape[0],
                        counts_len=counts.shape[0], **attrs)
    dprep = prepare_dispatch(ctx, x, ids, repeatable=True, **attrs)
    cprep = prepare_combine(ctx, y, ids, assist, counts, repeatable=True, **attrs)
    cb = CtypesBinding(acl.backend().libraries)
    floor = CFloor()
    ws = acl.DeviceMemory(WORKSPACE_BYTES)
    dws = acl.DeviceMemory(max(dprep.workspace_size, 32))
    cws = acl.DeviceMemory(max(cprep.workspace_size, 32))
    sh = stream.address
    empty_w = acl.Tensor.from_numpy(np.zeros((0,), np.float32))
    c_out = acl.Tensor.empty((bs, h), bf16)
    d_attrs = [world_size, rank, e, ccl, 0, 0, 0, 1, 0, 0, 0, 1]  # the defaults prepare_dispatch passes
    c_attrs = [world_size, rank, e, ccl, 0, 0, 0, 1, 0, 0, 0, 0, 0]  # ... and prepare_combine
    tail = [0, 0, 0]  # zero / copy / const experts, after commAlg
    d_tensors = [address(t.descriptor()) if t is not None else 0 for t in [ctx, x, ids] + [None] * 5 + list(d)]
    c_tensors = [address(t.descriptor()) if t is not None else 0
                 for t in [ctx, y, ids, assist, counts, empty_w] + [None] * 13 + [c_out]]
    d_sets = [[x.data_ptr, ids.data_ptr], [x2.data_ptr, ids2.data_ptr]]
    c_sets = [[y.data_ptr, ids.data_ptr, assist.data_ptr, counts.data_ptr],
              [y2.data_ptr, ids2.data_ptr, assist2.data_ptr, counts2.data_ptr]]
    d_steps = itertools.cycle([(x, ids), (x2, ids2)])
    c_steps = itertools.cycle([(y, ids, assist, counts), (y2, ids2, assist2, counts2)])

    def py(fn: Callable[[], object]) -> Runner:
        return lambda n: batch_us(fn, n)

    dispatch: dict[str, Runner] = {
        "ctypes": py(lambda: cb.dispatch([ctx, x, ids] + [None] * 5, list(d), d_attrs, b"", tail, sh, ws.ptr)),
        "per_call": py(lambda: moe_distribute_dispatch(ctx, x, ids, stream=stream, outputs=d, **attrs)),
        "c_per_call": lambda n: floor.dispatch_per_call(d_tensors, d_attrs + tail, b"", ws.ptr, WORKSPACE_BYTES,
                                                        sh, n),
        "plan": py(lambda: dplan(*next(d_steps), stream=stream)),
        "c_plan": lambda n: floor.plan(DISPATCH, address(_executor_of(dprep)), list(DISPATCH_REBOUND),
                                       _input_descriptors(dprep, DISPATCH_REBOUND), d_sets,
                                       dws.ptr, dprep.workspace_size, sh, n),
        "plan_reuse": py(lambda: dplan(x, ids, stream=stream)),
        "c_plan_reuse": lambda n: floor.plan(DISPATCH, address(_executor_of(dprep)), [], [], [[]], dws.ptr,
                                             dprep.workspace_size, sh, n),
    }
    combine: dict[str, Runner] = {
        "ctypes": py(lambda: cb.combine([ctx, y, ids, assist, counts, empty_w] + [None] * 13, [c_out], c_attrs, b"",
                                        tail, sh, ws.ptr)),
        "per_call": py(lambda: moe_distribute_combine(ctx, y, ids, assist, counts, stream=stream, x_out=c_out,
                                                      **attrs)),
        "c_per_call": lambda n: floor.combine_per_call(c_tensors, c_attrs + tail, b"", ws.ptr, WORKSPACE_BYTES,
                                                       sh, n),
        "plan": py(lambda: cplan(*next(c_steps), stream=stream)),
        "c_plan": lambda n: floor.plan(COMBINE, address(_executor_of(cprep)), list(COMBINE_REBOUND),
                                       _input_descriptors(cprep, COMBINE_REBOUND), c_sets,
                                       cws.ptr, cprep.workspace_size, sh, n),
        "plan_reuse": py(lambda: cplan(y, ids, assist, counts, stream=stream)),
        "c_plan_reuse": lambda n: floor.plan(COMBINE, address(_executor_of(cprep)), [], [], [[]], cws.ptr,
                                             cprep.workspace_size, sh, n),
    }

    def settle() -> None:
        stream.synchronize()
        keepalive.reap()

    result: dict[str, Any] = {}
    try:
        for op, runners, rebound in (("dispatch", dispatch, DISPATCH_REBOUND), ("combine", combine, COMBINE_REBOUND)):
            progress(f"host overhead: {op}, {len(runners)} paths x {repeats} repeats x {calls} calls")
            for run in runners.values():  # warm caches
                run(min(calls, 200))
                settle()
            row: dict[str, Any] = interleaved(runners, calls, repeats, settle)
            row["plan_rebinds"] = list(rebound.values())
            _ratios(row)
            result[op] = row
    finally:
        settle()
        for p in (dplan, cplan, dprep, cprep):
            p.close()
    return result


def _host_overhead_rank(rank: int, world_size: int, root: bytes, calls: int, repeats: int,
                        progress: Progress) -> dict[str, Any]:
    import aclnn_py as acl
    from aclnn_py import _mock
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import moe_distribute_combine, moe_distribute_dispatch

    dev = acl.Device.current()  # the launcher made rank % device_count current
    stream = dev.create_stream()
    bf16 = acl.dtypes.bfloat16
    bs, h, k, e = 1, 1024, 1, world_size
    result: dict[str, Any] = {}
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        attrs: dict[str, Any] = dict(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=e,
                                     ccl_buffer_size=ccl)
        x = acl.Tensor.from_numpy(np.ones((bs, h), bf16))
        ids = acl.Tensor.from_numpy(np.full((bs, k), rank % e, np.int32))
        # one real round so combine has meaningful inputs
        d = moe_distribute_dispatch(ctx, x, ids, stream=stream, **attrs)
        stream.synchronize()
        y = acl.Tensor.from_numpy(d.expand_x.numpy().astype(bf16))
        moe_distribute_combine(ctx, y, ids, d.assist_info_for_combine, d.ep_recv_counts, stream=stream, **attrs)
        stream.synchronize()
        comm.barrier(stream)
        stream.synchronize()
        if rank == 0:
            _mock.set_skip_kernels(True)
            try:
                result = _measure_rank0(ctx, stream, world_size, ccl, d, y, x, ids, calls, repeats, progress)
            finally:
                _mock.set_skip_kernels(False)
        comm.barrier(stream)
        stream.synchronize()
        stream.close()
    return result


def host_overhead(calls: int = 3000, repeats: int = 7, progress: Progress = SILENT) -> dict[str, Any]:
    """Host µs per call of dispatch and combine on the five paths, with their ratios."""
    from aclnn_py.launch import run_threads

    result: dict[str, Any] = run_threads(_host_overhead_rank, 2, calls, repeats, progress, timeout=900)[0]
    return result
