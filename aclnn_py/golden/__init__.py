"""Independent numpy reference ("golden") of MoeDistributeDispatchV5 / MoeDistributeCombineV5.

Profiles: Ascend910_93 (A3, the default) and Ascend950 (keyword ``soc="Ascend950"``).  The golden
implements the operator semantics of ``docs/operators.md`` on its own: it shares no code with the
C++ mock or the rest of ``aclnn_py`` and imports only numpy, ml_dtypes and the self-contained
``casts`` (low-precision formats, numpy only).  Its modules: ``config`` (notation, derived sizes, per-rank inputs),
``formats``, ``quant`` (quantisation kernels), ``dispatch``, ``combine``, ``roundtrip``, ``sizing``
(buffer sizing, its own copy of the arithmetic) and ``results``.

Every function takes the inputs of *all* ranks (lists indexed by ep rank id) and returns the outputs
of all ranks, exact to the bit:

* :func:`dispatch` — placement, pair selection, payload, receiver order, global_bs, quant modes 0
  and 2 and the all-zero-row rule; on the 950 also quant modes 1, 3, 4, 5, fp8 outputs of mode 2,
  low-precision inputs and elastic_info.
* :func:`combine` — send, the fp32 reduction order, comm quant 2, special experts, the const-expert
  rule; on the 950 also comm quant 3 / 4 (MXFP8) and elastic_info.
* :func:`round_trip` — dispatch → user expert function → combine.
* :func:`dispatch_tp` / :func:`combine_tp` — the group-string generations with a TP domain of two
  ranks: each EP domain's dispatch then :func:`tp_all_gather`; :func:`tp_reduce_scatter` then each
  EP domain's combine (module ``tp``).
* :func:`expand_idx` / :func:`assist_from_expand_idx` — the first generation's routing output and
  how combine reads it (module ``first_generation``).
* :func:`ccl_buffer_size_mb` (``get_low_latency_ccl_buffer_size``) and :func:`window_bytes_required`
  (the kernel-side window check).

Arithmetic conventions (docs/operators.md, "fp32 arithmetic"): every fp32 operation is done in
float32 numpy arithmetic with an explicit order; ``a*b + c`` is always a rounded multiply followed by
a rounded add (numpy never fuses).  Casts to fp16 / bf16 are round-to-nearest-even (numpy /
ml_dtypes ``astype``).  Only the const-expert softmax uses float64.

The golden interprets inputs; it does not re-implement every operator check (that is the mock's
job), but raises :class:`ValueError` for inputs it cannot interpret (inconsistent shapes, E not
divisible by W-R, ids out of range, unsupported modes, a 950 feature on the A3 profile, …).

Ascend 950: choices where the operator's documentation leaves a detail open
---------------------------------------------------------------------------
The C++ mock implements the same list.  Formats and casts are defined in ``casts.py`` (its docstring
gives the bit layouts, rounding, saturation and NaN/inf rules).

Output types ("dtype arguments").  ``y_dtype`` / ``x_dtype`` accept an
``aclnn_py.DataType`` member or its aclDataType int, a numpy / ml_dtypes dtype, or a name
("int8", "hifloat8", "float8_e4m3fn", "float8_e5m2", "float4_e2m1", "float4_e1m2", "float16",
"bfloat16").  expand_x is int8 for int8, an ml_dtypes ``float8_e4m3fn`` / ``float8_e5m2`` array for
fp8, uint8 codes for hifloat8, and uint8 bytes of shape (N, H/2) for fp4 (two codes per byte, element
2i in the low nibble).  dynamic_scales is float32 (N,) for modes 2, float32 (N, ceil(H/128)) for mode
3, uint8 e8m0 bytes (N, align2(ceil(H/32))) for modes 4 / 5, and the forwarded per-token scales
(N, dim1) in their own dtype for quant 0 with a low-precision x.

1. **Mode 1.** ``scales`` is required: float32 (1,), (H,) or (E+S, H) / (E, H) (the
   mode-2 row rule: row s for shared expert s, e + S for MoE expert e); hifloat8 takes only (1,).
   ``y = float32(x) * scale`` (one fp32 multiply).  int8: ``q = rint(y)`` saturated to [-128, 127]
   (the int32 → half → int8 chain, each step saturating).  hifloat8: ``casts.hif8_encode(y)`` —
   ROUND = ties away from zero, **not saturating** (|y| ≥ 40960 → the ±inf code).
   dynamic_scales is not written (None).
2. **Mode 2 fp8.** ``ds = 448f / m`` (e4m3fn) or ``57344f / m`` (e5m2), ``q = fp8_rint(xf*ds)``
   without saturation (irrelevant: |xf*ds| ≤ max·(1+2^-24) never rounds past max), scale ``1f/ds``.
   Smooth scales exactly as on A3.  An all-zero row → scale 0, codes +0.
3. **Mode 3.** Groups of 128 along H, the last one zero-padded (the padding only enters the
   max); per group ``ds = fmax / max|g|``, ``q = fp8_rint(xf*ds)`` without saturation, scale
   ``1/ds``; an all-zero group → scale 0, codes +0.  y_dtype fp8 only; smooth scales as mode 2.
4. **Modes 1–3: non-finite input** (or a product that is NaN) and **a non-zero max so small that
   fmax / max overflows to +inf** are refused (ValueError), as on A3: the operator's documentation leaves them
   undefined and the mock tests avoid them.
5. **Mode 4 (MX).** Block exponent = max of ``casts.float32_exponent_field`` over the 32
   elements (equal to the bf16 field, and to that of fp16 truncated to bf16); e8m0 = 0xFF when the
   field is 255 (inf/nan), ``E - emax`` when ``E > emax``, else 0.  Element = sat-RNE cast of
   ``x * 2^(127 - e8m0)``: for bf16 x the product is rounded to bf16 (``(float32(x) * m).astype(bf16)``),
   for fp16 x it is a float32 multiply.  **A block whose scale is 0xFF has every element code 0**
   (the scale alone makes the block NaN on decode).  The tail block is zero-padded; an odd block
   count gets one padding scale byte 0.  fp4 outputs need H even (ValueError otherwise).
6. **Mode 5 (MX clip).** amax = max|float32(x)| per block (NaN if any NaN); e8m0 from the documented
   steps 2–3 with ``t = max(amax, float32(1e-4)) * (1f / float32(fp8_max))`` (``1/fp8_max`` rounded
   to float32 first); elements exactly as mode 4 (bf16 product in bf16, fp16 in fp32; 0xFF blocks →
   code 0).  fp8 outputs only.
7. **Low-precision inputs ("0 + low-precision input").** quant 0 only; x is an ml_dtypes fp8
   array, or uint8 with ``x_dtype`` hifloat8 / fp8 / fp4; fp4 x is packed uint8 (BS, H/2).  ``scales``
   is required, one (BS_r, dim1) array per rank, float32 or uint8 / float8_e8m0fnu (same dtype and
   dim1 on every rank), 1 ≤ dim1 ≤ H and one row no wider than the room its token's window row has
   after the x bytes: ``dim1 * itemsize <= align(2H, 32) - bytes of one x row`` (H/2 for fp4, H
   otherwise), e.g. dim1 ≤ H/4 for fp8 x with float32 scales; row i of dynamic_scales is the source token's scale row,
   byte for byte (shared-expert copies too).  y_dtype, if given, must equal x's type.  fp16/bf16 x
   with quant 0 still rejects scales.
8. **Comm quant 3 / 4.** 3 = MXFP8 e5m2, 4 = MXFP8 e4m3fn: the sender quantises each
   expand_x row exactly as dispatch mode 4 (block 32, e8m0, sat-RNE, 0xFF blocks → code 0); the
   receiver dequantises ``decode(code) * 2^(e8m0-127)`` in float32 (exact; a 0xFF block gives NaN),
   rounds it to the row dtype (RNE) and back to float32, then weights and accumulates as any row.
9. **950 int8 comm quant ("950 differences").** "rounded to the row dtype, then multiplied by w
   in fp32" is the arithmetic the A3 receiver already performs (steps 1–3), so comm quant 2 gives
   the same values on both profiles; the golden uses one code path.
10. **elastic_info.** One int32 (4+2W,) array (or one per rank, all equal).  Present at all
   (flag set or not): ``A = max(shared formula, MoE formula)`` on every rank, ``L := max(L, 1)``.
   Flag ``[0] != 0``: ``[1], [2], [3]`` must equal W, R, E (the golden models a re-mapping of the
   same world, not a smaller one) and ``[4+W : 4+2W]`` must be a permutation of 0 … W-1: logical
   rank l (whose experts, shared/MoE role and slot layout follow the placement and receive order with rank id l) is served
   by physical rank ``table[l]``.  Senders keep their physical rank id everywhere (assist_info
   triples, slot ``j*W + src``, shared replica ``src % P + s*P`` computed from the physical src, the
   combine's return address).  ``[4 : 4+W]`` is not read.  Combine uses the same table to know each
   physical rank's role (shared / MoE) and so its row count.
11. **A3 refusals.** On ``soc="Ascend910_93"`` quant modes 1, 3, 4, 5, a y_dtype other than the
   default, a non-fp16/bf16 x, comm quant 3 / 4 and a non-None elastic_info raise ValueError naming
   the parameter.  performance_info (timing) is not modelled by the golden.
12. **Atlas A2.** ``soc="Ascend910B"`` applies the A2 limits (world sizes 16 … 256, no shared or
   special experts, 1-D masks, comm quant 2 only with "hierarchy") and gives the A3 outputs for
   comm_alg "", "fullmesh" and "hierarchy" alike: the layouts of assist_info_for_combine and
   ep_recv_counts are opaque on hardware, so the mock keeps one row order.
"""

from __future__ import annotations

from .combine import combine
from .config import (
    SOC_950,
    SOC_A2,
    SOC_A3,
    local_expert_num,
    normalized_shared_expert_num,
    rows_capacity,
)
from .dispatch import dispatch
from .first_generation import assist_from_expand_idx, expand_idx
from .formats import format_name
from .quant import (
    comm_quant_int8_round_trip,
    comm_quant_mx_round_trip,
    dynamic_scales_shape,
    mx_scale_columns,
    quantize_mx,
    quantize_per_group,
    quantize_per_token,
    quantize_per_token_int8,
    quantize_static,
)
from .results import CombineResult, DispatchResult
from .roundtrip import round_trip
from .shrink import combine_shrink, dispatch_shrink, live_ranks
from .sizing import a2_window_bytes_required, ccl_buffer_size_mb, ep_recv_counts_size, window_bytes_required
from .tp import combine_tp, dispatch_tp, tp_all_gather, tp_reduce_scatter

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
    "SOC_A2",
    "a2_window_bytes_required",
    "ep_recv_counts_size",
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
    "tp_all_gather",
    "tp_reduce_scatter",
    "dispatch_tp",
    "combine_tp",
    "expand_idx",
    "assist_from_expand_idx",
    "live_ranks",
    "dispatch_shrink",
    "combine_shrink",
]
