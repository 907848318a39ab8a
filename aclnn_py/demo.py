"""`aclnn-py demo`: one MoE layer round — dispatch → a deterministic expert FFN per local expert →
combine — on N ranks of the mock (real processes by default), checked against the numpy golden.

Every rank generates its own inputs from ``--seed`` and its rank, so the parent can rebuild all of
them and run :func:`aclnn_py.golden.round_trip` on the same data. The report lists, per rank, the
tokens received per local expert, the largest difference from the golden for dispatch and combine
(exactly 0 when they agree bit for bit) and the time of each phase. The exit code is 1 on any
mismatch.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import golden
from .dtypes import bfloat16

DTYPES = {"bf16": bfloat16, "fp16": np.dtype(np.float16)}


@dataclass(frozen=True)
class Model:
    """One demo layer: world, batch, hidden size, routing, experts and options."""

    world_size: int = 4
    tokens: int = 8
    hidden: int = 1024
    topk: int = 4
    experts: int = 8
    shared_experts: int = 0
    shared_expert_ranks: int = 0
    zero_experts: int = 0
    copy_experts: int = 0
    quant_mode: int = 0
    comm_quant_mode: int = 0
    dtype: str = "bf16"
    mask: str = "none"
    weights: bool = True
    seed: int = 0

    @property
    def shared(self) -> int:
        return self.shared_experts if self.shared_expert_ranks else 0

    @property
    def dispatch_kwargs(self) -> dict[str, Any]:
        return dict(moe_expert_num=self.experts, shared_expert_num=self.shared,
                    shared_expert_rank_num=self.shared_expert_ranks, quant_mode=self.quant_mode,
                    zero_expert_num=self.zero_experts, copy_expert_num=self.copy_experts)


def rank_inputs(m: Model, rank: int) -> dict[str, np.ndarray | None]:
    """This rank's x, expert ids, weights and mask, a pure function of (model, rank)."""
    rng = np.random.default_rng([m.seed, rank])
    dt = DTYPES[m.dtype]
    x = rng.uniform(-2.0, 2.0, (m.tokens, m.hidden)).astype(np.float32).astype(dt)
    n_ids = m.experts + m.zero_experts + m.copy_experts
    ids = np.stack([rng.choice(n_ids, m.topk, replace=False) for _ in range(m.tokens)]).astype(np.int32)
    w = rng.uniform(0.0, 1.0, (m.tokens, m.topk)).astype(np.float32) if m.weights else None
    mask: np.ndarray | None = None
    if m.mask == "1d":
        mask = np.arange(m.tokens) < max(1, m.tokens - rank % 3)
    elif m.mask == "2d":
        mask = rng.uniform(size=(m.tokens, m.topk)) < 0.8
    return {"x": x, "ids": ids, "weights": w, "mask": mask}


def expert_ffn(m: Model, rank: int, expand_x: np.ndarray, dynamic_scales: np.ndarray | None,
               expert_token_nums: np.ndarray, expert_token_nums_type: int = 1) -> np.ndarray:
    """A deterministic stand-in for the expert MLP: y = tanh(x·a_e)·b_e in float32 per local expert
    e (dequantising int8 rows with their scale first), cast to the model dtype."""
    dt = DTYPES[m.dtype]
    counts = np.asarray(expert_token_nums, dtype=np.int64)
    if expert_token_nums_type == 0:
        counts = np.diff(np.concatenate([[0], counts]))
    rows = expand_x.astype(np.float32)
    if dynamic_scales is not None:
        rows = rows * dynamic_scales.astype(np.float32)[:, None]
    out = np.empty(rows.shape, np.float32)
    start = 0
    for j, n in enumerate(counts.tolist()):
        e = rank * 16 + j  # any fixed per-(rank, local expert) constant will do
        a = np.float32(0.5 + 0.01 * (e % 13))
        b = np.float32(1.0 - 0.02 * (e % 7))
        out[start:start + n] = np.tanh(rows[start:start + n] * a) * b
        start += n
    return out[:start].astype(dt)


def _rank_main(rank: int, world_size: int, root: bytes, m: Model) -> dict[str, Any]:
    from .buffer import MoeDistributeBuffer
    from .hccl import Communicator
    from .runtime import Device

    dev = Device.current()  # the launcher made rank % device_count current
    inp = rank_inputs(m, rank)
    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        stream = dev.create_stream()
        t0 = time.perf_counter()
        out = buf.low_latency_dispatch(inp["x"], inp["ids"], m.experts, topk_weights=inp["weights"],
                                       x_active_mask=inp["mask"], quant_mode=m.quant_mode,
                                       shared_expert_num=m.shared, shared_expert_rank_num=m.shared_expert_ranks,
                                       zero_expert_num=m.zero_experts, copy_expert_num=m.copy_experts, stream=stream)
        buf.synchronize(stream)
        t1 = time.perf_counter()
        counts = out.ep_recv_counts.numpy()
        n = int(counts[-1])
        expand_x = out.expand_x.numpy()[:n]
        scales = out.dynamic_scales.numpy()[:n] if m.quant_mode else None
        tok_nums = out.expert_token_nums.numpy()
        y = np.zeros(out.expand_x.shape, DTYPES[m.dtype])  # combine takes expand_x's (A, H) layout
        y[:n] = expert_ffn(m, rank, expand_x, scales, tok_nums)
        t2 = time.perf_counter()
        x_out = buf.low_latency_combine(y, inp["ids"], inp["weights"], out.assist_info_for_combine,
                                        out.ep_recv_counts, num_experts=m.experts, x_active_mask=inp["mask"],
                                        comm_quant_mode=m.comm_quant_mode, shared_expert_num=m.shared,
                                        shared_expert_rank_num=m.shared_expert_ranks, ori_x=inp["x"]
                                        if m.copy_experts else None, zero_expert_num=m.zero_experts,
                                        copy_expert_num=m.copy_experts, stream=stream)
        buf.synchronize(stream)
        t3 = time.perf_counter()
        result = {
            "expand_x": expand_x, "dynamic_scales": scales, "assist": out.assist_info_for_combine.numpy()[:3 * n],
            "ep_recv_counts": counts, "expert_token_nums": tok_nums, "x_out": x_out.numpy(),
            "times_ms": (1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2)),
        }
        stream.close()
    return result


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def run(m: Model, threads: bool = False, timeout: float = 300.0) -> tuple[bool, str]:
    """Run the round on the mock and compare with the golden; returns (ok, report)."""
    from .launch import run_threads, spawn

    launcher = run_threads if threads else spawn
    t0 = time.perf_counter()
    results = launcher(_rank_main, m.world_size, m, timeout=timeout)
    wall = time.perf_counter() - t0
    inputs = [rank_inputs(m, r) for r in range(m.world_size)]
    xs: list[np.ndarray] = [i["x"] for i in inputs]  # type: ignore[misc]  # always present
    ids: list[np.ndarray] = [i["ids"] for i in inputs]  # type: ignore[misc]
    ws = None if not m.weights else [i["weights"] for i in inputs]
    masks = None if m.mask == "none" else [i["mask"] for i in inputs]

    def fn(rank: int, d: golden.DispatchResult) -> np.ndarray:
        return expert_ffn(m, rank, d.expand_x, d.dynamic_scales, d.expert_token_nums)

    g_disp, g_comb = golden.round_trip(
        xs, ids, fn, expert_scales=ws, x_active_mask=masks, ori_x=xs if m.copy_experts else None,
        comm_quant_mode=m.comm_quant_mode, **m.dispatch_kwargs)
    ok = True
    lines = [f"aclnn-py demo: {m.world_size} ranks ({'threads' if threads else 'processes'}) on the mock, "
             f"BS={m.tokens} H={m.hidden} K={m.topk} experts={m.experts} "
             f"shared={m.shared}x{m.shared_expert_ranks} ranks zero={m.zero_experts} copy={m.copy_experts} "
             f"quant={m.quant_mode} comm_quant={m.comm_quant_mode} {m.dtype} mask={m.mask}",
             f"{'rank':>4}  {'tokens received per local expert':<36} {'dispatch Δ':>10} {'combine Δ':>10} "
             f"{'dispatch ms':>11} {'expert ms':>9} {'combine ms':>10}"]
    for r, (res, gd, gc) in enumerate(zip(results, g_disp, g_comb)):
        dd = max(_max_diff(res["expand_x"], gd.expand_x), _max_diff(res["assist"], gd.assist_info_for_combine),
                 _max_diff(res["ep_recv_counts"], gd.ep_recv_counts))
        if m.quant_mode and gd.dynamic_scales is not None:
            dd = max(dd, _max_diff(res["dynamic_scales"], gd.dynamic_scales))
        written = gc.written
        cd = _max_diff(res["x_out"][written], gc.x_out[written])
        bits_equal = (res["x_out"][written].tobytes() == gc.x_out[written].tobytes()
                      and res["expand_x"].tobytes() == gd.expand_x.tobytes())
        ok = ok and dd == 0 and cd == 0 and bits_equal
        per_expert = ",".join(str(int(v)) for v in res["expert_token_nums"])
        td, te, tc = res["times_ms"]
        lines.append(f"{r:>4}  {per_expert:<36} {dd:>10.3g} {cd:>10.3g} {td:>11.2f} {te:>9.2f} {tc:>10.2f}")
    lines.append(f"wall time {wall:.2f} s; result: {'MATCH (bit for bit with the golden)' if ok else 'MISMATCH'}")
    return ok, "\n".join(lines)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="an N-rank dispatch → experts → combine round on the mock, checked "
                                    "against the golden")
    d = Model()
    p.add_argument("--world-size", type=int, default=d.world_size, help="ranks (processes, or threads)")
    p.add_argument("--tokens", type=int, default=d.tokens, help="tokens per rank (BS)")
    p.add_argument("--hidden", type=int, default=d.hidden, help="hidden size H (1024..8192)")
    p.add_argument("--topk", type=int, default=d.topk, help="experts per token K")
    p.add_argument("--experts", type=int, default=d.experts, help="MoE experts (divisible by the MoE ranks)")
    p.add_argument("--shared-experts", type=int, default=d.shared_experts, help="shared experts S")
    p.add_argument("--shared-expert-ranks", type=int, default=d.shared_expert_ranks,
                   help="ranks hosting shared experts R (a multiple of S)")
    p.add_argument("--zero-experts", type=int, default=d.zero_experts, help="zero experts")
    p.add_argument("--copy-experts", type=int, default=d.copy_experts, help="copy experts")
    p.add_argument("--quant-mode", type=int, default=d.quant_mode, choices=(0, 2),
                   help="0: no quantisation; 2: per-token dynamic int8")
    p.add_argument("--comm-quant-mode", type=int, default=d.comm_quant_mode, choices=(0, 2),
                   help="combine transport: 0 as is, 2 int8 with per-8 scales")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=d.dtype, help="token dtype")
    p.add_argument("--mask", choices=("none", "1d", "2d"), default=d.mask, help="x_active_mask kind")
    p.add_argument("--no-weights", action="store_true", help="unweighted combine (topk_weights=None)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of every rank's inputs")
    p.add_argument("--threads", action="store_true", help="ranks as threads of this process")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before the run is aborted")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    m = Model(world_size=args.world_size, tokens=args.tokens, hidden=args.hidden, topk=args.topk,
              experts=args.experts, shared_experts=args.shared_experts,
              shared_expert_ranks=args.shared_expert_ranks, zero_experts=args.zero_experts,
              copy_experts=args.copy_experts, quant_mode=args.quant_mode, comm_quant_mode=args.comm_quant_mode,
              dtype=args.dtype, mask=args.mask, weights=not args.no_weights, seed=args.seed)
    ok, report = run(m, threads=args.threads, timeout=args.timeout)
    print(report)
    return 0 if ok else 1


__all__ = ["Model", "add_parser", "expert_ffn", "main", "rank_inputs", "run"]
