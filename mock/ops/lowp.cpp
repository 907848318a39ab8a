// Row kernels of the Ascend 950 quantisation modes; see lowp.h. Plain loops over H with selects
// (no data-dependent branches inside the element loops) so GCC vectorises them; -ffp-contract=off
// keeps every multiply separately rounded.
#include "ops/lowp.h"

#include <cstring>

#pragma GCC optimize("vect-cost-model=dynamic")

namespace aclmock {
namespace moe {

namespace {

template <bool BF16>
void load_row(const uint16_t *__restrict x, const float *__restrict smooth, float *__restrict t, int64_t H) {
    for (int64_t h = 0; h < H; ++h) t[h] = cvt_in<BF16>(x[h]);
    if (smooth)
        for (int64_t h = 0; h < H; ++h) t[h] = t[h] * smooth[h];
}
void load(const uint16_t *x, bool bf16, const float *smooth, float *t, int64_t H) {
    bf16 ? load_row<true>(x, smooth, t, H) : load_row<false>(x, smooth, t, H);
}

inline uint32_t exp_field(float v) { return (f2u(v) >> 23) & 0xffu; }

template <class F>
void encode_nosat(const float *__restrict y, float ds, uint8_t *__restrict c, int64_t n) {
    for (int64_t h = 0; h < n; ++h) {
        float p = y[h] * ds;
        c[h] = mf_encode<F, false>(p);
    }
}

template <class F, bool BF16>
void mx_row_t(const float *__restrict t, const uint8_t *__restrict e8, uint8_t *__restrict c, int64_t H) {
    // x * 2^(127 - e8m0): a float32 multiply; bf16 rows round the product to bf16 (mode 4
    // step 4); then the saturating RNE cast. A 0xFF block (inf/NaN inside) gets code 0.
    const int64_t nb = mx_blocks(H);
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * 32, n = lo + 32 < H ? 32 : H - lo;
        const uint32_t s = e8[b];
        if (s == 0xff) {
            std::memset(c + lo, 0, size_t(n));
            continue;
        }
        const float mult = pow2f(127 - int32_t(s));
        const float *__restrict tb = t + lo;
        uint8_t *__restrict cb = c + lo;
        for (int64_t h = 0; h < n; ++h) {
            float p = tb[h] * mult;
            if (BF16) p = bf16_to_f32(f32_to_bf16(p));
            cb[h] = mf_encode<F, true>(p);
        }
    }
}

template <class F>
void mx_codes(const float *t, const uint8_t *e8, bool bf16, uint8_t *c, int64_t H) {
    bf16 ? mx_row_t<F, true>(t, e8, c, H) : mx_row_t<F, false>(t, e8, c, H);
}

template <class F, bool BF16>
void mx_dequant_t(const uint8_t *__restrict c, const uint8_t *__restrict e8, float *__restrict v, int64_t H) {
    const int64_t nb = mx_blocks(H);
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * 32, n = lo + 32 < H ? 32 : H - lo;
        const float scale = e8m0_to_f32(e8[b]);
        const uint8_t *__restrict cb = c + lo;
        float *__restrict vb = v + lo;
        for (int64_t h = 0; h < n; ++h) {
            const float d = mf_decode<F>(cb[h]) * scale;   // exact (a power of two)
            vb[h] = BF16 ? bf16_to_f32(f32_to_bf16(d)) : fp16_to_f32(f32_to_fp16(d));
        }
    }
}

// max |t[h]| over [lo, hi) as float bits (non-negative floats order like their bits; NaN bits are
// above inf's, so a NaN shows as a NaN max)
inline float abs_max(const float *__restrict t, int64_t n) {
    uint32_t m = 0;
    for (int64_t h = 0; h < n; ++h) {
        const uint32_t a = f2u(t[h]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    return u2f(m);
}

}  // namespace

void static_quant_row(const uint16_t *x, bool bf16, const float *scale, bool scalar, Fmt fmt, uint8_t *out,
                      float *tmp, int64_t H) {
    load(x, bf16, nullptr, tmp, H);
    if (scalar) {
        const float s = scale[0];
        for (int64_t h = 0; h < H; ++h) tmp[h] = tmp[h] * s;
    } else {
        for (int64_t h = 0; h < H; ++h) tmp[h] = tmp[h] * scale[h];
    }
    if (fmt == Fmt::HiF8) {
        for (int64_t h = 0; h < H; ++h) out[h] = hif8_encode(tmp[h]);
        return;
    }
    // int8: rint, saturating to [-128, 127] (clamping first is the same for integral bounds); NaN -> 0
    int8_t *q = reinterpret_cast<int8_t *>(out);
    for (int64_t h = 0; h < H; ++h) {
        uint32_t y = f2u(tmp[h]);
        y &= mask_if(tmp[h] == tmp[h]);                                  // NaN -> 0
        y = sel(mask_if(u2f(y) > 127.0f), f2u(127.0f), y);
        y = sel(mask_if(u2f(y) < -128.0f), f2u(-128.0f), y);
        q[h] = int8_t(int32_t(rint_small(u2f(y))));
    }
}

void fp8_dynamic_row(const uint16_t *x, bool bf16, const float *smooth, Fmt fmt, int64_t group, uint8_t *codes,
                     float *scales, float *tmp, int64_t H) {
    load(x, bf16, smooth, tmp, H);
    const float fmax = fp8_max(fmt);
    const int64_t ng = (H + group - 1) / group;
    for (int64_t g = 0; g < ng; ++g) {
        const int64_t lo = g * group, hi = lo + group < H ? lo + group : H;
        const float m = abs_max(tmp + lo, hi - lo);   // the tail group's zero padding only enters the max
        const float ds = fmax / m;
        scales[g] = 1.0f / ds;
        if (!(ds <= 3.4028234663852886e38f)) {
            // max 0 (or fmax/max overflowing): ds = +inf, scale 1/ds = 0, codes +0
            std::memset(codes + lo, 0, size_t(hi - lo));
            continue;
        }
        if (fmt == Fmt::E4M3)
            encode_nosat<E4M3T>(tmp + lo, ds, codes + lo, hi - lo);
        else
            encode_nosat<E5M2T>(tmp + lo, ds, codes + lo, hi - lo);
    }
}

void mx_quant_row(const uint16_t *x, bool bf16, Fmt fmt, bool clip, uint8_t *codes, uint8_t *e8, float *tmp,
                  int64_t H) {
    const int64_t nb = mx_blocks(H);
    load(x, bf16, nullptr, tmp, H);
    uint8_t *c = reinterpret_cast<uint8_t *>(tmp + align_up(uint64_t(H), 128));   // unpacked codes
    const int32_t emax = fmt_emax(fmt);
    const float inv = 1.0f / fp8_max(fmt);   // mode 5: the float32-rounded reciprocal
    const float floor_t = float(1e-4);        // float32(1e-4), rounded from the double like numpy
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * 32, hi = lo + 32 < H ? lo + 32 : H;   // the tail's zero padding adds nothing
        uint32_t ef = 0;
        for (int64_t h = lo; h < hi; ++h) {
            const uint32_t f = exp_field(tmp[h]);
            ef = f > ef ? f : ef;
        }
        const float amax = abs_max(tmp + lo, hi - lo);   // finite when ef < 255
        uint32_t s;
        if (ef == 255) {
            s = 255;                                                    // inf / NaN in the block
        } else if (!clip) {
            s = int32_t(ef) > emax ? ef - uint32_t(emax) : 0;          // mode 4 step 3
        } else if (amax == 0.0f) {
            s = 0;
        } else {                                                        // mode 5 step 3
            const float t = (amax > floor_t ? amax : floor_t) * inv;
            const uint32_t tb = f2u(t), ex = (tb >> 23) & 0xffu, mn = tb & 0x7fffffu;
            const bool up = (ex > 0 && ex < 254 && mn > 0) || (ex == 0 && mn > 0x400000u);
            s = ex + (up ? 1u : 0u);
        }
        e8[b] = uint8_t(s);
    }
    switch (fmt) {
    case Fmt::E4M3: mx_codes<E4M3T>(tmp, e8, bf16, codes, H); break;
    case Fmt::E5M2: mx_codes<E5M2T>(tmp, e8, bf16, codes, H); break;
    case Fmt::E2M1: mx_codes<E2M1T>(tmp, e8, bf16, c, H); break;
    case Fmt::E1M2: mx_codes<E1M2T>(tmp, e8, bf16, c, H); break;
    default: break;
    }
    if (is_fp4(fmt))
        for (int64_t i = 0; i < H / 2; ++i) codes[i] = uint8_t((c[2 * i] & 0x0f) | ((c[2 * i + 1] & 0x0f) << 4));
}

void mx_dequant_row(const uint8_t *codes, const uint8_t *e8, Fmt fmt, bool bf16, float *v, int64_t H) {
    if (fmt == Fmt::E4M3)
        bf16 ? mx_dequant_t<E4M3T, true>(codes, e8, v, H) : mx_dequant_t<E4M3T, false>(codes, e8, v, H);
    else
        bf16 ? mx_dequant_t<E5M2T, true>(codes, e8, v, H) : mx_dequant_t<E5M2T, false>(codes, e8, v, H);
}

}  // namespace moe
}  // namespace aclmock
