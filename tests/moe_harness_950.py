"""Machinery of the Ascend950 kernel tests (issue 6): random configurations over the 950 matrix
(quant modes 0-5 with every output format, low-precision inputs, elastic_info, performance_info,
comm quant 0/2/3/4), per-rank inputs, many configurations per world, and the bit-for-bit comparison
with aclnn_py.golden (soc="Ascend950"). Builds on tests/moe_harness.py (same Case fields for the
A3 part of a configuration)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import moe_harness as mh
import numpy as np

SOC = "Ascend950"
F32 = np.float32
FP8 = ["float8_e4m3fn", "float8_e5m2"]
FP4 = ["float4_e2m1", "float4_e1m2"]
LOWP_X = ["hifloat8"] + FP8 + FP4
# y formats per quant mode (SPEC §4.6, golden choice list)
Y_FORMATS = {1: ["int8", "hifloat8"], 2: ["int8"] + FP8, 3: FP8, 4: FP8 + FP4, 5: FP8}
_DT = {"int8": "INT8", "hifloat8": "HIFLOAT8", "float8_e4m3fn": "FLOAT8_E4M3FN", "float8_e5m2": "FLOAT8_E5M2",
       "float4_e2m1": "FLOAT4_E2M1", "float4_e1m2": "FLOAT4_E1M2"}
_NP_FP8 = {"float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn), "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}


def datatype(fmt: str) -> Any:
    from aclnn_py import DataType

    return DataType[_DT[fmt]]


@dataclass
class Case950:
    base: mh.Case
    yfmt: str | None = None          # expand_x format for quant >= 1
    xfmt: str | None = None          # low-precision x (quant 0)
    static_kind: str = "scalar"      # quant 1 scales: scalar | row | expert
    tok_dim1: int = 1                # low-precision x: per-token scales dim 1
    tok_e8m0: bool = False           # ... as e8m0 bytes (else float32)
    extreme: bool = False            # MX: rows of tiny / huge magnitude and inf/NaN elements
    elastic: str = "none"            # none | flag0 | perm
    perf: bool = False               # performance_info passed (dispatch and combine)

    def __getattr__(self, name: str) -> Any:   # the A3 fields
        if name.startswith("__") or name == "base":   # unpickling looks up attributes before __dict__ exists
            raise AttributeError(name)
        return getattr(self.base, name)

    def __repr__(self) -> str:
        b = self.base
        return (f"Case950(seed={b.seed}, W={b.W}, H={b.H}, K={b.K}, L={b.L}, S={b.S}, R={b.R}, bss={b.bss}, "
                f"G={b.global_bs}, mask={b.mask}, ZCQ={b.Z},{b.C},{b.Q}, quant={b.quant}, y={self.yfmt}, "
                f"x={self.xfmt or b.dtype}, smooth={b.smooth}, static={self.static_kind}, dim1={self.tok_dim1}, "
                f"extreme={self.extreme}, elastic={self.elastic}, perf={self.perf}, cq={b.comm_quant}, "
                f"alg={b.comm_alg!r}, es={b.escales}, w={b.weights}, sx={b.shared_x})")


def random_case(rng: np.random.Generator, W: int, seed: int, combine: bool = False) -> Case950:
    b = mh.random_case(rng, W, seed, combine=combine)
    # smaller tokens than the A3 matrix: the 950 golden quantises per (token, expert) row
    bs = [min(x, 24) for x in b.bss]
    if len(set(b.bss)) > 1:       # uneven BS: global_bs = maxBs * W plus the original slack
        g = max(bs) * W + (b.global_bs - max(b.bss) * W)
    else:
        g = bs[0] * W if b.global_bs else 0
    b = mh.replace(b, bss=bs, global_bs=g)
    c = Case950(base=b)
    kind = rng.choice(["lowp", "q1", "q2", "q3", "q4", "q5", "q0"], p=[0.14, 0.16, 0.16, 0.16, 0.2, 0.12, 0.06])
    if kind == "lowp":
        c.xfmt = str(rng.choice(LOWP_X))
        c.base = mh.replace(b, quant=0, smooth=False)
        elem = 0.5 if c.xfmt in FP4 else 1
        c.tok_e8m0 = bool(rng.random() < 0.4)
        room = (-(-2 * b.H // 32) * 32) - int(b.H * elem)
        cap = room if c.tok_e8m0 else room // 4
        c.tok_dim1 = int(rng.choice([1, b.H // 128, b.H // 32, cap]))
        c.tok_dim1 = max(1, min(c.tok_dim1, cap, b.H))
    elif kind == "q0":
        c.base = mh.replace(b, quant=0, smooth=False)
    else:
        q = int(kind[1])
        c.yfmt = str(rng.choice(Y_FORMATS[q]))
        smooth = q in (2, 3) and rng.random() < 0.5
        c.base = mh.replace(b, quant=q, smooth=smooth, zero_row=b.zero_row)
        if q == 1:
            c.static_kind = "scalar" if c.yfmt == "hifloat8" else str(rng.choice(["scalar", "row", "expert"]))
        if c.yfmt in FP4 and b.H % 2:
            c.base = mh.replace(c.base, H=b.H + 1)
        c.extreme = q in (4, 5) and not combine and rng.random() < 0.4
    if W >= 2 and rng.random() < 0.3:
        c.elastic = str(rng.choice(["flag0", "perm"], p=[0.3, 0.7]))
    c.perf = bool(rng.random() < 0.3)
    if combine:
        c.base = mh.replace(c.base, comm_quant=int(rng.choice([0, 2, 3, 4], p=[0.2, 0.2, 0.3, 0.3])))
    return c


@dataclass
class Inputs950:
    base: mh.Inputs
    x_golden: list[np.ndarray]       # as golden.dispatch takes it (fp8 arrays, uint8 codes, packed fp4)
    x_mock: list[Any]                # numpy arrays or (array, DataType) for Tensor.from_numpy
    scales: Any                      # golden scales argument (also what the mock gets, per rank)
    elastic: np.ndarray | None


def make_inputs(c: Case950) -> Inputs950:
    b = c.base
    inp = mh.make_inputs(b)
    rng = np.random.default_rng(b.seed + 7_000_000)
    xg, xm = list(inp.x), list(inp.x)
    scales: Any = inp.scales
    if c.xfmt is not None:
        xg, xm, toks = [], [], []
        for r in range(b.W):
            bs = b.bss[r]
            if c.xfmt in _NP_FP8:
                codes = rng.integers(0, 256, size=(bs, b.H), dtype=np.uint8)
                a = codes.view(_NP_FP8[c.xfmt])
                xg.append(a)
                xm.append(a)
            else:
                width = b.H // 2 if c.xfmt in FP4 else b.H
                codes = rng.integers(0, 256, size=(bs, width), dtype=np.uint8)
                xg.append(codes)
                xm.append((codes, datatype(c.xfmt)))
            if c.tok_e8m0:
                toks.append(rng.integers(0, 256, size=(bs, c.tok_dim1), dtype=np.uint8))
            else:
                toks.append(rng.standard_normal((bs, c.tok_dim1), dtype=F32))
        scales = toks
    elif b.quant == 1:
        rows = b.E + b.S_norm if b.R else b.E
        shape = {"scalar": (1,), "row": (b.H,), "expert": (rows, b.H)}[c.static_kind]
        scales = (rng.random(shape, dtype=F32) * 3.75 + 0.25).astype(F32)
    if c.extreme:
        dt = mh.DTYPES[b.dtype]
        for r in range(b.W):
            x = xg[r].astype(F32)
            for t in range(b.bss[r]):
                u = rng.random()
                if u < 0.2:
                    x[t] *= F32(2.0**-100 if b.dtype == "bf16" else 2.0**-18)   # tiny / fp16 subnormal
                elif u < 0.35 and b.dtype == "bf16":
                    x[t] *= F32(2.0**120)                                        # e8m0 up to 254
                elif u < 0.45:
                    x[t, rng.integers(b.H)] = [np.inf, -np.inf, np.nan][rng.integers(3)]
            xg[r] = x.astype(dt)
        xm = list(xg)
        inp.x = list(xg)
    elastic = None
    if c.elastic != "none":
        elastic = np.zeros(4 + 2 * b.W, np.int32)
        elastic[1:4] = (b.W, b.R, b.E)
        elastic[4:4 + b.W] = rng.integers(0, 5, size=b.W)   # not read
        if c.elastic == "perm":
            elastic[0] = 1
            elastic[4 + b.W:] = rng.permutation(b.W)
        else:
            elastic[4 + b.W:] = np.arange(b.W)
    return Inputs950(base=inp, x_golden=xg, x_mock=xm, scales=scales, elastic=elastic)


def _per_rank(v: Any, rank: int) -> Any:
    return v[rank] if isinstance(v, list) else v


def roles(c: Case950, inp: Inputs950) -> list[tuple[int, int, int]]:
    """Per physical rank: (logical rank, receive slots, local experts)."""
    b = c.base
    table = np.arange(b.W)
    if inp.elastic is not None and inp.elastic[0]:
        table = inp.elastic[4 + b.W:]
    logical = np.argsort(table)
    out = []
    for r in range(b.W):
        lr = int(logical[r])
        out.append((lr, b.W, 1) if lr < b.R else (lr, b.W * b.L, b.L))
    return out


# ---------------------------------------------------------------------------------------------------
# golden
# ---------------------------------------------------------------------------------------------------

def golden_dispatch(c: Case950, inp: Inputs950):
    from aclnn_py import golden

    b = c.base
    x_dtype = c.xfmt if c.xfmt is not None and c.xfmt not in _NP_FP8 else None
    return golden.dispatch(inp.x_golden, inp.base.ids, scales=inp.scales, x_active_mask=inp.base.mask,
                           expert_scales=inp.base.escales, quant_mode=b.quant, expert_token_nums_type=b.ent_type,
                           y_dtype=c.yfmt, x_dtype=x_dtype, elastic_info=inp.elastic, soc=SOC, **b.kwargs())


def golden_combine(c: Case950, inp: Inputs950, disp, ys):
    from aclnn_py import golden

    b, bi = c.base, inp.base
    return golden.combine(ys, bi.ids, [d.assist_info_for_combine for d in disp], [d.ep_recv_counts for d in disp],
                          expert_scales=bi.weights, x_active_mask=bi.mask, shared_expert_x=bi.shared_x,
                          ori_x=bi.x if (b.C or b.Q) else None, const_expert_alpha_1=bi.alpha1,
                          const_expert_alpha_2=bi.alpha2, const_expert_v=bi.const_v, comm_quant_mode=b.comm_quant,
                          elastic_info=inp.elastic, soc=SOC, **b.kwargs())


def expert_fn(c: Case950, expand_x: np.ndarray) -> np.ndarray:
    """A deterministic "expert" on any expand_x format: 16-bit rows as values, other formats as
    their raw codes (one per element), scaled by a row-dependent factor, cast to the row dtype."""
    dt = mh.DTYPES[c.base.dtype]
    n = expand_x.shape[0]
    raw = np.ascontiguousarray(expand_x)
    if raw.dtype in (np.dtype(np.float16), mh.DTYPES["bf16"]):
        xf = raw.astype(F32)
    else:
        codes = raw.view(np.uint8)
        if codes.shape[1] * 2 == c.base.H:       # packed fp4
            from aclnn_py.casts import unpack_fp4

            codes = unpack_fp4(codes)
        xf = (codes.astype(F32) - F32(100)) / F32(16)
    f = (1.0 + (np.arange(n) % 7).astype(F32) / 8).astype(F32)[:, None]
    return (xf * f).astype(dt)


# ---------------------------------------------------------------------------------------------------
# mock, one rank
# ---------------------------------------------------------------------------------------------------

def _tensor(v: Any, stream: Any) -> Any:
    from aclnn_py import Tensor

    if isinstance(v, tuple):
        return Tensor.from_numpy(v[0], stream=stream, dtype=v[1])
    return v


def mock_dispatch(c: Case950, inp: Inputs950, rank: int, ctx: Any, ccl: int, stream: Any, perf: Any) -> dict:
    from aclnn_py.ops import prepare_dispatch

    b, bi = c.base, inp.base
    sc = _per_rank(inp.scales, rank)
    if isinstance(sc, np.ndarray) and c.tok_e8m0:
        from aclnn_py import DataType, Tensor

        sc = Tensor.from_numpy(sc, stream=stream, dtype=DataType.FLOAT8_E8M0)
    p = prepare_dispatch(ctx, _tensor(inp.x_mock[rank], stream), bi.ids[rank], ep_world_size=b.W, ep_rank_id=rank,
                         ccl_buffer_size=ccl, scales=sc, x_active_mask=bi.mask[rank] if bi.mask else None,
                         expert_scales=bi.escales[rank] if bi.escales else None, quant_mode=b.quant,
                         expert_token_nums_type=b.ent_type, y_dtype=datatype(c.yfmt) if c.yfmt else None,
                         elastic_info=inp.elastic, performance_info=perf if c.perf else None, stream=stream,
                         **b.kwargs())
    p.launch(stream)
    stream.synchronize()
    o = p.result
    _, slots, nloc = roles(c, inp)[rank]
    recv = o.ep_recv_counts.numpy()[:slots]
    n = int(recv[-1])
    # numpy() (a copy): Tensor.numpy_view cannot build ml_dtypes fp8 / e8m0 views (as_strided loses them)
    ex, ds = o.expand_x.numpy(), o.dynamic_scales.numpy()
    return {"n": n, "recv": recv, "tok_nums": o.expert_token_nums.numpy()[:nloc], "expand_x": ex[:n].copy(),
            "dynamic_scales": ds[:n].copy(), "assist": o.assist_info_for_combine.numpy_view()[:3 * n].copy(),
            "expand_scales": o.expand_scales.numpy_view()[:n].copy(),
            "poison": {"expand_x": mh._poisoned(ex[n:]), "dynamic_scales": mh._poisoned(ds[n:]),
                       "dynamic_scales_all": mh._poisoned(ds)},
            "ds_meta": (o.dynamic_scales.shape, o.dynamic_scales.dtype, o.expand_x.shape, o.expand_x.dtype),
            "_tensors": o}


def mock_combine(c: Case950, inp: Inputs950, rank: int, ctx: Any, ccl: int, stream: Any, d: dict, perf: Any):
    from aclnn_py.ops import prepare_combine

    b, bi = c.base, inp.base
    n = d["n"]
    t = d["_tensors"]
    A = t.expand_x.shape[0]
    y = np.zeros((A, b.H), mh.DTYPES[b.dtype])
    y[:n] = expert_fn(c, d["expand_x"])
    p = prepare_combine(ctx, y, bi.ids[rank], t.assist_info_for_combine, t.ep_recv_counts,
                        bi.weights[rank] if bi.weights else None, ep_world_size=b.W, ep_rank_id=rank,
                        ccl_buffer_size=ccl, x_active_mask=bi.mask[rank] if bi.mask else None,
                        shared_expert_x=bi.shared_x[rank] if bi.shared_x else None,
                        ori_x=bi.x[rank] if (b.C or b.Q) else None, const_expert_alpha_1=bi.alpha1,
                        const_expert_alpha_2=bi.alpha2, const_expert_v=bi.const_v, comm_quant_mode=b.comm_quant,
                        elastic_info=inp.elastic, performance_info=perf if c.perf else None, stream=stream,
                        **b.kwargs())
    p.launch(stream)
    stream.synchronize()
    return p.result.numpy()


def world_body(rank: int, world_size: int, root: bytes, cases: list[Case950], inputs: list[Inputs950],
               combine: bool) -> list[dict]:
    from aclnn_py import Device, Tensor, _mock
    from aclnn_py.hccl import Communicator, build_context

    assert _mock.soc() == SOC
    out = []
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        stream = Device.current().create_stream()
        perf = Tensor.zeros((world_size,), np.int64)
        try:
            for c, inp in zip(cases, inputs):
                d = mock_dispatch(c, inp, rank, ctx, ccl, stream, perf)
                res = {k: v for k, v in d.items() if k != "_tensors"}
                res["perf_after_dispatch"] = perf.numpy().copy() if c.perf else None
                if combine:
                    res["x_out"] = mock_combine(c, inp, rank, ctx, ccl, stream, d, perf)
                    res["perf_after_combine"] = perf.numpy().copy() if c.perf else None
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


def check_dispatch(c: Case950, rank: int, m: dict, g) -> None:
    where = f"{c!r} rank {rank}"
    n = g.num_rows
    assert m["n"] == n, f"N differs ({m['n']} != {n}): {where}"
    assert np.array_equal(m["recv"], g.ep_recv_counts), f"ep_recv_counts differ: {where}"
    assert np.array_equal(m["tok_nums"], g.expert_token_nums), f"expert_token_nums differ: {where}"
    assert np.array_equal(_bits(m["expand_x"]), _bits(g.expand_x)), f"expand_x differs: {where}"
    assert m["poison"]["expand_x"], f"expand_x rows >= N were written: {where}"
    assert np.array_equal(m["assist"], g.assist_info_for_combine), f"assist_info differs: {where}"
    if g.dynamic_scales is not None:
        assert np.array_equal(_bits(m["dynamic_scales"]), _bits(g.dynamic_scales)), f"scales differ: {where}"
        assert m["poison"]["dynamic_scales"], f"dynamic_scales >= N written: {where}"
    else:
        assert m["poison"]["dynamic_scales_all"], f"dynamic_scales written: {where}"
    if g.expand_scales is not None:
        assert np.array_equal(_bits(m["expand_scales"]), _bits(g.expand_scales)), f"expand_scales differ: {where}"
    if m["perf_after_dispatch"] is not None:
        p = m["perf_after_dispatch"]
        assert p.shape == (c.W,) and p.dtype == np.int64 and (p >= 0).all(), f"performance_info {p}: {where}"


def run_world(cases: list[Case950], combine: bool, timeout: float = 300.0) -> list[list[dict]]:
    """Run `cases` (same W) in one thread world on the 950 profile and check every rank against the
    golden; returns the raw per-rank results."""
    from aclnn_py.launch import run_threads

    W = cases[0].W
    assert all(c.W == W for c in cases)
    inputs = [make_inputs(c) for c in cases]
    results = run_threads(world_body, W, cases, inputs, combine, timeout=timeout)
    for i, (c, inp) in enumerate(zip(cases, inputs)):
        g = golden_dispatch(c, inp)
        for r in range(W):
            check_dispatch(c, r, results[r][i], g[r])
        if combine:
            ys = [expert_fn(c, g[r].expand_x[:g[r].num_rows]) for r in range(W)]
            gc = golden_combine(c, inp, g, ys)
            for r in range(W):
                mh.check_combine(c.base, inp.base, r, results[r][i]["x_out"], gc[r])
    # performance_info only ever grows
    for r in range(W):
        prev = np.zeros(W, np.int64)
        for i in range(len(cases)):
            for key in ("perf_after_dispatch", "perf_after_combine"):
                p = results[r][i].get(key)
                if p is not None:
                    assert (p >= prev).all(), f"performance_info decreased on rank {r}: {prev} -> {p}"
                    prev = p
    return results


__all__ = ["Case950", "Inputs950", "random_case", "make_inputs", "run_world", "SOC"]
