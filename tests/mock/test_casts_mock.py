"""The mock's C++ low-precision casts (mock/ops/lowp.h, through the aclnn_py._mock test hook) against
aclnn_py/golden/casts.py (itself checked against ml_dtypes and the HiF8 paper in tests/test_casts.py), on
dense inputs: every bf16 bit pattern with several low halves, every fp16 value, every rounding
midpoint of each format's grid (scaled over all binades) and its float32 neighbours, subnormals, ±0,
±inf, NaNs, and 2^20 random bit patterns. Decoders: all codes."""

from __future__ import annotations

import numpy as np
import pytest

from aclnn_py.golden import casts

FP_FORMATS = ["float8_e4m3fn", "float8_e5m2", "float4_e2m1", "float4_e1m2"]


def _dense_inputs() -> np.ndarray:
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF], np.uint32)
    parts = [(hi[:, None] | lows[None, :]).reshape(-1)]
    parts.append(np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32))
    rng = np.random.default_rng(950)
    parts.append(rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32))
    parts.append(np.arange(0, 1 << 12, dtype=np.uint32))  # float32 subnormals
    return np.concatenate(parts).view(np.float32)


def _midpoints(values: np.ndarray) -> np.ndarray:
    """Midpoints of consecutive grid values, scaled by 2^k over the useful range, ± 1 float32 ulp."""
    v = np.unique(np.abs(values[np.isfinite(values)]).astype(np.float64))
    mids = (v[:-1] + v[1:]) / 2
    pts = np.concatenate([mids * 2.0**k for k in range(-40, 41)] + [v])
    pts = pts[(pts > 0) & (pts < 3e38)].astype(np.float32)
    u = pts.view(np.uint32)
    around = np.concatenate([u, u + 1, u - 1]).view(np.float32)
    return np.concatenate([around, -around])


DENSE = _dense_inputs()


@pytest.mark.parametrize("fmt,saturate", [(f, s) for f in FP_FORMATS for s in (True, False)
                                          if s or f.startswith("float8")])  # fp4 casts always saturate
def test_minifloat_encode_matches_casts(mock, fmt, saturate):
    mf = casts.MINIFLOATS[fmt]
    grid = casts.decode(np.arange(1 << mf.bits, dtype=np.uint8), mf)
    x = np.concatenate([DENSE, _midpoints(grid),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], np.float32)])
    got = mock.lowp_encode(fmt, x, saturate)
    want = casts.encode(x, mf, saturate=saturate)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, (f"{bad.size} mismatches, first: x={x[bad[0]]!r} (0x{x.view(np.uint32)[bad[0]]:08x}) "
                           f"mock 0x{got[bad[0]]:02x} casts 0x{want[bad[0]]:02x}")


def test_hifloat8_encode_matches_casts(mock):
    grid = casts.hif8_table()
    x = np.concatenate([DENSE, _midpoints(grid), np.float32([2.0**-23, 2.0**-24, 40960.0, 40959.996, 32768.0,
                                                             1.5 * 2.0**15, 2.0**16, 0.0, -0.0, np.inf, -np.inf,
                                                             np.nan])])
    got = mock.lowp_encode("hifloat8", x, False)
    want = casts.hif8_encode(x)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, (f"{bad.size} mismatches, first: x={x[bad[0]]!r} (0x{x.view(np.uint32)[bad[0]]:08x}) "
                           f"mock 0x{got[bad[0]]:02x} casts 0x{want[bad[0]]:02x}")


def test_hifloat8_round_trips_every_code(mock):
    # every finite code's value encodes back to the code (0x80 NaN and ±inf handled by casts' rules)
    vals = casts.hif8_table()
    codes = np.arange(256, dtype=np.uint8)
    fin = np.isfinite(vals) & (codes != 0x80)
    assert np.array_equal(mock.lowp_encode("hifloat8", vals[fin], False), codes[fin])
    assert mock.lowp_encode("hifloat8", np.float32([np.inf, -np.inf, np.nan]), False).tolist() == [0x6F, 0xEF, 0x80]


@pytest.mark.parametrize("fmt", FP_FORMATS)
def test_minifloat_decode_every_code(mock, fmt):
    mf = casts.MINIFLOATS[fmt]
    codes = np.arange(1 << mf.bits, dtype=np.uint8)
    got, want = mock.lowp_decode(fmt, codes), casts.decode(codes, mf)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # ±0 too


def test_e8m0_decode_every_code(mock):
    codes = np.arange(256, dtype=np.uint8)
    got, want = mock.lowp_decode("float8_e8m0", codes), casts.e8m0_to_float32(codes)
    assert np.isnan(got[255]) and np.isnan(want[255])
    assert np.array_equal(got[:255].view(np.uint32), want[:255].view(np.uint32))
    assert got[0].view(np.uint32) == 0x00400000  # 2^-127, a float32 subnormal


def test_hook_rejects_unknown_and_invalid(mock):
    with pytest.raises(ValueError, match="unknown low-precision format"):
        mock.lowp_encode("float8_e4m3", np.zeros(1, np.float32), True)
    with pytest.raises(ValueError, match="must saturate"):
        mock.lowp_encode("float4_e2m1", np.zeros(1, np.float32), False)
    with pytest.raises(ValueError, match="does not saturate"):
        mock.lowp_encode("hifloat8", np.zeros(1, np.float32), True)
