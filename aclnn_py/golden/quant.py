"""The golden's quantisation kernels (docs/operators.md): dispatch's per-token int8 / fp8 (mode 2),
static (mode 1), per-group (mode 3) and MX (modes 4, 5) quantisation, combine's int8 and MXFP8
transports (comm quant 2, 3, 4), and the dynamic_scales layout of each mode. Every fp32 operation is
a rounded float32 numpy operation in the stated order; numpy never fuses a multiply-add."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import casts
from .config import BF16, F32, ROW_DTYPES, SOC_950, SOC_A3, check_soc, row_dtype
from .formats import (
    FMT_E4M3,
    FMT_E5M2,
    FMT_HIF8,
    FMT_INT8,
    FP4,
    FP8,
    as_output,
    format_name,
    fp8_max,
    minifloat,
)


def _finite_or_raise(xf: np.ndarray, what: str) -> None:
    if not np.isfinite(xf).all():
        raise ValueError(f"{what}: non-finite value; its quantisation is undefined")


def _rint_to_int8(y: np.ndarray) -> np.ndarray:
    """``q = rint(y)`` → int32 → half (exact) → int8 (dispatch quant 2 step 6, comm quant 2 step 6)."""
    result: np.ndarray = np.rint(y).astype(np.int32).astype(np.float16).astype(np.int8)
    return result


def quantize_per_token_int8(xf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic per-token int8 quantisation of float32 rows (docs/operators.md quant_mode 2, steps 3–7).

    ``xf`` is (n, H) float32, already smoothed if smooth scales apply.  Returns ``(q int8 (n,H),
    scale float32 (n,))`` with ``ds = 127f / max|xf|``, ``q = int8(half(int32(rint(xf*ds))))``
    and ``scale = 1f / ds``.  A row with ``max|xf| == 0`` gives scale 0.0 and all values 0.
    """
    xf = np.asarray(xf)
    if xf.dtype != F32 or xf.ndim != 2:
        raise ValueError("quantize_per_token_int8: expects a 2-D float32 array")
    if not np.isfinite(xf).all():
        raise ValueError("quant_mode 2: non-finite input row; its quantisation is undefined")
    m = np.max(np.abs(xf), axis=1) if xf.shape[1] else np.zeros(xf.shape[0], F32)
    zero = m == F32(0)
    with np.errstate(divide="ignore"):
        ds = F32(127.0) / m  # float32 / float32 → float32; +inf for an all-zero row
    if np.isinf(ds[~zero]).any():
        raise ValueError(
            "quant_mode 2: a row whose max|x| is so small that 127/max overflows to +inf is not "
            "covered by the documented rules (only an all-zero row is)"
        )
    ds_safe = np.where(zero, F32(0), ds).astype(F32)
    y = xf * ds_safe[:, None]  # float32 multiply
    q = _rint_to_int8(y)
    q[zero] = 0
    with np.errstate(divide="ignore"):
        scale = F32(1.0) / ds  # 1/inf = 0.0 for an all-zero row
    return q, scale.astype(F32)


def comm_quant_int8_round_trip(rows: np.ndarray) -> np.ndarray:
    """comm_quant_mode 2 transport of rows (docs/operators.md, A3 path): returns the float32 values the
    receiver accumulates.

    Sender: blocks of 8 elements (tail zero-padded), ``sc = bm * (1f/127f)`` in fp32, transmitted
    scale ``sc`` cast (RNE) to the row dtype, ``q = int8(rint(half(rint(xf / sc))))`` with the
    unrounded fp32 ``sc``.  Receiver: ``deq = float32(half(q)) * float32(transmitted scale)``,
    rounded to the row dtype, then back to float32.  An all-zero block gives 0.
    """
    rows = np.asarray(rows)
    dt = row_dtype("expand_x", rows)
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


def _rint_to_int8_sat(y: np.ndarray) -> np.ndarray:
    """``rint(y)`` → int32 → half → int8 with every step saturating = clip to [-128, 127]."""
    result: np.ndarray = np.clip(np.rint(y), -128, 127).astype(np.int8)
    return result


def quantize_static(xf: np.ndarray, scale: np.ndarray, y_dtype: Any = "int8") -> np.ndarray:
    """Static quantisation (docs/operators.md quant_mode 1; package docstring choice 1).

    ``xf`` (n, H) float32, ``scale`` broadcastable to it (float32).  int8: saturating
    ``rint(xf*scale)``; hifloat8: ``hif8_encode(xf*scale)`` (ties away, inf on overflow).
    Returns int8 or uint8 HiF8 codes."""
    fmt = format_name(y_dtype)
    _finite_or_raise(np.asarray(xf, F32), "quant_mode 1")
    y = np.asarray(xf, F32) * np.asarray(scale, F32)  # float32 multiply (overflow → ±inf saturates)
    if np.isnan(y).any():
        raise ValueError("quant_mode 1: NaN input or product; its quantisation is undefined")
    if fmt == FMT_INT8:
        return _rint_to_int8_sat(y)
    if fmt == FMT_HIF8:
        return casts.hif8_encode(y)
    raise ValueError(f"y_dtype: quant_mode 1 outputs int8 or hifloat8 (got {fmt})")


def quantize_per_token(xf: np.ndarray, y_dtype: Any = "int8") -> tuple[np.ndarray, np.ndarray]:
    """Dynamic per-token quantisation (docs/operators.md quant_mode 2): int8 (the A3 rule,
    :func:`quantize_per_token_int8`) or fp8 e4m3fn / e5m2 (``ds = fmax/m``, fp8 RNE without
    saturation, scale ``1/ds``; all-zero row → scale 0, codes +0).  Returns (codes, scales (n,))."""
    fmt = format_name(y_dtype)
    if fmt == FMT_INT8:
        return quantize_per_token_int8(xf)
    if fmt not in FP8:
        raise ValueError(f"y_dtype: quant_mode 2 outputs int8, float8_e4m3fn or float8_e5m2 (got {fmt})")
    q, sc = _fp8_dynamic(np.asarray(xf, F32)[:, None, :], fmt, "quant_mode 2")
    return as_output(q[:, 0, :], fmt), sc[:, 0]


def _fp8_dynamic(blk: np.ndarray, fmt: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(n, g, size) float32 (zero-padded) → fp8 codes (n, g, size), scales 1/ds (n, g)."""
    _finite_or_raise(blk, what)
    m = np.max(np.abs(blk), axis=2) if blk.shape[2] else np.zeros(blk.shape[:2], F32)
    zero = m == F32(0)
    with np.errstate(divide="ignore"):
        ds = fp8_max(fmt) / m  # float32 division; +inf for an all-zero row / group
    if np.isinf(ds[~zero]).any():
        raise ValueError(f"{what}: a max|x| so small that fmax/max overflows to +inf is not covered "
                         "by the documented rules (only an all-zero row/group is)")
    ds_safe = np.where(zero, F32(0), ds).astype(F32)
    y = blk * ds_safe[:, :, None]  # float32 multiply
    q = casts.encode(y, minifloat(fmt), saturate=False)
    q[zero] = 0
    with np.errstate(divide="ignore"):
        sc = (F32(1.0) / ds).astype(F32)  # 1/inf = 0 for an all-zero group
    return q, sc


def quantize_per_group(xf: np.ndarray, y_dtype: Any, group: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """Per-group dynamic fp8 quantisation (docs/operators.md quant_mode 3): groups of ``group`` along H, the
    tail zero-padded.  Returns (fp8 array (n, H), float32 scales (n, ceil(H/group)))."""
    fmt = format_name(y_dtype)
    if fmt not in FP8:
        raise ValueError(f"y_dtype: quant_mode 3 outputs float8_e4m3fn or float8_e5m2 (got {fmt})")
    xf = np.asarray(xf, F32)
    n, h = xf.shape
    ng = -(-h // group)
    pad = np.zeros((n, ng * group), F32)
    pad[:, :h] = xf
    q, sc = _fp8_dynamic(pad.reshape(n, ng, group), fmt, "quant_mode 3")
    return as_output(q.reshape(n, ng * group)[:, :h], fmt), sc


def mx_scale_columns(hidden: int) -> int:
    """Columns of the e8m0 scales of MX quantisation: ``align2(ceil(H/32))`` (docs/operators.md mode 4)."""
    nb = -(-int(hidden) // 32)
    return nb + (nb & 1)


def quantize_mx(rows: np.ndarray, y_dtype: Any, *, clip: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """MX quantisation of fp16 / bf16 rows (docs/operators.md quant_mode 4, or 5 with ``clip=True``;
    package docstring choices 5, 6).  Returns (expand_x array, uint8 e8m0 scales (n, align2(ceil(H/32))))
    — expand_x is fp8 (n, H) or packed fp4 uint8 (n, H/2)."""
    fmt = format_name(y_dtype)
    allowed = FP8 if clip else FP8 + FP4
    if fmt not in allowed:
        raise ValueError(f"y_dtype: quant_mode {5 if clip else 4} outputs {' / '.join(allowed)} (got {fmt})")
    codes, e8 = _mx_codes(rows, fmt, clip)
    return as_output(codes, fmt), e8


def _mx_codes(rows: np.ndarray, fmt: str, clip: bool) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(rows)
    dt = rows.dtype
    if dt not in ROW_DTYPES:
        raise ValueError(f"MX quantisation: rows must be float16 or bfloat16 (got {dt})")
    n, h = rows.shape
    if fmt in FP4 and h % 2:
        raise ValueError(f"H: must be even for packed fp4 output (got {h})")
    mf = minifloat(fmt)
    nb = -(-h // 32)
    xf = np.zeros((n, nb * 32), F32)
    xf[:, :h] = rows.astype(F32)
    blk = xf.reshape(n, nb, 32)
    if not clip:
        # mode 4 steps 1-3: largest biased exponent field of the block
        ef = casts.float32_exponent_field(blk).max(axis=2)
        e8 = np.where(ef == 255, 255, np.where(ef > mf.emax, ef - mf.emax, 0))
    else:
        # mode 5 steps 1-3
        with np.errstate(invalid="ignore"):
            amax = np.max(np.abs(blk), axis=2)  # NaN propagates
        bad = ~np.isfinite(amax)
        inv = F32(1.0) / fp8_max(fmt)  # float32-rounded reciprocal
        t = np.maximum(np.where(bad, F32(0), amax), F32(1e-4)).astype(F32) * inv  # float32 multiply
        tb = np.ascontiguousarray(t, F32).view(np.uint32).astype(np.int64)
        ex, mn = (tb >> 23) & 0xFF, tb & 0x7FFFFF
        up = ((ex > 0) & (ex < 254) & (mn > 0)) | ((ex == 0) & (mn > 0x400000))
        e8 = np.where(bad, 255, np.where(amax == 0, 0, ex + up))
    special = e8 == 255
    mult = casts.pow2_float32(127 - np.where(special, 127, e8))  # 2^(127-e8m0); e8m0=254 → 2^-127
    prod = blk * mult[:, :, None]  # float32 multiply (exact but for underflow)
    if dt == BF16:  # bf16 input: the product is a bf16 multiply (docs/operators.md mode 4 step 4)
        prod = prod.astype(BF16).astype(F32)
    codes = casts.encode(prod, mf, saturate=True)
    codes[special] = 0
    scales = np.zeros((n, nb + (nb & 1)), np.uint8)
    scales[:, :nb] = e8
    return codes.reshape(n, nb * 32)[:, :h], scales


def comm_quant_mx_round_trip(rows: np.ndarray, comm_quant_mode: int) -> np.ndarray:
    """comm_quant_mode 3 (MXFP8 e5m2) / 4 (MXFP8 e4m3fn) transport (docs/operators.md "950 differences";
    package docstring choice 8): float32 values the receiver accumulates (before weighting)."""
    rows = np.asarray(rows)
    dt = row_dtype("expand_x", rows, soc=SOC_950)
    fmt = {3: FMT_E5M2, 4: FMT_E4M3}[comm_quant_mode]
    n, h = rows.shape
    codes, e8 = _mx_codes(rows, fmt, clip=False)
    nb = -(-h // 32)
    vals = np.zeros((n, nb * 32), F32)
    vals[:, :h] = casts.decode(codes, minifloat(fmt))
    deq = vals.reshape(n, nb, 32) * casts.e8m0_to_float32(e8[:, :nb])[:, :, None]  # exact; NaN for 0xFF
    result: np.ndarray = deq.reshape(n, nb * 32)[:, :h].astype(dt).astype(F32)
    return result


def dynamic_scales_shape(capacity: int, quant_mode: int, hidden: int, *, soc: str = SOC_A3,
                         scales_dim1: int | None = None) -> tuple[tuple[int, ...], np.dtype] | None:
    """Allocation (shape, dtype) of dynamic_scales, or None for quant 0 with
    fp16/bf16 x (allocated by the wrapper as (A,) float32 but never written) and for quant 1.

    ``scales_dim1`` (with its dtype float32 assumed) applies to quant 0 with a low-precision x."""
    soc = check_soc(soc)
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


__all__ = ["quantize_per_token_int8", "comm_quant_int8_round_trip", "quantize_static", "quantize_per_token",
           "quantize_per_group", "mx_scale_columns", "quantize_mx", "comm_quant_mx_round_trip", "dynamic_scales_shape"]
