"""Low-precision casts used by the Ascend 950 profile (numpy, vectorised, bit exact).

Every encoder takes float32 values (anything numpy converts to float32) and returns **uint8 codes**,
one code per byte (the 4-bit formats use the low nibble; :func:`pack_fp4` packs two per byte).
Every decoder takes codes and returns float32.  The module depends only on numpy; it imports nothing
from the rest of ``aclnn_py`` so the golden (and the tests) can load it from its path.

Formats
-------

``float8_e4m3fn`` (OCP 8-bit FP E4M3, "fn" = finite + NaN): 1 sign, 4 exponent (bias 7), 3 mantissa
bits, subnormals, no infinity, NaN = ``S.1111.111`` (0x7F / 0xFF), max 448.

``float8_e5m2`` (OCP E5M2, IEEE-like): 1 sign, 5 exponent (bias 15), 2 mantissa, subnormals,
±inf = 0x7C / 0xFC, NaN = exponent 31 with a non-zero mantissa, max 57344.

``float4_e2m1`` (OCP MX FP4): 1 sign, 2 exponent (bias 1), 1 mantissa; values 0, 0.5, 1, 1.5, 2, 3,
4, 6; no inf / NaN.

``float4_e1m2``: 1 sign, 1 exponent, 2 mantissa bits, **bias 1**, no inf / NaN: exponent field 0 is
subnormal (``m/4``: 0, 0.25, 0.5, 0.75), field 1 is ``1 + m/4`` (1, 1.25, 1.5, 1.75); max 1.75.  It is
not an OCP format; the definition is CANN's own ``op::Float4E1M2`` (``include/nnopbase/opdev/
float4_e1m2.h`` in the ``cann/opbase`` repository on gitcode: "Bias: 1, max normal 1.75 (0x7),
min positive denorm 0.25 (0x1), no NaN, no infinity"), and it agrees with the MX scale rule of docs/operators.md
(``emax = 0`` for e1m2, ``emax = 2`` for e2m1).

``float8_e8m0`` (OCP MX scale, ``E8M0``): an unsigned biased exponent, value ``2^(c - 127)``,
0xFF = NaN, no zero.

``hifloat8`` (HiF8): Huawei's tapered 8-bit format, written from the paper *"Ascend HiFloat8 Format
for Deep Learning"*, Y. Luo et al., arXiv:2409.16626 (Sept. 2024), §2 (definition, Tables 1–4)
and §3 (rounding).  A code is ``S | Dot | Exponent | Mantissa``:

========  ===========  ==============  =============  ===================================
Dot code  D (exp bits)  mantissa bits  exponents      value
========  ===========  ==============  =============  ===================================
``11``    4             1              ±8 … ±15       ``(-1)^S 2^E (1 + m/2)``
``10``    3             2              ±4 … ±7        ``(-1)^S 2^E (1 + m/4)``
``01``    2             3              ±2, ±3         ``(-1)^S 2^E (1 + m/8)``
``001``   1             3              ±1             ``(-1)^S 2^E (1 + m/8)``
``0001``  0             3              0              ``(-1)^S (1 + m/8)``
``0000``  denormal      3              —              ``(-1)^S 2^(m - 23)``, m = 1 … 7
========  ===========  ==============  =============  ===================================

The D-bit exponent field is sign-magnitude with an implicit leading magnitude bit: its first bit is
the exponent's sign (0 = positive) and the magnitude is ``2^(D-1) + (remaining D-1 bits)``.
Special values (paper Table 4): ``0x00`` = 0 (one zero only), ``0x80`` = NaN, ``0x6F`` / ``0xEF``
(= ``S.11.0111.1``, the would-be ``±1.5 × 2^15``) = ±inf.  Largest finite value ``2^15 = 32768``
(0x6E), smallest normal ``2^-15`` (0x7E), smallest denormal ``2^-22`` (0x01): 38 binades.  Because
the exponent is sign-magnitude, code order is *not* value order (0x10 = 2.0 but 0x18 = 0.5).

Rounding
--------

* fp8 / fp4: round to nearest, ties to even, computed exactly (float64 scaling by powers of two and
  ``np.rint``) as if the exponent range were unbounded below the largest binade; subnormals follow
  IEEE 754 (gradual underflow), the sign of a value that rounds to zero is kept (``-0`` = 0x80 / 0x8).
* ``saturate=True`` ("cast_fp8_sat_rint", quant modes 4/5): any value — including ±inf — whose
  rounded magnitude exceeds the format's max becomes ±max; NaN stays NaN (fp8).
* ``saturate=False`` ("fp8_rint without saturation", quant mode 3; the IEEE behaviour, which is
  what ml_dtypes implements): a rounded magnitude above max overflows to **NaN** for e4m3fn (it has
  no infinity: 464 → 448 by ties-to-even, anything above 464 → NaN; ±inf → NaN) and to **±inf** for
  e5m2 (≥ 61440 → inf).
* NaN inputs: e4m3fn → ``0x7F | sign``; e5m2 → ``0x7E | sign`` (the quiet NaN ml_dtypes produces);
  fp4 (no NaN) → ``0x0`` (+0, the value CANN's ``Float4E2M1::quiet_NaN()`` documents).
* HiF8 encodes with the paper's **TA** rounding (ties away from zero on the HiF8 grid of the value's
  binade — CANN's ``RoundMode::CAST_ROUND``; quant mode 1 "cast with ROUND"): magnitudes at or
  above the midpoint ``1.25 × 2^15 = 40960`` round to the infinity code unless ``saturate`` (then
  ``0x6E`` = 32768); magnitudes below ``2^-23`` round to 0, ``[2^-23, 2^-22)`` to ``2^-22``.  −0 and
  anything rounding to zero give 0x00; NaN → 0x80; ±inf → 0x6F / 0xEF (or ±32768 when saturating).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "E8M0_NAN",
    "FP4_E1M2",
    "FP4_E2M1",
    "FP8_E4M3FN",
    "FP8_E5M2",
    "HIF8_MAX",
    "HIF8_NAN",
    "HIF8_NEG_INF",
    "HIF8_POS_INF",
    "MINIFLOATS",
    "MiniFloat",
    "decode",
    "e8m0_to_float32",
    "encode",
    "float32_exponent_field",
    "float32_to_fp4_e1m2",
    "float32_to_fp4_e2m1",
    "float32_to_fp8_e4m3fn",
    "float32_to_fp8_e5m2",
    "fp4_e1m2_to_float32",
    "fp4_e2m1_to_float32",
    "fp8_e4m3fn_to_float32",
    "fp8_e5m2_to_float32",
    "hif8_decode",
    "hif8_encode",
    "hif8_table",
    "pack_fp4",
    "pow2_float32",
    "unpack_fp4",
]

F32 = np.float32


# ---------------------------------------------------------------------------------------------------
# Generic sign / exponent / mantissa minifloats (fp8 e4m3fn, e5m2, fp4 e2m1, e1m2)
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MiniFloat:
    """A small binary floating-point format with subnormals."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max_code: int
    """Code (without sign) of the largest finite value."""
    inf_code: int | None
    """Code of +inf, or None (no infinity)."""
    nan_code: int | None
    """Code of the canonical (positive) NaN the encoder emits, or None (no NaN)."""
    emax: int
    """Unbiased exponent of the largest binade (the MX scale rule of docs/operators.md)."""

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade."""
        return 1 - self.bias

    @property
    def max_value(self) -> float:
        return float(_decode_magnitudes(self)[self.max_code])


FP8_E4M3FN = MiniFloat("float8_e4m3fn", 4, 3, 7, max_code=0x7E, inf_code=None, nan_code=0x7F, emax=8)
FP8_E5M2 = MiniFloat("float8_e5m2", 5, 2, 15, max_code=0x7B, inf_code=0x7C, nan_code=0x7E, emax=15)
FP4_E2M1 = MiniFloat("float4_e2m1", 2, 1, 1, max_code=0x7, inf_code=None, nan_code=None, emax=2)
FP4_E1M2 = MiniFloat("float4_e1m2", 1, 2, 1, max_code=0x7, inf_code=None, nan_code=None, emax=0)
MINIFLOATS = {f.name: f for f in (FP8_E4M3FN, FP8_E5M2, FP4_E2M1, FP4_E1M2)}


def _decode_magnitudes(fmt: MiniFloat) -> np.ndarray:
    """float64 magnitude of every non-negative code 0 … 2^(bits-1)-1 (specials as inf / nan)."""
    c = np.arange(fmt.sign_bit, dtype=np.int64)
    e = c >> fmt.mbits
    m = c & ((1 << fmt.mbits) - 1)
    frac = m / float(1 << fmt.mbits)
    val = np.where(e == 0, np.ldexp(frac, fmt.emin), np.ldexp(1.0 + frac, e - fmt.bias))
    if fmt.inf_code is not None:  # IEEE-like: top exponent = inf / nan
        top = e == (1 << fmt.ebits) - 1
        val = np.where(top, np.where(m == 0, np.inf, np.nan), val)
    elif fmt.nan_code is not None:
        val = np.where(c == fmt.nan_code, np.nan, val)
    return val


def decode(codes: np.ndarray, fmt: MiniFloat) -> np.ndarray:
    """Codes (one per byte; the low ``fmt.bits`` bits are used) → float32 values."""
    c = np.asarray(codes).astype(np.int64) & ((1 << fmt.bits) - 1)
    mag = _decode_magnitudes(fmt)[c & (fmt.sign_bit - 1)]
    result: np.ndarray = np.where(c & fmt.sign_bit, -mag, mag).astype(F32)
    return result


def encode(x: np.ndarray, fmt: MiniFloat, *, saturate: bool = True) -> np.ndarray:
    """float32 → ``fmt`` codes (uint8), round to nearest even; see the module docstring for the
    saturation and special-value rules.  Formats without inf/NaN (fp4) must saturate."""
    if not saturate and fmt.inf_code is None and fmt.nan_code is None:
        raise ValueError(f"{fmt.name}: has neither inf nor NaN, so a cast to it must saturate")
    xf = np.asarray(x, dtype=F32)
    with np.errstate(invalid="ignore"):  # signalling-NaN bit patterns
        a = np.abs(xf.astype(np.float64))
    neg = np.signbit(xf)
    nan = np.isnan(a)
    inf = np.isinf(a)
    fin = ~(nan | inf)
    a_f = np.where(fin, a, 0.0)
    # binade exponent of a (frexp: a = f * 2^k, f in [0.5, 1)), clamped to the subnormal binade
    _, k = np.frexp(a_f)
    e = np.where(a_f > 0, np.maximum(k.astype(np.int64) - 1, fmt.emin), fmt.emin)
    n = np.rint(np.ldexp(a_f, fmt.mbits - e))  # exact scaling; rint = ties to even
    code = ((e - fmt.emin) << fmt.mbits) + n.astype(np.int64)  # a carry moves to the next binade
    over = fin & (code > fmt.max_code)
    if saturate:
        code = np.where(over | inf, fmt.max_code, code)
    elif fmt.inf_code is not None:
        code = np.where(over | inf, fmt.inf_code, code)
    else:
        code = np.where(over | inf, fmt.nan_code, code)
    code = code | np.where(neg, fmt.sign_bit, 0)
    if fmt.nan_code is not None:
        code = np.where(nan, fmt.nan_code | np.where(neg, fmt.sign_bit, 0), code)
    else:
        code = np.where(nan, 0, code)
    return code.astype(np.uint8)


def float32_to_fp8_e4m3fn(x: np.ndarray, *, saturate: bool) -> np.ndarray:
    """fp32 → float8_e4m3fn codes, RNE; overflow → ±448 (saturate) or NaN (not)."""
    return encode(x, FP8_E4M3FN, saturate=saturate)


def float32_to_fp8_e5m2(x: np.ndarray, *, saturate: bool) -> np.ndarray:
    """fp32 → float8_e5m2 codes, RNE; overflow → ±57344 (saturate) or ±inf (not)."""
    return encode(x, FP8_E5M2, saturate=saturate)


def float32_to_fp4_e2m1(x: np.ndarray) -> np.ndarray:
    """fp32 → float4_e2m1 codes (0 … 15, one per byte), RNE, saturating to ±6; NaN → 0."""
    return encode(x, FP4_E2M1, saturate=True)


def float32_to_fp4_e1m2(x: np.ndarray) -> np.ndarray:
    """fp32 → float4_e1m2 codes (0 … 15, one per byte), RNE, saturating to ±1.75; NaN → 0."""
    return encode(x, FP4_E1M2, saturate=True)


def fp8_e4m3fn_to_float32(codes: np.ndarray) -> np.ndarray:
    return decode(codes, FP8_E4M3FN)


def fp8_e5m2_to_float32(codes: np.ndarray) -> np.ndarray:
    return decode(codes, FP8_E5M2)


def fp4_e2m1_to_float32(codes: np.ndarray) -> np.ndarray:
    return decode(codes, FP4_E2M1)


def fp4_e1m2_to_float32(codes: np.ndarray) -> np.ndarray:
    return decode(codes, FP4_E1M2)


# ---------------------------------------------------------------------------------------------------
# HiFloat8 (arXiv:2409.16626)
# ---------------------------------------------------------------------------------------------------

HIF8_NAN = 0x80
HIF8_POS_INF = 0x6F
HIF8_NEG_INF = 0xEF
HIF8_MAX = 0x6E  # 2^15


def _hif8_decode_all() -> np.ndarray:
    """float64 value of every code 0 … 255 (vectorised over the codes)."""
    code = np.arange(256, dtype=np.int64)
    c = code & 0x7F
    neg = code >= 0x80
    top2 = c >> 5
    # Dot field (prefix code) → exponent width D and mantissa width
    ew = np.select([top2 == 3, top2 == 2, top2 == 1, (c >> 4) == 1, (c >> 3) == 1], [4, 3, 2, 1, 0], -1)
    mw = np.select([ew == 4, ew == 3], [1, 2], 3)
    mant = c & ((1 << mw) - 1)
    ef = (c >> mw) & ((1 << np.maximum(ew, 0)) - 1)
    half = np.where(ew > 0, 1 << np.maximum(ew - 1, 0), 0)
    mag = half | (ef & np.maximum(half - 1, 0))  # implicit leading magnitude bit
    exp = np.where(ew > 0, np.where(ef & half, -mag, mag), 0)
    val = np.ldexp(1.0 + mant / np.ldexp(1.0, mw), exp)
    dml = ew < 0  # Dot 0000: denormal 2^(m-23); m == 0 is zero (S=0) / NaN (S=1)
    val = np.where(dml, np.where(mant > 0, np.ldexp(1.0, mant - 23), 0.0), val)
    val = np.where(neg, -val, val)
    val[HIF8_NAN] = np.nan
    val[HIF8_POS_INF] = np.inf
    val[HIF8_NEG_INF] = -np.inf
    return val


_HIF8_VALUES = _hif8_decode_all()
_HIF8_F32 = _HIF8_VALUES.astype(F32)
# positive finite codes sorted by value, with +inf's slot at its would-be value 1.5 * 2^15
_pos = np.array([c for c in range(1, 0x80) if c != HIF8_POS_INF], dtype=np.int64)
_order = np.argsort(_HIF8_VALUES[_pos])
_HIF8_POS_CODES = np.concatenate([[0], _pos[_order], [HIF8_POS_INF]])
_HIF8_POS_VALUES = np.concatenate([[0.0], _HIF8_VALUES[_pos][_order], [1.5 * 2.0**15]])
_HIF8_MIDS = (_HIF8_POS_VALUES[:-1] + _HIF8_POS_VALUES[1:]) / 2  # exact in float64
del _pos, _order


def hif8_table() -> np.ndarray:
    """float32 value of each of the 256 HiF8 codes (NaN for 0x80, ±inf for 0x6F / 0xEF)."""
    result: np.ndarray = _HIF8_F32.copy()
    return result


def hif8_decode(codes: np.ndarray) -> np.ndarray:
    """HiF8 codes (uint8) → float32."""
    return _HIF8_F32[np.asarray(codes).astype(np.uint8)]


def hif8_encode(x: np.ndarray, *, saturate: bool = False) -> np.ndarray:
    """float32 → HiF8 codes with the paper's TA rounding (nearest, ties away from zero) = CANN's
    ``CAST_ROUND``.  Overflow (≥ 40960 in magnitude) gives ±inf, or ±32768 when ``saturate``."""
    xf = np.asarray(x, dtype=F32)
    with np.errstate(invalid="ignore"):  # signalling-NaN bit patterns
        a = np.abs(xf.astype(np.float64))
    nan = np.isnan(a)
    # index of the nearest grid value; side="right" sends an exact midpoint to the larger magnitude
    idx = np.searchsorted(_HIF8_MIDS, np.where(nan, 0.0, a), side="right")
    code = _HIF8_POS_CODES[idx]
    if saturate:
        code = np.where(code == HIF8_POS_INF, HIF8_MAX, code)
    code = np.where(np.signbit(xf) & (code != 0), code | 0x80, code)
    code = np.where(nan, HIF8_NAN, code)
    return code.astype(np.uint8)


# ---------------------------------------------------------------------------------------------------
# E8M0 scales and float32 bit helpers
# ---------------------------------------------------------------------------------------------------

E8M0_NAN = 0xFF


def e8m0_to_float32(codes: np.ndarray) -> np.ndarray:
    """E8M0 scale bytes → float32 ``2^(c-127)`` (0 → 2^-127, an fp32 subnormal; 0xFF → NaN)."""
    c = np.asarray(codes).astype(np.int64)
    return np.where(c == E8M0_NAN, np.nan, np.ldexp(1.0, c - 127)).astype(F32)


def float32_exponent_field(x: np.ndarray) -> np.ndarray:
    """The biased 8-bit exponent field of float32 values (0 for zero/subnormals, 255 for inf/NaN).

    For bf16 inputs this equals the bf16 exponent field; for fp16 inputs it is the exponent field of
    the fp16 value truncated to bf16 (truncation keeps the exponent), as quant mode 4's first step
    prescribes (docs/operators.md)."""
    b = np.ascontiguousarray(np.asarray(x, dtype=F32)).view(np.uint32)
    result: np.ndarray = ((b >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
    return result


def pow2_float32(e: np.ndarray) -> np.ndarray:
    """float32 ``2^e`` for integer e in [-149, 127] (exact; subnormal below -126)."""
    return np.ldexp(1.0, np.asarray(e, dtype=np.int64)).astype(F32)


# ---------------------------------------------------------------------------------------------------
# 4-bit packing (two codes per byte, element 2i in the low nibble — aclnn_py.dtypes.pack_nibbles)
# ---------------------------------------------------------------------------------------------------


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """(…, 2n) 4-bit codes (uint8) → (…, n) bytes, element 2i in the low nibble."""
    c = np.asarray(codes).astype(np.uint8)
    if c.shape[-1] % 2:
        raise ValueError(f"packing 4-bit codes needs an even last dimension (got {c.shape[-1]})")
    return ((c[..., 0::2] & 0x0F) | ((c[..., 1::2] & 0x0F) << 4)).astype(np.uint8)


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_fp4`: (…, n) bytes → (…, 2n) codes."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), np.uint8)
    out[..., 0::2] = p & 0x0F
    out[..., 1::2] = p >> 4
    return out
