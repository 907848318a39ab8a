"""Independent numpy reference ("golden") of MoeDistributeDispatchV5 / MoeDistributeCombineV5.

Profiles: Ascend910_93 (A3, the default) and Ascend950 (keyword ``soc="Ascend950"``).  The only
source is ``SPEC.md`` (section numbers below refer to it); the module shares no code with the C++
mock and imports nothing from the rest of ``aclnn_py`` except the self-contained ``casts`` module
(low-precision formats; loaded from its path when this file is).

Every function takes the inputs of *all* ranks (lists indexed by ep rank id) and returns the outputs
of all ranks, exact to the bit:

* :func:`dispatch` — SPEC §4 (placement §4.1, pair selection §4.2, payload §4.3, receiver order
  §4.4, global_bs §4.5, quant modes 0 and 2 §4.6, and the §0 all-zero-row rule); on the 950 also
  quant modes 1, 3, 4, 5, fp8 outputs of mode 2, low-precision inputs (§4.6) and elastic_info (§4.7).
* :func:`combine` — SPEC §6 (send §6.1, fp32 reduction order §6.2, comm quant 2 §6.3, special
  experts, the §0 const-expert rule); on the 950 also comm quant 3 / 4 (MXFP8) and elastic_info.
* :func:`round_trip` — dispatch → user expert function → combine.
* :func:`ccl_buffer_size_mb` (SPEC §9.2) and :func:`window_bytes_required` (SPEC §9.3).

Arithmetic conventions (SPEC §0 "fp32 arithmetic"): every operation SPEC describes in fp32 is done in
float32 numpy arithmetic with an explicit order; ``a*b + c`` is always a rounded multiply followed by
a rounded add (numpy never fuses).  Casts to fp16 / bf16 are round-to-nearest-even (numpy /
ml_dtypes ``astype``).  Only the const-expert softmax uses float64, as SPEC §0 prescribes.

The golden interprets inputs; it does not re-implement every operator check (that is the mock's
job), but raises :class:`ValueError` for inputs it cannot interpret (inconsistent shapes, E not
divisible by W-R, ids out of range, unsupported modes, a 950 feature on the A3 profile, …).

Ascend 950: choices where SPEC leaves a detail open
---------------------------------------------------

The C++ mock implements the same list.  Formats and casts are defined in ``casts.py`` (its docstring
gives the bit layouts, rounding, saturation and NaN/inf rules).

Output types (SPEC §0 "dtype arguments", §10.4).  ``y_dtype`` / ``x_dtype`` accept an
``aclnn_py.DataType`` member or its aclDataType int, a numpy / ml_dtypes dtype, or a name
("int8", "hifloat8", "float8_e4m3fn", "float8_e5m2", "float4_e2m1", "float4_e1m2", "float16",
"bfloat16").  expand_x is int8 for int8, an ml_dtypes ``float8_e4m3fn`` / ``float8_e5m2`` array for
fp8, uint8 codes for hifloat8, and uint8 bytes of shape (N, H/2) for fp4 (two codes per byte, element
2i in the low nibble).  dynamic_scales is float32 (N,) for modes 2, float32 (N, ceil(H/128)) for mode
3, uint8 e8m0 bytes (N, align2(ceil(H/32))) for modes 4 / 5, and the forwarded per-token scales
(N, dim1) in their own dtype for quant 0 with a low-precision x.

1. **Mode 1 (§4.6, static).** ``scales`` is required: float32 (1,), (H,) or (E+S, H) / (E, H) (the
   mode-2 row rule: row s for shared expert s, e + S for MoE expert e); hifloat8 takes only (1,).
   ``y = float32(x) * scale`` (one fp32 multiply).  int8: ``q = rint(y)`` saturated to [-128, 127]
   (the int32 → half → int8 chain, each step saturating).  hifloat8: ``casts.hif8_encode(y)`` —
   ROUND = ties away from zero, **not saturating** (|y| ≥ 40960 → the ±inf code).
   dynamic_scales is not written (None).
2. **Mode 2 fp8 (§4.6).** ``ds = 448f / m`` (e4m3fn) or ``57344f / m`` (e5m2), ``q = fp8_rint(xf*ds)``
   without saturation (irrelevant: |xf*ds| ≤ max·(1+2^-24) never rounds past max), scale ``1f/ds``.
   Smooth scales exactly as on A3.  An all-zero row → scale 0, codes +0 (§0).
3. **Mode 3 (§4.6).** Groups of 128 along H, the last one zero-padded (the padding only enters the
   max); per group ``ds = fmax / max|g|``, ``q = fp8_rint(xf*ds)`` without saturation, scale
   ``1/ds``; an all-zero group → scale 0, codes +0.  y_dtype fp8 only; smooth scales as mode 2.
4. **Modes 1–3: non-finite input** (or a product that is NaN) and **a non-zero max so small that
   fmax / max overflows to +inf** are refused (ValueError), as on A3: SPEC §12.3 leaves them
   undefined and the mock tests avoid them.
5. **Mode 4 (§4.6 MX).** Block exponent = max of ``casts.float32_exponent_field`` over the 32
   elements (equal to the bf16 field, and to that of fp16 truncated to bf16); e8m0 = 0xFF when the
   field is 255 (inf/nan), ``E - emax`` when ``E > emax``, else 0.  Element = sat-RNE cast of
   ``x * 2^(127 - e8m0)``: for bf16 x the product is rounded to bf16 (``(float32(x) * m).astype(bf16)``),
   for fp16 x it is a float32 multiply.  **A block whose scale is 0xFF has every element code 0**
   (the scale alone makes the block NaN on decode).  The tail block is zero-padded; an odd block
   count gets one padding scale byte 0.  fp4 outputs need H even (ValueError otherwise).
6. **Mode 5 (§4.6 MX clip).** amax = max|float32(x)| per block (NaN if any NaN); e8m0 from SPEC's
   steps 2–3 with ``t = max(amax, float32(1e-4)) * (1f / float32(fp8_max))`` (``1/fp8_max`` rounded
   to float32 first); elements exactly as mode 4 (bf16 product in bf16, fp16 in fp32; 0xFF blocks →
   code 0).  fp8 outputs only.
7. **Low-precision inputs (§4.6 "0 + low-precision input").** quant 0 only; x is an ml_dtypes fp8
   array, or uint8 with ``x_dtype`` hifloat8 / fp8 / fp4; fp4 x is packed uint8 (BS, H/2).  ``scales``
   is required, one (BS_r, dim1) array per rank, float32 or uint8 / float8_e8m0fnu (same dtype and
   dim1 on every rank), 1 ≤ dim1 ≤ H and one row no wider than the room its token's window row has
   after the x bytes: ``dim1 * itemsize <= align(2H, 32) - bytes of one x row`` (H/2 for fp4, H
   otherwise), e.g. dim1 ≤ H/4 for fp8 x with float32 scales; row i of dynamic_scales is the source token's scale row,
   byte for byte (shared-expert copies too).  y_dtype, if given, must equal x's type.  fp16/bf16 x
   with quant 0 still rejects scales.
8. **Comm quant 3 / 4 (§5, §6.3).** 3 = MXFP8 e5m2, 4 = MXFP8 e4m3fn: the sender quantises each
   expand_x row exactly as dispatch mode 4 (block 32, e8m0, sat-RNE, 0xFF blocks → code 0); the
   receiver dequantises ``decode(code) * 2^(e8m0-127)`` in float32 (exact; a 0xFF block gives NaN),
   rounds it to the row dtype (RNE) and back to float32, then weights and accumulates as §6.2.
9. **950 int8 comm quant (§6.3 "950 differences").** "rounded to the row dtype, then multiplied by w
   in fp32" is the arithmetic the A3 receiver already performs (steps 1–3), so comm quant 2 gives
   the same values on both profiles; the golden uses one code path.
10. **elastic_info (§4.7, §2).** One int32 (4+2W,) array (or one per rank, all equal).  Present at all
   (flag set or not): ``A = max(shared formula, MoE formula)`` on every rank, ``L := max(L, 1)``.
   Flag ``[0] != 0``: ``[1], [2], [3]`` must equal W, R, E (the golden models a re-mapping of the
   same world, not a smaller one) and ``[4+W : 4+2W]`` must be a permutation of 0 … W-1: logical
   rank l (whose experts, shared/MoE role and slot layout follow §4.1/§4.4 with rank id l) is served
   by physical rank ``table[l]``.  Senders keep their physical rank id everywhere (assist_info
   triples, slot ``j*W + src``, shared replica ``src % P + s*P`` computed from the physical src, the
   combine's return address).  ``[4 : 4+W]`` is not read.  Combine uses the same table to know each
   physical rank's role (shared / MoE) and so its row count.
11. **A3 refusals.** On ``soc="Ascend910_93"`` quant modes 1, 3, 4, 5, a y_dtype other than the
   default, a non-fp16/bf16 x, comm quant 3 / 4 and a non-None elastic_info raise ValueError naming
   the parameter.  performance_info (timing) is not modelled by the golden.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

try:
    from . import casts as _casts
except ImportError:  # loaded from its path (the tests do): load the sibling casts.py the same way
    import importlib.util as _ilu
    import sys as _sys
    from pathlib import Path as _Path

    _cname = __name__ + "_casts"
    _cspec = _ilu.spec_from_file_location(_cname, _Path(__file__).with_name("casts.py"))
    assert _cspec is not None and _cspec.loader is not None
    _casts = _ilu.module_from_spec(_cspec)
    _sys.modules[_cname] = _casts
    _cspec.loader.exec_module(_casts)

__all__ = [
    "DispatchResult",
    "CombineResult",
    "dispatch",
    "combine",
    "round_trip",
    "rows_capacity",
    "local_expert_num",
    "normalized_shared_expert_num",
    "quantize_per_token_int8",
    "comm_quant_int8_round_trip",
    "SOC_A3",
    "SOC_950",
    "format_name",
    "quantize_static",
    "quantize_per_token",
    "quantize_per_group",
    "quantize_mx",
    "mx_scale_columns",
    "comm_quant_mx_round_trip",
    "dynamic_scales_shape",
    "ccl_buffer_size_mb",
    "window_bytes_required",
]

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
_ROW_DTYPES = (FP16, BF16)
_COMM_ALGS = ("", "fullmesh_v1", "fullmesh_v2")
_MIB = 1 << 20

# ---------------------------------------------------------------------------------------------------
# Small derived sizes (SPEC notation, §2)
# ---------------------------------------------------------------------------------------------------


def normalized_shared_expert_num(shared_expert_num: int, shared_expert_rank_num: int) -> int:
    """Return S after the tiling's normalisation (SPEC notation): ``R == 0 and S == 1`` → ``S = 0``.

    Raises ValueError for (S, R) pairs the placement of SPEC §4.1 cannot interpret (SPEC §3.2:
    exactly one of S, R zero after normalisation, or ``R % S != 0``, or S outside [0, 4]).
    """
    s, r = int(shared_expert_num), int(shared_expert_rank_num)
    if r == 0 and s == 1:
        s = 0
    if not 0 <= s <= 4:
        raise ValueError(f"shared_expert_num: must be in [0, 4] (got {s})")
    if r < 0:
        raise ValueError(f"shared_expert_rank_num: must be >= 0 (got {r})")
    if (s == 0) != (r == 0):
        raise ValueError(
            "shared_expert_num/shared_expert_rank_num: exactly one of them is 0 after normalising "
            f"(S={s}, R={r}; SPEC §3.2)"
        )
    if s and r % s:
        raise ValueError(
            f"shared_expert_rank_num: must be divisible by shared_expert_num (got {r} % {s}; SPEC §3.2)"
        )
    return s


def _moe_local_num(ep_world_size: int, moe_expert_num: int, shared_expert_rank_num: int) -> int:
    w, e, r = int(ep_world_size), int(moe_expert_num), int(shared_expert_rank_num)
    if w < 1:
        raise ValueError(f"ep_world_size: must be >= 1 (got {w})")
    if not 0 <= r < w:
        raise ValueError(f"shared_expert_rank_num: must be in [0, ep_world_size) (got {r}, W={w})")
    if e <= 0:
        raise ValueError(f"moe_expert_num: must be > 0 (got {e})")
    if e % (w - r):
        raise ValueError(
            "moe_expert_num: must be divisible by ep_world_size - shared_expert_rank_num "
            f"(got {e} % {w - r})"
        )
    return e // (w - r)


def local_expert_num(
    ep_world_size: int,
    rank: int,
    moe_expert_num: int,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
) -> int:
    """localExpertNum of SPEC §2: 1 on a shared rank (``rank < R``), ``L = E / (W - R)`` on a MoE rank."""
    normalized_shared_expert_num(shared_expert_num, shared_expert_rank_num)
    n_local = _moe_local_num(ep_world_size, moe_expert_num, shared_expert_rank_num)
    if not 0 <= rank < ep_world_size:
        raise ValueError(f"rank: must be in [0, ep_world_size) (got {rank})")
    return 1 if rank < shared_expert_rank_num else n_local


def rows_capacity(
    ep_world_size: int,
    rank: int,
    moe_expert_num: int,
    shared_expert_num: int,
    shared_expert_rank_num: int,
    global_bs: int,
    bs: int,
    topk: int,
    elastic: bool = False,
) -> int:
    """A, the expand_x row capacity of SPEC §2.

    * shared rank: ``A = maxBs * ceil(W / (R / S))``
    * MoE rank:    ``A = G * min(L, K)``
    * ``elastic`` (elastic_info present, 950): ``A = max`` of both (the shared one only when R > 0),
      with ``L := max(L, 1)``.

    with ``G = global_bs`` or ``bs * W`` when global_bs is 0, and ``maxBs = G / W``.
    """
    w = int(ep_world_size)
    s = normalized_shared_expert_num(shared_expert_num, shared_expert_rank_num)
    n_local = _moe_local_num(w, moe_expert_num, shared_expert_rank_num)
    g = _resolve_global_bs(global_bs, w, [bs])
    if not 0 <= rank < w:
        raise ValueError(f"rank: must be in [0, ep_world_size) (got {rank})")
    shared_a = (g // w) * (-(-w // (shared_expert_rank_num // s))) if s else 0
    if elastic:
        return max(shared_a, g * min(max(n_local, 1), int(topk)))
    if rank < shared_expert_rank_num:
        return shared_a
    return g * min(n_local, int(topk))


def _resolve_global_bs(global_bs: int, w: int, bss: Sequence[int]) -> int:
    """G of SPEC notation / §4.5; validates the uneven-BS rule of SPEC §0."""
    g = int(global_bs)
    if g == 0:
        if len({int(b) for b in bss}) > 1:
            raise ValueError(
                "global_bs: BS differs across ranks, which needs global_bs = maxBs * W (SPEC §0, §4.5); "
                f"got global_bs=0 with BS={list(bss)}"
            )
        return int(bss[0]) * w
    if g < 0 or g % w:
        raise ValueError(f"global_bs: must be 0 or a multiple of ep_world_size (got {g} % {w})")
    for b in bss:
        if g < int(b) * w:
            raise ValueError(f"global_bs: must be >= BS * ep_world_size (got {g} < {b} * {w})")
    return g


# ---------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------


@dataclass
class DispatchResult:
    """One rank's dispatch outputs (SPEC §4.4); rows beyond N are omitted (SPEC §0: unwritten)."""

    expand_x: np.ndarray
    """(N, H): x's dtype for quant_mode 0, int8 for quant_mode 2; on the 950 as ``y_dtype`` says
    (fp8 ml_dtypes arrays, uint8 HiF8 codes, packed fp4 uint8 (N, H/2))."""
    dynamic_scales: np.ndarray | None
    """(N,) float32 per-row scales ``1/ds`` for quant_mode 2; None for quant_mode 0 and 1.
    950: (N, ceil(H/128)) float32 for mode 3, (N, align2(ceil(H/32))) uint8 e8m0 for modes 4/5,
    (N, dim1) forwarded per-token scales for quant 0 with a low-precision x."""
    assist_info_for_combine: np.ndarray
    """(3*N,) int32 triples (src_rank, src_token_index, k_slot)."""
    expert_token_nums: np.ndarray
    """(localExpertNum,) int64; per-expert counts (type 1) or their inclusive cumsum (type 0)."""
    ep_recv_counts: np.ndarray
    """(W*L,) on a MoE rank or (W,) on a shared rank, int32 inclusive prefix sums of the slot counts."""
    expand_scales: np.ndarray | None
    """(N,) float32 carried topk weights on a MoE rank when expert_scales was given; None otherwise."""
    num_rows: int
    """N, the number of rows received."""
    capacity: int
    """A of SPEC §2."""
    local_expert_num: int
    """1 on a shared rank, L on a MoE rank."""
    y_dtype: str = ""
    """Format name of expand_x ("float16", "bfloat16", "int8", "hifloat8", "float8_e4m3fn", …)."""
    logical_rank: int = -1
    """The logical rank this physical rank serves (itself unless elastic_info re-maps, §4.7)."""


@dataclass
class CombineResult:
    """One rank's combine output (SPEC §6.2)."""

    x_out: np.ndarray
    """(BS, H) in expand_x's dtype; rows of tokens that are not processed are zero here."""
    written: np.ndarray
    """(BS,) bool: which rows the operator writes (processed tokens, SPEC §6.2)."""


# ---------------------------------------------------------------------------------------------------
# Common input handling
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Cfg:
    w: int
    e: int
    r: int  # R
    s: int  # normalised S
    l: int  # L
    p: int  # R / S (0 when there are no shared ranks)
    z: int
    c: int
    q: int
    k: int
    h: int
    bss: list[int]
    g: int

    def dest_of_moe(self, e: np.ndarray) -> np.ndarray:
        return e // self.l + self.r

    def dest_of_shared(self, src: int, s: int) -> int:
        return (src % self.p) + s * self.p


def _per_rank(name: str, value: Any, w: int) -> list[Any]:
    if value is None:
        return [None] * w
    if isinstance(value, np.ndarray):
        return [value] * w
    value = list(value)
    if len(value) != w:
        raise ValueError(f"{name}: expected one array per rank ({w}), got {len(value)}")
    result: list[Any] = value
    return result


def _make_cfg(
    x_shapes: Sequence[tuple[int, ...]],
    expert_ids: Sequence[np.ndarray],
    *,
    moe_expert_num: int,
    shared_expert_num: int,
    shared_expert_rank_num: int,
    global_bs: int,
    comm_alg: str,
    zero_expert_num: int,
    copy_expert_num: int,
    const_expert_num: int,
    x_name: str,
) -> _Cfg:
    w = len(x_shapes)
    if w < 1:
        raise ValueError(f"{x_name}: need at least one rank")
    if len(expert_ids) != w:
        raise ValueError(f"expert_ids: expected {w} arrays (one per rank), got {len(expert_ids)}")
    if comm_alg not in _COMM_ALGS:
        raise ValueError(f"comm_alg: must be one of {_COMM_ALGS} on A3 with a context (got {comm_alg!r})")
    s = normalized_shared_expert_num(shared_expert_num, shared_expert_rank_num)
    r = int(shared_expert_rank_num)
    l = _moe_local_num(w, moe_expert_num, r)
    z, c, q = int(zero_expert_num), int(copy_expert_num), int(const_expert_num)
    if min(z, c, q) < 0:
        raise ValueError(f"zero/copy/const_expert_num: must be >= 0 (got {z}, {c}, {q})")
    h = None
    k = None
    bss = []
    for rank, (shape, ids) in enumerate(zip(x_shapes, expert_ids)):
        if len(shape) != 2:
            raise ValueError(f"{x_name}[{rank}]: must be 2-D (got shape {tuple(shape)})")
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[0] != shape[0]:
            raise ValueError(
                f"expert_ids[{rank}]: must be (BS, K) with BS == {x_name}.shape[0] "
                f"(got {ids.shape} vs {tuple(shape)})"
            )
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"expert_ids[{rank}]: must be an integer array (got {ids.dtype})")
        if h is None:
            h, k = int(shape[1]), int(ids.shape[1])
        if shape[1] != h:
            raise ValueError(f"{x_name}[{rank}]: H differs across ranks ({shape[1]} vs {h})")
        if ids.shape[1] != k:
            raise ValueError(f"expert_ids[{rank}]: K differs across ranks ({ids.shape[1]} vs {k})")
        if shape[0] < 1:
            raise ValueError(f"{x_name}[{rank}]: BS must be >= 1")
        bss.append(int(shape[0]))
    assert h is not None and k is not None
    if k < 1 or k > moe_expert_num + z + c + q:
        raise ValueError(f"expert_ids: K must be in [1, E+Z+C+Q] (got K={k})")
    g = _resolve_global_bs(global_bs, w, bss)
    return _Cfg(w=w, e=int(moe_expert_num), r=r, s=s, l=l, p=(r // s if s else 0), z=z, c=c, q=q,
                k=k, h=h, bss=bss, g=g)


def _masks(cfg: _Cfg, x_active_mask: list[np.ndarray] | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rank: (token_valid (BS,), pair_valid (BS,K)) per SPEC §4.2 / §6.2."""
    out: list[tuple[Any, Any]] = []
    if isinstance(x_active_mask, np.ndarray):
        raise ValueError("x_active_mask: expected a list with one mask per rank")
    masks = _per_rank("x_active_mask", x_active_mask, cfg.w)
    for rank, m in enumerate(masks):
        bs, k = cfg.bss[rank], cfg.k
        if m is None:
            out.append((np.ones(bs, bool), np.ones((bs, k), bool)))
            continue
        m = np.asarray(m)
        if m.dtype != np.bool_:
            raise ValueError(f"x_active_mask[{rank}]: must be bool (got {m.dtype})")
        if cfg.g > bs * cfg.w:
            raise ValueError(
                f"x_active_mask[{rank}]: not allowed when global_bs > BS * ep_world_size "
                f"(got {cfg.g} > {bs} * {cfg.w}; SPEC §3.1)"
            )
        if m.ndim == 1 and m.shape == (bs,):
            n = int(np.count_nonzero(m))  # only the count matters (SPEC §0 "1-D mask")
            tok = np.arange(bs) < n
            out.append((tok, np.repeat(tok[:, None], k, axis=1)))
        elif m.ndim == 2 and m.shape == (bs, k):
            out.append((m.any(axis=1), m.copy()))
        else:
            raise ValueError(f"x_active_mask[{rank}]: must be (BS,) or (BS, K) = ({bs}, {k}) (got {m.shape})")
    return out


def _check_ids(cfg: _Cfg, rank: int, ids: np.ndarray, pair_valid: np.ndarray) -> None:
    lim = cfg.e + cfg.z + cfg.c + cfg.q
    bad = pair_valid & ((ids < 0) | (ids >= lim))
    if bad.any():
        t, k = map(int, np.argwhere(bad)[0])
        raise ValueError(
            f"expert_ids[{rank}][{t},{k}]: must be in [0, E+Z+C+Q) = [0, {lim}) (got {int(ids[t, k])})"
        )


def _row_dtype(name: str, a: np.ndarray, soc: str = "Ascend910_93") -> np.dtype:
    dt = np.asarray(a).dtype
    if dt not in _ROW_DTYPES:
        raise ValueError(f"{name}: dtype must be float16 or bfloat16 on {soc} (got {dt})")
    return dt


# ---------------------------------------------------------------------------------------------------
# Quantisation kernels (SPEC §4.6, §6.3, §0)
# ---------------------------------------------------------------------------------------------------


def _rint_to_int8(y: np.ndarray) -> np.ndarray:
    """``q = rint(y)`` → int32 → half (exact) → int8 (SPEC §4.6 step 6, §6.3 step 6)."""
    result: np.ndarray = np.rint(y).astype(np.int32).astype(np.float16).astype(np.int8)
    return result


def quantize_per_token_int8(xf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic per-token int8 quantisation of float32 rows (SPEC §4.6 quant_mode 2, steps 3–7).

    ``xf`` is (n, H) float32, already smoothed if smooth scales apply.  Returns ``(q int8 (n,H),
    scale float32 (n,))`` with ``ds = 127f / max|xf|``, ``q = int8(half(int32(rint(xf*ds))))``
    and ``scale = 1f / ds``.  A row with ``max|xf| == 0`` gives scale 0.0 and all values 0 (SPEC §0).
    """
    xf = np.asarray(xf)
    if xf.dtype != F32 or xf.ndim != 2:
        raise ValueError("quantize_per_token_int8: expects a 2-D float32 array")
    if not np.isfinite(xf).all():
        raise ValueError("quant_mode 2: non-finite input row; its quantisation is undefined (SPEC §4.6)")
    m = np.max(np.abs(xf), axis=1) if xf.shape[1] else np.zeros(xf.shape[0], F32)
    zero = m == F32(0)
    with np.errstate(divide="ignore"):
        ds = F32(127.0) / m  # float32 / float32 → float32; +inf for an all-zero row
    if np.isinf(ds[~zero]).any():
        raise ValueError(
            "quant_mode 2: a row whose max|x| is so small that 127/max overflows to +inf is not "
            "covered by SPEC §4.6/§0 (only an all-zero row is)"
        )
    ds_safe = np.where(zero, F32(0), ds).astype(F32)
    y = xf * ds_safe[:, None]  # float32 multiply
    q = _rint_to_int8(y)
    q[zero] = 0
    with np.errstate(divide="ignore"):
        scale = F32(1.0) / ds  # 1/inf = 0.0 for an all-zero row (SPEC §0)
    return q, scale.astype(F32)


def comm_quant_int8_round_trip(rows: np.ndarray) -> np.ndarray:
    """comm_quant_mode 2 transport of rows (SPEC §6.3, A3 path): returns the float32 values the
    receiver accumulates.

    Sender: blocks of 8 elements (tail zero-padded), ``sc = bm * (1f/127f)`` in fp32, transmitted
    scale ``sc`` cast (RNE) to the row dtype, ``q = int8(rint(half(rint(xf / sc))))`` with the
    unrounded fp32 ``sc``.  Receiver: ``deq = float32(half(q)) * float32(transmitted scale)``,
    rounded to the row dtype, then back to float32.  An all-zero block gives 0 (SPEC §0).
    """
    rows = np.asarray(rows)
    dt = _row_dtype("expand_x", rows)
    n, h = rows.shape
    xf = rows.astype(F32)
    if not np.isfinite(xf).all():
        raise ValueError("comm_quant_mode 2: non-finite expand_x value; its quantisation is undefined")
    nb = -(-h // 8)
    pad = np.zeros((n, nb * 8), F32)
    pad[:, :h] = xf
    blk = pad.reshape(n, nb, 8)
    bm = np.max(np.abs(blk), axis=2)
    inv127 = F32(1.0) / F32(127.0)
    sc = bm * inv127  # float32
    sc_t = sc.astype(dt)  # transmitted scale, RNE
    zero = sc == F32(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        quot = blk / sc[:, :, None]  # float32 division by the unrounded scale
    quot = np.where(zero[:, :, None], F32(0), quot).astype(F32)
    q = _rint_to_int8(quot)  # rint → half (exact; a second rint is a no-op) → int8
    deq = q.astype(np.float16).astype(F32) * sc_t.astype(F32)[:, :, None]  # float32 multiply
    deq = np.where(zero[:, :, None], F32(0), deq).astype(F32)
    out = deq.reshape(n, nb * 8)[:, :h]
    result: np.ndarray = out.astype(dt).astype(F32)
    return result


# ---------------------------------------------------------------------------------------------------
# Ascend 950: formats, quantisation modes 1, 3, 4, 5, fp8 mode 2, MX comm quant (SPEC §4.6, §6.3)
# ---------------------------------------------------------------------------------------------------

SOC_A3 = "Ascend910_93"
SOC_950 = "Ascend950"
_SOCS = (SOC_A3, SOC_950)

_FMT_INT8 = "int8"
_FMT_HIF8 = "hifloat8"
_FMT_E4M3 = "float8_e4m3fn"
_FMT_E5M2 = "float8_e5m2"
_FMT_E2M1 = "float4_e2m1"
_FMT_E1M2 = "float4_e1m2"
_FMT_F16 = "float16"
_FMT_BF16 = "bfloat16"
_FP8 = (_FMT_E4M3, _FMT_E5M2)
_FP4 = (_FMT_E2M1, _FMT_E1M2)
_LOW_PRECISION_X = (_FMT_HIF8,) + _FP8 + _FP4

# aclDataType values (ABI.md §1.1; aclnn_py.DataType is an IntEnum of them)
_ACL_TO_FMT = {2: _FMT_INT8, 34: _FMT_HIF8, 35: _FMT_E5M2, 36: _FMT_E4M3, 40: _FMT_E2M1, 41: _FMT_E1M2,
               1: _FMT_F16, 27: _FMT_BF16}
_NP_TO_FMT = {np.dtype(np.int8): _FMT_INT8, np.dtype(ml_dtypes.float8_e4m3fn): _FMT_E4M3,
              np.dtype(ml_dtypes.float8_e5m2): _FMT_E5M2, np.dtype(ml_dtypes.float4_e2m1fn): _FMT_E2M1,
              FP16: _FMT_F16, BF16: _FMT_BF16}
_NAME_ALIASES = {"hif8": _FMT_HIF8, "float8_e4m3": _FMT_E4M3, "fp8_e4m3fn": _FMT_E4M3, "fp8_e5m2": _FMT_E5M2,
                 "float4_e2m1fn": _FMT_E2M1, "fp4_e2m1": _FMT_E2M1, "fp4_e1m2": _FMT_E1M2, "fp16": _FMT_F16,
                 "half": _FMT_F16, "bf16": _FMT_BF16}
_FMT_NAMES = set(_ACL_TO_FMT.values())


def format_name(dtype: Any) -> str:
    """Normalise a y_dtype / x_dtype argument to a format name (see the module docstring)."""
    if isinstance(dtype, str):
        n = _NAME_ALIASES.get(dtype.lower(), dtype.lower())
        if n in _FMT_NAMES:
            return n
        raise ValueError(f"unknown data type name {dtype!r}")
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        try:
            return _ACL_TO_FMT[int(dtype)]
        except KeyError:
            raise ValueError(f"aclDataType {int(dtype)} is not a dispatch input/output type") from None
    try:
        return _NP_TO_FMT[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise ValueError(f"data type {dtype!r} is not a dispatch input/output type") from None


def _minifloat(fmt: str) -> Any:
    return _casts.MINIFLOATS[fmt]


def _check_soc(soc: str) -> None:
    if soc not in _SOCS:
        raise ValueError(f"soc: must be {SOC_A3!r} or {SOC_950!r} (got {soc!r})")


def _finite_or_raise(xf: np.ndarray, what: str) -> None:
    if not np.isfinite(xf).all():
        raise ValueError(f"{what}: non-finite value; its quantisation is undefined (SPEC §4.6, §12.3)")


def _as_output(codes: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 codes (n, H) → the expand_x array of format ``fmt`` (module docstring)."""
    if fmt in _FP8:
        return codes.astype(np.uint8).view(_NP_FMT[fmt])
    if fmt in _FP4:
        return _casts.pack_fp4(codes)
    return codes.astype(np.uint8)


_NP_FMT = {_FMT_E4M3: np.dtype(ml_dtypes.float8_e4m3fn), _FMT_E5M2: np.dtype(ml_dtypes.float8_e5m2)}


def _fp8_max(fmt: str) -> np.float32:
    result: np.float32 = F32(448.0) if fmt == _FMT_E4M3 else F32(57344.0)
    return result


def _rint_to_int8_sat(y: np.ndarray) -> np.ndarray:
    """``rint(y)`` → int32 → half → int8 with every step saturating = clip to [-128, 127]."""
    result: np.ndarray = np.clip(np.rint(y), -128, 127).astype(np.int8)
    return result


def quantize_static(xf: np.ndarray, scale: np.ndarray, y_dtype: Any = "int8") -> np.ndarray:
    """Static quantisation (SPEC §4.6 quant_mode 1; module docstring choice 1).

    ``xf`` (n, H) float32, ``scale`` broadcastable to it (float32).  int8: saturating
    ``rint(xf*scale)``; hifloat8: ``hif8_encode(xf*scale)`` (ties away, inf on overflow).
    Returns int8 or uint8 HiF8 codes."""
    fmt = format_name(y_dtype)
    _finite_or_raise(np.asarray(xf, F32), "quant_mode 1")
    y = np.asarray(xf, F32) * np.asarray(scale, F32)  # float32 multiply (overflow → ±inf saturates)
    if np.isnan(y).any():
        raise ValueError("quant_mode 1: NaN input or product; its quantisation is undefined")
    if fmt == _FMT_INT8:
        return _rint_to_int8_sat(y)
    if fmt == _FMT_HIF8:
        return _casts.hif8_encode(y)
    raise ValueError(f"y_dtype: quant_mode 1 outputs int8 or hifloat8 (got {fmt})")


def quantize_per_token(xf: np.ndarray, y_dtype: Any = "int8") -> tuple[np.ndarray, np.ndarray]:
    """Dynamic per-token quantisation (SPEC §4.6 quant_mode 2): int8 (the A3 rule,
    :func:`quantize_per_token_int8`) or fp8 e4m3fn / e5m2 (``ds = fmax/m``, fp8 RNE without
    saturation, scale ``1/ds``; all-zero row → scale 0, codes +0).  Returns (codes, scales (n,))."""
    fmt = format_name(y_dtype)
    if fmt == _FMT_INT8:
        return quantize_per_token_int8(xf)
    if fmt not in _FP8:
        raise ValueError(f"y_dtype: quant_mode 2 outputs int8, float8_e4m3fn or float8_e5m2 (got {fmt})")
    q, sc = _fp8_dynamic(np.asarray(xf, F32)[:, None, :], fmt, "quant_mode 2")
    return _as_output(q[:, 0, :], fmt), sc[:, 0]


def _fp8_dynamic(blk: np.ndarray, fmt: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(n, g, size) float32 (zero-padded) → fp8 codes (n, g, size), scales 1/ds (n, g)."""
    _finite_or_raise(blk, what)
    m = np.max(np.abs(blk), axis=2) if blk.shape[2] else np.zeros(blk.shape[:2], F32)
    zero = m == F32(0)
    with np.errstate(divide="ignore"):
        ds = _fp8_max(fmt) / m  # float32 division; +inf for an all-zero row / group
    if np.isinf(ds[~zero]).any():
        raise ValueError(f"{what}: a max|x| so small that fmax/max overflows to +inf is not covered "
                         "by SPEC §4.6/§0 (only an all-zero row/group is)")
    ds_safe = np.where(zero, F32(0), ds).astype(F32)
    y = blk * ds_safe[:, :, None]  # float32 multiply
    q = _casts.encode(y, _minifloat(fmt), saturate=False)
    q[zero] = 0
    with np.errstate(divide="ignore"):
        sc = (F32(1.0) / ds).astype(F32)  # 1/inf = 0 for an all-zero group (§0)
    return q, sc


def quantize_per_group(xf: np.ndarray, y_dtype: Any, group: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Per-group dynamic fp8 quantisation (SPEC §4.6 quant_mode 3): groups of ``group`` along H, the
    tail zero-padded.  Returns (fp8 array (n, H), float32 scales (n, ceil(H/group)))."""
    fmt = format_name(y_dtype)
    if fmt not in _FP8:
        raise ValueError(f"y_dtype: quant_mode 3 outputs float8_e4m3fn or float8_e5m2 (got {fmt})")
    xf = np.asarray(xf, F32)
    n, h = xf.shape
    ng = -(-h // group)
    pad = np.zeros((n, ng * group), F32)
    pad[:, :h] = xf
    q, sc = _fp8_dynamic(pad.reshape(n, ng, group), fmt, "quant_mode 3")
    return _as_output(q.reshape(n, ng * group)[:, :h], fmt), sc


def mx_scale_columns(hidden: int) -> int:
    """Columns of the e8m0 scales of MX quantisation: ``align2(ceil(H/32))`` (SPEC §4.6 mode 4)."""
    nb = -(-int(hidden) // 32)
    return nb + (nb & 1)


def quantize_mx(rows: np.ndarray, y_dtype: Any, *, clip: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """MX quantisation of fp16 / bf16 rows (SPEC §4.6 quant_mode 4, or 5 with ``clip=True``;
    module docstring choices 5, 6).  Returns (expand_x array, uint8 e8m0 scales (n, align2(ceil(H/32))))
    — expand_x is fp8 (n, H) or packed fp4 uint8 (n, H/2)."""
    fmt = format_name(y_dtype)
    allowed = _FP8 if clip else _FP8 + _FP4
    if fmt not in allowed:
        raise ValueError(f"y_dtype: quant_mode {5 if clip else 4} outputs {' / '.join(allowed)} (got {fmt})")
    codes, e8 = _mx_codes(rows, fmt, clip)
    return _as_output(codes, fmt), e8


def _mx_codes(rows: np.ndarray, fmt: str, clip: bool) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(rows)
    dt = rows.dtype
    if dt not in _ROW_DTYPES:
        raise ValueError(f"MX quantisation: rows must be float16 or bfloat16 (got {dt})")
    n, h = rows.shape
    if fmt in _FP4 and h % 2:
        raise ValueError(f"H: must be even for packed fp4 output (got {h})")
    mf = _minifloat(fmt)
    nb = -(-h // 32)
    xf = np.zeros((n, nb * 32), F32)
    xf[:, :h] = rows.astype(F32)
    blk = xf.reshape(n, nb, 32)
    if not clip:
        # §4.6 mode 4 steps 1-3: largest biased exponent field of the block
        ef = _casts.float32_exponent_field(blk).max(axis=2)
        e8 = np.where(ef == 255, 255, np.where(ef > mf.emax, ef - mf.emax, 0))
    else:
        # §4.6 mode 5 steps 1-3
        with np.errstate(invalid="ignore"):
            amax = np.max(np.abs(blk), axis=2)  # NaN propagates
        bad = ~np.isfinite(amax)
        inv = F32(1.0) / _fp8_max(fmt)  # float32-rounded reciprocal
        t = np.maximum(np.where(bad, F32(0), amax), F32(1e-4)).astype(F32) * inv  # float32 multiply
        tb = np.ascontiguousarray(t, F32).view(np.uint32).astype(np.int64)
        ex, mn = (tb >> 23) & 0xFF, tb & 0x7FFFFF
        up = ((ex > 0) & (ex < 254) & (mn > 0)) | ((ex == 0) & (mn > 0x400000))
        e8 = np.where(bad, 255, np.where(amax == 0, 0, ex + up))
    special = e8 == 255
    mult = _casts.pow2_float32(127 - np.where(special, 127, e8))  # 2^(127-e8m0); e8m0=254 → 2^-127
    prod = blk * mult[:, :, None]  # float32 multiply (exact but for underflow)
    if dt == BF16:  # bf16 input: the product is a bf16 multiply (SPEC §4.6 mode 4 step 4)
        prod = prod.astype(BF16).astype(F32)
    codes = _casts.encode(prod, mf, saturate=True)
    codes[special] = 0
    scales = np.zeros((n, nb + (nb & 1)), np.uint8)
    scales[:, :nb] = e8
    return codes.reshape(n, nb * 32)[:, :h], scales


def comm_quant_mx_round_trip(rows: np.ndarray, comm_quant_mode: int) -> np.ndarray:
    """comm_quant_mode 3 (MXFP8 e5m2) / 4 (MXFP8 e4m3fn) transport (SPEC §6.3 "950 differences";
    module docstring choice 8): float32 values the receiver accumulates (before weighting)."""
    rows = np.asarray(rows)
    dt = _row_dtype("expand_x", rows, soc=SOC_950)
    fmt = {3: _FMT_E5M2, 4: _FMT_E4M3}[comm_quant_mode]
    n, h = rows.shape
    codes, e8 = _mx_codes(rows, fmt, clip=False)
    nb = -(-h // 32)
    vals = np.zeros((n, nb * 32), F32)
    vals[:, :h] = _casts.decode(codes, _minifloat(fmt))
    deq = vals.reshape(n, nb, 32) * _casts.e8m0_to_float32(e8[:, :nb])[:, :, None]  # exact; NaN for 0xFF
    result: np.ndarray = deq.reshape(n, nb * 32)[:, :h].astype(dt).astype(F32)
    return result


def dynamic_scales_shape(capacity: int, quant_mode: int, hidden: int, *, soc: str = SOC_A3,
                         scales_dim1: int | None = None) -> tuple[tuple[int, ...], np.dtype] | None:
    """Allocation (shape, dtype) of dynamic_scales (SPEC §2, §4.6, §10.4), or None for quant 0 with
    fp16/bf16 x (allocated by the wrapper as (A,) float32 but never written) and for quant 1.

    ``scales_dim1`` (with its dtype float32 assumed) applies to quant 0 with a low-precision x."""
    _check_soc(soc)
    a = int(capacity)
    if quant_mode == 2:
        return (a,), np.dtype(F32)
    if soc == SOC_950:
        if quant_mode == 3:
            return (a, -(-int(hidden) // 128)), np.dtype(F32)
        if quant_mode in (4, 5):
            return (a, mx_scale_columns(hidden)), np.dtype(np.uint8)
        if quant_mode == 0 and scales_dim1 is not None:
            return (a, int(scales_dim1)), np.dtype(F32)
    return None


def _elastic_table(elastic_info: Any, w: int, r: int, e: int, soc: str) -> tuple[bool, np.ndarray]:
    """(present, logical → physical table) from elastic_info (SPEC §4.7; module docstring choice 10)."""
    ident = np.arange(w, dtype=np.int64)
    if elastic_info is None:
        return False, ident
    if soc != SOC_950:
        raise ValueError("elastic_info: reserved on Ascend910_93, must be None (SPEC §0)")
    per = [np.asarray(a) for a in _per_rank("elastic_info", elastic_info, w)]
    info = per[0]
    for rank, a in enumerate(per):
        if a.dtype != np.int32 or a.shape != (4 + 2 * w,):
            raise ValueError(f"elastic_info[{rank}]: must be int32 of shape (4 + 2W,) = ({4 + 2 * w},) "
                             f"(got {a.dtype} {a.shape})")
        if not np.array_equal(a, info):
            raise ValueError(f"elastic_info[{rank}]: differs from rank 0's")
    if info[0] == 0:
        return True, ident
    if (int(info[1]), int(info[2]), int(info[3])) != (w, r, e):
        raise ValueError(
            "elastic_info: [1], [2], [3] must equal ep_world_size, shared_expert_rank_num, moe_expert_num "
            f"(got {int(info[1])}, {int(info[2])}, {int(info[3])} vs {w}, {r}, {e}; the golden models a "
            "re-mapping of the same world)")
    table = info[4 + w: 4 + 2 * w].astype(np.int64)
    if not np.array_equal(np.sort(table), ident):
        raise ValueError(f"elastic_info: the rank table [4+W:4+2W] must be a permutation of 0..W-1 (got {table.tolist()})")
    return True, table


# ---------------------------------------------------------------------------------------------------
# Dispatch (SPEC §4)
# ---------------------------------------------------------------------------------------------------


def dispatch(
    x: list[np.ndarray],
    expert_ids: list[np.ndarray],
    *,
    moe_expert_num: int,
    scales: np.ndarray | list[np.ndarray] | None = None,
    x_active_mask: list[np.ndarray] | None = None,
    expert_scales: list[np.ndarray] | None = None,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    quant_mode: int = 0,
    global_bs: int = 0,
    expert_token_nums_type: int = 1,
    comm_alg: str = "",
    zero_expert_num: int = 0,
    copy_expert_num: int = 0,
    const_expert_num: int = 0,
    y_dtype: Any = None,
    x_dtype: Any = None,
    elastic_info: np.ndarray | list[np.ndarray] | None = None,
    soc: str = "Ascend910_93",
) -> list[DispatchResult]:
    """Reference MoeDistributeDispatchV5 over all ranks (SPEC §4; A3 by default, ``soc="Ascend950"``).

    ``x[r]`` is rank r's (BS_r, H) fp16/bf16 tokens and ``expert_ids[r]`` its (BS_r, K) int ids.

    * Placement (§4.1): MoE expert e → rank ``e // L + R``, local expert ``e % L``; shared expert s
      of sender src → rank ``src % P + s*P`` with ``P = R/S``; ids ≥ E (zero/copy/const) are never sent.
    * Pairs (§4.2): valid (t, k) pairs with id < E in flattened order; every valid token once per
      shared expert (slot ``K + s``).  1-D mask: only ``sum(mask)`` matters; 2-D mask: per pair.
    * Receiver order (§4.4): slot ``j*W + src`` (MoE rank) or ``src`` (shared rank), ascending;
      within a slot, the sender's ascending flattened ``t*K + k``.
    * quant_mode 2 (§4.6): per-row dynamic int8 with the SENDER's smooth scales (row ``s`` for shared
      expert s, ``e + S`` for MoE expert e); all-zero row → scale 0, values 0 (§0).
    * comm_alg "", "fullmesh_v1", "fullmesh_v2" give identical outputs (§0).

    Ascend950 (module docstring, choices 1–7, 10): quant modes 1, 3, 4, 5 and fp8 mode 2 with
    ``y_dtype``; quant 0 with a low-precision x (``x_dtype`` for uint8 arrays) and per-token
    ``scales`` forwarded as dynamic_scales; ``elastic_info``.

    ``scales`` is one float32 array for every rank or a list of one per rank (per-token scales of a
    low-precision x: a list).  ``expert_scales`` is a list of (BS_r, K) float32 arrays; an array with
    a zero dim counts as absent.  Returns one :class:`DispatchResult` per rank.
    """
    _check_soc(soc)
    is950 = soc == SOC_950
    x = list(x)
    expert_ids = [np.asarray(a) for a in expert_ids]
    xs = [np.asarray(a) for a in x]
    if not xs:
        raise ValueError("x: need at least one rank")
    # --- x's format (§3.1; 950: §4.6 low-precision inputs) ---
    x_fmt, packed = _x_format(xs, x_dtype, soc)
    shapes = [(a.shape[0], a.shape[1] * 2) if packed and a.ndim == 2 else a.shape for a in xs]
    cfg = _make_cfg(shapes, expert_ids, moe_expert_num=moe_expert_num,
                    shared_expert_num=shared_expert_num, shared_expert_rank_num=shared_expert_rank_num,
                    global_bs=global_bs, comm_alg=comm_alg, zero_expert_num=zero_expert_num,
                    copy_expert_num=copy_expert_num, const_expert_num=const_expert_num, x_name="x")
    dt = xs[0].dtype
    if not is950 and quant_mode not in (0, 2):
        raise ValueError(f"quant_mode: must be 0 or 2 on Ascend910_93 (got {quant_mode})")
    if quant_mode not in range(6):
        raise ValueError(f"quant_mode: must be in [0, 5] on Ascend950 (got {quant_mode})")
    if expert_token_nums_type not in (0, 1):
        raise ValueError(f"expert_token_nums_type: must be 0 or 1 (got {expert_token_nums_type})")
    low_x = x_fmt in _LOW_PRECISION_X
    if low_x and quant_mode != 0:
        raise ValueError(f"x: a {x_fmt} input needs quant_mode 0 (got {quant_mode}; SPEC §4.6)")
    y_fmt = _y_format(y_dtype, quant_mode, x_fmt, soc)
    if y_fmt in _FP4 and cfg.h % 2:
        raise ValueError(f"x: H must be even for a packed fp4 output (got H={cfg.h}; SPEC §0)")
    w, k, h, e_num, s_num = cfg.w, cfg.k, cfg.h, cfg.e, cfg.s
    elastic, table = _elastic_table(elastic_info, w, cfg.r, e_num, soc)

    # scales: smooth (quant 2/3, §4.6 step 2), static (quant 1), per-token (quant 0, low-precision x)
    scale_rows: Any = None  # per rank: (E[+S], H) rows indexed by srow
    static_row: Any = None  # per rank: (1, 1) or (1, H) broadcast row
    token_scales: Any = None  # per rank: (BS, dim1) forwarded rows
    if scales is not None:
        if quant_mode == 0 and not low_x:
            raise ValueError("scales: must be absent when quant_mode is 0 (SPEC §3.2)")
        if quant_mode in (4, 5):
            raise ValueError(f"scales: must be absent for MX quant_mode {quant_mode} (SPEC §3.2)")
        want = (e_num + s_num, h) if cfg.r else (e_num, h)
        if quant_mode == 0:
            if isinstance(scales, np.ndarray):
                raise ValueError("scales: per-token scales of a low-precision x need one array per rank")
            token_scales = _token_scales(scales, cfg, x_fmt)
        elif quant_mode == 1:
            per = [np.asarray(a) for a in _per_rank("scales", scales, w)]
            allowed = [(1,)] if y_fmt == _FMT_HIF8 else [(1,), (h,), want]
            for rank, sa in enumerate(per):
                if sa.dtype != F32 or sa.shape not in allowed:
                    raise ValueError(f"scales[{rank}]: quant_mode 1 with {y_fmt} output needs float32 of shape "
                                     f"{' or '.join(map(str, allowed))} (got {sa.dtype} {sa.shape}; SPEC §4.6)")
            if per[0].shape == want and tuple(want) not in [(1,), (h,)]:
                scale_rows = per
            else:
                static_row = [sa.reshape(1, -1) for sa in per]
        else:
            per = _per_rank("scales", scales, w)
            scale_rows = []
            for rank, sa in enumerate(per):
                sa = np.asarray(sa)
                if sa.dtype != F32 or sa.shape != want:
                    raise ValueError(f"scales[{rank}]: must be float32 of shape {want} (got {sa.dtype} {sa.shape})")
                scale_rows.append(sa)
    elif quant_mode == 1:
        raise ValueError("scales: quant_mode 1 (static) needs scales (SPEC §3.2)")
    elif quant_mode == 0 and low_x:
        raise ValueError(f"scales: a {x_fmt} x needs per-token scales (BS, dim1 <= H) (SPEC §4.6)")

    # expert_scales presence (§3.1): present iff non-null and no dim is 0; all ranks alike
    weights = None
    if expert_scales is not None:
        es = [None if a is None else np.asarray(a) for a in _per_rank("expert_scales", expert_scales, w)]
        present = [a is not None and a.size > 0 for a in es]
        if any(present) and not all(present):
            raise ValueError("expert_scales: given on some ranks but absent/empty on others")
        if all(present):
            for rank, a in enumerate(es):
                assert a is not None  # all present
                if a.dtype != F32 or a.shape != (cfg.bss[rank], k):
                    raise ValueError(
                        f"expert_scales[{rank}]: must be float32 (BS, K) = ({cfg.bss[rank]}, {k}) "
                        f"(got {a.dtype} {a.shape})"
                    )
            weights = es

    masks = _masks(cfg, x_active_mask)

    # --- build every transmitted row as a record (§4.2, §4.3); destinations are logical ranks ---
    rec_src, rec_t, rec_k, rec_dest, rec_slot, rec_order, rec_srow = ([] for _ in range(7))
    src: Any  # a rank number here, an array of ranks further down
    t: Any
    for src in range(w):
        ids = expert_ids[src].astype(np.int64)
        tok_valid, pair_valid = masks[src]
        _check_ids(cfg, src, ids, pair_valid)
        moe = pair_valid & (ids < e_num)
        tt, kk = np.nonzero(moe)  # row-major → ascending flattened t*K + k
        ee = ids[tt, kk]
        rec_src.append(np.full(tt.size, src, np.int64))
        rec_t.append(tt)
        rec_k.append(kk)
        rec_dest.append(cfg.dest_of_moe(ee))
        rec_slot.append((ee % cfg.l) * w + src)
        rec_order.append(tt * k + kk)
        rec_srow.append(ee + s_num)
        if cfg.r:
            vt = np.nonzero(tok_valid)[0]
            for s in range(s_num):
                rec_src.append(np.full(vt.size, src, np.int64))
                rec_t.append(vt)
                rec_k.append(np.full(vt.size, k + s, np.int64))
                rec_dest.append(np.full(vt.size, cfg.dest_of_shared(src, s), np.int64))
                rec_slot.append(np.full(vt.size, src, np.int64))
                rec_order.append(vt)
                rec_srow.append(np.full(vt.size, s, np.int64))

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64)

    a_src, a_t, a_k, a_dest = cat(rec_src), cat(rec_t), cat(rec_k), cat(rec_dest)
    a_slot, a_order, a_srow = cat(rec_slot), cat(rec_order), cat(rec_srow)

    def gather(per_rank: list[np.ndarray], src: np.ndarray, idx: np.ndarray, width: int, dtype: Any) -> np.ndarray:
        out = np.empty((src.size, width), dtype)
        for sr in np.unique(src):
            m = src == sr
            out[m] = per_rank[sr][idx[m]]
        return out

    results: list[DispatchResult | None] = [None] * w
    for dest in range(w):  # logical rank; served by physical rank table[dest] (§4.7)
        shared_rank = dest < cfg.r
        n_slots = w if shared_rank else cfg.l * w
        sel = np.nonzero(a_dest == dest)[0]
        sel = sel[np.lexsort((a_order[sel], a_slot[sel]))]  # slot ascending, then sender order
        src, t, kk, srow = a_src[sel], a_t[sel], a_k[sel], a_srow[sel]
        n = int(sel.size)
        cnt = np.bincount(a_slot[sel], minlength=n_slots)
        cap = rows_capacity(w, dest, e_num, shared_expert_num, cfg.r, cfg.g, cfg.bss[0], k, elastic=elastic)
        if n > cap:
            raise ValueError(
                f"rank {dest}: receives {n} rows, more than its capacity A={cap} (SPEC §2; duplicate "
                "expert ids in a row?)"
            )
        ep_recv = np.cumsum(cnt).astype(np.int32)
        if shared_rank:
            etn = np.array([n], np.int64)
        else:
            per_expert = cnt.reshape(cfg.l, w).sum(axis=1).astype(np.int64)
            etn = per_expert if expert_token_nums_type == 1 else np.cumsum(per_expert).astype(np.int64)
        assist = np.stack([src, t, kk], axis=1).reshape(-1).astype(np.int32)

        rows = gather(xs, src, t, xs[0].shape[1], dt)
        dyn = None
        if quant_mode == 0:
            expand_x = rows
            if token_scales is not None:
                dyn = gather(token_scales, src, t, token_scales[0].shape[1], token_scales[0].dtype)
        else:
            xf = rows.astype(F32)
            if quant_mode in (2, 3) and scale_rows is not None:
                xf = xf * gather(scale_rows, src, srow, h, F32)  # float32 multiply (smoothing)
            if quant_mode == 1:
                sc = gather(scale_rows, src, srow, h, F32) if scale_rows is not None else (
                    gather(static_row, src, np.zeros_like(src), static_row[0].shape[1], F32))
                expand_x = quantize_static(xf, sc, y_fmt)
            elif quant_mode == 2 and y_fmt == _FMT_INT8:
                expand_x, dyn = quantize_per_token_int8(xf)  # the A3 path
            elif quant_mode == 2:
                expand_x, dyn = quantize_per_token(xf, y_fmt)
            elif quant_mode == 3:
                expand_x, dyn = quantize_per_group(xf, y_fmt)
            else:
                expand_x, dyn = quantize_mx(rows, y_fmt, clip=quant_mode == 5)
        exp_scales = None
        if weights is not None and not shared_rank:
            exp_scales = np.empty(n, F32)
            for sr in np.unique(src):
                m = src == sr
                exp_scales[m] = weights[sr][t[m], kk[m]]
        results[int(table[dest])] = DispatchResult(
            expand_x=expand_x, dynamic_scales=dyn, assist_info_for_combine=assist,
            expert_token_nums=etn, ep_recv_counts=ep_recv, expand_scales=exp_scales, num_rows=n,
            capacity=cap, local_expert_num=1 if shared_rank else cfg.l, y_dtype=y_fmt,
            logical_rank=dest,
        )
    return results  # type: ignore[return-value]


def _x_format(xs: list[np.ndarray], x_dtype: Any, soc: str) -> tuple[str, bool]:
    """(format name of x, packed fp4?) — fp16/bf16 on A3; the 950 adds hif8/fp8/fp4 (SPEC §3.1, §4.6)."""
    dt = xs[0].dtype
    for rank, a in enumerate(xs):
        if a.dtype != dt:
            raise ValueError(f"x[{rank}]: dtype differs across ranks ({a.dtype} vs {dt})")
        if a.ndim != 2:
            raise ValueError(f"x[{rank}]: must be 2-D (got shape {a.shape})")
    declared = None if x_dtype is None else format_name(x_dtype)
    if soc != SOC_950:
        if declared is not None and declared not in (_FMT_F16, _FMT_BF16):
            raise ValueError(f"x_dtype: {declared} inputs need Ascend950 (Ascend910_93 takes float16/bfloat16)")
        _row_dtype("x[0]", xs[0])
        fmt = _NP_TO_FMT[dt]
        if declared is not None and declared != fmt:
            raise ValueError(f"x_dtype: {declared} does not match x's dtype {dt}")
        return fmt, False
    if dt == np.uint8:
        if declared is None or declared not in _LOW_PRECISION_X:
            raise ValueError("x_dtype: a uint8 x needs x_dtype hifloat8 / float8_* / float4_* (SPEC §0)")
        return declared, declared in _FP4
    fmt950 = _NP_TO_FMT.get(dt)
    if fmt950 is None or fmt950 == _FMT_INT8 or fmt950 == _FMT_E2M1:
        raise ValueError(f"x: dtype {dt} is not a dispatch input on Ascend950 (fp4 x is packed uint8 with x_dtype)")
    if declared is not None and declared != fmt950:
        raise ValueError(f"x_dtype: {declared} does not match x's dtype {dt}")
    return fmt950, False


def _y_format(y_dtype: Any, quant_mode: int, x_fmt: str, soc: str) -> str:
    """expand_x's format: x's for quant 0, int8 otherwise, y_dtype overriding (SPEC §10.4, §4.6)."""
    default = x_fmt if quant_mode == 0 else _FMT_INT8
    fmt = default if y_dtype is None else format_name(y_dtype)
    if soc != SOC_950:
        if fmt != default:
            raise ValueError(f"y_dtype: {fmt} output needs Ascend950 (quant_mode {quant_mode} on Ascend910_93 "
                             f"outputs {default})")
        return fmt
    allowed = {0: (x_fmt,), 1: (_FMT_INT8, _FMT_HIF8), 2: (_FMT_INT8,) + _FP8, 3: _FP8, 4: _FP8 + _FP4,
               5: _FP8}[quant_mode]
    if fmt not in allowed:
        raise ValueError(f"y_dtype: quant_mode {quant_mode} outputs {' / '.join(allowed)} (got {fmt}; SPEC §4.6)")
    return fmt


def _token_scales(scales: Any, cfg: _Cfg, x_fmt: str) -> list[np.ndarray]:
    """Per-token scales of a low-precision x: (BS_r, dim1), float32 or e8m0 bytes, with 1 <= dim1 <= H
    and one row fitting in the token's window row after its x bytes (module docstring choice 7)."""
    per = [np.asarray(a) for a in _per_rank("scales", scales, cfg.w)]
    ok_dt = (np.dtype(F32), np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e8m0fnu))
    d0 = per[0].dtype
    dim1 = per[0].shape[1] if per[0].ndim == 2 else -1
    for rank, a in enumerate(per):
        if a.ndim != 2 or a.shape[0] != cfg.bss[rank] or not 1 <= a.shape[1] <= cfg.h or a.dtype not in ok_dt:
            raise ValueError(f"scales[{rank}]: must be float32 or e8m0 (BS, dim1) with 1 <= dim1 <= H = {cfg.h} "
                             f"and BS = {cfg.bss[rank]} (got {a.dtype} {a.shape})")
        if a.dtype != d0 or a.shape[1] != dim1:
            raise ValueError(f"scales[{rank}]: dtype/dim1 differ across ranks")
    x_bytes = cfg.h // 2 if x_fmt in _FP4 else cfg.h
    room = _align(2 * cfg.h, 32) - x_bytes
    if dim1 * d0.itemsize > room:
        raise ValueError(f"scales: one row of per-token scales must fit in the token's window row: dim1 * "
                         f"{d0.itemsize} bytes <= align(2H, 32) - {x_bytes} bytes of x = {room} (got dim1 {dim1})")
    return per


# ---------------------------------------------------------------------------------------------------
# Combine (SPEC §6)
# ---------------------------------------------------------------------------------------------------


def combine(
    expand_x: list[np.ndarray],
    expert_ids: list[np.ndarray],
    assist_info_for_combine: list[np.ndarray],
    ep_send_counts: list[np.ndarray],
    *,
    moe_expert_num: int,
    expert_scales: list[np.ndarray] | None = None,
    x_active_mask: list[np.ndarray] | None = None,
    shared_expert_x: list[np.ndarray] | None = None,
    ori_x: list[np.ndarray] | None = None,
    const_expert_alpha_1: np.ndarray | list[np.ndarray] | None = None,
    const_expert_alpha_2: np.ndarray | list[np.ndarray] | None = None,
    const_expert_v: np.ndarray | list[np.ndarray] | None = None,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    global_bs: int = 0,
    comm_quant_mode: int = 0,
    comm_alg: str = "",
    zero_expert_num: int = 0,
    copy_expert_num: int = 0,
    const_expert_num: int = 0,
    elastic_info: np.ndarray | list[np.ndarray] | None = None,
    soc: str = "Ascend910_93",
) -> list[CombineResult]:
    """Reference MoeDistributeCombineV5 over all ranks (SPEC §6; A3 by default, ``soc="Ascend950"``).

    Send (§6.1): rank e sends ``expand_x[e][i]`` for ``i < N`` (``N`` = last prefix count of
    ``ep_send_counts[e]``) to rank ``src`` slot ``t*(K+S) + k`` from the triple in assist_info;
    with comm_quant_mode 2 the row travels int8-quantised (§6.3).

    Reduce (§6.2), per processed token, fp32 ``acc = 0`` then in order:
    k = 0..K-1 (pairs with a false 2-D mask flag skipped): MoE row, zero expert (nothing), copy
    expert (ori_x), const expert (§0 rule) — each ``× w`` when expert_scales is non-empty, one rounded
    multiply then one rounded add; then the S shared rows unweighted; then shared_expert_x; finally
    ``x_out = cast(acc)`` with round-half-to-even.  Unprocessed rows are zero and ``written`` False.

    Arrays of the const-expert parameters may be given once for all ranks or one per rank.

    Ascend950 (module docstring, choices 8–10): comm_quant_mode 3 (MXFP8 e5m2) and 4 (MXFP8
    e4m3fn); ``elastic_info`` tells each physical rank's role (shared / MoE) when it re-maps ranks.
    """
    _check_soc(soc)
    ex = [np.asarray(a) for a in expand_x]
    expert_ids = [np.asarray(a) for a in expert_ids]
    w = len(ex)
    if len(expert_ids) != w:
        raise ValueError(f"expert_ids: expected {w} arrays (one per rank), got {len(expert_ids)}")
    for name, lst in (("assist_info_for_combine", assist_info_for_combine), ("ep_send_counts", ep_send_counts)):
        if len(lst) != w:
            raise ValueError(f"{name}: expected {w} arrays (one per rank), got {len(lst)}")
    dt = _row_dtype("expand_x[0]", ex[0], soc)
    h: Any = None
    for rank, a in enumerate(ex):
        if a.dtype != dt:
            raise ValueError(f"expand_x[{rank}]: dtype differs across ranks ({a.dtype} vs {dt})")
        if a.ndim != 2:
            raise ValueError(f"expand_x[{rank}]: must be 2-D (got shape {a.shape})")
        if h is None:
            h = a.shape[1]
        elif a.shape[1] != h:
            raise ValueError(f"expand_x[{rank}]: H differs across ranks ({a.shape[1]} vs {h})")
    # the token shapes come from expert_ids (BS_r, K); H from expand_x
    cfg = _make_cfg([(ids.shape[0] if ids.ndim == 2 else -1, h) for ids in expert_ids], expert_ids,
                    moe_expert_num=moe_expert_num, shared_expert_num=shared_expert_num,
                    shared_expert_rank_num=shared_expert_rank_num, global_bs=global_bs, comm_alg=comm_alg,
                    zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
                    const_expert_num=const_expert_num, x_name="expert_ids")
    if comm_quant_mode not in ((0, 2, 3, 4) if soc == SOC_950 else (0, 2)):
        allowed = "0, 2, 3 or 4" if soc == SOC_950 else "0 or 2"
        raise ValueError(f"comm_quant_mode: must be {allowed} on {soc} (got {comm_quant_mode})")
    _, table = _elastic_table(elastic_info, cfg.w, cfg.r, cfg.e, soc)
    logical_of = np.argsort(table)  # physical rank → the logical rank it serves (§4.7)
    k, s_num, e_num = cfg.k, cfg.s, cfg.e
    ks = k + s_num

    # --- optional inputs ---
    weights: list[np.ndarray | None] = [None] * w
    if expert_scales is not None:
        for rank, a in enumerate(_per_rank("expert_scales", expert_scales, w)):
            if a is None:
                continue
            a = np.asarray(a)
            if a.size == 0:
                continue  # empty → unweighted (§5)
            if a.dtype != F32 or a.shape != (cfg.bss[rank], k):
                raise ValueError(
                    f"expert_scales[{rank}]: must be float32 (BS, K) = ({cfg.bss[rank]}, {k}) or empty "
                    f"(got {a.dtype} {a.shape})"
                )
            weights[rank] = a
    sx_list: list[Any] = [None] * w
    if shared_expert_x is not None:
        if cfg.r:
            raise ValueError("shared_expert_x: only allowed when shared_expert_rank_num == 0 (SPEC §5)")
        for rank, a in enumerate(_per_rank("shared_expert_x", shared_expert_x, w)):
            a = np.asarray(a)
            bs = cfg.bss[rank]
            if a.ndim == 3 and a.shape[0] * a.shape[1] == bs and a.shape[2] == h:
                a = a.reshape(bs, h)
            if a.dtype != dt or a.shape != (bs, h):
                raise ValueError(
                    f"shared_expert_x[{rank}]: must be {dt} of shape ({bs}, {h}) or 3-D with dim0*dim1 == BS "
                    f"(got {a.dtype} {a.shape})"
                )
            sx_list[rank] = a
    ori_list: list[Any] = [None] * w
    if cfg.c or cfg.q:
        if ori_x is None:
            raise ValueError("ori_x: required when copy_expert_num > 0 or const_expert_num > 0 (SPEC §5)")
        for rank, a in enumerate(_per_rank("ori_x", ori_x, w)):
            a = np.asarray(a)
            if a.dtype != dt or a.shape != (cfg.bss[rank], h):
                raise ValueError(f"ori_x[{rank}]: must be {dt} of shape ({cfg.bss[rank]}, {h}) (got {a.dtype} {a.shape})")
            ori_list[rank] = a
    const_lists = []
    if cfg.q:
        for name, val in (("const_expert_alpha_1", const_expert_alpha_1),
                          ("const_expert_alpha_2", const_expert_alpha_2), ("const_expert_v", const_expert_v)):
            if val is None:
                raise ValueError(f"{name}: required when const_expert_num > 0 (SPEC §5)")
            per = [np.asarray(a) for a in _per_rank(name, val, w)]
            for rank, a in enumerate(per):
                if a.dtype != dt or a.shape != (cfg.q, h):
                    raise ValueError(f"{name}[{rank}]: must be {dt} of shape (Q, H) = ({cfg.q}, {h}) (got {a.dtype} {a.shape})")
            const_lists.append(per)

    # --- send phase (§6.1): transmitted fp32 values and the slot each lands in ---
    vals = []
    slot_row = [np.full((bs, ks), -1, np.int64) for bs in cfg.bss]
    base = 0
    for e_rank in range(w):
        shared_rank = logical_of[e_rank] < cfg.r
        cnts = np.asarray(ep_send_counts[e_rank]).reshape(-1)
        need = w if shared_rank else cfg.l * w
        if cnts.size < need:
            raise ValueError(f"ep_send_counts[{e_rank}]: needs >= {need} elements (got {cnts.size})")
        n = int(cnts[need - 1])
        if n < 0 or n > ex[e_rank].shape[0]:
            raise ValueError(f"ep_send_counts[{e_rank}]: row count {n} outside [0, expand_x rows {ex[e_rank].shape[0]}]")
        info = np.asarray(assist_info_for_combine[e_rank]).reshape(-1)
        if info.size < 3 * n:
            raise ValueError(f"assist_info_for_combine[{e_rank}]: needs >= {3 * n} entries (got {info.size})")
        trip = info[: 3 * n].astype(np.int64).reshape(n, 3)
        rows = ex[e_rank][:n]
        if comm_quant_mode == 2:
            vals.append(comm_quant_int8_round_trip(rows))  # same values on A3 and 950 (choice 9)
        elif comm_quant_mode in (3, 4):
            vals.append(comm_quant_mx_round_trip(rows, comm_quant_mode))
        else:
            vals.append(rows.astype(F32))
        kk: Any  # an array here, a slot number further down
        src, t, kk = trip[:, 0], trip[:, 1], trip[:, 2]
        bs_of = np.array(cfg.bss, np.int64)
        ok = (src >= 0) & (src < w) & (kk >= 0) & (kk < ks) & (t >= 0)
        ok[ok] &= t[ok] < bs_of[src[ok]]
        if not ok.all():
            i = int(np.argmin(ok))
            raise ValueError(
                f"assist_info_for_combine[{e_rank}]: row {i} triple {tuple(int(v) for v in trip[i])} out of range"
            )
        for sr in np.unique(src):
            m = np.nonzero(src == sr)[0]
            dst = slot_row[sr]
            flat = t[m] * ks + kk[m]
            if np.unique(flat).size != flat.size or (dst.reshape(-1)[flat] >= 0).any():
                raise ValueError(f"assist_info_for_combine[{e_rank}]: a slot of rank {sr} is received twice")
            dst.reshape(-1)[flat] = base + m
        base += n
    all_vals = np.concatenate(vals, axis=0) if vals else np.zeros((0, h), F32)

    masks = _masks(cfg, x_active_mask)
    out = []
    for rank in range(w):
        bs = cfg.bss[rank]
        ids = expert_ids[rank].astype(np.int64)
        tok_valid, pair_valid = masks[rank]
        _check_ids(cfg, rank, ids, pair_valid & tok_valid[:, None])
        proc = np.nonzero(tok_valid)[0]
        acc = np.zeros((proc.size, h), F32)
        wt = weights[rank]
        ori_f: Any = ori_list[rank][proc].astype(F32) if ori_list[rank] is not None else None
        sr = slot_row[rank]
        for kk in range(k):
            idk = ids[proc, kk]
            use = pair_valid[proc, kk]
            is_moe = use & (idk < e_num)
            is_copy = use & (idk >= e_num + cfg.z) & (idk < e_num + cfg.z + cfg.c)
            is_const = use & (idk >= e_num + cfg.z + cfg.c)
            if not (is_moe.any() or is_copy.any() or is_const.any()):
                continue
            v = np.zeros((proc.size, h), F32)
            if is_moe.any():
                rr = sr[proc[is_moe], kk]
                if (rr < 0).any():
                    t_bad = int(proc[is_moe][np.argmax(rr < 0)])
                    raise ValueError(f"rank {rank}: no row was received for token {t_bad}, k {kk} (MoE expert)")
                v[is_moe] = all_vals[rr]
            if is_copy.any():
                v[is_copy] = ori_f[is_copy]
            if is_const.any():
                v[is_const] = _const_expert_rows(
                    ori_f[is_const], idk[is_const] - (e_num + cfg.z + cfg.c),
                    const_lists[0][rank], const_lists[1][rank], const_lists[2][rank],
                )
            contrib = is_moe | is_copy | is_const
            if wt is not None:
                term = v * wt[proc, kk][:, None]  # float32 multiply, rounded
            else:
                term = v
            # adding +0.0 to an accumulator that starts at +0.0 is the identity (acc is never -0.0),
            # so selecting zero for skipped tokens equals skipping them
            term = np.where(contrib[:, None], term, F32(0)).astype(F32)
            acc = acc + term  # float32 add, rounded
        for s in range(s_num):
            rr = sr[proc, k + s]
            if (rr < 0).any():
                t_bad = int(proc[np.argmax(rr < 0)])
                raise ValueError(f"rank {rank}: no shared-expert row was received for token {t_bad}, slot {k + s}")
            acc = acc + all_vals[rr]  # unweighted (§6.2 step 2)
        if sx_list[rank] is not None:
            acc = acc + sx_list[rank][proc].astype(F32)  # §6.2 step 3
        x_out = np.zeros((bs, h), dt)
        x_out[proc] = acc.astype(dt)  # RNE cast (§6.2 step 4)
        out.append(CombineResult(x_out=x_out, written=tok_valid.copy()))
    return out


def _const_expert_rows(ori_f: np.ndarray, c: np.ndarray, alpha1: np.ndarray, alpha2: np.ndarray,
                       const_v: np.ndarray) -> np.ndarray:
    """Const-expert value rows (SPEC §6.2 and the §0 "const experts" rule).

    ``a1 = sum_h float32(alpha_1[c,h]) * float32(ori_x[t,h])`` in ascending h with one rounding per
    product and per addition (``np.cumsum(..., dtype=float32)[-1]``), ``a2`` likewise; the two-way
    softmax in float64 from those float32 values; ``p1``, ``p2`` rounded to float32; then
    ``v = p1*ori_x + p2*const_v`` in float32 (two rounded multiplies, one rounded add).
    """
    a1f = alpha1.astype(F32)[c]
    a2f = alpha2.astype(F32)[c]
    cvf = const_v.astype(F32)[c]
    d1 = np.cumsum(a1f * ori_f, axis=1, dtype=F32)[:, -1]
    d2 = np.cumsum(a2f * ori_f, axis=1, dtype=F32)[:, -1]
    # two-way softmax in float64 (Python floats are IEEE doubles); math.exp is the C library's exp,
    # the same function a C++ implementation calls, whereas numpy's SIMD exp may differ by an ulp
    p1 = np.empty(d1.size, F32)
    p2 = np.empty(d1.size, F32)
    for i, (v1, v2) in enumerate(zip(d1.tolist(), d2.tolist())):
        m = max(v1, v2)
        e1 = math.exp(v1 - m)
        e2 = math.exp(v2 - m)
        den = e1 + e2
        p1[i] = e1 / den  # rounded to float32 on assignment (RNE)
        p2[i] = e2 / den
    result: np.ndarray = (p1[:, None] * ori_f) + (p2[:, None] * cvf)  # float32 throughout
    return result


# ---------------------------------------------------------------------------------------------------
# Round trip
# ---------------------------------------------------------------------------------------------------

_DISPATCH_ONLY = {"scales", "quant_mode", "expert_token_nums_type", "y_dtype", "x_dtype"}
_COMBINE_ONLY = {"shared_expert_x", "ori_x", "const_expert_alpha_1", "const_expert_alpha_2",
                 "const_expert_v", "comm_quant_mode"}
_COMMON = {"moe_expert_num", "x_active_mask", "expert_scales", "shared_expert_num",
           "shared_expert_rank_num", "global_bs", "comm_alg", "zero_expert_num", "copy_expert_num",
           "const_expert_num", "elastic_info", "soc"}


def round_trip(
    x: list[np.ndarray],
    expert_ids: list[np.ndarray],
    expert_fn: Callable[[int, DispatchResult], np.ndarray],
    **kw: Any,
) -> tuple[list[DispatchResult], list[CombineResult]]:
    """Dispatch → ``expert_fn(rank, dispatch_result)`` per rank → combine, with the same options.

    ``expert_fn`` returns that rank's expert output rows, (N, H) (or more rows) in x's dtype.
    Options of either operator may be given; each is routed to the operator(s) that take it.
    ``expert_scales`` serves as dispatch's expert_scales and combine's weights.  When copy or const
    experts exist and ``ori_x`` is not given, ``ori_x`` defaults to ``x``.
    """
    unknown = set(kw) - _DISPATCH_ONLY - _COMBINE_ONLY - _COMMON
    if unknown:
        raise TypeError(f"round_trip: unknown option(s) {sorted(unknown)}")
    dkw = {n: v for n, v in kw.items() if n in _DISPATCH_ONLY | _COMMON}
    ckw = {n: v for n, v in kw.items() if n in _COMBINE_ONLY | _COMMON}
    if (kw.get("copy_expert_num", 0) or kw.get("const_expert_num", 0)) and ckw.get("ori_x") is None:
        ckw["ori_x"] = list(x)
    disp = dispatch(x, expert_ids, **dkw)
    outs = []
    for rank, d in enumerate(disp):
        y = np.asarray(expert_fn(rank, d))
        if y.ndim != 2 or y.shape[0] < d.num_rows:
            raise ValueError(f"expert_fn: rank {rank} returned shape {y.shape}, need ({d.num_rows}, H)")
        outs.append(y)
    comb = combine(outs, expert_ids, [d.assist_info_for_combine for d in disp],
                   [d.ep_recv_counts for d in disp], **ckw)
    return disp, comb


# ---------------------------------------------------------------------------------------------------
# Buffer sizing (SPEC §9)
# ---------------------------------------------------------------------------------------------------


def _align(v: int, b: int) -> int:
    return -(-v // b) * b


def _token_sizes(hidden: int, comm_alg: str) -> tuple[int, int]:
    """(Td, Tc) of SPEC §9.2: per-token dispatch and combine window bytes."""
    tal = _align(hidden * 2, 32) + 44
    td = -(-tal // 480) * 512 if comm_alg == "fullmesh_v2" else _align(tal, 512)
    tc = _align(hidden * 2, 512)
    return td, tc


def ccl_buffer_size_mb(
    world_size: int,
    num_max_dispatch_tokens_per_rank: int,
    hidden: int,
    num_moe_expert: int,
    topk: int,
    num_shared_expert: int = 0,
    num_shared_expert_ranks: int = 0,
    comm_alg: str = "",
) -> int:
    """``get_low_latency_ccl_buffer_size`` (SPEC §9.2): the HCCL_BUFFSIZE value (MiB) to set.

    Range checks raise ValueError naming the argument and the rule.  Formula::

        tal = align(hidden*2, 32) + 44
        Td  = fullmesh_v2 ? ceil(tal/480)*512 : align(tal, 512)
        Tc  = align(hidden*2, 512)
        min = 2*(tokens*Td*W*L + tokens*Tc*(topk + num_shared_expert)) + 1 MiB
        ret = align(ceil(min / 1 MiB), 2) / 2

    with ``L = num_moe_expert // (W - num_shared_expert_ranks)``.
    """
    w, tokens = int(world_size), int(num_max_dispatch_tokens_per_rank)

    def rng(name: str, v: int, lo: int, hi: int) -> None:
        if not lo <= v <= hi:
            raise ValueError(f"{name}: must be in [{lo}, {hi}] (got {v})")

    rng("world_size", w, 2, 768)
    rng("hidden", hidden, 1024, 8192)
    rng("num_max_dispatch_tokens_per_rank", tokens, 1, 512)
    rng("num_moe_expert", num_moe_expert, 1, 1024)
    rng("topk", topk, 1, 16)
    rng("num_shared_expert", num_shared_expert, 0, 4)
    if not w - num_shared_expert_ranks > 0:
        raise ValueError(
            f"num_shared_expert_ranks: world_size - num_shared_expert_ranks must be > 0 "
            f"(got {w} - {num_shared_expert_ranks})"
        )
    n_local = num_moe_expert // (w - num_shared_expert_ranks)
    if not 0 < n_local * w <= 2048:
        raise ValueError(
            "num_moe_expert: L * world_size must be in (0, 2048] with L = num_moe_expert // "
            f"(world_size - num_shared_expert_ranks) (got L={n_local}, L*W={n_local * w})"
        )
    if comm_alg not in _COMM_ALGS:
        raise ValueError(f"comm_alg: must be one of {_COMM_ALGS} (got {comm_alg!r})")
    td, tc = _token_sizes(hidden, comm_alg)
    min_bytes = 2 * (tokens * td * w * n_local + tokens * tc * (topk + num_shared_expert)) + _MIB
    return _align(-(-min_bytes // _MIB), 2) // 2


def window_bytes_required(
    ep_world_size: int,
    max_bs: int,
    hidden: int,
    moe_expert_num: int,
    topk: int,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    comm_alg: str = "",
    soc: str = "Ascend910_93",
) -> int:
    """Left-hand side of the kernel-side window check of SPEC §9.3, in bytes::

        2*(maxBs*Td*W*L + maxBs*Tc*(K+S))     (+ W*1024 on Ascend950)

    The operator requires it to be ``<= cclBufferSize - 1 MiB``.  S is the normalised shared expert
    count (SPEC notation) and ``L = E / (W - R)``; Td and Tc as in §9.2 (the code's +44 constant).
    """
    w = int(ep_world_size)
    s = normalized_shared_expert_num(shared_expert_num, shared_expert_rank_num)
    n_local = _moe_local_num(w, moe_expert_num, shared_expert_rank_num)
    if comm_alg not in _COMM_ALGS:
        raise ValueError(f"comm_alg: must be one of {_COMM_ALGS} (got {comm_alg!r})")
    if soc not in ("Ascend910_93", "Ascend950"):
        raise ValueError(f"soc: must be 'Ascend910_93' or 'Ascend950' (got {soc!r})")
    td, tc = _token_sizes(int(hidden), comm_alg)
    need = 2 * (max_bs * td * w * n_local + max_bs * tc * (topk + s))
    if soc == "Ascend950":
        need += w * 1024
    return need
