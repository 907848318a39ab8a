"""`aclnn-py demo`: seeded MoE layer rounds — dispatch → a deterministic expert FFN per local expert →
combine — on N ranks of a backend (the mock by default, or a CANN install: ``--backend cann`` or a
root path), with every output of every rank checked against the numpy golden.

Every rank generates its inputs from ``--seed``, the round and its rank, so the parent rebuilds all of
them and runs :func:`aclnn_py.golden.round_trip` on the same data. The expert FFN dequantises what
dispatch delivers (per the quant mode) in float32, so the combine inputs are a pure function of the
dispatch outputs on both sides. On real NPUs one command therefore checks the binding, the CANN
version's operators and the HCCL set-up together.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .. import golden, socs
from ..dtypes import DataType, bfloat16
from ..golden import casts
from ..ops import generations
from ..ops.profiles import FAMILIES, SocProfile
from ..socs import family_of
from .cli_conventions import UsageError, int_at_least, positive_seconds
from .demo_check import DemoResult, OutputCheck, RankRow, compare

#: the demo's Atlas A2 world: one every CANN release accepts there
A2_DEFAULT_WORLD = 16

if TYPE_CHECKING:
    from ..buffer import MoeDistributeBuffer
    from ..runtime import Stream

DTYPES = {"bf16": bfloat16, "fp16": np.dtype(np.float16)}
_FORMAT_OF_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}

# ---- SoC profiles -----------------------------------------------------------------------------------
QUANT_MODES = {
    0: "none: expand_x keeps the tokens' dtype",
    1: "static: x × a fixed scale (per column, or one for hifloat8), cast to the y-dtype; no dynamic_scales",
    2: "dynamic per token: one float32 scale per row",
    3: "dynamic per group: one float32 scale per 128 columns",
    4: "MX: one e8m0 scale per 32 columns",
    5: "MX with clipping: one e8m0 scale per 32 columns from max(|x|, 1e-4)",
}
COMM_QUANT_MODES = {
    0: "none: expert outputs travel in the tokens' dtype",
    2: "int8 with one scale per 8 columns",
    3: "MXFP8 e5m2 with one e8m0 scale per 32 columns",
    4: "MXFP8 e4m3fn with one e8m0 scale per 32 columns",
}
#: y-dtype names the demo accepts and their aclDataType.
Y_DTYPES = {"int8": DataType.INT8, "hifloat8": DataType.HIFLOAT8, "float8_e4m3fn": DataType.FLOAT8_E4M3FN,
            "float8_e5m2": DataType.FLOAT8_E5M2, "float4_e2m1": DataType.FLOAT4_E2M1,
            "float4_e1m2": DataType.FLOAT4_E1M2}


#: The SoC profiles the demo runs, by the family name the mock takes and the golden checks.
PROFILES: Mapping[str, SocProfile] = {p.name: p for _, p in FAMILIES}


# ---- the model ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Model:
    """One demo layer: world, batch, hidden size, routing, experts, quantisation, rounds."""

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
    y_dtype: str = "auto"       # "auto": the SoC profile's default for the quant mode
    comm_quant_mode: int = 0
    dtype: str = "bf16"
    mask: str = "none"
    weights: bool = True
    seed: int = 0
    rounds: int = 1
    soc: str = "Ascend910_93"

    @property
    def shared(self) -> int:
        return self.shared_experts if self.shared_expert_ranks else 0

    @property
    def expand_x_format(self) -> str:
        """expand_x's element type: x's for quant mode 0, else the y-dtype."""
        if self.quant_mode == 0:
            return _FORMAT_OF_DTYPE[self.dtype]
        if self.y_dtype != "auto":
            return self.y_dtype
        profile = PROFILES.get(family_of(self.soc) or "")
        choices = profile.y_dtypes(self.quant_mode) if profile else ()
        return choices[0] if choices else "int8"

    @property
    def dispatch_kwargs(self) -> dict[str, Any]:
        return dict(moe_expert_num=self.experts, shared_expert_num=self.shared,
                    shared_expert_rank_num=self.shared_expert_ranks, quant_mode=self.quant_mode,
                    zero_expert_num=self.zero_experts, copy_expert_num=self.copy_experts)

    def counted_entries(self, rank: int) -> int:
        """The entries of `rank`'s ep_recv_counts that count rows (one per (expert, source) pair); Atlas A2
        sizes the tensor larger for its layered path, and those extra entries are not counts."""
        if rank < self.shared_expert_ranks:
            return self.world_size
        return self.world_size * (self.experts // (self.world_size - self.shared_expert_ranks))

    def describe(self) -> list[str]:
        """The model in words, for the report."""
        moe_ranks = self.world_size - self.shared_expert_ranks
        per_rank = self.experts // moe_ranks if moe_ranks > 0 else 0
        mask = {"none": "every token active", "1d": "a 1-D active-token mask (a prefix of each rank's tokens)",
                "2d": "a 2-D active mask per (token, expert) pair"}[self.mask]
        return [
            f"model: {self.tokens} tokens per rank, hidden size {self.hidden}, {self.dtype} tokens; each token goes "
            f"to {self.topk} of {self.experts} MoE experts ({per_rank} per MoE rank on {moe_ranks} ranks)",
            f"special experts: {self.shared} shared experts on {self.shared_expert_ranks} ranks, {self.zero_experts} "
            f"zero experts, {self.copy_experts} copy experts; {mask}; "
            + ("combine weighted by the routing weights" if self.weights else "unweighted combine"),
            f"dispatch quant_mode {self.quant_mode} ({QUANT_MODES[self.quant_mode]}), expand_x is "
            f"{self.expand_x_format}; combine comm_quant_mode {self.comm_quant_mode} "
            f"({COMM_QUANT_MODES[self.comm_quant_mode]})",
            f"SoC profile {self.soc}; {self.rounds} round(s) from seed {self.seed}",
        ]

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "expand_x_format": self.expand_x_format}


class RankInputs(NamedTuple):
    """One rank's host inputs of a round."""

    x: np.ndarray
    ids: np.ndarray
    weights: np.ndarray | None  # None: the model runs unweighted
    mask: np.ndarray | None     # None: every token active


def rank_inputs(m: Model, rank: int, rnd: int = 0) -> RankInputs:
    """This rank's x, expert ids, weights and mask for round `rnd`: a pure function of (model, round, rank)."""
    rng = np.random.default_rng([m.seed, rnd, rank])
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
    return RankInputs(x, ids, w, mask)


def static_scales(m: Model) -> np.ndarray | None:
    """quant_mode 1's scales, float32, the same on every rank: one per column (H,) for an int8
    expand_x, a single one (1,) for HiFloat8 (the only shape it takes); None for other modes."""
    if m.quant_mode != 1:
        return None
    n = 1 if m.expand_x_format == "hifloat8" else m.hidden
    result: np.ndarray = np.random.default_rng([m.seed, 1 << 20]).uniform(16.0, 48.0, n).astype(np.float32)
    return result


def dequantize(m: Model, expand_x: np.ndarray, dynamic_scales: np.ndarray | None) -> np.ndarray:
    """What dispatch delivered, as float32 rows (n, H): codes decoded, then scaled back per the quant mode."""
    fmt = m.expand_x_format
    a = np.ascontiguousarray(expand_x)
    if fmt in ("float4_e2m1", "float4_e1m2"):
        v = casts.decode(casts.unpack_fp4(a.view(np.uint8)), casts.MINIFLOATS[fmt])
    elif fmt in ("float8_e4m3fn", "float8_e5m2"):
        v = casts.decode(a.view(np.uint8), casts.MINIFLOATS[fmt])
    elif fmt == "hifloat8":
        v = casts.hif8_decode(a.view(np.uint8))
    else:
        v = a.astype(np.float32)
    h = m.hidden
    if m.quant_mode == 1:
        scales = static_scales(m)
        assert scales is not None
        v = v / scales[None, :]  # (1,) broadcasts like (H,)
    elif m.quant_mode == 2:
        assert dynamic_scales is not None
        v = v * dynamic_scales.astype(np.float32)[:, None]
    elif m.quant_mode == 3:
        assert dynamic_scales is not None
        v = v * np.repeat(dynamic_scales.astype(np.float32), 128, axis=1)[:, :h]
    elif m.quant_mode in (4, 5):
        assert dynamic_scales is not None
        e8 = casts.e8m0_to_float32(np.ascontiguousarray(dynamic_scales).view(np.uint8))
        v = v * np.repeat(e8[:, :-(-h // 32)], 32, axis=1)[:, :h]
    result: np.ndarray = v.astype(np.float32)
    return result


def expert_ffn(m: Model, rank: int, expand_x: np.ndarray, dynamic_scales: np.ndarray | None,
               expert_token_nums: np.ndarray, expert_token_nums_type: int = 1) -> np.ndarray:
    """A deterministic stand-in for the expert MLP: y = tanh(x·a_e)·b_e in float32 per local expert e,
    on the dequantised rows, cast to the model dtype."""
    counts = np.asarray(expert_token_nums, dtype=np.int64)
    if expert_token_nums_type == 0:
        counts = np.diff(np.concatenate([[0], counts]))
    rows = dequantize(m, expand_x, dynamic_scales)
    out = np.empty(rows.shape, np.float32)
    start = 0
    for j, n in enumerate(counts.tolist()):
        e = rank * 16 + j  # any fixed per-(rank, local expert) constant will do
        a = np.float32(0.5 + 0.01 * (e % 13))
        b = np.float32(1.0 - 0.02 * (e % 7))
        out[start:start + n] = np.tanh(rows[start:start + n] * a) * b
        start += n
    return out[:start].astype(DTYPES[m.dtype])


# ---- the ranks -----------------------------------------------------------------------------------------
def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _rank_main(rank: int, world_size: int, root: bytes, m: Model, devices: Sequence[int],
               progress: bool) -> list[dict[str, Any]]:
    from ..buffer import MoeDistributeBuffer
    from ..hccl import Communicator
    from ..runtime import Device, init

    init()
    dev = Device(devices[rank]).set_current()
    if progress:
        _say(f"  rank {rank}/{world_size}: device {devices[rank]}, joining the communicator")
    rounds = []
    with Communicator(world_size, rank, root) as comm, MoeDistributeBuffer(comm) as buf:
        stream = dev.create_stream()
        try:
            for rnd in range(m.rounds):
                rounds.append(_one_round(buf, stream, m, rank, rnd))
                if progress and rank == 0:
                    _say(f"  round {rnd + 1}/{m.rounds} done on rank 0")
        finally:
            stream.close()
    return rounds


def _one_round(buf: MoeDistributeBuffer, stream: Stream, m: Model, rank: int, rnd: int) -> dict[str, Any]:
    inp = rank_inputs(m, rank, rnd)
    y_dtype = Y_DTYPES[m.expand_x_format] if m.quant_mode else None
    t0 = time.perf_counter()
    out = buf.low_latency_dispatch(inp.x, inp.ids, m.experts, topk_weights=inp.weights,
                                   x_active_mask=inp.mask, quant_mode=m.quant_mode, y_dtype=y_dtype,
                                   x_smooth_scale=static_scales(m), shared_expert_num=m.shared,
                                   shared_expert_rank_num=m.shared_expert_ranks, zero_expert_num=m.zero_experts,
                                   copy_expert_num=m.copy_experts, stream=stream)
    buf.synchronize(stream)
    t1 = time.perf_counter()
    counts = out.ep_recv_counts.numpy()[:m.counted_entries(rank)]
    n = int(counts[-1])
    expand_x = out.expand_x.numpy()[:n]
    scales = out.dynamic_scales.numpy()[:n] if m.quant_mode in (2, 3, 4, 5) else None
    tok_nums = out.expert_token_nums.numpy()
    expand_scales = out.expand_scales.numpy()[:n] if out.expand_scales.shape[0] else None
    y = np.zeros((out.expand_x.shape[0], m.hidden), DTYPES[m.dtype])  # combine takes (A, H) rows
    y[:n] = expert_ffn(m, rank, expand_x, scales, tok_nums)
    t2 = time.perf_counter()
    x_out = buf.low_latency_combine(y, inp.ids, inp.weights, out.assist_info_for_combine,
                                    out.ep_recv_counts, num_experts=m.experts, x_active_mask=inp.mask,
                                    comm_quant_mode=m.comm_quant_mode, shared_expert_num=m.shared,
                                    shared_expert_rank_num=m.shared_expert_ranks,
                                    ori_x=inp.x if m.copy_experts else None, zero_expert_num=m.zero_experts,
                                    copy_expert_num=m.copy_experts, stream=stream)
    buf.synchronize(stream)
    t3 = time.perf_counter()
    return {"expand_x": expand_x, "dynamic_scales": scales,
            "assist_info_for_combine": out.assist_info_for_combine.numpy()[:3 * n],
            "expert_token_nums": tok_nums, "ep_recv_counts": counts, "expand_scales": expand_scales,
            "x_out": x_out.numpy(), "times_ms": (1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2))}


# ---- the golden and the comparison -------------------------------------------------------------------
def golden_round(m: Model, rnd: int) -> tuple[list[golden.DispatchResult], list[golden.CombineResult]]:
    """The golden of round `rnd` on every rank (ValueError when the golden cannot interpret the model)."""
    inputs = [rank_inputs(m, r, rnd) for r in range(m.world_size)]
    xs = [i.x for i in inputs]
    ids = [i.ids for i in inputs]
    kw: dict[str, Any] = dict(m.dispatch_kwargs, comm_quant_mode=m.comm_quant_mode, soc=m.soc)
    if m.weights:
        kw["expert_scales"] = [i.weights for i in inputs]
    if m.mask != "none":
        kw["x_active_mask"] = [i.mask for i in inputs]
    if m.copy_experts:
        kw["ori_x"] = xs
    if m.quant_mode:
        kw["y_dtype"] = int(Y_DTYPES[m.expand_x_format])
    if m.quant_mode == 1:
        kw["scales"] = static_scales(m)

    def fn(rank: int, d: golden.DispatchResult) -> np.ndarray:
        return expert_ffn(m, rank, d.expand_x, d.dynamic_scales, d.expert_token_nums)

    return golden.round_trip(xs, ids, fn, **kw)


def check_round(m: Model, rnd: int, results: Sequence[Mapping[str, Any]],
                gold: tuple[list[golden.DispatchResult], list[golden.CombineResult]]) -> list[OutputCheck]:
    """Every output of every rank of one round against the golden."""
    g_disp, g_comb = gold
    scales_fmt = "e8m0" if m.quant_mode in (4, 5) else ""
    checks: list[OutputCheck] = []
    for r, (res, gd, gc) in enumerate(zip(results, g_disp, g_comb)):
        checks += [
            compare("expand_x", r, rnd, res["expand_x"], gd.expand_x, m.expand_x_format),
            compare("dynamic_scales", r, rnd, res["dynamic_scales"], gd.dynamic_scales, scales_fmt),
            compare("assist_info_for_combine", r, rnd, res["assist_info_for_combine"], gd.assist_info_for_combine),
            compare("expert_token_nums", r, rnd, res["expert_token_nums"], gd.expert_token_nums),
            compare("ep_recv_counts", r, rnd, res["ep_recv_counts"], gd.ep_recv_counts),
            compare("expand_scales", r, rnd, res["expand_scales"], gd.expand_scales),
            # rows of tokens the operator does not process are left untouched: only written rows count
            compare("x_out", r, rnd, res["x_out"][gc.written], gc.x_out[gc.written], rows=np.flatnonzero(gc.written)),
        ]
    return checks


# ---- running ---------------------------------------------------------------------------------------
def validate(m: Model, profile: SocProfile, device_count: int, devices: Sequence[int], *,
             mock: bool = False) -> None:
    """Refuse, as a UsageError with one clear line, what the demo or the operators cannot run.
    `mock`: the device count is the mock's, which the user sets, so a shortfall says how."""
    for name, value, low in (("--tokens", m.tokens, 1), ("--hidden", m.hidden, 1), ("--topk", m.topk, 1),
                             ("--experts", m.experts, 1), ("--rounds", m.rounds, 1)):
        if value < low:
            raise UsageError(f"{name} must be >= {low} (got {value})")
    for name, value in (("--shared-experts", m.shared_experts), ("--shared-expert-ranks", m.shared_expert_ranks),
                        ("--zero-experts", m.zero_experts), ("--copy-experts", m.copy_experts)):
        if value < 0:
            raise UsageError(f"{name} must be >= 0 (got {value})")
    w, r, s = m.world_size, m.shared_expert_ranks, m.shared_experts
    if w < 2:
        raise UsageError(f"--world-size must be >= 2: the operators run on 2 or more ranks (got {w})")
    if r >= w:
        raise UsageError(f"--shared-expert-ranks {r} leaves no MoE rank in a world of {w}")
    if (s == 0) != (r == 0):
        raise UsageError(f"--shared-experts and --shared-expert-ranks must both be 0 or both be > 0 (got {s} and {r})")
    if s and r % s:
        raise UsageError(f"--shared-expert-ranks {r} must be a multiple of --shared-experts {s}")
    if m.experts % (w - r):
        raise UsageError(f"--experts {m.experts} is not divisible by the {w - r} MoE ranks "
                         f"(--world-size {w} - --shared-expert-ranks {r})")
    if m.topk > m.experts + m.zero_experts + m.copy_experts:
        raise UsageError(f"--topk {m.topk} is more than the {m.experts + m.zero_experts + m.copy_experts} experts "
                         "a token can be routed to")
    _validate_modes(m, profile)
    _validate_sizes(m)
    if len(devices) != w:
        raise UsageError(f"--devices lists {len(devices)} devices for {w} ranks")
    if len(set(devices)) != len(devices):
        raise UsageError(f"--devices lists a device twice ({','.join(map(str, devices))}); one rank per device")
    hint = f" (set {ENV_MOCK_DEVICE_COUNT}, up to 1024, for more mock devices)" if mock else ""
    if w > device_count:
        raise UsageError(f"--world-size {w} needs {w} devices but the backend reports {device_count}{hint}")
    bad = [d for d in devices if not 0 <= d < device_count]
    if bad:
        raise UsageError(f"--devices {','.join(map(str, bad))}: the backend reports devices "
                         f"0..{device_count - 1}{hint}")


def _validate_sizes(m: Model) -> None:
    """The operators' size rules (BS, H, K per SoC), checked before any rank starts: the same words
    phase 1 would return on every rank."""
    from ..ops import MoeConfig
    from ..ops.prechecks import size_problem

    cfg = MoeConfig(ep_world_size=m.world_size, ep_rank_id=0, moe_expert_num=m.experts, ccl_buffer_size=0,
                    shared_expert_num=m.shared, shared_expert_rank_num=m.shared_expert_ranks,
                    zero_expert_num=m.zero_experts, copy_expert_num=m.copy_experts, quant_mode=m.quant_mode,
                    comm_quant_mode=m.comm_quant_mode, soc=m.soc,
                    group_ep="size-check")  # never reaches a C call; a group-string generation needs one
    problem = size_problem(cfg, "dispatch", m.tokens, m.hidden, m.topk)
    if problem is not None:
        raise UsageError(f"the operator rejects this model: {problem.message or problem}")


def _validate_modes(m: Model, profile: SocProfile) -> None:
    others = [p.name for p in PROFILES.values() if m.quant_mode in p.quant_modes and p is not profile]
    hint = f" ({', '.join(others)} supports it: --soc on the mock)" if others else ""
    if m.quant_mode not in profile.quant_modes:
        raise UsageError(f"--quant-mode {m.quant_mode} is not supported on {profile.name} (it supports "
                         f"{', '.join(map(str, sorted(profile.quant_modes)))}){hint}")
    choices = profile.y_dtypes(m.quant_mode)
    if m.y_dtype != "auto" and m.y_dtype not in choices:
        allowed = ", ".join(choices) if choices else "none: expand_x keeps the tokens' dtype"
        raise UsageError(f"--y-dtype {m.y_dtype} is not an output of quant mode {m.quant_mode} on {profile.name} "
                         f"(allowed: {allowed})")
    if m.comm_quant_mode not in profile.comm_quant_modes:
        raise UsageError(f"--comm-quant-mode {m.comm_quant_mode} is not supported on {profile.name} (it supports "
                         f"{', '.join(map(str, sorted(profile.comm_quant_modes)))})")
    if m.expand_x_format in ("float4_e2m1", "float4_e1m2") and m.hidden % 2:
        raise UsageError(f"--hidden {m.hidden} must be even for a packed fp4 expand_x")


def run(m: Model, *, threads: bool = False, timeout: float = 300.0, devices: Sequence[int] | None = None,
        say: Callable[[str], None] | None = None, where: str = "") -> DemoResult:
    """Run `m.rounds` rounds on `m.world_size` ranks of the default backend (processes, or threads of
    this process) and compare every output with the golden. `say` receives progress lines."""
    from ..worlds import run_threads, spawn

    devices = list(range(m.world_size)) if devices is None else list(devices)
    golds = []
    for rnd in range(m.rounds):
        if say:
            say(f"demo: golden of round {rnd + 1}/{m.rounds}")
        try:
            golds.append(golden_round(m, rnd))
        except ValueError as e:
            raise UsageError(f"the golden cannot run this model: {e}") from e
    how = "threads" if threads else "processes"
    if say:
        say(f"demo: starting {m.world_size} ranks ({how}) on devices {','.join(map(str, devices))}")
    t0 = time.perf_counter()
    args = (m, devices, say is not None)
    if threads:
        per_rank = run_threads(_rank_main, m.world_size, *args, timeout=timeout, set_device=False)
    else:
        identity = devices == list(range(m.world_size))  # the launcher's own device choice is rank % count
        per_rank = spawn(_rank_main, m.world_size, *args, timeout=timeout, set_device=identity)
    wall = time.perf_counter() - t0
    if say:
        say("demo: comparing every output with the golden")
    checks: list[OutputCheck] = []
    for rnd in range(m.rounds):
        checks += check_round(m, rnd, [per_rank[r][rnd] for r in range(m.world_size)], golds[rnd])
    last = [per_rank[r][-1] for r in range(m.world_size)]
    rows = [RankRow(r, devices[r], [int(v) for v in last[r]["expert_token_nums"]], last[r]["times_ms"])
            for r in range(m.world_size)]
    title = f"aclnn-py demo: {m.world_size} ranks ({how}) on {where or 'the default backend'}"
    used = generations.exported()[0]  # what MoeDistributeBuffer picks on every rank: the newest exported
    return DemoResult(title, [*m.describe(), f"operators: {used}, the newest generation the backend exports"], rows,
                      checks, wall, {"model": m.to_json(), "launcher": how, "devices": devices,
                                     "generation": used.number})


# ---- command line --------------------------------------------------------------------------------------
DESCRIPTION = """\
Seeded MoE layer rounds (dispatch -> a deterministic expert FFN per local expert -> combine) on N
ranks, every output of every rank checked bit for bit against the numpy golden: expand_x,
dynamic_scales, assist_info_for_combine, expert_token_nums, ep_recv_counts, expand_scales, x_out.

On the mock (the default) it shows the operators at work. With --backend cann (or a CANN root path)
on an Ascend machine, one run checks the binding, the installed CANN's operators and the HCCL set-up:
one rank process per device, the SoC profile is what the device reports."""
ENV_BACKEND = "ACLNN_PY_BACKEND"
ENV_MOCK_SOC = "ACLNN_MOCK_SOC"
ENV_MOCK_DEVICE_COUNT = "ACLNN_MOCK_DEVICE_COUNT"
EXIT_CODES = """exit status:
  0  MATCH: every output of every rank equals the golden bit for bit
  1  MISMATCH (the report names output, rank, first differing index and size), or a rank failed
     on the backend (an ACL / aclnn / HCCL error, a timeout: the message says which)
  2  a usage or environment error: bad arguments, a mode the SoC does not support, fewer devices
     than ranks, no such backend, an operator rejecting the model's sizes
  3  an internal error (a traceback is printed)"""


def add_parser(sub: Any) -> None:
    d = Model()
    p = sub.add_parser("demo", help="seeded dispatch → experts → combine rounds on N ranks, every output checked "
                                    "against the golden", description=DESCRIPTION, epilog=EXIT_CODES)
    g = p.add_argument_group("where")
    g.add_argument("--backend", default="mock",
                   help='"mock", "cann" (the installed CANN) or the path of a CANN root')
    g.add_argument("--soc", default="auto", help="SoC: a family (Ascend910_93, Ascend950, Ascend910B) or a member name "
                   "such as Ascend910_9391 or Ascend910B3 selects the mock's "
                   "profile; on real CANN the SoC is the device's and --soc may only repeat it (auto: the backend's)")
    g.add_argument("--world-size", type=int, default=None,
                   help=f"ranks, one per device (default: {d.world_size}, on Atlas A2 {A2_DEFAULT_WORLD}, "
                   "or the number of --devices)")
    g.add_argument("--devices", default=None, help="comma-separated device ids, one per rank "
                   "(default: 0 .. world-size-1)")
    g.add_argument("--threads", action="store_true", help="ranks as threads of this process (mock only)")
    g.add_argument("--timeout", type=positive_seconds, default=300.0, help="seconds before every rank is stopped")
    g = p.add_argument_group("model")
    g.add_argument("--tokens", type=int, default=d.tokens, help="tokens per rank (BS)")
    g.add_argument("--hidden", type=int, default=d.hidden, help="hidden size H (the operators take 1024..8192)")
    g.add_argument("--topk", type=int, default=d.topk, help="experts per token K")
    g.add_argument("--experts", type=int, default=None,
                   help=f"MoE experts, divisible by the MoE ranks (default: {d.experts}, or one per MoE rank when "
                   "there are more ranks)")
    g.add_argument("--shared-experts", type=int, default=d.shared_experts, help="shared experts S")
    g.add_argument("--shared-expert-ranks", type=int, default=d.shared_expert_ranks,
                   help="ranks hosting shared experts R (a multiple of S)")
    g.add_argument("--zero-experts", type=int, default=d.zero_experts, help="zero experts")
    g.add_argument("--copy-experts", type=int, default=d.copy_experts, help="copy experts")
    g.add_argument("--dtype", choices=sorted(DTYPES), default=d.dtype, help="token dtype")
    g.add_argument("--mask", choices=("none", "1d", "2d"), default=d.mask, help="x_active_mask kind")
    g.add_argument("--no-weights", action="store_true", help="unweighted combine (topk_weights=None)")
    g = p.add_argument_group("quantisation (what the SoC profile supports: Ascend910_93 quant 0, 2 and comm "
                             "quant 0, 2; Ascend950 also quant 1, 3, 4, 5 and comm quant 3, 4)")
    g.add_argument("--quant-mode", type=int, default=d.quant_mode, choices=sorted(QUANT_MODES),
                   help="dispatch quantisation: " + "; ".join(f"{k} {v}" for k, v in QUANT_MODES.items()))
    g.add_argument("--y-dtype", default=d.y_dtype, choices=("auto", *Y_DTYPES),
                   help="expand_x's type for quant modes 1-5 (auto: int8 for 1 and 2, float8_e4m3fn for 3-5)")
    g.add_argument("--comm-quant-mode", type=int, default=d.comm_quant_mode, choices=sorted(COMM_QUANT_MODES),
                   help="combine transport: " + "; ".join(f"{k} {v}" for k, v in COMM_QUANT_MODES.items()))
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int_at_least(0), default=d.seed, help="seed of every rank's inputs (>= 0)")
    g.add_argument("--rounds", type=int, default=d.rounds, help="rounds on the same communicators")
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")
    g.add_argument("--json", action="store_true", help="print one JSON document on stdout, nothing on stderr")
    p.set_defaults(func=main)


def _default_world_size(profile: SocProfile) -> int:
    # Atlas A2: 16 ranks, a world every CANN release accepts there (8.3.RC1 starts at 16; docs/operators.md,
    # "Atlas A2"); the others from 2
    return A2_DEFAULT_WORLD if profile.atlas_a2 else Model().world_size


def _devices(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        out = [int(v) for v in text.split(",") if v.strip() != ""]
    except ValueError:
        raise UsageError(f"--devices {text!r}: give comma-separated integers, e.g. 0,1,2,3") from None
    if not out:
        raise UsageError("--devices: give at least one device id")
    return out


def _open_backend(backend: str, soc: str) -> tuple[str, str, int, str]:
    """Load the backend in this process; (where, soc, device count, CANN version) for the report."""
    import aclnn_py as acl

    from .doctor import cann_version

    try:
        b = acl.init(backend)
        name, count = acl.soc_name(), acl.Device.count()
    except acl.BackendError as e:
        raise UsageError(f"--backend {backend}: {e}") from e
    except acl.AclnnPyError as e:
        raise UsageError(f"--backend {backend}: the runtime does not answer: {e}") from e
    family = family_of(name)
    if soc != "auto" and name != soc and soc != family:
        raise UsageError(f"--soc {soc}: the {b.kind} backend reports {name}" +
                         (" (on real CANN the SoC is the device's; leave --soc out)" if not b.is_mock else ""))
    if family is None:
        raise UsageError(f"the device reports SoC {name!r}, of no family the demo knows: a name beginning with "
                         f"{socs.accepted()}")
    version = cann_version(b.root).version
    what = "the mock" if b.is_mock else f"CANN {version} at {b.root}"
    return f"{what} ({name}, {count} devices)", name, count, version


def main(args: argparse.Namespace) -> int:
    if args.soc != "auto" and family_of(args.soc) is None:
        raise UsageError(f"--soc {args.soc!r} is of no known SoC family: give a name beginning with "
                         f"{socs.accepted()}")
    devices = _devices(args.devices)
    quiet = args.quiet or args.json
    say = None if quiet else _say
    if args.json:
        warnings.simplefilter("ignore")  # stdout is the document; stderr stays silent
        os.environ["PYTHONWARNINGS"] = "ignore"
    os.environ[ENV_BACKEND] = args.backend  # the ranks load the same backend
    if args.soc != "auto":
        os.environ[ENV_MOCK_SOC] = args.soc
    where, soc, count, version = _open_backend(args.backend, args.soc)
    world = args.world_size if args.world_size is not None else (
        len(devices) if devices else _default_world_size(PROFILES[family_of(soc) or ""]))
    if devices is None:
        devices = list(range(world))
    experts = args.experts if args.experts is not None else max(Model().experts, world - args.shared_expert_ranks)
    m = Model(world_size=world, tokens=args.tokens, hidden=args.hidden, topk=args.topk, experts=experts,
              shared_experts=args.shared_experts, shared_expert_ranks=args.shared_expert_ranks,
              zero_experts=args.zero_experts, copy_experts=args.copy_experts, quant_mode=args.quant_mode,
              y_dtype=args.y_dtype, comm_quant_mode=args.comm_quant_mode, dtype=args.dtype, mask=args.mask,
              weights=not args.no_weights, seed=args.seed, rounds=args.rounds, soc=soc)
    import aclnn_py as acl

    is_mock = acl.backend().is_mock
    validate(m, PROFILES[family_of(soc) or ""], count, devices, mock=is_mock)
    if args.threads and not is_mock:
        raise UsageError("--threads: thread ranks are a mock convenience; on CANN every rank is a process")
    if say:
        say(f"demo: {where}")
    result = _run_reporting_failures(m, args, devices, say, where)
    if result is None:
        return 1
    result.facts.update(backend=args.backend, soc=soc, cann_version=version)
    print(json.dumps(result.to_json(), indent=2, allow_nan=False) if args.json else result.text())
    return 0 if result.ok else 1


def _run_reporting_failures(m: Model, args: argparse.Namespace, devices: list[int],
                            say: Callable[[str], None] | None, where: str) -> DemoResult | None:
    """run(), with the backend's failures as a report (exit 1) and the operator's refusal of the
    model's parameters as a usage error (exit 2)."""
    from ..errors import AclnnError, AclnnPyError
    from ..worlds import RankError

    try:
        return run(m, threads=args.threads, timeout=args.timeout, devices=devices, say=say, where=where)
    except AclnnError.ParamInvalid as e:
        rank = getattr(e, "rank", None)
        raise UsageError(f"the operator rejects this model{f' on rank {rank}' if rank is not None else ''}: "
                         f"{e.message or e}") from e
    except (AclnnPyError, TimeoutError, RankError) as e:
        rank = getattr(e, "rank", None)
        msg = f"FAILED{f' on rank {rank}' if rank is not None else ''}: {type(e).__name__}: {e}"
        if args.json:
            print(json.dumps({"ok": False, "result": "FAILED", "error": msg, "model": m.to_json()}, indent=2))
        else:
            print(f"aclnn-py demo: {where}\nresult: {msg}")
        return None


__all__ = ["COMM_QUANT_MODES", "Model", "PROFILES", "QUANT_MODES", "Y_DTYPES", "add_parser",
           "check_round", "dequantize", "expert_ffn", "golden_round", "main", "rank_inputs", "run",
           "static_scales", "validate"]
