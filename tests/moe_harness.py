"""Shared machinery of the dispatch/combine kernel tests: random configurations over the issue 4/5
matrix, per-rank inputs, running many configurations per world (threads or processes) and the
bit-for-bit comparison with aclnn_py.golden (SPEC §4, §6, §0)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import ml_dtypes
import numpy as np

DTYPES = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
SR_PAIRS = [(1, 0), (0, 0), (1, 1), (2, 2), (1, 2), (2, 4)]
COMM_ALGS = ["", "fullmesh_v1", "fullmesh_v2"]
POISON = 0xA5


@dataclass
class Case:
    seed: int
    W: int
    H: int
    K: int
    L: int                   # MoE experts per MoE rank
    S: int                   # shared_expert_num as passed
    R: int
    bss: list[int]
    global_bs: int
    mask: str                # none | 1d | 2d
    Z: int = 0
    C: int = 0
    Q: int = 0
    quant: int = 0
    smooth: bool = False
    dtype: str = "bf16"
    escales: bool = False    # dispatch expert_scales
    ent_type: int = 1
    comm_alg: str = ""
    comm_quant: int = 0
    weights: bool = False    # combine expert_scales non-empty
    shared_x: bool = False
    zero_row: bool = False   # put an all-zero token row in (quant 2 rule of SPEC §0)

    @property
    def E(self) -> int:
        return self.L * (self.W - self.R)

    @property
    def S_norm(self) -> int:
        return 0 if (self.R == 0 and self.S == 1) else self.S

    def kwargs(self) -> dict[str, Any]:
        """Attributes shared by golden and mock calls."""
        return dict(moe_expert_num=self.E, shared_expert_num=self.S, shared_expert_rank_num=self.R,
                    global_bs=self.global_bs, comm_alg=self.comm_alg, zero_expert_num=self.Z,
                    copy_expert_num=self.C, const_expert_num=self.Q)


def random_case(rng: np.random.Generator, W: int, seed: int, combine: bool = False) -> Case:
    """One configuration of the matrix for world size W."""
    pairs = [(s, r) for (s, r) in SR_PAIRS if r < W]
    S, R = pairs[rng.integers(len(pairs))]
    L = int(rng.integers(1, 9))
    H = int(rng.choice([1024, 2048, 7168], p=[0.5, 0.3, 0.2]))
    comm_alg = COMM_ALGS[rng.integers(3)]
    kmax = 12 if comm_alg == "fullmesh_v2" else 16
    Z, C, Q = (int(v) for v in rng.integers(0, 3, size=3) * (rng.random(3) < 0.35))
    if not combine:
        Q = Q  # const experts are dropped by dispatch like the others
    E = L * (W - R)
    K = int(rng.integers(1, min(kmax, E + Z + C + Q) + 1))
    # BS skewed small, 1..64; larger worlds and H = 7168 keep BS lower to bound the runtime (the
    # golden's cost grows with W * BS * K * H)
    bsmax = 64 if W <= 4 else (40 if W <= 8 else 20)
    if H == 7168:
        bsmax = min(bsmax, 24 if W <= 4 else 12)
    bs = int(min(bsmax, 1 + rng.geometric(0.08)))
    uneven = rng.random() < 0.25
    if uneven:
        bss = [int(rng.integers(1, bs + 1)) for _ in range(W)]
        max_bs = max(bss) + int(rng.integers(0, 3))
        global_bs = max_bs * W
        mask = "none"
    else:
        bss = [bs] * W
        global_bs = 0 if rng.random() < 0.6 else bs * W
        mask = ["none", "1d", "2d"][rng.integers(3)]
    quant = int(rng.choice([0, 2]))
    return Case(seed=seed, W=W, H=H, K=K, L=L, S=S, R=R, bss=bss, global_bs=global_bs, mask=mask, Z=Z, C=C,
                Q=Q, quant=quant, smooth=bool(quant == 2 and rng.random() < 0.5),
                dtype=["fp16", "bf16"][rng.integers(2)], escales=bool(rng.random() < 0.6),
                ent_type=int(rng.integers(2)), comm_alg=comm_alg,
                comm_quant=int(rng.choice([0, 2])) if combine else 0,
                weights=bool(rng.random() < 0.6), shared_x=bool(combine and R == 0 and rng.random() < 0.5),
                zero_row=bool(rng.random() < 0.3))


@dataclass
class Inputs:
    x: list[np.ndarray]
    ids: list[np.ndarray]
    mask: list[np.ndarray] | None
    escales: list[np.ndarray] | None
    scales: list[np.ndarray] | None
    weights: list[np.ndarray] | None = None
    shared_x: list[np.ndarray] | None = None
    alpha1: np.ndarray | None = None
    alpha2: np.ndarray | None = None
    const_v: np.ndarray | None = None


def make_inputs(c: Case) -> Inputs:
    rng = np.random.default_rng(c.seed)
    dt = DTYPES[c.dtype]
    total = c.E + c.Z + c.C + c.Q
    xs, ids, masks, es, sc, sx = [], [], [], [], [], []
    for r in range(c.W):
        bs = c.bss[r]
        mag = np.exp2(rng.integers(-6, 6, size=(bs, 1))).astype(np.float32)
        x = (rng.standard_normal((bs, c.H), dtype=np.float32) * mag).astype(dt)
        if c.zero_row and bs > 0:
            x[rng.integers(bs)] = 0
        xs.append(x)
        # K distinct ids per row, MoE experts more likely than special ones
        a = np.empty((bs, c.K), np.int32)
        for t in range(bs):
            a[t] = rng.choice(total, size=c.K, replace=False)
        ids.append(a)
        if c.mask == "1d":
            n = int(rng.integers(0, bs + 1))
            m = np.zeros(bs, bool)
            m[:n] = True
            if rng.random() < 0.2:          # only the count matters (SPEC §0)
                rng.shuffle(m)
            masks.append(m)
        elif c.mask == "2d":
            masks.append(rng.random((bs, c.K)) < 0.7)
        es.append(rng.random((bs, c.K), dtype=np.float32))
        if c.smooth:
            rows = c.E + c.S_norm if c.R else c.E
            sc.append((rng.random((rows, c.H), dtype=np.float32) + 0.5).astype(np.float32))
        if c.shared_x:
            sx.append((rng.standard_normal((bs, c.H), dtype=np.float32)).astype(dt))
    inp = Inputs(x=xs, ids=ids, mask=masks if c.mask != "none" else None, escales=es if c.escales else None,
                 scales=sc if c.smooth else None, weights=es if c.weights else None,
                 shared_x=sx if c.shared_x else None)
    if c.Q:
        inp.alpha1 = (rng.standard_normal((c.Q, c.H), dtype=np.float32) * 0.05).astype(dt)
        inp.alpha2 = (rng.standard_normal((c.Q, c.H), dtype=np.float32) * 0.05).astype(dt)
        inp.const_v = rng.standard_normal((c.Q, c.H), dtype=np.float32).astype(dt)
    return inp


def expert_fn(c: Case, expand_x: np.ndarray, dynamic_scales: np.ndarray | None) -> np.ndarray:
    """A deterministic "expert": dequantise, scale each row by a row-dependent factor, cast."""
    dt = DTYPES[c.dtype]
    n = expand_x.shape[0]
    if c.quant == 2:
        xf = expand_x.astype(np.float32) * dynamic_scales.astype(np.float32)[:, None]
    else:
        xf = expand_x.astype(np.float32)
    f = (1.0 + (np.arange(n) % 7).astype(np.float32) / 8).astype(np.float32)[:, None]
    return (xf * f).astype(dt)


# ---------------------------------------------------------------------------------------------------
# golden
# ---------------------------------------------------------------------------------------------------

def golden_dispatch(c: Case, inp: Inputs):
    from aclnn_py import golden

    return golden.dispatch(inp.x, inp.ids, scales=inp.scales, x_active_mask=inp.mask, expert_scales=inp.escales,
                           quant_mode=c.quant, expert_token_nums_type=c.ent_type, **c.kwargs())


def golden_combine(c: Case, inp: Inputs, disp, ys):
    from aclnn_py import golden

    return golden.combine(ys, inp.ids, [d.assist_info_for_combine for d in disp], [d.ep_recv_counts for d in disp],
                          expert_scales=inp.weights, x_active_mask=inp.mask, shared_expert_x=inp.shared_x,
                          ori_x=inp.x if (c.C or c.Q) else None, const_expert_alpha_1=inp.alpha1,
                          const_expert_alpha_2=inp.alpha2, const_expert_v=inp.const_v,
                          comm_quant_mode=c.comm_quant, **c.kwargs())


# ---------------------------------------------------------------------------------------------------
# mock, one rank
# ---------------------------------------------------------------------------------------------------

def _poisoned(a: np.ndarray) -> bool:
    return bool(np.all(np.ascontiguousarray(a).view(np.uint8) == POISON))


def mock_dispatch(c: Case, inp: Inputs, rank: int, ctx: Any, ccl: int, stream: Any) -> dict[str, Any]:
    """One dispatch on this rank. Returns the written parts of the outputs (copies) and, for the
    unwritten regions of SPEC §0, whether they still hold the allocation's poison bytes."""
    from aclnn_py.ops import prepare_dispatch

    p = prepare_dispatch(ctx, inp.x[rank], inp.ids[rank], ep_world_size=c.W, ep_rank_id=rank,
                         ccl_buffer_size=ccl, scales=inp.scales[rank] if inp.scales else None,
                         x_active_mask=inp.mask[rank] if inp.mask else None,
                         expert_scales=inp.escales[rank] if inp.escales else None, quant_mode=c.quant,
                         expert_token_nums_type=c.ent_type, stream=stream, **c.kwargs())
    p.launch(stream)
    stream.synchronize()
    o = p.result
    recv = o.ep_recv_counts.numpy()
    n = int(recv[-1])
    ex, ds, ai, es = (o.expand_x.numpy_view(), o.dynamic_scales.numpy_view(),
                      o.assist_info_for_combine.numpy_view(), o.expand_scales.numpy_view())
    return {"n": n, "recv": recv, "tok_nums": o.expert_token_nums.numpy(), "expand_x": ex[:n].copy(),
            "dynamic_scales": ds[:n].copy(), "assist": ai[:3 * n].copy(), "expand_scales": es[:n].copy(),
            "poison": {"expand_x": _poisoned(ex[n:]), "dynamic_scales": _poisoned(ds[n:]),
                       "dynamic_scales_all": _poisoned(ds), "assist": _poisoned(ai[3 * n:]),
                       "expand_scales": _poisoned(es[n:]), "expand_scales_all": _poisoned(es)},
            "_tensors": o}


def mock_combine(c: Case, inp: Inputs, rank: int, ctx: Any, ccl: int, stream: Any, d: dict[str, Any]) -> np.ndarray:
    from aclnn_py.ops import prepare_combine

    n = d["n"]
    A = d["_tensors"].expand_x.shape[0]
    y = np.zeros((A, c.H), DTYPES[c.dtype])
    y[:n] = expert_fn(c, d["expand_x"], d["dynamic_scales"] if c.quant == 2 else None)
    t = d["_tensors"]
    p = prepare_combine(ctx, y, inp.ids[rank], t.assist_info_for_combine, t.ep_recv_counts,
                        inp.weights[rank] if inp.weights else None, ep_world_size=c.W, ep_rank_id=rank,
                        ccl_buffer_size=ccl, x_active_mask=inp.mask[rank] if inp.mask else None,
                        shared_expert_x=inp.shared_x[rank] if inp.shared_x else None,
                        ori_x=inp.x[rank] if (c.C or c.Q) else None, const_expert_alpha_1=inp.alpha1,
                        const_expert_alpha_2=inp.alpha2, const_expert_v=inp.const_v,
                        comm_quant_mode=c.comm_quant, stream=stream, **c.kwargs())
    p.launch(stream)
    stream.synchronize()
    return p.result.numpy()  # (BS, H): small


def world_body(rank: int, world_size: int, root: bytes, cases: list[Case], inputs: list[Inputs] | None,
               combine: bool) -> list[dict[str, Any]]:
    """Runs every case on this rank of one world; returns per case the raw outputs."""
    from aclnn_py import Device
    from aclnn_py.hccl import Communicator, build_context

    if inputs is None:
        inputs = [make_inputs(c) for c in cases]
    out = []
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        stream = Device.current().create_stream()
        try:
            for c, inp in zip(cases, inputs):
                d = mock_dispatch(c, inp, rank, ctx, ccl, stream)
                res = {k: v for k, v in d.items() if k != "_tensors"}
                if combine:
                    res["x_out"] = mock_combine(c, inp, rank, ctx, ccl, stream, d)
                out.append(res)
        finally:
            stream.synchronize()
            stream.close()
    return out


# ---------------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------------

def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def check_dispatch(c: Case, rank: int, m: dict[str, Any], g) -> None:
    where = f"{c} rank {rank}"
    n = g.num_rows
    assert m["n"] == n, f"N differs ({m['n']} != {n}): {where}"
    assert np.array_equal(m["recv"], g.ep_recv_counts), f"ep_recv_counts differ: {where}"
    assert np.array_equal(m["tok_nums"], g.expert_token_nums), f"expert_token_nums differ: {where}"
    assert np.array_equal(_bits(m["expand_x"]), _bits(g.expand_x)), f"expand_x differs: {where}"
    assert m["poison"]["expand_x"], f"expand_x rows >= N were written: {where}"
    assert np.array_equal(m["assist"], g.assist_info_for_combine), f"assist_info differs: {where}"
    assert m["poison"]["assist"], f"assist_info entries >= 3N were written: {where}"
    if c.quant == 2:
        assert np.array_equal(_bits(m["dynamic_scales"]), _bits(g.dynamic_scales)), f"scales differ: {where}"
        assert m["poison"]["dynamic_scales"], f"dynamic_scales >= N written: {where}"
    else:
        assert m["poison"]["dynamic_scales_all"], f"dynamic_scales written with quant 0: {where}"
    if c.escales:
        if rank >= c.R:
            assert np.array_equal(_bits(m["expand_scales"]), _bits(g.expand_scales)), \
                f"expand_scales differ: {where}"
            assert m["poison"]["expand_scales"], f"expand_scales >= N written: {where}"
        else:
            assert m["poison"]["expand_scales_all"], f"expand_scales written on a shared rank: {where}"


def _ordered(a: np.ndarray) -> np.ndarray:
    """16-bit float bit patterns mapped to integers ordered like the values (for ulp distances)."""
    u = np.ascontiguousarray(a).view(np.uint16).astype(np.int32)
    return np.where(u & 0x8000, -(u & 0x7FFF), u)


def const_rows(c: Case, inp: Inputs, rank: int) -> np.ndarray:
    ids = inp.ids[rank]
    lo = c.E + c.Z + c.C
    return np.any((ids >= lo) & (ids < lo + c.Q), axis=1) if c.Q else np.zeros(ids.shape[0], bool)


def check_combine(c: Case, inp: Inputs, rank: int, x_out: np.ndarray, g) -> None:
    where = f"{c} rank {rank}"
    wr = g.written
    assert _poisoned(x_out[~wr]), f"x_out rows of unprocessed tokens were written: {where}"
    exact = wr & ~const_rows(c, inp, rank)
    assert np.array_equal(_bits(x_out[exact]), _bits(g.x_out[exact])), f"x_out differs: {where}"
    approx = wr & ~exact
    if approx.any():   # const experts: within 1 ulp (SPEC §0)
        d = np.abs(_ordered(x_out[approx]) - _ordered(g.x_out[approx]))
        assert d.max() <= 1, f"x_out of const-expert rows differs by {d.max()} ulp: {where}"


def run_world(cases: list[Case], combine: bool, processes: bool = False, timeout: float = 300.0) -> None:
    """Run `cases` (same W) in one world and check every rank against the golden."""
    from aclnn_py.launch import run_threads, spawn

    W = cases[0].W
    assert all(c.W == W for c in cases)
    inputs = [make_inputs(c) for c in cases]
    if processes:
        results = spawn(world_body, W, cases, None, combine, timeout=timeout)
    else:
        results = run_threads(world_body, W, cases, inputs, combine, timeout=timeout)
    for i, (c, inp) in enumerate(zip(cases, inputs)):
        g = golden_dispatch(c, inp)
        for r in range(W):
            check_dispatch(c, r, results[r][i], g[r])
        if combine:
            ys = []
            for r in range(W):
                n = g[r].num_rows
                ys.append(expert_fn(c, g[r].expand_x[:n], g[r].dynamic_scales if c.quant == 2 else None))
            gc = golden_combine(c, inp, g, ys)
            for r in range(W):
                check_combine(c, inp, r, results[r][i]["x_out"], gc[r])


__all__ = ["Case", "Inputs", "random_case", "make_inputs", "run_world", "check_dispatch", "check_combine",
           "DTYPES", "replace", "field"]
