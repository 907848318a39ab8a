"""Host overhead: µs per dispatch / combine call spent in Python and the C API, with the mock's
kernels switched off (``_mock.set_skip_kernels``: phase 2 still checks everything and queues a task,
the task does nothing) and its poison fill of reused memory off (CANN fills nothing; with it on, the
buffer's reused outputs would pay a refill the other paths do not). Ten paths per op, measured in the same process on the same tensors,
attributes and stream, their batches interleaved so that drift of a shared machine hits all alike:

* ``buffer`` — :class:`~aclnn_py.MoeDistributeBuffer`'s ``low_latency_dispatch`` /
  ``low_latency_combine`` with device Tensors and a Stream, as a serving loop calls them (dropping each
  call's result): each call writes into the memory of the buffer's result set of two calls before and
  hands out new Tensors over it;
* ``buffer_host`` — the same with host arrays (numpy) for the activations, as a serving stack without
  device Tensors passes them: each call copies them into the Tensors the result set keeps (from
  pageable memory: the copy returns once it has run);
* ``buffer_varying`` — ``buffer`` with the token count of a serving loop's batches varying: three
  counts (1, 2, 3 tokens) in turn, so each result set meets every layout in turn;
* ``ctypes`` — a plain ctypes binding (descriptors created per call, as ctypes users do);
* ``per_call`` — aclnn-py's ``moe_distribute_dispatch`` / ``moe_distribute_combine`` with one
  MoeConfig made once (as MoeDistributeBuffer passes it) and caller-provided outputs (cached
  descriptors, phase 1 every call);
* ``c_per_call`` — the C floor of that: phase 1 + phase 2 in a C loop, descriptors made once;
* ``plan`` — a :class:`~aclnn_py.ops.DispatchPlan` / ``CombinePlan`` called with new activations each
  step (two input sets alternate, so every call rebinds the plan's activation inputs);
* ``c_plan`` — the C floor of that: ``aclSetInputTensorAddr`` of the same inputs + phase 2 in a C
  loop on one repeatable executor;
* ``plan_reuse`` / ``c_plan_reuse`` — the same with the same input tensors every call: the plan
  rebinds nothing, the C loop only launches.

The Python paths are timed by :mod:`timeit` with their calls written out in its loop, as a serving
loop writes them (:func:`_written_out`); the C paths time their own loops. A ratio of two paths is the
median over repeats of their ratio within a repeat (:func:`paired_ratio`).
"""

from __future__ import annotations

import gc
import statistics
import threading
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from .c_floor import COMBINE, DISPATCH, CFloor, address
from .ctypes_baseline import CtypesBinding
from .progress import SILENT, Progress
from .stats import ratio, summary_us

PATHS = ("buffer", "buffer_host", "buffer_varying", "ctypes", "per_call", "c_per_call", "plan", "c_plan", "plan_reuse", "c_plan_reuse")
WORKSPACE_BYTES = 1 << 24  # the C per-call loop's workspace; phase 1 asks for far less

# Inputs a plan call rebinds in this bench (C parameter indices, names as in aclnn_py.ops).
DISPATCH_REBOUND = {1: "x", 2: "expert_ids"}
COMBINE_REBOUND = {1: "expand_x", 2: "expert_ids", 3: "assist_info_for_combine", 4: "ep_send_counts"}

Runner = Callable[[int], float]  # runs a batch of n calls, returns µs per call


def _executor_of(prepared: Any) -> Any:
    """The aclOpExecutor* of a prepared op."""
    return prepared.executor


def _input_descriptors(prepared: Any, slots: dict[int, str]) -> list[int]:
    """Addresses of the aclTensor descriptors of a prepared op's inputs `slots` (all present)."""
    return [address(prepared.inputs[i].descriptor()) for i in slots]


def interleaved(runners: dict[str, Runner], calls: int, repeats: int,
                between: Callable[[], None]) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """Median / min / max µs per call of every runner over `repeats` batches of `calls` calls, and the
    batches' µs per call in repeat order; each repeat runs every runner once, starting one further
    along each time; `between` runs after each batch, outside the timing."""
    names = list(runners)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(runners[name](calls))
            between()
    return {n: summary_us(samples[n]) for n in names}, samples


def paired_ratio(a: list[float], b: list[float]) -> float:
    """The median over repeats of a / b, each pair measured in the same repeat: on a shared machine a
    burst of load slows both members of a pair, so the ratio moves less than a ratio of medians."""
    return statistics.median(ratio(x, y) for x, y in zip(a, b))


def _ratios(row: dict[str, Any], samples: dict[str, list[float]]) -> None:
    row["ctypes_over_plan"] = paired_ratio(samples["ctypes"], samples["plan"])
    row["per_call_over_plan"] = paired_ratio(samples["per_call"], samples["plan"])
    row["plan_over_c_plan"] = paired_ratio(samples["plan"], samples["c_plan"])
    row["per_call_over_c_per_call"] = paired_ratio(samples["per_call"], samples["c_per_call"])
    row["plan_reuse_over_c_plan_reuse"] = paired_ratio(samples["plan_reuse"], samples["c_plan_reuse"])
    row["buffer_over_per_call"] = paired_ratio(samples["buffer"], samples["per_call"])
    row["buffer_over_c_per_call"] = paired_ratio(samples["buffer"], samples["c_per_call"])
    row["buffer_host_over_buffer"] = paired_ratio(samples["buffer_host"], samples["buffer"])
    row["buffer_varying_over_buffer"] = paired_ratio(samples["buffer_varying"], samples["buffer"])


@dataclass
class _Setup:
    """What every path of one rank shares: context, stream, attributes, two sets of activations
    (the second at other addresses, so a plan call can be given new tensors each step), the real
    dispatch outputs, and the baselines' own objects."""

    ctx: Any
    buf: Any               # a MoeDistributeBuffer on the same communicator
    stream: Any
    attrs: dict[str, Any]
    x: tuple[Any, Any]
    ids: tuple[Any, Any]
    y: tuple[Any, Any]
    assist: tuple[Any, Any]
    counts: tuple[Any, Any]
    d: Any                 # DispatchOutputs of a real round: the per-call paths' outputs
    c_out: Any
    empty_weights: Any
    ctypes: CtypesBinding
    floor: CFloor
    workspace: Any         # for the ctypes and C per-call loops
    # per token count (1, 2, 3): x, ids, and the expand_x, assist_info_for_combine and ep_recv_counts of
    # a real dispatch of them, for the varying buffer loop
    varied: list[tuple[Any, ...]] = field(default_factory=list)
    closing: list[Any] = field(default_factory=list)

    @cached_property
    def config(self) -> Any:
        """The attributes as one MoeConfig, made once (as MoeDistributeBuffer does)."""
        from aclnn_py.ops import MoeConfig

        return MoeConfig(**self.attrs)

    @property
    def int_attrs(self) -> list[int]:
        a = self.attrs
        return [a["ep_world_size"], a["ep_rank_id"], a["moe_expert_num"], a["ccl_buffer_size"]]


def _written_out(calls: str, **names: object) -> Runner:
    """µs per call of `calls` (one call per line, run in turn), timed by :mod:`timeit`: the calls are
    written out in its loop as a serving loop writes them — no function wrapped around each call, no
    argument unpacking — with `names` as the loop's variables. The garbage collector stays on, as in a
    serving loop (timeit turns it off by default)."""
    per_round = calls.count("\n") + 1
    timer = timeit.Timer(calls, setup="gc.enable()", globals={"gc": gc, **names})

    def run(n: int) -> float:
        rounds = max(n // per_round, 1)
        return timer.timeit(rounds) * 1e6 / (rounds * per_round)

    return run


def _plan_floor(s: _Setup, op: int, prepared: Any, rebound: dict[int, str],
                address_sets: list[list[int]]) -> tuple[Runner, Runner]:
    """The C plan loops on `prepared`'s repeatable executor: rebinding `rebound` to the alternating
    `address_sets`, and launching only."""
    import aclnn_py as acl

    ws = acl.DeviceMemory(max(prepared.workspace_size, 32))
    s.closing += [prepared, ws]
    ex, sh, size = address(_executor_of(prepared)), s.stream.handle, prepared.workspace_size
    descs = _input_descriptors(prepared, rebound)

    def rebinding(n: int) -> float:
        return s.floor.plan(op, ex, list(rebound), descs, address_sets, ws.ptr, size, sh, n)

    def launch_only(n: int) -> float:
        return s.floor.plan(op, ex, [], [], [[]], ws.ptr, size, sh, n)

    return rebinding, launch_only


def _numbered(varied: list[tuple[Any, ...]], names: tuple[str, ...]) -> dict[str, Any]:
    """The varying loop's variables: ``x0``, ``ids0``, … for each token count's tuple."""
    return {f"{name}{i}": value for i, row in enumerate(varied) for name, value in zip(names, row)}


def _dispatch_runners(s: _Setup) -> dict[str, Runner]:
    from aclnn_py.dtypes import bfloat16
    from aclnn_py.ops import DispatchPlan, moe_distribute_dispatch, prepare_dispatch

    x, ids = s.x[0], s.ids[0]
    bs, h = x.shape
    plan = DispatchPlan(s.ctx, bs=bs, hidden=h, topk=ids.shape[1], x_dtype=bfloat16, **s.attrs)
    prepared = prepare_dispatch(s.ctx, x, ids, repeatable=True, **s.attrs)
    s.closing.append(plan)
    attrs = s.int_attrs + [0, 0, 0, 1, 0, 0, 0, 1]  # the defaults prepare_dispatch passes
    tail = [0, 0, 0]  # zero / copy / const experts, after commAlg
    tensors = [address(t.descriptor()) if t is not None else 0 for t in [s.ctx, x, ids] + [None] * 5 + list(s.d)]
    c_plan, c_plan_reuse = _plan_floor(s, DISPATCH, prepared, DISPATCH_REBOUND,
                                       [[xi.data_ptr, ii.data_ptr] for xi, ii in zip(s.x, s.ids)])
    sh, ws = s.stream.handle, s.workspace.ptr
    (x0, x1), (ids0, ids1) = s.x, s.ids
    return {
        "buffer": _written_out("buf.low_latency_dispatch(x, ids, e, stream=stream)", buf=s.buf, x=x, ids=ids,
                               e=s.attrs["moe_expert_num"], stream=s.stream),
        "buffer_host": _written_out("buf.low_latency_dispatch(x, ids, e, stream=stream)", buf=s.buf, x=x.numpy(),
                                    ids=ids.numpy(), e=s.attrs["moe_expert_num"], stream=s.stream),
        "buffer_varying": _written_out("\n".join(f"buf.low_latency_dispatch(x{i}, ids{i}, e, stream=stream)"
                                                 for i in range(len(s.varied))),
                                       buf=s.buf, e=s.attrs["moe_expert_num"], stream=s.stream,
                                       **_numbered(s.varied, ("x", "ids"))),
        "ctypes": _written_out("binding.dispatch([ctx, x, ids] + [None] * 5, list(d), attrs, b'', tail, sh, ws)",
                               binding=s.ctypes, ctx=s.ctx, x=x, ids=ids, d=s.d, attrs=attrs, tail=tail, sh=sh, ws=ws),
        "per_call": _written_out("moe_distribute_dispatch(ctx, x, ids, stream=stream, outputs=d, config=cfg)",
                                 moe_distribute_dispatch=moe_distribute_dispatch, ctx=s.ctx, x=x, ids=ids,
                                 stream=s.stream, d=s.d, cfg=s.config),
        "c_per_call": lambda n: s.floor.dispatch_per_call(tensors, attrs + tail, b"", ws, WORKSPACE_BYTES, sh, n),
        "plan": _written_out("plan(x0, ids0, stream=stream)\nplan(x1, ids1, stream=stream)",
                             plan=plan, x0=x0, ids0=ids0, x1=x1, ids1=ids1, stream=s.stream),
        "c_plan": c_plan,
        "plan_reuse": _written_out("plan(x, ids, stream=stream)", plan=plan, x=x, ids=ids, stream=s.stream),
        "c_plan_reuse": c_plan_reuse,
    }


def _combine_runners(s: _Setup) -> dict[str, Runner]:
    from aclnn_py.dtypes import bfloat16
    from aclnn_py.ops import CombinePlan, moe_distribute_combine, prepare_combine

    y, ids, assist, counts = s.y[0], s.ids[0], s.assist[0], s.counts[0]
    bs, h = s.x[0].shape
    plan = CombinePlan(s.ctx, a=y.shape[0], bs=bs, hidden=h, topk=ids.shape[1], dtype=bfloat16,
                       assist_len=assist.shape[0], counts_len=counts.shape[0], **s.attrs)
    prepared = prepare_combine(s.ctx, y, ids, assist, counts, repeatable=True, **s.attrs)
    s.closing.append(plan)
    attrs = s.int_attrs + [0, 0, 0, 1, 0, 0, 0, 0, 0]  # the defaults prepare_combine passes
    tail = [0, 0, 0]
    ins = [s.ctx, y, ids, assist, counts, s.empty_weights] + [None] * 13
    tensors = [address(t.descriptor()) if t is not None else 0 for t in ins + [s.c_out]]
    c_plan, c_plan_reuse = _plan_floor(s, COMBINE, prepared, COMBINE_REBOUND,
                                       [[t.data_ptr for t in step] for step in zip(s.y, s.ids, s.assist, s.counts)])
    sh, ws = s.stream.handle, s.workspace.ptr
    (y0, y1), (ids0, ids1), (assist0, assist1), (counts0, counts1) = s.y, s.ids, s.assist, s.counts
    return {
        "buffer": _written_out("buf.low_latency_combine(y, ids, None, assist, counts, num_experts=e, stream=stream)",
                               buf=s.buf, y=y, ids=ids, assist=assist, counts=counts, e=s.attrs["moe_expert_num"],
                               stream=s.stream),
        "buffer_host": _written_out("buf.low_latency_combine(y, ids, None, assist, counts, num_experts=e, "
                                    "stream=stream)", buf=s.buf, y=y.numpy(), ids=ids.numpy(), assist=assist,
                                    counts=counts, e=s.attrs["moe_expert_num"], stream=s.stream),
        "buffer_varying": _written_out("\n".join(f"buf.low_latency_combine(y{i}, ids{i}, None, assist{i}, counts{i}, "
                                                 f"num_experts=e, stream=stream)" for i in range(len(s.varied))),
                                       buf=s.buf, e=s.attrs["moe_expert_num"], stream=s.stream,
                                       **_numbered(s.varied, ("x", "ids", "y", "assist", "counts"))),
        "ctypes": _written_out("binding.combine(ins, [out], attrs, b'', tail, sh, ws)",
                               binding=s.ctypes, ins=ins, out=s.c_out, attrs=attrs, tail=tail, sh=sh, ws=ws),
        "per_call": _written_out("moe_distribute_combine(ctx, y, ids, assist, counts, stream=stream, x_out=out, "
                                 "config=cfg)", moe_distribute_combine=moe_distribute_combine, ctx=s.ctx, y=y,
                                 ids=ids, assist=assist, counts=counts, stream=s.stream, out=s.c_out, cfg=s.config),
        "c_per_call": lambda n: s.floor.combine_per_call(tensors, attrs + tail, b"", ws, WORKSPACE_BYTES, sh, n),
        "plan": _written_out("plan(y0, ids0, assist0, counts0, stream=stream)\n"
                             "plan(y1, ids1, assist1, counts1, stream=stream)",
                             plan=plan, y0=y0, ids0=ids0, assist0=assist0, counts0=counts0, y1=y1, ids1=ids1,
                             assist1=assist1, counts1=counts1, stream=s.stream),
        "c_plan": c_plan,
        "plan_reuse": _written_out("plan(y, ids, assist, counts, stream=stream)", plan=plan, y=y, ids=ids,
                                   assist=assist, counts=counts, stream=s.stream),
        "c_plan_reuse": c_plan_reuse,
    }


def _measure_rank0(ctx: Any, buf: Any, stream: Any, attrs: dict[str, Any], d: Any, y: Any, x: Any, ids: Any,
                   varied: list[tuple[Any, ...]], calls: int, repeats: int, progress: Progress) -> dict[str, Any]:
    import aclnn_py as acl

    def second(t: Any) -> Any:  # the same values at another address
        return acl.Tensor.from_numpy(t.numpy())

    assist, counts = d.assist_info_for_combine, d.ep_recv_counts
    s = _Setup(ctx=ctx, buf=buf, stream=stream, attrs=attrs, x=(x, second(x)), ids=(ids, second(ids)), y=(y, second(y)),
               assist=(assist, second(assist)), counts=(counts, second(counts)), d=d,
               c_out=acl.Tensor.empty(x.shape, acl.dtypes.bfloat16),
               empty_weights=acl.Tensor.from_numpy(np.zeros((0,), np.float32)),
               ctypes=CtypesBinding(acl.backend().libraries), floor=CFloor(),
               workspace=acl.DeviceMemory(WORKSPACE_BYTES), varied=varied)

    def settle() -> None:
        stream.synchronize()  # also releases what the stream held for the calls it has run

    result: dict[str, Any] = {}
    try:
        for op, make, rebound in (("dispatch", _dispatch_runners, DISPATCH_REBOUND),
                                  ("combine", _combine_runners, COMBINE_REBOUND)):
            runners = make(s)
            progress(f"host overhead: {op}, {len(runners)} paths x {repeats} repeats x {calls} calls")
            for run in runners.values():  # warm caches
                run(min(calls, 200))
                settle()
            summaries, samples = interleaved(runners, calls, repeats, settle)
            row: dict[str, Any] = dict(summaries)
            row["plan_rebinds"] = list(rebound.values())
            _ratios(row, samples)
            result[op] = row
    finally:
        settle()
        for obj in s.closing:
            obj.close()
    return result


def _host_overhead_rank(rank: int, world_size: int, root: bytes, calls: int, repeats: int,
                        progress: Progress, measured: threading.Event) -> dict[str, Any]:
    import aclnn_py as acl
    from aclnn_py import _mock
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import moe_distribute_combine, moe_distribute_dispatch

    dev = acl.Device.current()  # the launcher made rank % device_count current
    stream = dev.create_stream()
    bf16 = acl.dtypes.bfloat16
    bs, h, k, e = 1, 1024, 1, world_size
    result: dict[str, Any] = {}
    with Communicator(world_size, rank, root) as comm, MoeDistributeBuffer(comm) as buf:
        ctx, ccl = build_context(comm)
        attrs: dict[str, Any] = dict(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=e,
                                     ccl_buffer_size=ccl)
        # a real dispatch per token count, so combine has meaningful inputs (the first count is the other
        # paths' shape)
        varied = []
        for n in (bs, bs + 1, bs + 2):
            xn = acl.Tensor.from_numpy(np.ones((n, h), bf16))
            idsn = acl.Tensor.from_numpy(np.full((n, k), rank % e, np.int32))
            dn = moe_distribute_dispatch(ctx, xn, idsn, stream=stream, **attrs)
            stream.synchronize()
            yn = acl.Tensor.from_numpy(dn.expand_x.numpy().astype(bf16))
            varied.append((xn, idsn, yn, dn.assist_info_for_combine, dn.ep_recv_counts))
            if n == bs:
                x, ids, d, y = xn, idsn, dn, yn
        moe_distribute_combine(ctx, y, ids, d.assist_info_for_combine, d.ep_recv_counts, stream=stream, **attrs)
        stream.synchronize()
        comm.barrier(stream)
        stream.synchronize()
        if rank == 0:
            _mock.set_skip_kernels(True)
            poison = _mock.poison()
            _mock.set_poison(False)
            try:
                result = _measure_rank0(ctx, buf, stream, attrs, d, y, x, ids, varied, calls, repeats, progress)
            finally:
                _mock.set_skip_kernels(False)
                _mock.set_poison(poison)
                measured.set()
        else:
            # the other ranks wait on the host, not in a device barrier: a barrier kernel polling for
            # rank 0 would take a core from the measurement on a small machine
            measured.wait()
        comm.barrier(stream)
        stream.synchronize()
        stream.close()
    return result


def host_overhead(calls: int = 2000, repeats: int = 15, progress: Progress = SILENT) -> dict[str, Any]:
    """Host µs per call of dispatch and combine on every path, with their ratios."""
    from aclnn_py.worlds import run_threads

    result: dict[str, Any] = run_threads(_host_overhead_rank, 2, calls, repeats, progress, threading.Event(),
                                         timeout=900)[0]
    return result
