// 64-bit fingerprints of byte strings (private to mock/ops): whether a buffer still holds what a
// kernel wrote there. hash_bytes reads every byte (fed in pieces of any size through Hasher::update,
// or at once; both give the same value); sample_hash reads a bounded sample of a large buffer. Not cryptographic: contents that differ by accident are
// told apart (a change anywhere, rows swapped), crafted collisions are not resisted.
#pragma once

#include <cstdint>

#pragma GCC visibility push(hidden)  // nothing but the four aclnn entry points is exported

namespace aclmock {
namespace moe {

class Hasher {
public:
    void update(const void *p, uint64_t n);
    uint64_t finish() const;

private:
    void stripes(const uint8_t *b, uint64_t n);   // n whole 64-byte stripes
    uint64_t acc_[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint64_t stripe_ = 0;      // stripes consumed (each stripe's key depends on its position)
    uint8_t pend_[64];         // bytes of an incomplete stripe
    uint32_t npend_ = 0;
    uint64_t total_ = 0;
};

uint64_t hash_bytes(const void *p, uint64_t n);

// A fingerprint of n bytes that reads at most 640 bytes: the whole string when it is short, else its
// first and last kSampleEdgeBytes and kSampleWords 8-byte words spread evenly between them. It tells
// whether a large buffer still holds what was written there (a buffer rewritten with other data
// differs almost surely at the sampled words), at no cost proportional to its size. Every dispatch
// samples its expand_x and every combine its input once: the sample is kept small because both run
// on every rank in every round (a 2.5 KiB sample took about 6 % of the instructions of a 64-rank
// thread world's round, callgrind).
constexpr uint64_t kSampleEdgeBytes = 64, kSampleWords = 64;
uint64_t sample_hash(const void *p, uint64_t n);

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
