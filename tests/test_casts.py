"""Tests of aclnn_py/golden/casts.py: fp8 / fp4 / e8m0 casts against ml_dtypes (an independent oracle), the
fp4 e1m2 and HiFloat8 casts against values derived by hand from their definitions (CANN's
Float4E1M2; arXiv:2409.16626 for HiF8).

casts.py is loaded from its path so these tests do not depend on the package ``__init__``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

_ROOT = Path(__file__).resolve().parents[1] / "aclnn_py"


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, _ROOT / file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


casts = _load("_aclnn_py_casts_under_test", "golden/casts.py")
dtypes = _load("_aclnn_py_dtypes_for_casts_test", "dtypes.py")

F32 = np.float32
FP8 = [(casts.FP8_E4M3FN, ml_dtypes.float8_e4m3fn), (casts.FP8_E5M2, ml_dtypes.float8_e5m2)]


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(F32)


def dense_inputs(fmt_values: np.ndarray, seed: int = 0) -> np.ndarray:
    """Every bf16 bit pattern (all exponents, both signs, inf, nan, subnormals), every representable
    value, every midpoint between neighbours and the float32 neighbours of both, plus random fp32."""
    v = np.unique(np.abs(fmt_values[np.isfinite(fmt_values)]).astype(np.float64))
    mids = (v[:-1] + v[1:]) / 2
    pts = np.concatenate([v, mids, 2 * v[-1:], v * 1.5]).astype(F32)
    near = np.concatenate([pts, np.nextafter(pts, F32(np.inf)), np.nextafter(pts, F32(0))])
    rng = np.random.default_rng(seed)
    rand = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(F32)
    allbf = (np.arange(1 << 16, dtype=np.uint32) << 16).view(F32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], F32)
    x = np.concatenate([near, -near, allbf, rand, specials])
    return x


# ----------------------------------------------------------------------------------------------------
# fp8 e4m3fn / e5m2 against ml_dtypes
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,dt", FP8, ids=lambda v: getattr(v, "name", ""))
def test_fp8_decode_all_codes_matches_ml_dtypes(fmt, dt):
    c = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(casts.decode(c, fmt), c.view(dt).astype(F32))


@pytest.mark.parametrize("fmt,dt", FP8, ids=lambda v: getattr(v, "name", ""))
def test_fp8_rint_without_saturation_matches_ml_dtypes(fmt, dt):
    # ml_dtypes' float32 → float8 conversion is IEEE round-to-nearest-even without saturation:
    # e4m3fn overflows to NaN, e5m2 to ±inf.  Every NaN payload is compared too.
    x = dense_inputs(casts.decode(np.arange(256, dtype=np.uint8), fmt))
    got = casts.encode(x, fmt, saturate=False)
    exp = x.astype(dt).view(np.uint8)
    bad = np.nonzero(got != exp)[0]
    assert bad.size == 0, (x[bad[:5]], got[bad[:5]], exp[bad[:5]])


@pytest.mark.parametrize("fmt,dt", FP8, ids=lambda v: getattr(v, "name", ""))
def test_fp8_rint_with_saturation_is_clip_then_cast(fmt, dt):
    # saturation = clamp to ±max, then the (monotone) RNE cast; NaN stays NaN, ±inf → ±max
    x = dense_inputs(casts.decode(np.arange(256, dtype=np.uint8), fmt), seed=1)
    m = fmt.max_value
    got = casts.encode(x, fmt, saturate=True)
    ok = ~np.isnan(x)
    exp = np.clip(x[ok], -m, m).astype(dt).view(np.uint8)
    np.testing.assert_array_equal(got[ok], exp)
    assert np.isnan(casts.decode(got[~ok], fmt)).all()


def test_fp8_hand_worked_cases():
    e4, e5 = casts.FP8_E4M3FN, casts.FP8_E5M2
    enc = casts.encode
    # e4m3fn: 448 = 1.110b * 2^8 (0x7E); 464 is the midpoint to 480 = 1.111b*2^8 → ties to even → 448
    assert enc(F32(464), e4, saturate=False) == 0x7E
    assert enc(F32(464.00003), e4, saturate=False) == 0x7F  # rounds to 480 > max → NaN (no inf)
    assert enc(F32(464.00003), e4, saturate=True) == 0x7E
    assert enc(F32(np.inf), e4, saturate=False) == 0x7F and enc(F32(-np.inf), e4, saturate=False) == 0xFF
    assert enc(F32(-np.inf), e4, saturate=True) == 0xFE  # -448
    # subnormals: min 2^-9 (code 1); 2^-10 ties between 0 and code 1 → even → +0; 3*2^-10 ties 1|2 → 2
    assert enc(F32(2.0**-10), e4) == 0x00
    assert enc(F32(-(2.0**-10)), e4) == 0x80  # sign kept: -0
    assert enc(F32(3 * 2.0**-10), e4) == 0x02
    assert enc(F32(2.0**-6), e4) == 0x08  # min normal
    # e5m2: 57344 = 1.11b * 2^15 (0x7B); 61440 ties with 65536 (even) → overflow → inf 0x7C
    assert enc(F32(61440), e5, saturate=False) == 0x7C
    assert enc(F32(61439.996), e5, saturate=False) == 0x7B
    assert enc(F32(61440), e5, saturate=True) == 0x7B
    assert enc(F32(-np.inf), e5, saturate=False) == 0xFC and enc(F32(-np.inf), e5, saturate=True) == 0xFB
    assert enc(F32(np.nan), e5, saturate=True) == 0x7E
    assert enc(F32(1.25), e5) == 0x3D  # 1.01b: exponent 15 → 0 01111 01
    assert enc(F32(1.125), e5) == 0x3C  # 1.001b ties between 1.00b and 1.01b → even 1.00b


# ----------------------------------------------------------------------------------------------------
# fp4 e2m1 against ml_dtypes; e1m2 from its definition
# ----------------------------------------------------------------------------------------------------


def test_fp4_e2m1_decode_matches_ml_dtypes():
    c = np.arange(16, dtype=np.uint8)
    np.testing.assert_array_equal(casts.fp4_e2m1_to_float32(c), c.view(ml_dtypes.float4_e2m1fn).astype(F32))


def test_fp4_e2m1_cast_matches_ml_dtypes():
    # ml_dtypes' float4_e2m1fn cast is RNE and saturating (±6, ±inf → ±6); NaN differs (see below)
    x = dense_inputs(casts.fp4_e2m1_to_float32(np.arange(16)), seed=2)
    ok = ~np.isnan(x)
    got = casts.float32_to_fp4_e2m1(x)
    exp = x[ok].astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    np.testing.assert_array_equal(got[ok], exp)
    assert (got[~ok] == 0).all()  # NaN → +0 (the format has no NaN; module docstring)
    assert got.max() <= 0x0F


def test_fp4_e2m1_hand_worked_cases():
    x = F32([0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 7.0, -5.0, -0.1, 1e30, -np.inf])
    # 0.25: tie 0|0.5 → 0 (even);  0.75: tie 0.5(1)|1(2) → 2;  1.25: tie 1(2)|1.5(3) → 2;
    # 2.5: tie 2(4)|3(5) → 4;  3.5: tie 3(5)|4(6) → 6;  5: tie 4(6)|6(7) → 6;  7 → sat 6 (7);
    # -5 → 0x8|6;  -0.1 → -0 (0x8);  1e30 → 7;  -inf → 0xF
    assert casts.float32_to_fp4_e2m1(x).tolist() == [0, 2, 2, 4, 6, 6, 7, 0xE, 0x8, 7, 0xF]


def test_fp4_e1m2_definition_and_cast():
    # S.E.MM, bias 1: E=0 → m/4, E=1 → 1 + m/4  → the positive codes 0..7 are exactly k/4
    c = np.arange(16)
    assert casts.fp4_e1m2_to_float32(c).tolist() == [k / 4 for k in range(8)] + [-k / 4 for k in range(8)]
    assert casts.FP4_E1M2.max_value == 1.75 and casts.FP4_E1M2.emax == 0
    # so the RNE cast with saturation is min(rint(4|x|), 7) with the sign in bit 3 — an oracle that
    # shares nothing with the generic encoder
    x = dense_inputs(casts.fp4_e1m2_to_float32(c), seed=3)
    ok = ~np.isnan(x)
    a = np.abs(x[ok].astype(np.float64))
    exp = np.minimum(np.rint(np.minimum(a, 8.0) * 4), 7).astype(np.uint8) | np.where(np.signbit(x[ok]), 8, 0)
    np.testing.assert_array_equal(casts.float32_to_fp4_e1m2(x)[ok], exp.astype(np.uint8))
    assert (casts.float32_to_fp4_e1m2(x)[~ok] == 0).all()
    # hand: 0.125 ties 0|0.25 → 0; 0.375 ties 0.25(1)|0.5(2) → 2; 1.875 ties 1.75(7)|2 → 2 > max → 7
    assert casts.float32_to_fp4_e1m2(F32([0.125, 0.375, 1.875, -1.3])).tolist() == [0, 2, 7, 0x8 | 5]


def test_fp4_must_saturate():
    with pytest.raises(ValueError):
        casts.encode(F32([1.0]), casts.FP4_E2M1, saturate=False)


def test_pack_fp4_matches_dtypes_pack_nibbles():
    rng = np.random.default_rng(4)
    c = rng.integers(0, 16, (5, 12), dtype=np.uint8)
    p = casts.pack_fp4(c)
    assert p.shape == (5, 6)
    np.testing.assert_array_equal(p, dtypes.pack_nibbles(c))
    np.testing.assert_array_equal(casts.unpack_fp4(p), c)
    assert casts.pack_fp4(np.array([0x1, 0x2], np.uint8)).tolist() == [0x21]  # element 0 → low nibble
    with pytest.raises(ValueError):
        casts.pack_fp4(np.zeros(3, np.uint8))


# ----------------------------------------------------------------------------------------------------
# E8M0 and float32 fields
# ----------------------------------------------------------------------------------------------------


def test_e8m0_decode_matches_ml_dtypes():
    c = np.arange(256, dtype=np.uint8)
    got = casts.e8m0_to_float32(c)
    np.testing.assert_array_equal(got, c.view(ml_dtypes.float8_e8m0fnu).astype(F32))
    assert got[127] == 1.0 and got[0] == F32(2.0**-127) and np.isnan(got[255])
    # exact powers of two go back to their code through ml_dtypes
    np.testing.assert_array_equal(got[:255].astype(ml_dtypes.float8_e8m0fnu).view(np.uint8), c[:255])


def test_float32_exponent_field_and_pow2():
    x = F32([0.0, -0.0, 1.0, -3.0, 2.0**-126, 2.0**-130, np.inf, np.nan, 65504.0])
    assert casts.float32_exponent_field(x).tolist() == [0, 0, 127, 128, 1, 0, 255, 255, 142]
    e = np.arange(-149, 128)
    p = casts.pow2_float32(e)
    np.testing.assert_array_equal(p.astype(np.float64), 2.0 ** e.astype(np.float64))
    # bf16 values have the same exponent field as their float32 image
    bf = (np.arange(1 << 16, dtype=np.uint32) << 16).view(F32)
    with np.errstate(invalid="ignore"):
        bf = bf.astype(ml_dtypes.bfloat16).astype(F32)
    assert (casts.float32_exponent_field(bf)
            == ((np.arange(1 << 16) >> 7) & 0xFF)).all()


# ----------------------------------------------------------------------------------------------------
# HiFloat8
# ----------------------------------------------------------------------------------------------------

# Values derived by hand from arXiv:2409.16626, Tables 1-4 (Dot prefix codes, sign-magnitude exponent
# with an implicit leading magnitude bit, denormals 2^(m-23), specials).
HIF8_HAND = {
    0x00: 0.0,
    0x01: 2.0**-22,   # 0.0000.001: denormal m=1
    0x07: 2.0**-16,   # denormal m=7
    0x08: 1.0,        # 0.0001.000: D=0, E=0
    0x0F: 1.875,      # 0.0001.111
    0x10: 2.0,        # 0.001.0.000: D=1, Se=0 → +1
    0x17: 3.75,       # 2 * 1.875
    0x18: 0.5,        # 0.001.1.000: Se=1 → -1
    0x1C: 0.75,       # 0.5 * 1.5
    0x20: 4.0,        # 0.01.00.000: D=2, +|1|0 → +2
    0x28: 8.0,        # 0.01.01.000: +3
    0x2D: 8.0 * 1.625,
    0x30: 0.25,       # 0.01.10.000: -2
    0x38: 0.125,      # 0.01.11.000: -3
    0x40: 16.0,       # 0.10.000.00: D=3, +4
    0x43: 28.0,       # 16 * 1.75
    0x5C: 2.0**-7,    # 0.10.111.00: -7
    0x60: 256.0,      # 0.11.0000.0: D=4, +8
    0x61: 384.0,      # 256 * 1.5
    0x6E: 32768.0,    # 0.11.0111.0: +15 (max finite)
    0x70: 2.0**-8,    # 0.11.1000.0: -8
    0x7E: 2.0**-15,   # 0.11.1111.0: -15 (min normal)
    0x7F: 1.5 * 2.0**-15,
    0x88: -1.0,
    0xC0: -16.0,
    0xEE: -32768.0,
}


def test_hif8_decode_hand_values_and_specials():
    t = casts.hif8_table()
    assert t.dtype == F32 and t.shape == (256,)
    for code, val in HIF8_HAND.items():
        assert t[code] == F32(val), hex(code)
    assert np.isnan(t[0x80]) and t[0x6F] == np.inf and t[0xEF] == -np.inf
    np.testing.assert_array_equal(casts.hif8_decode(np.array(list(HIF8_HAND), np.uint8)),
                                  F32(list(HIF8_HAND.values())))


def test_hif8_invariants():
    t = casts.hif8_table().astype(np.float64)
    fin = np.isfinite(t)
    assert fin.sum() == 253  # 256 - NaN - ±inf
    # symmetric sign (except 0x00 / 0x80 = zero / NaN)
    for c in range(1, 128):
        if c != 0x6F:
            assert t[c | 0x80] == -t[c]
    # the 126 positive finite values are distinct powers-of-two-scaled grids covering 2^-22 … 2^15
    pos = np.sort(t[1:128][np.isfinite(t[1:128])])
    assert pos.size == 126 and (np.diff(pos) > 0).all()
    assert pos[0] == 2.0**-22 and pos[-1] == 2.0**15
    # precision per binade: 3 mantissa bits for |E| <= 3, 2 for 4..7, 1 for 8..15, 0 for denormals
    for e in range(-22, 16):
        n = np.count_nonzero((pos >= 2.0**e) & (pos < 2.0 ** (e + 1)))
        exp = 1 if e < -15 or e == 15 else 2 if abs(e) >= 8 else 4 if abs(e) >= 4 else 8
        assert n == exp, e  # (2^15 * 1.5 is the inf code, so the top binade holds one value)
    # value is monotonic in code inside each (Dot, exponent-sign) run for a positive exponent sign
    # and within each binade otherwise; overall the code order is not the value order (0x18 < 0x10)
    assert t[0x18] < t[0x10]
    # encode(decode(c)) == c for every finite code
    codes = np.nonzero(fin)[0].astype(np.uint8)
    np.testing.assert_array_equal(casts.hif8_encode(t[codes].astype(F32)), codes)


def _hif8_brute_force(x: np.ndarray) -> np.ndarray:
    """Nearest finite-or-inf HiF8 value, ties to the larger magnitude — by exhaustive comparison."""
    t = casts.hif8_table().astype(np.float64)
    cand = np.array([c for c in range(128) if np.isfinite(t[c])] + [0x6F])
    vals = np.where(cand == 0x6F, 1.5 * 2.0**15, t[cand])  # inf sits where 1.5*2^15 would be
    a = np.abs(x.astype(np.float64))[:, None]
    d = np.abs(a - vals[None, :])
    best = d.min(axis=1, keepdims=True)
    # among the nearest, the largest magnitude (ties away from zero)
    pick = np.where(d == best, vals[None, :], -1.0).argmax(axis=1)
    code = cand[pick]
    code = np.where(np.isinf(x), 0x6F, code)
    code = np.where((x < 0) & (code != 0), code | 0x80, code)
    return np.where(np.isnan(x), 0x80, code).astype(np.uint8)


def test_hif8_encode_round_ties_away_against_brute_force():
    t = casts.hif8_table().astype(np.float64)
    pos = np.sort(t[1:128][np.isfinite(t[1:128])])
    grid = np.concatenate([[0.0], pos, [1.5 * 2.0**15]])
    mids = ((grid[:-1] + grid[1:]) / 2).astype(F32)
    rng = np.random.default_rng(5)
    rand = (rng.standard_normal(30_000) * np.exp2(rng.integers(-26, 18, 30_000))).astype(F32)
    x = np.concatenate([mids, np.nextafter(mids, F32(0)), np.nextafter(mids, F32(np.inf)), -mids, rand,
                        F32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e38, -1e38, 2.0**-30])])
    np.testing.assert_array_equal(casts.hif8_encode(x), _hif8_brute_force(x))


def test_hif8_encode_hand_worked_cases():
    enc = casts.hif8_encode
    # ties away from zero: 1.0625 is the midpoint of 1.0 (0x08) and 1.125 (0x09) → 0x09
    assert enc(F32(1.0625)) == 0x09
    assert enc(F32(-1.0625)) == 0x89
    # 2^15 binade has 1 mantissa bit: 40960 = 1.25*2^15 is the midpoint to the inf slot → inf
    assert enc(F32(40959.996)) == 0x6E
    assert enc(F32(40960)) == 0x6F and enc(F32(-40960)) == 0xEF
    assert enc(F32(40960), saturate=True) == 0x6E and enc(F32(-np.inf), saturate=True) == 0xEE
    # bottom: [2^-23, 2^-22) → 2^-22; below 2^-23 → 0; -tiny → 0x00 (only one zero)
    assert enc(F32(2.0**-23)) == 0x01 and enc(F32(2.0**-24)) == 0x00 and enc(F32(-(2.0**-24))) == 0x00
    # denormal binades hold one value each: 1.5 * 2^-17 ties 2^-17 (0x06) | 2^-16 (0x07) → 0x07
    assert enc(F32(1.5 * 2.0**-17)) == 0x07 and enc(F32(1.4 * 2.0**-17)) == 0x06
    # a carry into the next binade: 15.5 = 1.9375*2^3 (3 mantissa bits) ties to 16 = 0x40
    assert enc(F32(15.5)) == 0x40
    # 2^-16 binade → 2^-15 normal: 1.5*2^-16 ties → 2^-15 (0x7E)
    assert enc(F32(1.5 * 2.0**-16)) == 0x7E
    assert enc(F32(np.nan)) == 0x80 and enc(F32(-0.0)) == 0x00
    # values round-trip within half an ulp of their binade
    x = np.random.default_rng(6).uniform(-30000, 30000, 5000).astype(F32)
    y = casts.hif8_decode(enc(x)).astype(np.float64)
    e = np.floor(np.log2(np.abs(x.astype(np.float64))))
    mbits = np.select([np.abs(e) <= 3, np.abs(e) <= 7], [3, 2], 1)
    assert (np.abs(y - x) <= 2.0 ** (e - mbits) / 2).all()
