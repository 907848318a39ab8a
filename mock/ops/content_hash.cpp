// The fingerprint of content_hash.h. Per 64-byte stripe s and 64-bit lane l (of 8):
//   v = w[l] ^ (key[l] + s * golden), acc[l] += w[l ^ 1] + low32(v) * high32(v)
// (the accumulate step of XXH3, with a key that moves with the stripe so that reordered rows change
// the result), then the lanes, the tail (as 8-byte words) and the length are mixed with multiplies. It runs at
// about the speed of a memcpy (≈10 GB/s measured), so it is used for small buffers only (routing
// tensors, expert ids); large ones are sampled.

#include "ops/content_hash.h"

#include <cstring>

namespace aclmock {
namespace moe {

namespace {
constexpr uint64_t kKey[8] = {0xbe4ba423396cfeb8ull, 0x1cad21f72c81017cull, 0xdb979083e96dd4deull,
                              0x1f67b3b7a4a44072ull, 0x78e5c0cc4ee679cbull, 0x2172ffcc7dd05a82ull,
                              0x8e2443f7744608b8ull, 0x4c263a81e69035e0ull};
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

inline uint64_t mix(uint64_t h, uint64_t w) {
    h ^= w * kGolden;
    h = (h << 31) | (h >> 33);
    return h * 0xbf58476d1ce4e5b9ull;
}
}  // namespace

void Hasher::stripes(const uint8_t *b, uint64_t n) {
    // local accumulators: the input bytes may alias any member, which would keep them in memory
    uint64_t acc[8];
    std::memcpy(acc, acc_, sizeof acc);
    uint64_t stripe = stripe_;
    for (uint64_t s = 0; s < n; ++s, ++stripe) {
        uint64_t w[8];
        std::memcpy(w, b + 64 * s, 64);
        const uint64_t salt = stripe * kGolden;
        for (int l = 0; l < 8; ++l) {
            const uint64_t v = w[l] ^ (kKey[l] + salt);
            acc[l] += w[l ^ 1] + (v & 0xffffffffull) * (v >> 32);
        }
    }
    std::memcpy(acc_, acc, sizeof acc);
    stripe_ = stripe;
}

void Hasher::update(const void *p, uint64_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    total_ += n;
    if (npend_) {   // complete the pending stripe first
        const uint64_t take = n < 64 - npend_ ? n : 64 - npend_;
        std::memcpy(pend_ + npend_, b, take);
        npend_ += uint32_t(take);
        b += take;
        n -= take;
        if (npend_ < 64) return;
        stripes(pend_, 1);
        npend_ = 0;
    }
    stripes(b, n / 64);
    std::memcpy(pend_, b + n / 64 * 64, n % 64);
    npend_ = uint32_t(n % 64);
}

uint64_t Hasher::finish() const {
    uint64_t h = total_;
    for (uint64_t a : acc_) h = mix(h, a);
    // the tail word by word, the last one zero-padded (the length mixed in last tells the padding
    // from zero bytes): a 60-byte tail costs 8 mixes, not 60
    for (uint32_t i = 0; i < npend_; i += 8) {
        uint64_t w = 0;
        std::memcpy(&w, pend_ + i, npend_ - i < 8 ? npend_ - i : 8);
        h = mix(h, w);
    }
    return mix(h, total_);
}

uint64_t hash_bytes(const void *p, uint64_t n) {
    Hasher h;
    h.update(p, n);
    return h.finish();
}

uint64_t sample_hash(const void *p, uint64_t n) {
    constexpr uint64_t kEdge = kSampleEdgeBytes, kWords = kSampleWords;
    if (n <= 2 * kEdge + 8 * kWords) return hash_bytes(p, n);
    // the sample gathered first and hashed in one pass (the same value as feeding its pieces in turn)
    const uint8_t *b = static_cast<const uint8_t *>(p);
    uint8_t sample[2 * kEdge + 8 * kWords];
    std::memcpy(sample, b, kEdge);
    std::memcpy(sample + kEdge, b + n - kEdge, kEdge);
    const uint64_t span = n - 2 * kEdge - 8;
    for (uint64_t i = 0; i < kWords; ++i) std::memcpy(sample + 2 * kEdge + 8 * i, b + kEdge + span * i / (kWords - 1), 8);
    return mix(hash_bytes(sample, sizeof sample), n);
}

}  // namespace moe
}  // namespace aclmock
