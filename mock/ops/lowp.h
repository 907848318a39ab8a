// Low-precision formats of the Ascend 950 profile (private to mock/ops, also compiled into the
// aclnn_py._mock test hook): bit-exact float32 -> fp8 / fp4 / HiFloat8 encoders, fp8 / e8m0
// decoders, and the row kernels of dispatch quant modes 1, 2 (fp8), 3, 4, 5 and combine comm quant
// 3 / 4. The rules are the ones aclnn_py/golden/casts.py and the aclnn_py.golden package docstring states
// (their module docstrings, "choices" 1-8); this file is written from those rules, not from the
// Python code, and tests/mock/test_casts_mock.py checks both against each other on dense inputs.
//
// Formats (sign | exponent | mantissa, subnormals everywhere):
//   float8_e4m3fn  bias 7,  3 mantissa bits, no inf, NaN = S.1111.111, max 448      (OCP FP8)
//   float8_e5m2    bias 15, 2 mantissa bits, inf = S.11111.00, NaN otherwise, max 57344
//   float4_e2m1    bias 1,  1 mantissa bit,  no inf / NaN, max 6                   (OCP MX FP4)
//   float4_e1m2    bias 1,  2 mantissa bits, no inf / NaN, max 1.75    (CANN's op::Float4E1M2)
//   float8_e8m0    2^(c-127), 0xFF = NaN                                           (OCP MX scale)
//   hifloat8       Huawei's tapered format, "Ascend HiFloat8 Format for Deep Learning", Luo et al.,
//                  arXiv:2409.16626 (2024), §2 Tables 1-4 and §3: Dot prefix 11 / 10 / 01 / 001 /
//                  0001 / 0000 selects 4 / 3 / 2 / 1 / 0 exponent bits (sign-magnitude with an
//                  implicit leading magnitude bit) and 1 / 2 / 3 / 3 / 3 mantissa bits; 0000 is the
//                  denormal range 2^(m-23); 0x00 = 0, 0x80 = NaN, 0x6F / 0xEF = +-inf, max 2^15.
//
// Rounding: fp8 / fp4 round to nearest even on the format's grid (gradual underflow, the sign of a
// result that rounds to 0 is kept). Saturating casts clamp every overflow (inf included) to +-max;
// non-saturating ones give inf (e5m2) or NaN (e4m3fn). NaN -> S.1111.111 (e4m3fn), S.11111.10
// (e5m2), +0 (fp4). HiF8 rounds ties away from zero (the paper's TA, CANN's CAST_ROUND), does not
// saturate (|x| >= 1.25 * 2^15 -> inf), and |x| < 2^-23 -> 0.
//
// Everything is branch-free arithmetic + selects so the row loops of lowp.cpp vectorise.
#pragma once

#include <cstdint>

#include "ops/numerics.h"

#pragma GCC visibility push(hidden)

namespace aclmock {
namespace moe {

// Output / input formats of the 950 profile.
enum class Fmt : int { None = 0, Int8, HiF8, E4M3, E5M2, E2M1, E1M2 };

// float32 2^e for integer e in [-149, 127] (exact; subnormal below -126).
inline float pow2f(int32_t e) {
    const uint32_t normal = uint32_t(e + 127) << 23;
    const uint32_t sub = 1u << ((e + 149) & 31);
    return u2f(e >= -126 ? normal : sub);
}

// ---- generic minifloat (fp8 e4m3fn / e5m2, fp4 e2m1 / e1m2) --------------------------------------
struct E4M3T { static constexpr int mbits = 3, emin = -6, max_code = 0x7e, inf_code = -1, nan_code = 0x7f, sign = 0x80; };
struct E5M2T { static constexpr int mbits = 2, emin = -14, max_code = 0x7b, inf_code = 0x7c, nan_code = 0x7e, sign = 0x80; };
struct E2M1T { static constexpr int mbits = 1, emin = 0, max_code = 0x7, inf_code = -1, nan_code = -1, sign = 0x8; };
struct E1M2T { static constexpr int mbits = 2, emin = 0, max_code = 0x7, inf_code = -1, nan_code = -1, sign = 0x8; };

// Selects are written as bit masks (all ones / all zeros) so GCC if-converts them and the row loops
// vectorise (SSE2 has no blend; a ternary on floats would otherwise stay a branch).
inline uint32_t mask_if(bool c) { return 0u - uint32_t(c); }
inline uint32_t sel(uint32_t m, uint32_t a, uint32_t b) { return (a & m) | (b & ~m); }

template <class F, bool SAT>
inline uint8_t mf_encode(float x) {
    static_assert(SAT || F::inf_code >= 0 || F::nan_code >= 0, "a format without inf/NaN must saturate");
    const uint32_t u = f2u(x);
    const uint32_t au = u & 0x7fffffffu;
    const uint32_t sign = (u >> 31) * uint32_t(F::sign);
    const uint32_t nan = mask_if(au > 0x7f800000u);
    const uint32_t inf = mask_if(au == 0x7f800000u);
    // binade of |x| (floor(log2)), clamped to the format's subnormal binade; float32 subnormals are
    // far below every format's smallest subnormal, so clamping their -127 is right too
    int32_t e = int32_t(au >> 23) - 127;
    e = e < F::emin ? F::emin : e;
    e = e > 127 ? 127 : e;                                   // inf/NaN: replaced below
    // |x| * 2^(mbits - e) < 2^(mbits+1) is exact (a power-of-two scaling of a float, no underflow)
    const float y = u2f(f2u(u2f(au) * u2f(uint32_t(F::mbits - e + 127) << 23)) & ~(nan | inf));
    const int32_t n = int32_t(rint_small(y));                // ties to even; a carry moves up a binade
    const int32_t code = ((e - F::emin) << F::mbits) + n;
    const uint32_t over = inf | mask_if(code > F::max_code);
    constexpr uint32_t special = SAT ? uint32_t(F::max_code) : uint32_t(F::inf_code >= 0 ? F::inf_code : F::nan_code);
    uint32_t c = sel(over, special, uint32_t(code)) | sign;
    const uint32_t nan_code = F::nan_code >= 0 ? (uint32_t(F::nan_code) | sign) : 0u;
    c = sel(nan, nan_code, c);
    return uint8_t(c);
}

// fp8 code -> float32 (exact; NaN codes give a quiet NaN with the code's sign).
template <class F>
inline float mf_decode(uint32_t c) {
    constexpr int ebits = (F::sign == 0x80 ? 7 : 3) - F::mbits;
    const uint32_t s = mask_if((c & F::sign) != 0) & 0x80000000u;
    const uint32_t mag = c & (F::sign - 1);
    const uint32_t ef = mag >> F::mbits, m = mag & ((1u << F::mbits) - 1);
    const float sub = float(int32_t(m)) * pow2f(F::emin - F::mbits);
    const uint32_t nrm = (uint32_t(int32_t(ef) - 1 + F::emin + 127) << 23) | (m << (23 - F::mbits));
    uint32_t v = sel(mask_if(ef == 0), f2u(sub), nrm);
    if (F::inf_code >= 0) {   // IEEE-like: top exponent = inf / NaN
        const uint32_t top = mask_if(ef == (1u << ebits) - 1);
        v = sel(top, sel(mask_if(m == 0), 0x7f800000u, 0x7fc00000u), v);
    } else if (F::nan_code >= 0) {
        v = sel(mask_if(mag == uint32_t(F::nan_code)), 0x7fc00000u, v);
    }
    return u2f(v | s);
}

// e8m0 scale byte -> 2^(c-127) (c = 0: 2^-127, a float32 subnormal; 0xFF: NaN).
inline float e8m0_to_f32(uint32_t c) {
    const uint32_t v = c == 0 ? 0x00400000u : (c << 23);
    return u2f(c == 0xff ? 0x7fc00000u : v);
}

// ---- HiFloat8 -------------------------------------------------------------------------------------
// Code of the value 2^E * (1 + m / 2^mbits(E)) (E in [-15, 15]), of the denormal 2^E (E in [-22, -16]),
// or of +inf (E >= 16). Sign not included.
inline uint32_t hif8_code_of(int32_t E, uint32_t m) {
    const uint32_t A = uint32_t(E < 0 ? -E : E);
    const uint32_t es = E < 0 ? 1u : 0u;
    uint32_t c;
    if (A == 0) c = 0x08u | m;                                    // Dot 0001, 3 mantissa bits
    else if (A == 1) c = 0x10u | (es << 3) | m;                   // Dot 001, D = 1
    else if (A <= 3) c = 0x20u | (es << 4) | ((A - 2) << 3) | m;  // Dot 01, D = 2
    else if (A <= 7) c = 0x40u | (es << 4) | ((A - 4) << 2) | m;  // Dot 10, D = 3, 2 mantissa bits
    else c = 0x60u | (es << 4) | ((A - 8) << 1) | m;              // Dot 11, D = 4, 1 mantissa bit
    c = E <= -16 ? uint32_t(E + 23) : c;                          // Dot 0000: 2^(m-23)
    return E >= 16 ? 0x6fu : c;
}

// float32 -> HiF8, ties away from zero, not saturating.
inline uint8_t hif8_encode(float x) {
    const uint32_t u = f2u(x);
    const uint32_t au = u & 0x7fffffffu;
    const int32_t E = int32_t(au >> 23) - 127;
    uint32_t code;
    if (au > 0x7f800000u) return 0x80;                  // NaN
    if (E >= 16) {
        code = 0x6f;                                    // >= 2^16 (and inf): inf
    } else if (E <= -24) {
        code = 0;                                       // < 2^-23
    } else if (E == -23) {
        code = 1;                                       // [2^-23, 2^-22) -> 2^-22 (ties away)
    } else {
        const int32_t A = E < 0 ? -E : E;
        int32_t mb = A >= 8 ? 1 : (A >= 4 ? 2 : 3);
        mb = E <= -16 ? 0 : mb;                         // denormal binades: powers of two only
        const float y = u2f(au) * pow2f(mb - E);        // in [2^mb, 2^(mb+1)), exact
        const int32_t n = int32_t(y + 0.5f);            // ties away (floor of a positive value)
        const bool carry = n == (1 << (mb + 1));
        code = carry ? hif8_code_of(E + 1, 0) : hif8_code_of(E, uint32_t(n - (1 << mb)));
    }
    code |= ((u >> 31) != 0 && code != 0) ? 0x80u : 0u;
    return uint8_t(code);
}

// Scalar dispatch over a runtime format (tests and cold paths; the row kernels are templated).
inline uint8_t encode_fmt(Fmt f, float x, bool saturate) {
    switch (f) {
    case Fmt::E4M3: return saturate ? mf_encode<E4M3T, true>(x) : mf_encode<E4M3T, false>(x);
    case Fmt::E5M2: return saturate ? mf_encode<E5M2T, true>(x) : mf_encode<E5M2T, false>(x);
    case Fmt::E2M1: return mf_encode<E2M1T, true>(x);
    case Fmt::E1M2: return mf_encode<E1M2T, true>(x);
    case Fmt::HiF8: return hif8_encode(x);
    default: return 0;
    }
}
inline float decode_fmt(Fmt f, uint32_t c) {
    switch (f) {
    case Fmt::E4M3: return mf_decode<E4M3T>(c);
    case Fmt::E5M2: return mf_decode<E5M2T>(c);
    case Fmt::E2M1: return mf_decode<E2M1T>(c);
    case Fmt::E1M2: return mf_decode<E1M2T>(c);
    default: return 0.0f;
    }
}

inline bool is_fp8(Fmt f) { return f == Fmt::E4M3 || f == Fmt::E5M2; }
inline bool is_fp4(Fmt f) { return f == Fmt::E2M1 || f == Fmt::E1M2; }
// Unbiased exponent of the format's largest binade (mode 4 step 2).
inline int32_t fmt_emax(Fmt f) {
    return f == Fmt::E4M3 ? 8 : f == Fmt::E5M2 ? 15 : f == Fmt::E2M1 ? 2 : 0;
}
inline float fp8_max(Fmt f) { return f == Fmt::E4M3 ? 448.0f : 57344.0f; }

// Columns of the e8m0 scales of an MX row: align2(ceil(H/32)) (mode 4).
inline int64_t mx_blocks(int64_t H) { return (H + 31) / 32; }
inline int64_t mx_scale_cols(int64_t H) { int64_t nb = mx_blocks(H); return nb + (nb & 1); }
inline int64_t group_cols(int64_t H) { return (H + 127) / 128; }

// ---- row kernels (lowp.cpp) -------------------------------------------------------------------
// Rows are fp16 (!bf16) or bf16; `tmp` holds lowp_tmp_floats(H) floats of scratch.
inline uint64_t lowp_tmp_floats(int64_t H) { return 2 * align_up(uint64_t(H), 128) + 64; }

// Mode 1 (static): y = float(x) * scale[h] (scale_stride 0: one scalar); int8: rint saturated to
// [-128, 127] (NaN -> 0); hifloat8: hif8_encode(y). `out` gets H bytes.
void static_quant_row(const uint16_t *x, bool bf16, const float *scale, bool scalar, Fmt fmt, uint8_t *out,
                      float *tmp, int64_t H);
// Modes 2 (fp8, group = H) and 3 (group = 128): xf = float(x) [* smooth]; per group ds = fmax/max|g|,
// codes = fp8_rint(xf * ds) without saturation, scale 1/ds; max 0 or ds = +inf -> scale 0, codes +0.
// Writes H codes and ceil(H/group) float32 scales.
void fp8_dynamic_row(const uint16_t *x, bool bf16, const float *smooth, Fmt fmt, int64_t group, uint8_t *codes,
                     float *scales, float *tmp, int64_t H);
// Modes 4 / 5 (MX, block 32): e8m0 scales (mx_blocks(H) of them; the caller pads to align2) and
// sat-RNE codes of x * 2^(127 - e8m0) (bf16 rows: product rounded to bf16); 0xFF blocks -> code 0.
// fp4 codes are packed two per byte (element 2i in the low nibble): H/2 bytes; fp8: H bytes.
void mx_quant_row(const uint16_t *x, bool bf16, Fmt fmt, bool clip, uint8_t *codes, uint8_t *e8, float *tmp,
                  int64_t H);
// Combine comm quant 3 / 4 receiver: v[h] = float(round_to_row(decode(code) * 2^(e8m0 - 127))).
void mx_dequant_row(const uint8_t *codes, const uint8_t *e8, Fmt fmt, bool bf16, float *v, int64_t H);

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
