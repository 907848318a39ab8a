"""The seeded configuration matrix of the operator suites, per SoC profile, and each configuration's
per-rank inputs.

Ascend910_93: world sizes, shared experts, masks, uneven BS, special experts, quant 0 / 2, comm quant
0 / 2, every comm_alg. Ascend950 adds quant modes 1 (int8 / hifloat8; scalar, (H,) and per-expert
scales), 2 with fp8, 3, 4 (fp8 and packed fp4), 5, low-precision inputs with forwarded per-token
scales (float32 or e8m0), extreme MX rows, elastic_info, performance_info and comm quant 3 / 4. A 950
configuration is drawn by drawing an A3 one first and then its 950 part, so both matrices keep their
seeds."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

A3, A950 = "Ascend910_93", "Ascend950"
PROFILES = (A3, A950)
A2 = "Ascend910B"      # Atlas A2: its own matrix (tests/ops/test_a2_rounds.py), not in PROFILES

DTYPES = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
SR_PAIRS = [(1, 0), (0, 0), (1, 1), (2, 2), (1, 2), (2, 4)]
COMM_ALGS = ["", "fullmesh_v1", "fullmesh_v2"]
F32 = np.float32
FP8 = ["float8_e4m3fn", "float8_e5m2"]
FP4 = ["float4_e2m1", "float4_e1m2"]
LOWP_X = ["hifloat8"] + FP8 + FP4
# expand_x formats per quant mode on the 950
Y_FORMATS = {1: ["int8", "hifloat8"], 2: ["int8"] + FP8, 3: FP8, 4: FP8 + FP4, 5: FP8}
NP_FP8 = {"float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn), "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}
_DT = {"int8": "INT8", "hifloat8": "HIFLOAT8", "float8_e4m3fn": "FLOAT8_E4M3FN", "float8_e5m2": "FLOAT8_E5M2",
       "float4_e2m1": "FLOAT4_E2M1", "float4_e1m2": "FLOAT4_E1M2"}


def on_profile(*socs: str) -> Any:
    """Run the test on these SoC profiles only (the `profile` fixture of tests/conftest.py)."""
    return pytest.mark.parametrize("profile", socs, indirect=True)


def datatype(fmt: str) -> Any:
    from aclnn_py import DataType

    return DataType[_DT[fmt]]


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
    zero_row: bool = False   # an all-zero token row (the quant 2 rule)
    # Ascend950
    soc: str = A3
    yfmt: str | None = None          # expand_x format for quant >= 1
    xfmt: str | None = None          # low-precision x (quant 0)
    static_kind: str = "scalar"      # quant 1 scales: scalar | row | expert
    tok_dim1: int = 1                # low-precision x: per-token scales dim 1
    tok_e8m0: bool = False           # ... as e8m0 bytes (else float32)
    extreme: bool = False            # MX: rows of tiny / huge magnitude and inf/NaN elements
    elastic: str = "none"            # none | flag0 | perm
    perf: bool = False               # performance_info passed (dispatch and combine)

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


def random_case(rng: np.random.Generator, W: int, seed: int, combine: bool = False, soc: str = A3) -> Case:
    """One configuration of the profile's matrix for world size W."""
    c = _random_a3(rng, W, seed, combine)
    return c if soc == A3 else _random_950(rng, c, W, combine)


def _random_a3(rng: np.random.Generator, W: int, seed: int, combine: bool) -> Case:
    pairs = [(s, r) for (s, r) in SR_PAIRS if r < W]
    S, R = pairs[rng.integers(len(pairs))]
    L = int(rng.integers(1, 9))
    H = int(rng.choice([1024, 2048, 7168], p=[0.5, 0.3, 0.2]))
    comm_alg = COMM_ALGS[rng.integers(3)]
    kmax = 12 if comm_alg == "fullmesh_v2" else 16
    Z, C, Q = (int(v) for v in rng.integers(0, 3, size=3) * (rng.random(3) < 0.35))
    E = L * (W - R)
    K = int(rng.integers(1, min(kmax, E + Z + C + Q) + 1))
    # BS skewed small, 1..64; larger worlds and H = 7168 keep BS lower to bound the runtime (the
    # golden's cost grows with W * BS * K * H)
    bsmax = 64 if W <= 4 else (40 if W <= 8 else 20)
    if H == 7168:
        bsmax = min(bsmax, 24 if W <= 4 else 12)
    bs = int(min(bsmax, 1 + rng.geometric(0.08)))
    if rng.random() < 0.25:      # uneven BS
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


def _random_950(rng: np.random.Generator, b: Case, W: int, combine: bool) -> Case:
    # smaller token counts than the A3 matrix: the 950 golden quantises per (token, expert) row
    bs = [min(x, 24) for x in b.bss]
    if len(set(b.bss)) > 1:       # uneven BS: global_bs = maxBs * W plus the original slack
        g = max(bs) * W + (b.global_bs - max(b.bss) * W)
    else:
        g = bs[0] * W if b.global_bs else 0
    c = replace(b, bss=bs, global_bs=g, soc=A950)
    kind = rng.choice(["lowp", "q1", "q2", "q3", "q4", "q5", "q0"], p=[0.14, 0.16, 0.16, 0.16, 0.2, 0.12, 0.06])
    if kind == "lowp":
        c.xfmt = str(rng.choice(LOWP_X))
        c.quant, c.smooth = 0, False
        elem = 0.5 if c.xfmt in FP4 else 1
        c.tok_e8m0 = bool(rng.random() < 0.4)
        room = (-(-2 * c.H // 32) * 32) - int(c.H * elem)
        cap = room if c.tok_e8m0 else room // 4
        c.tok_dim1 = int(rng.choice([1, c.H // 128, c.H // 32, cap]))
        c.tok_dim1 = max(1, min(c.tok_dim1, cap, c.H))
    elif kind == "q0":
        c.quant, c.smooth = 0, False
    else:
        q = int(kind[1])
        c.yfmt = str(rng.choice(Y_FORMATS[q]))
        c.quant, c.smooth = q, bool(q in (2, 3) and rng.random() < 0.5)
        if q == 1:
            c.static_kind = "scalar" if c.yfmt == "hifloat8" else str(rng.choice(["scalar", "row", "expert"]))
        if c.yfmt in FP4 and c.H % 2:
            c.H += 1
        c.extreme = bool(q in (4, 5) and not combine and rng.random() < 0.4)
    if W >= 2 and rng.random() < 0.3:
        c.elastic = str(rng.choice(["flag0", "perm"], p=[0.3, 0.7]))
    c.perf = bool(rng.random() < 0.3)
    if combine:
        c.comm_quant = int(rng.choice([0, 2, 3, 4], p=[0.2, 0.2, 0.3, 0.3]))
    return c


def cases_for(soc: str, w: int, start: int, count: int, base_seed: int, combine: bool = False) -> list[Case]:
    """Configurations start .. start+count of world size w in the matrix seeded with base_seed."""
    step = 97 if soc == A3 else 131
    rng = np.random.default_rng(base_seed + step * w + start)
    return [random_case(rng, w, seed=base_seed + 1000 * w + start + i, combine=combine, soc=soc)
            for i in range(count)]


# ---------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------

@dataclass
class Inputs:
    x: list[np.ndarray]              # as the golden takes them (fp8 arrays, uint8 codes, packed fp4)
    ids: list[np.ndarray]
    mask: list[np.ndarray] | None
    escales: list[np.ndarray] | None
    scales: Any                      # golden scales argument (also what the mock gets, per rank)
    weights: list[np.ndarray] | None = None
    shared_x: list[np.ndarray] | None = None
    alpha1: np.ndarray | None = None
    alpha2: np.ndarray | None = None
    const_v: np.ndarray | None = None
    x_mock: list[Any] | None = None  # numpy arrays or (array, DataType) for Tensor.from_numpy
    elastic: np.ndarray | None = None
    ori_x: list[np.ndarray] | None = None   # fp16 / bf16 x (copy and const experts)


def make_inputs(c: Case) -> Inputs:
    inp = _a3_inputs(c)
    if c.soc == A950:
        _add_950_inputs(c, inp)
    inp.x_mock = inp.x_mock if inp.x_mock is not None else list(inp.x)
    return inp


def _a3_inputs(c: Case) -> Inputs:
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
            if rng.random() < 0.2:          # only the count matters
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
                 shared_x=sx if c.shared_x else None, ori_x=list(xs))
    if c.Q:
        inp.alpha1 = (rng.standard_normal((c.Q, c.H), dtype=np.float32) * 0.05).astype(dt)
        inp.alpha2 = (rng.standard_normal((c.Q, c.H), dtype=np.float32) * 0.05).astype(dt)
        inp.const_v = rng.standard_normal((c.Q, c.H), dtype=np.float32).astype(dt)
    return inp


def _add_950_inputs(c: Case, inp: Inputs) -> None:
    rng = np.random.default_rng(c.seed + 7_000_000)
    if c.xfmt is not None:
        xg, xm, toks = [], [], []
        for r in range(c.W):
            bs = c.bss[r]
            if c.xfmt in NP_FP8:
                a = rng.integers(0, 256, size=(bs, c.H), dtype=np.uint8).view(NP_FP8[c.xfmt])
                xg.append(a)
                xm.append(a)
            else:
                width = c.H // 2 if c.xfmt in FP4 else c.H
                codes = rng.integers(0, 256, size=(bs, width), dtype=np.uint8)
                xg.append(codes)
                xm.append((codes, datatype(c.xfmt)))
            if c.tok_e8m0:
                toks.append(rng.integers(0, 256, size=(bs, c.tok_dim1), dtype=np.uint8))
            else:
                toks.append(rng.standard_normal((bs, c.tok_dim1), dtype=F32))
        inp.x, inp.x_mock, inp.scales = xg, xm, toks
    elif c.quant == 1:
        rows = c.E + c.S_norm if c.R else c.E
        shape = {"scalar": (1,), "row": (c.H,), "expert": (rows, c.H)}[c.static_kind]
        inp.scales = (rng.random(shape, dtype=F32) * 3.75 + 0.25).astype(F32)
    if c.extreme:
        dt = DTYPES[c.dtype]
        xs = []
        for r in range(c.W):
            x = inp.x[r].astype(F32)
            for t in range(c.bss[r]):
                u = rng.random()
                if u < 0.2:
                    x[t] *= F32(2.0**-100 if c.dtype == "bf16" else 2.0**-18)   # tiny / fp16 subnormal
                elif u < 0.35 and c.dtype == "bf16":
                    x[t] *= F32(2.0**120)                                        # e8m0 up to 254
                elif u < 0.45:
                    x[t, rng.integers(c.H)] = [np.inf, -np.inf, np.nan][rng.integers(3)]
            xs.append(x.astype(dt))
        inp.x, inp.ori_x = xs, list(xs)
    if c.elastic != "none":
        e = np.zeros(4 + 2 * c.W, np.int32)
        e[1:4] = (c.W, c.R, c.E)
        e[4:4 + c.W] = rng.integers(0, 5, size=c.W)   # not read
        if c.elastic == "perm":
            e[0] = 1
            e[4 + c.W:] = rng.permutation(c.W)
        else:
            e[4 + c.W:] = np.arange(c.W)
        inp.elastic = e


def roles(c: Case, inp: Inputs) -> list[tuple[int, int, int]]:
    """Per physical rank: (logical rank, receive slots, local experts)."""
    table = np.arange(c.W)
    if inp.elastic is not None and inp.elastic[0]:
        table = inp.elastic[4 + c.W:]
    logical = np.argsort(table)
    out = []
    for r in range(c.W):
        lr = int(logical[r])
        out.append((lr, c.W, 1) if lr < c.R else (lr, c.W * c.L, c.L))
    return out


__all__ = ["A2", "A3", "A950", "PROFILES", "Case", "Inputs", "random_case", "cases_for", "make_inputs", "roles", "replace",
           "DTYPES", "SR_PAIRS", "COMM_ALGS", "FP8", "FP4", "LOWP_X", "Y_FORMATS", "datatype", "on_profile"]
