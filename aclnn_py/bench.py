"""`aclnn-py bench`: host overhead per call and the mock's throughput, each measured side by side with
a baseline in the same run and reported as ratios (issue 7; numbers in README.md).

* **host overhead** — time per dispatch / combine call spent in Python and the C API, with the mock's
  kernels switched off (``_mock.set_skip_kernels``: phase 2 still checks everything and queues a
  task, the task does nothing). Three paths: a plain ctypes binding of the same C calls written
  here (descriptors created per call, as ctypes users do), aclnn-py's per-call path
  (``moe_distribute_dispatch`` with cached descriptors), and a plan (repeatable executor).
* **throughput** — one full round (dispatch + combine) on the mock at a reference model, against
  the memcpy floor (copying the bytes the round moves, measured in the same run) and the numpy golden.
* **scaling** — round time and memory (peak RSS, shared memory touched) for W = 2 … 64 processes.

Medians over repeats with their spread; ``--json`` prints one JSON document.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# ------------------------------------------------------------------------------------------------
# ctypes baseline: the same calls the way ctypes users write them (mindnlp / ops-test-kit style)


class CtypesBinding:
    """A minimal ctypes binding of aclCreateTensor/aclDestroyTensor and the two op pairs."""

    def __init__(self, libraries: dict[str, list[str]]):
        g = ctypes.RTLD_GLOBAL
        self.meta = ctypes.CDLL(libraries["meta"][0], mode=g)
        self.ops = ctypes.CDLL(libraries["ops"][0], mode=g)
        vp, i64, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64
        p_i64 = ctypes.POINTER(ctypes.c_int64)
        self.meta.aclCreateTensor.restype = vp
        self.meta.aclCreateTensor.argtypes = [p_i64, u64, ctypes.c_int, p_i64, i64, ctypes.c_int, p_i64, u64, vp]
        self.meta.aclDestroyTensor.argtypes = [vp]
        self.meta.aclDestroyTensor.restype = ctypes.c_int32
        d = self.ops.aclnnMoeDistributeDispatchV5GetWorkspaceSize
        d.argtypes = [vp] * 8 + [i64] * 12 + [ctypes.c_char_p] + [i64] * 3 + [vp] * 7 + [ctypes.POINTER(u64),
                                                                                      ctypes.POINTER(vp)]
        d.restype = ctypes.c_int32
        c = self.ops.aclnnMoeDistributeCombineV5GetWorkspaceSize
        c.argtypes = [vp] * 19 + [i64] * 13 + [ctypes.c_char_p] + [i64] * 3 + [vp, ctypes.POINTER(u64),
                                                                                ctypes.POINTER(vp)]
        c.restype = ctypes.c_int32
        for name in ("aclnnMoeDistributeDispatchV5", "aclnnMoeDistributeCombineV5"):
            f = getattr(self.ops, name)
            f.argtypes = [vp, u64, vp, vp]
            f.restype = ctypes.c_int32

    def tensor(self, t: Any) -> int:
        """aclCreateTensor for an aclnn_py Tensor's layout (a new descriptor, as ctypes code does)."""
        n = len(t.shape)
        dims = (ctypes.c_int64 * n)(*t.shape)
        strides = (ctypes.c_int64 * n)(*t.strides)
        storage = (ctypes.c_int64 * 1)(t.size)
        return int(self.meta.aclCreateTensor(dims, n, int(t.dtype), strides, 0, 2, storage, 1, t.ptr))

    def _two_phase(self, op: str, ins: list[Any], outs: list[Any], attrs: list[int], alg: bytes,
                   special: list[int], stream: int, ws: int) -> None:
        """Descriptors created per call, phase 1, phase 2, descriptors destroyed."""
        descs_in = [self.tensor(t) if t is not None else None for t in ins]
        descs_out = [self.tensor(t) for t in outs]
        wsize = ctypes.c_uint64()
        ex = ctypes.c_void_p()
        ret = getattr(self.ops, f"aclnn{op}GetWorkspaceSize")(
            *descs_in, *attrs, alg, *special, *descs_out, ctypes.byref(wsize), ctypes.byref(ex))
        if ret:
            raise RuntimeError(f"ctypes {op} phase 1 failed: {ret}")
        ret = getattr(self.ops, f"aclnn{op}")(ws, wsize.value, ex, stream)
        if ret:
            raise RuntimeError(f"ctypes {op} phase 2 failed: {ret}")
        for dsc in descs_in + descs_out:
            if dsc:
                self.meta.aclDestroyTensor(dsc)

    def dispatch(self, ins: list[Any], outs: list[Any], attrs: list[int], alg: bytes, special: list[int],
                 stream: int, ws: int) -> None:
        self._two_phase("MoeDistributeDispatchV5", ins, outs, attrs, alg, special, stream, ws)

    def combine(self, ins: list[Any], outs: list[Any], attrs: list[int], alg: bytes, special: list[int],
                stream: int, ws: int) -> None:
        self._two_phase("MoeDistributeCombineV5", ins, outs, attrs, alg, special, stream, ws)


# ------------------------------------------------------------------------------------------------
# measurement helpers


def measure(fn: Callable[[], object], calls: int, repeats: int) -> dict[str, float]:
    """Median and spread (min, max) of µs per call over `repeats` batches of `calls` calls."""
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) * 1e6 / calls)
    return {"median_us": statistics.median(per_call), "min_us": min(per_call), "max_us": max(per_call)}


def _host_overhead_rank(rank: int, world_size: int, root: bytes, calls: int, repeats: int) -> dict[str, Any]:
    import aclnn_py as acl
    from aclnn_py import _mock
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import CombinePlan, DispatchPlan, moe_distribute_combine, moe_distribute_dispatch
    from aclnn_py.ops._common import keepalive

    dev = acl.Device.current()  # the launcher made rank % device_count current
    stream = dev.create_stream()
    bf16 = acl.dtypes.bfloat16
    bs, h, k, e = 1, 1024, 1, world_size
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
        result: dict[str, Any] = {}
        if rank == 0:
            _mock.set_skip_kernels(True)
            try:
                dplan = DispatchPlan(ctx, bs=bs, hidden=h, topk=k, x_dtype=bf16, **attrs)
                cplan = CombinePlan(ctx, a=d.expand_x.shape[0], bs=bs, hidden=h, topk=k, dtype=bf16,
                                    assist_len=d.assist_info_for_combine.shape[0],
                                    counts_len=d.ep_recv_counts.shape[0], **attrs)
                cb = CtypesBinding(acl.backend().libraries)
                ws = acl.DeviceMemory(1 << 24)
                sh = stream.address
                d_attrs = [world_size, rank, e, ccl, 0, 0, 0, 1, 0, 0, 0, 1]
                c_attrs = [world_size, rank, e, ccl, 0, 0, 0, 1, 0, 0, 0, 0, 0]
                empty_w = acl.Tensor.from_numpy(np.zeros((0,), np.float32))
                d_outs = list(d)
                c_out = acl.Tensor.empty((bs, h), bf16)
                c_ins = [ctx, y, ids, d.assist_info_for_combine, d.ep_recv_counts, empty_w] + [None] * 13
                paths: dict[str, dict[str, Callable[[], object]]] = {
                    "dispatch": {
                        "ctypes": lambda: cb.dispatch([ctx, x, ids] + [None] * 5, d_outs, d_attrs, b"", [0, 0, 0],
                                                      sh, ws.ptr),
                        "per_call": lambda: moe_distribute_dispatch(ctx, x, ids, stream=stream, outputs=d,
                                                                    **attrs),
                        "plan": lambda: dplan(x, ids, stream=stream),
                    },
                    "combine": {
                        "ctypes": lambda: cb.combine(c_ins, [c_out], c_attrs, b"", [0, 0, 0], sh, ws.ptr),
                        "per_call": lambda: moe_distribute_combine(ctx, y, ids, d.assist_info_for_combine,
                                                                   d.ep_recv_counts, stream=stream, x_out=c_out,
                                                                   **attrs),
                        "plan": lambda: cplan(y, ids, d.assist_info_for_combine, d.ep_recv_counts, stream=stream),
                    },
                }
                for op, fns in paths.items():
                    result[op] = {}
                    for name, fn in fns.items():
                        for _ in range(min(calls, 200)):  # warm caches
                            fn()
                        stream.synchronize()
                        result[op][name] = measure(fn, calls, repeats)
                        stream.synchronize()
                        keepalive.reap()
                    r = result[op]
                    r["ctypes_over_plan"] = r["ctypes"]["median_us"] / r["plan"]["median_us"]
                    r["per_call_over_plan"] = r["per_call"]["median_us"] / r["plan"]["median_us"]
                dplan.close()
                cplan.close()
            finally:
                _mock.set_skip_kernels(False)
        comm.barrier(stream)
        stream.synchronize()
        stream.close()
    return result


def host_overhead(calls: int = 2000, repeats: int = 7) -> dict[str, Any]:
    """Host µs per call of dispatch and combine for the ctypes baseline, per-call path and plan."""
    from aclnn_py.launch import run_threads

    result: dict[str, Any] = run_threads(_host_overhead_rank, 2, calls, repeats, timeout=600)[0]
    return result


# ------------------------------------------------------------------------------------------------
# throughput: one round at a reference model, against the memcpy floor and the golden

REFERENCE = dict(world_size=8, tokens=128, hidden=7168, topk=8, experts=64, quant_mode=2)
QUICK = dict(world_size=4, tokens=16, hidden=2048, topk=4, experts=16, quant_mode=2)


def _round_inputs(m: dict[str, int], rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from aclnn_py.dtypes import bfloat16

    rng = np.random.default_rng([7, rank])
    x = rng.uniform(-1, 1, (m["tokens"], m["hidden"])).astype(np.float32).astype(bfloat16)
    ids = np.stack([rng.choice(m["experts"], m["topk"], replace=False) for _ in range(m["tokens"])]).astype(np.int32)
    w = rng.uniform(0, 1, (m["tokens"], m["topk"])).astype(np.float32)
    return x, ids, w


def _round_rank(rank: int, world_size: int, root: bytes, m: dict[str, int], rounds: int) -> dict[str, Any]:
    import aclnn_py as acl
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator

    dev = acl.Device.current()  # the launcher made rank % device_count current
    stream = dev.create_stream()
    x, ids, w = _round_inputs(m, rank)
    bf16 = acl.dtypes.bfloat16
    times = []
    moved = 0
    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        xt, idt, wt = (acl.Tensor.from_numpy(a) for a in (x, ids, w))
        dplan = buf.plan_dispatch(m["tokens"], m["hidden"], m["experts"], m["topk"], x_dtype=bf16,
                                  quant_mode=m["quant_mode"], with_weights=True)
        cplan = buf.plan_combine(dplan, with_weights=True, num_experts=m["experts"])
        y = acl.Tensor.zeros(dplan.outputs.expand_x.shape, bf16)
        for i in range(rounds + 1):
            comm.barrier(stream)
            stream.synchronize()
            t0 = time.perf_counter()
            out = dplan(xt, idt, expert_scales=wt, stream=stream)
            cplan(y, idt, out.assist_info_for_combine, out.ep_recv_counts, wt, stream=stream)
            stream.synchronize()
            if i:  # the first round warms up
                times.append(time.perf_counter() - t0)
        n = int(dplan.outputs.ep_recv_counts.numpy()[-1])
        h = m["hidden"]
        row_d = h * (1 if m["quant_mode"] else 2) + 4 + 12 + 4  # data, scale, triple, weight
        moved = n * row_d + n * h * 2  # dispatch in, combine back
        shm_mb = _shm_used_mb()  # the world's windows are still mapped: what the round touched
        dplan.close()
        cplan.close()
        comm.barrier(stream)
        stream.synchronize()
    stream.close()
    return {"times": times, "bytes_moved": moved, "shm_mb": shm_mb,
            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def memcpy_floor(nbytes: int, repeats: int = 7) -> float:
    """Seconds to copy `nbytes` once with numpy (a single large memcpy), median of repeats."""
    src = np.ones(max(nbytes, 1), np.uint8)
    dst = np.empty_like(src)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def golden_round_seconds(m: dict[str, int], repeats: int = 1) -> float:
    from aclnn_py import golden

    inputs = [_round_inputs(m, r) for r in range(m["world_size"])]
    xs, ids, ws = [i[0] for i in inputs], [i[1] for i in inputs], [i[2] for i in inputs]

    def expert(rank: int, d: Any) -> np.ndarray:
        return np.zeros((d.num_rows, m["hidden"]), xs[0].dtype)

    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        golden.round_trip(xs, ids, expert, moe_expert_num=m["experts"], quant_mode=m["quant_mode"], expert_scales=ws)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _buffsize_mb() -> int:
    return int(os.environ.get("HCCL_BUFFSIZE", "200"))


def throughput(m: dict[str, int], rounds: int = 5, processes: bool = True, golden: bool = True) -> dict[str, Any]:
    from aclnn_py.launch import run_threads, spawn

    launcher = spawn if processes else run_threads
    res = launcher(_round_rank, m["world_size"], m, rounds, timeout=900)
    per_round = [max(r["times"][i] for r in res) for i in range(rounds)]  # a round ends when the last rank does
    moved = sum(r["bytes_moved"] for r in res)
    floor = memcpy_floor(moved)
    gold = golden_round_seconds(m) if golden else float("nan")
    med = statistics.median(per_round)
    return {
        "model": m, "processes": processes,
        "round_s": {"median": med, "min": min(per_round), "max": max(per_round)},
        "bytes_moved": moved, "memcpy_floor_s": floor, "golden_round_s": gold,
        "round_over_memcpy_floor": med / floor if floor else float("inf"),
        "golden_over_round": gold / med if med else float("inf"),
        "peak_rss_mb_per_rank": max(r["maxrss_kb"] for r in res) / 1024,
        "shm_touched_mb": max(r["shm_mb"] for r in res),
    }


# ------------------------------------------------------------------------------------------------
# scaling: W processes at BS = 8


def _shm_used_mb() -> float:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize / 2**20


def scaling(worlds: list[int], tokens: int = 8, hidden: int = 2048, topk: int = 4) -> list[dict[str, Any]]:
    out = []
    for w in worlds:
        m = dict(world_size=w, tokens=tokens, hidden=hidden, topk=topk, experts=w * 2, quant_mode=0)
        before = _shm_used_mb()
        r = throughput(m, rounds=3, golden=False)
        out.append({"world_size": w, "round_ms": 1e3 * r["round_s"]["median"],
                    "peak_rss_mb_per_rank": r["peak_rss_mb_per_rank"],
                    "shm_touched_mb": r["shm_touched_mb"] - before, "window_mb_per_rank": 2 * _buffsize_mb(),
                    "bytes_moved": r["bytes_moved"]})
    return out


# ------------------------------------------------------------------------------------------------


def run(quick: bool = False) -> dict[str, Any]:
    from . import runtime

    runtime.init("mock")
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}}
    report["host_overhead"] = host_overhead(calls=300 if quick else 3000, repeats=3 if quick else 7)
    report["throughput"] = throughput(QUICK if quick else REFERENCE, rounds=2 if quick else 5)
    report["scaling"] = scaling([2, 4] if quick else [2, 4, 8, 16, 32, 64])
    return report


def _print_human(r: dict[str, Any]) -> None:
    print("host overhead, µs per call (median [min, max]); kernels skipped")
    for op in ("dispatch", "combine"):
        row = r["host_overhead"][op]
        cells = "  ".join(f"{p} {row[p]['median_us']:.1f} [{row[p]['min_us']:.1f}, {row[p]['max_us']:.1f}]"
                          for p in ("ctypes", "per_call", "plan"))
        print(f"  {op:8} {cells}  ctypes/plan {row['ctypes_over_plan']:.1f}x  per_call/plan "
              f"{row['per_call_over_plan']:.1f}x")
    t = r["throughput"]
    print(f"throughput {t['model']}: round {1e3 * t['round_s']['median']:.2f} ms, memcpy floor "
          f"{1e3 * t['memcpy_floor_s']:.3f} ms ({t['round_over_memcpy_floor']:.1f}x), golden "
          f"{1e3 * t['golden_round_s']:.1f} ms ({t['golden_over_round']:.1f}x slower than the mock)")
    print("scaling (BS=8):")
    for s in r["scaling"]:
        print(f"  W={s['world_size']:3}  round {s['round_ms']:.2f} ms  peak RSS/rank {s['peak_rss_mb_per_rank']:.0f} MB"
              f"  shm touched {s['shm_touched_mb']:.0f} MB (windows {s['window_mb_per_rank']} MB x W)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="host overhead and mock throughput, side by side with baselines")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (seconds)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    report = run(quick=args.quick)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_human(report)
    return 0
