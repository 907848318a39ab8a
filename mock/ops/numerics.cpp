// Row kernels of the mock MoE ops; see numerics.h. Plain loops over H that GCC vectorises at -O2
// (-ffp-contract=off keeps every multiply and add separately rounded).
#include "ops/numerics.h"

#include <cmath>

#include "ops/moe_window.h"

// The row loops below have run-time trip counts; GCC's -O2 "very cheap" cost model leaves most of
// them scalar. The dynamic model vectorises them (with scalar epilogues). No fast-math: results
// stay bit-exact.
#pragma GCC optimize("vect-cost-model=dynamic")

namespace aclmock {
namespace moe {

namespace {

template <bool BF16>
void row_to_f32_t(const uint16_t *__restrict src, float *__restrict dst, int64_t n) {
    for (int64_t h = 0; h < n; ++h) dst[h] = cvt_in<BF16>(src[h]);
}
template <bool BF16>
void f32_to_row_t(const float *__restrict src, uint16_t *__restrict dst, int64_t n) {
    for (int64_t h = 0; h < n; ++h) dst[h] = cvt_out<BF16>(src[h]);
}
template <bool BF16>
void acc_add_row_t(float *__restrict acc, const uint16_t *__restrict src, int64_t n) {
    for (int64_t h = 0; h < n; ++h) acc[h] = acc[h] + cvt_in<BF16>(src[h]);
}
template <bool BF16>
void acc_add_row_w_t(float *__restrict acc, const uint16_t *__restrict src, float w, int64_t n) {
    for (int64_t h = 0; h < n; ++h) {
        float p = cvt_in<BF16>(src[h]) * w;
        acc[h] = acc[h] + p;
    }
}

typedef float v4f __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

inline bool finite_pos(float m) { return m <= 3.4028234663852886e38f; }   // false for inf / NaN

}  // namespace

void row_to_f32(const uint16_t *src, bool bf16, float *dst, int64_t n) {
    bf16 ? row_to_f32_t<true>(src, dst, n) : row_to_f32_t<false>(src, dst, n);
}
void f32_to_row(const float *src, uint16_t *dst, bool bf16, int64_t n) {
    bf16 ? f32_to_row_t<true>(src, dst, n) : f32_to_row_t<false>(src, dst, n);
}
void acc_add_row(float *acc, const uint16_t *src, bool bf16, int64_t n) {
    bf16 ? acc_add_row_t<true>(acc, src, n) : acc_add_row_t<false>(acc, src, n);
}
void acc_add_row_w(float *acc, const uint16_t *src, bool bf16, float w, int64_t n) {
    bf16 ? acc_add_row_w_t<true>(acc, src, w, n) : acc_add_row_w_t<false>(acc, src, w, n);
}
void acc_add_f32(float *__restrict acc, const float *__restrict v, int64_t n) {
    for (int64_t h = 0; h < n; ++h) acc[h] = acc[h] + v[h];
}
void acc_add_f32_w(float *__restrict acc, const float *__restrict v, float w, int64_t n) {
    for (int64_t h = 0; h < n; ++h) {
        float p = v[h] * w;
        acc[h] = acc[h] + p;
    }
}

float quant_int8_row(const uint16_t *x, bool bf16, const float *smooth, int8_t *__restrict q,
                     float *__restrict tmp, int64_t n) {
    row_to_f32(x, bf16, tmp, n);
    if (smooth) {
        for (int64_t h = 0; h < n; ++h) tmp[h] = tmp[h] * smooth[h];
    }
    float m = 0.0f;
    bool nan = false;
    for (int64_t h = 0; h < n; ++h) {
        float a = std::fabs(tmp[h]);
        nan |= (a != a);
        m = a > m ? a : m;
    }
    float ds = 127.0f / m;
    float scale = 1.0f / ds;
    if (!finite_pos(ds)) {
        // m == 0 (all-zero row) or 127/m overflows: ds = +inf, stored scale 1/ds = 0, values 0
        // (the all-zero-row rule, applied to every ds = +inf).
        std::memset(q, 0, size_t(n));
        return scale;
    }
    if (!nan && finite_pos(m)) {
        for (int64_t h = 0; h < n; ++h) {
            float y = tmp[h] * ds;
            q[h] = int8_t(int32_t(rint_small(y)));
        }
    } else {
        // inf/NaN in the row (undefined on hardware): NaN products give 0, the rest rint + clamp.
        for (int64_t h = 0; h < n; ++h) {
            float y = tmp[h] * ds;
            if (y != y) { q[h] = 0; continue; }
            y = y > 127.0f ? 127.0f : (y < -127.0f ? -127.0f : y);
            q[h] = int8_t(int32_t(rint_small(y)));
        }
    }
    return scale;
}

void comm_quant_row(const uint16_t *x, bool bf16, int8_t *__restrict q, uint16_t *__restrict scales,
                    float *__restrict tmp, int64_t n) {
    // tmp: n floats of the row, one float per 8-element block (the unrounded fp32 scale sc), one
    // divisor per element
    const int64_t nsc = int64_t(comm_quant_scale_count(n));
    const int64_t nfull = n / 8;
    const float inv127 = 1.0f / 127.0f;
    float *__restrict sc = tmp + align_up(uint64_t(n), 16);
    float *__restrict dv = sc + align_up(uint64_t(nsc), 16);
    row_to_f32(x, bf16, tmp, n);
    uint32_t nonfinite = 0;                      // exponent all ones somewhere (inf / NaN)
    for (int64_t h = 0; h < n; ++h) nonfinite |= ((f2u(tmp[h]) & 0x7f800000u) + 0x00800000u) >> 31;
    const bool nan = nonfinite != 0;
    for (int64_t b = 0; b < nfull; ++b) {        // block max |x|, 2 x 4 lanes then across the lanes
        v4u ua, ub;
        std::memcpy(&ua, tmp + b * 8, 16);
        std::memcpy(&ub, tmp + b * 8 + 4, 16);
        v4f a = (v4f)(ua & 0x7fffffffu), c = (v4f)(ub & 0x7fffffffu);
        v4f m = a > c ? a : c;
        float m01 = m[0] > m[1] ? m[0] : m[1], m23 = m[2] > m[3] ? m[2] : m[3];
        sc[b] = (m01 > m23 ? m01 : m23) * inv127;
    }
    for (int64_t b = nfull; b < nsc; ++b) {      // the tail block is zero-padded, later ones all padding
        float bm = 0.0f;
        for (int64_t h = b * 8; h < b * 8 + 8 && h < n; ++h) {
            float a = std::fabs(tmp[h]);
            bm = a > bm ? a : bm;
        }
        sc[b] = bm * inv127;
    }
    bool finite = !nan;
    for (int64_t b = 0; b < nsc; ++b) finite &= sc[b] <= 3.4028234663852886e38f;
    for (int64_t b = 0; b < nsc; ++b) scales[b] = from_f32(sc[b], bf16);
    if (finite) {
        // q = int8(rint(xf / sc)), dividing by the unrounded fp32 sc: |xf / sc| <= 127.00002. An
        // all-zero block (sc = 0) divides its zeros by 1 instead: values 0.
        for (int64_t b = 0; b < nfull; ++b) {
            const float d = sc[b] > 0.0f ? sc[b] : 1.0f;
            for (int i = 0; i < 8; ++i) dv[b * 8 + i] = d;
        }
        for (int64_t h = nfull * 8; h < n; ++h) dv[h] = sc[h / 8] > 0.0f ? sc[h / 8] : 1.0f;
        for (int64_t h = 0; h < n; ++h) q[h] = int8_t(int32_t(rint_small(tmp[h] / dv[h])));
        return;
    }
    // inf/NaN in the row (undefined on hardware): NaN quotients give 0, the rest rint + clamp
    for (int64_t h = 0; h < n; ++h) {
        float y = tmp[h] / sc[h / 8];
        if (y != y) y = 0.0f;
        y = y > 127.0f ? 127.0f : (y < -127.0f ? -127.0f : y);
        q[h] = int8_t(int32_t(rint_small(y)));
    }
}

void comm_dequant_row(const int8_t *__restrict q, const uint16_t *__restrict scales, bool bf16,
                      float *__restrict v, int64_t n) {
    // v first holds each element's block scale (as float), then the dequantised value
    const int64_t nfull = n / 8;
    for (int64_t b = 0; b < nfull; ++b) {
        const float s = to_f32(scales[b], bf16);
        for (int i = 0; i < 8; ++i) v[b * 8 + i] = s;
    }
    for (int64_t h = nfull * 8; h < n; ++h) v[h] = to_f32(scales[h / 8], bf16);
    if (bf16) {
        for (int64_t h = 0; h < n; ++h) v[h] = bf16_to_f32(f32_to_bf16(float(q[h]) * v[h]));
    } else {
        for (int64_t h = 0; h < n; ++h) v[h] = fp16_to_f32(f32_to_fp16(float(q[h]) * v[h]));
    }
}

void const_expert_row(const uint16_t *ori, const uint16_t *alpha1, const uint16_t *alpha2,
                      const uint16_t *cv, bool bf16, float *v, int64_t n) {
    float a1 = 0.0f, a2 = 0.0f;
    for (int64_t h = 0; h < n; ++h) {
        float o = to_f32(ori[h], bf16);
        float p1 = to_f32(alpha1[h], bf16) * o;
        float p2 = to_f32(alpha2[h], bf16) * o;
        a1 = a1 + p1;
        a2 = a2 + p2;
    }
    double d1 = a1, d2 = a2;
    double m = d1 > d2 ? d1 : d2;
    double e1 = std::exp(d1 - m), e2 = std::exp(d2 - m);
    double den = e1 + e2;
    float p1 = float(e1 / den), p2 = float(e2 / den);
    for (int64_t h = 0; h < n; ++h) {
        float t1 = p1 * to_f32(ori[h], bf16);
        float t2 = p2 * to_f32(cv[h], bf16);
        v[h] = t1 + t2;
    }
}

}  // namespace moe
}  // namespace aclmock
