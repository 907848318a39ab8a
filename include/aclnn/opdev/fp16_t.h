/* op::fp16_t: the IEEE 754 binary16 host type that CANN programs use to fill and read float16 tensors.
 *
 * Written for aclnn-py from CANN's documented interface (the public member `val` holds the bits; a value
 * of any arithmetic type converts to it; it converts back to float, double, the integer types and bool;
 * + - * / and comparisons). Header-only: a program that includes it links against nothing more.
 *
 * Every conversion into fp16_t rounds to nearest, ties to even, as the device does; arithmetic is done in
 * double and rounded once (double has more than 2*11+2 significand bits, so the result is the correctly
 * rounded binary16 result). Out-of-range values become +-infinity; NaN stays NaN. Conversions to integer
 * types truncate toward zero and saturate (NaN gives 0), so no conversion has undefined behaviour. */
#ifndef ACLNN_OPDEV_FP16_T_H_
#define ACLNN_OPDEV_FP16_T_H_

#ifndef __cplusplus
#error "aclnn/opdev/fp16_t.h is a C++ header"
#endif

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace op {

namespace fp16_detail {

constexpr uint16_t kSignMask = 0x8000u;
constexpr uint16_t kExpMask = 0x7C00u;
constexpr uint16_t kManMask = 0x03FFu;
constexpr uint16_t kInfBits = 0x7C00u;
constexpr uint16_t kQuietNanBits = 0x7E00u;

inline uint16_t FromDouble(double d) {
    const uint16_t sign = std::signbit(d) ? kSignMask : 0u;
    if (std::isnan(d)) return static_cast<uint16_t>(sign | kQuietNanBits);
    const double a = std::fabs(d);
    // 65520 lies halfway between the largest finite half (65504) and 2^16; ties go to the even neighbour,
    // which is infinity's encoding.
    if (a >= 65520.0) return static_cast<uint16_t>(sign | kInfBits);
    if (a < 6.103515625e-05) {  // below 2^-14: a subnormal (or zero) in units of 2^-24
        const double units = std::nearbyint(std::ldexp(a, 24));
        return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));  // 1024 is 2^-14's own encoding
    }
    int e2 = 0;
    (void)std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
    int exponent = e2 - 1;
    double significand = std::nearbyint(std::ldexp(a, 10 - exponent));  // in [1024, 2048]
    if (significand >= 2048.0) {
        significand = 1024.0;
        ++exponent;
    }
    if (exponent > 15) return static_cast<uint16_t>(sign | kInfBits);
    const uint16_t biased = static_cast<uint16_t>(exponent + 15);
    return static_cast<uint16_t>(sign | (biased << 10) | (static_cast<uint16_t>(significand) - 1024u));
}

inline double ToDouble(uint16_t bits) {
    const bool negative = (bits & kSignMask) != 0;
    const int exp = (bits & kExpMask) >> 10;
    const int man = bits & kManMask;
    double magnitude;
    if (exp == 0x1F) {
        magnitude = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    } else if (exp == 0) {
        magnitude = std::ldexp(static_cast<double>(man), -24);
    } else {
        magnitude = std::ldexp(static_cast<double>(man | 0x400), exp - 25);
    }
    return negative ? -magnitude : magnitude;
}

template <typename I>
inline I ToInteger(double v) {
    if (std::isnan(v)) return 0;
    const double t = std::trunc(v);
    if (t <= static_cast<double>(std::numeric_limits<I>::lowest())) return std::numeric_limits<I>::lowest();
    if (t >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
    return static_cast<I>(t);
}

}  // namespace fp16_detail

typedef struct tagFp16 {
    uint16_t val;  // the binary16 bits: sign, 5 exponent bits, 10 mantissa bits

    tagFp16() : val(0u) {}
    // A uint16_t given to the constructor is taken as the bits themselves (CANN's convention); assigning
    // one converts its value.
    constexpr tagFp16(const uint16_t &bits) : val(bits) {}
    tagFp16(const tagFp16 &other) = default;
    template <typename T, typename = typename std::enable_if<std::is_arithmetic<T>::value>::type>
    tagFp16(const T &value) : val(0u) {
        *this = value;
    }

    tagFp16 &operator=(const tagFp16 &other) = default;
    tagFp16 &operator=(const float &v) { return Set(static_cast<double>(v)); }
    tagFp16 &operator=(const double &v) { return Set(v); }
    tagFp16 &operator=(const int8_t &v) { return Set(static_cast<double>(v)); }
    tagFp16 &operator=(const uint8_t &v) { return Set(static_cast<double>(v)); }
    tagFp16 &operator=(const int16_t &v) { return Set(static_cast<double>(v)); }
    tagFp16 &operator=(const uint16_t &v) { return Set(static_cast<double>(v)); }
    tagFp16 &operator=(const int32_t &v) { return Set(static_cast<double>(v)); }
    tagFp16 &operator=(const uint32_t &v) { return Set(static_cast<double>(v)); }
    tagFp16 &operator=(const int64_t &v) { return Set(static_cast<double>(v)); }
    tagFp16 &operator=(const uint64_t &v) { return Set(static_cast<double>(v)); }
    // the arithmetic types not named above (bool, char, long long where it differs from int64_t ...)
    template <typename T>
    typename std::enable_if<std::is_arithmetic<T>::value, tagFp16 &>::type operator=(const T &v) {
        return Set(static_cast<double>(v));
    }

    // Computed in double and rounded once to half: double's 53 bits exceed twice half's 11 plus 2, so
    // the result is the correctly rounded half one (as the hardware's), with no double rounding; the
    // comparisons are exact because every half is a double.
    tagFp16 operator+(const tagFp16 fp) const { return Made(toDouble() + fp.toDouble()); }
    tagFp16 operator-(const tagFp16 fp) const { return Made(toDouble() - fp.toDouble()); }
    tagFp16 operator*(const tagFp16 fp) const { return Made(toDouble() * fp.toDouble()); }
    tagFp16 operator/(const tagFp16 fp) const { return Made(toDouble() / fp.toDouble()); }
    tagFp16 operator+=(const tagFp16 fp) { return *this = *this + fp; }
    tagFp16 operator-=(const tagFp16 fp) { return *this = *this - fp; }
    tagFp16 operator*=(const tagFp16 fp) { return *this = *this * fp; }
    tagFp16 operator/=(const tagFp16 fp) { return *this = *this / fp; }

    // IEEE comparisons: NaN is unordered, +0 equals -0
    bool operator==(const tagFp16 &fp) const { return toDouble() == fp.toDouble(); }
    bool operator!=(const tagFp16 &fp) const { return !(*this == fp); }
    bool operator>(const tagFp16 &fp) const { return toDouble() > fp.toDouble(); }
    bool operator>=(const tagFp16 &fp) const { return toDouble() >= fp.toDouble(); }
    bool operator<(const tagFp16 &fp) const { return toDouble() < fp.toDouble(); }
    bool operator<=(const tagFp16 &fp) const { return toDouble() <= fp.toDouble(); }

    operator float() const { return static_cast<float>(toDouble()); }  // exact: every half is a float
    operator double() const { return toDouble(); }
    operator int8_t() const { return fp16_detail::ToInteger<int8_t>(toDouble()); }
    operator uint8_t() const { return fp16_detail::ToInteger<uint8_t>(toDouble()); }
    operator int16_t() const { return fp16_detail::ToInteger<int16_t>(toDouble()); }
    operator uint16_t() const { return fp16_detail::ToInteger<uint16_t>(toDouble()); }
    operator int32_t() const { return fp16_detail::ToInteger<int32_t>(toDouble()); }
    operator uint32_t() const { return fp16_detail::ToInteger<uint32_t>(toDouble()); }
    operator int64_t() const { return fp16_detail::ToInteger<int64_t>(toDouble()); }
    operator uint64_t() const { return fp16_detail::ToInteger<uint64_t>(toDouble()); }
    operator bool() const { return (val & 0x7FFFu) != 0; }  // -0 is false, NaN is true

    // 1 for +infinity, -1 for -infinity, 0 otherwise
    int IsInf() const {
        if ((val & 0x7FFFu) != fp16_detail::kInfBits) return 0;
        return (val & fp16_detail::kSignMask) ? -1 : 1;
    }

    float toFloat() const { return static_cast<float>(toDouble()); }
    double toDouble() const { return fp16_detail::ToDouble(val); }
    int8_t toInt8() const { return static_cast<int8_t>(*this); }
    uint8_t toUInt8() const { return static_cast<uint8_t>(*this); }
    int16_t toInt16() const { return static_cast<int16_t>(*this); }
    uint16_t toUInt16() const { return static_cast<uint16_t>(*this); }
    int32_t toInt32() const { return static_cast<int32_t>(*this); }
    uint32_t toUInt32() const { return static_cast<uint32_t>(*this); }

private:
    tagFp16 &Set(double v) {
        val = fp16_detail::FromDouble(v);
        return *this;
    }
    static tagFp16 Made(double v) {
        tagFp16 out;
        return out.Set(v);
    }
} fp16_t;

static_assert(sizeof(fp16_t) == 2, "fp16_t must have the size of a device float16 element");

// a number on the left of a comparison with an fp16_t is compared in its own type
template <typename T, typename = typename std::enable_if<std::is_arithmetic<T>::value>::type>
bool operator<(T a, fp16_t b) {
    return a < static_cast<T>(b);
}

template <typename T, typename = typename std::enable_if<std::is_arithmetic<T>::value>::type>
bool operator>(T a, fp16_t b) {
    return a > static_cast<T>(b);
}

}  // namespace op

namespace std {
inline bool isnan(op::fp16_t value) {
    return (value.val & 0x7C00u) == 0x7C00u && (value.val & 0x03FFu) != 0;
}

inline float abs(op::fp16_t value) {
    return std::fabs(value.toFloat());
}
}  // namespace std

#endif  // ACLNN_OPDEV_FP16_T_H_
