// Bit-exact numerics of the mock MoE kernels (private to mock/ops): fp16/bf16 <-> fp32 with
// round-half-to-even, per-token int8 quantisation (mode 2), comm quant int8
// and the fp32 accumulation helpers of combine. The build uses -ffp-contract=off, so
// every `a*b + c` below is a rounded multiply followed by a rounded add.
//
// The scalar converters are branch-light inline functions so the row loops in numerics.cpp
// vectorise. NaN conversions follow numpy (fp16: sign | 0x7c00 | top mantissa bits, never turning a
// NaN into inf) and ml_dtypes (bf16: 0x7fc0 / 0xffc0).
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/moe_window.h"

#pragma GCC visibility push(hidden)  // nothing but the four aclnn entry points is exported

namespace aclmock {
namespace moe {

inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_f32(uint16_t h) { return u2f(uint32_t(h) << 16); }

// Exact for every fp16 value: the 15 exponent/mantissa bits shifted into float position make a
// float 2^-112 times the value (subnormal halves become subnormal floats), and the multiply by 2^112
// is exact; inf/NaN (which land at >= 2^16) get the all-ones exponent.
inline float fp16_to_f32(uint16_t h) {
    uint32_t em = uint32_t(h & 0x7fffu) << 13;
    float f = u2f(em) * u2f(0x77800000u);                  // * 2^112
    uint32_t o = f2u(f);
    o |= (f >= 65536.0f) ? 0x7f800000u : 0u;              // inf / NaN survive
    o |= uint32_t(h & 0x8000u) << 16;
    return u2f(o);
}

// Both casts are written as computations followed by selects (no branches) so row loops vectorise.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t qnan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    return uint16_t(((u & 0x7fffffffu) > 0x7f800000u) ? qnan : rounded);
}

inline uint16_t f32_to_fp16(float f) {
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    // normal range: rebias the exponent (-112 << 23) and round half to even on bit 13 (a carry
    // into the exponent is correct: 65520 -> inf)
    uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    // below 2^-14: adding 0.5 lines the fp16 subnormal ulp (2^-24) up with the float ulp of 0.5, so
    // the float add rounds half to even exactly where fp16 would
    uint32_t sub = f2u(u2f(a) + 0.5f) - 0x3f000000u;
    // NaN keeps its top mantissa bits (numpy), never becoming inf
    uint32_t m = (a & 0x7fffffu) >> 13;
    uint32_t nan = 0x7c00u | m | uint32_t(m == 0);
    // selects as bit masks (GCC if-converts these reliably)
    uint32_t is_sub = 0u - uint32_t(a < 0x38800000u);
    uint32_t is_inf = 0u - uint32_t(a >= 0x47800000u);   // >= 65536 (and inf): inf
    uint32_t is_nan = 0u - uint32_t(a > 0x7f800000u);
    uint32_t o = (sub & is_sub) | (normal & ~is_sub);
    o = (0x7c00u & is_inf) | (o & ~is_inf);
    o = (nan & is_nan) | (o & ~is_nan);
    return uint16_t(o | sign);
}

inline float to_f32(uint16_t v, bool bf16) { return bf16 ? bf16_to_f32(v) : fp16_to_f32(v); }
inline uint16_t from_f32(float f, bool bf16) { return bf16 ? f32_to_bf16(f) : f32_to_fp16(f); }
// The same with the format fixed at compile time, for row loops the compiler vectorises.
template <bool BF16>
inline float cvt_in(uint16_t v) { return BF16 ? bf16_to_f32(v) : fp16_to_f32(v); }
template <bool BF16>
inline uint16_t cvt_out(float f) { return BF16 ? f32_to_bf16(f) : f32_to_fp16(f); }

// rint (half to even) of |y| < 2^22, in float arithmetic.
inline float rint_small(float y) {
    const float magic = 12582912.0f;   // 1.5 * 2^23
    return (y + magic) - magic;
}

// ---- row kernels (numerics.cpp) -------------------------------------------------------------
// Elements are 16-bit (fp16 when !bf16, bf16 otherwise).

void row_to_f32(const uint16_t *src, bool bf16, float *dst, int64_t n);
void f32_to_row(const float *src, uint16_t *dst, bool bf16, int64_t n);

// acc[h] += v[h]   /   acc[h] += v[h] * w   (multiply rounded, add rounded)
void acc_add_row(float *acc, const uint16_t *src, bool bf16, int64_t n);
void acc_add_row_w(float *acc, const uint16_t *src, bool bf16, float w, int64_t n);
void acc_add_f32(float *acc, const float *v, int64_t n);
void acc_add_f32_w(float *acc, const float *v, float w, int64_t n);

// Quant mode 2: xf = float(x) [* smooth]; m = max|xf|; ds = 127/m; q = rint(xf*ds) → int8;
// returns the stored scale 1/ds. ds = +inf (m == 0, or 127/m overflowing) gives scale 0 and every
// q = 0. `tmp` holds n floats of scratch.
float quant_int8_row(const uint16_t *x, bool bf16, const float *smooth, int8_t *q, float *tmp, int64_t n);

// Comm quant 2 sender: int8 data and comm_quant_scale_count(n) block scales in the row dtype.
// `tmp` holds comm_quant_tmp_floats(n) floats of scratch.
void comm_quant_row(const uint16_t *x, bool bf16, int8_t *q, uint16_t *scales, float *tmp, int64_t n);
inline uint64_t comm_quant_tmp_floats(int64_t n) {
    // the row as floats, the block scales, one divisor per element
    return align_up(uint64_t(n), 16) + align_up(comm_quant_scale_count(n), 16) + uint64_t(n);
}
// Comm quant 2 receiver: v[h] = float(round_to_row_dtype(float(q[h]) * float(scale of its block))).
void comm_dequant_row(const int8_t *q, const uint16_t *scales, bool bf16, float *v, int64_t n);

// Const expert: a1/a2 fp32 dot products summed h ascending; softmax in double;
// v = p1*ori + p2*cv in fp32.
void const_expert_row(const uint16_t *ori, const uint16_t *alpha1, const uint16_t *alpha2,
                      const uint16_t *cv, bool bf16, float *v, int64_t n);

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
