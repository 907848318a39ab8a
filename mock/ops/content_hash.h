// A fast 64-bit fingerprint of a byte string (private to mock/ops): tells whether a buffer still
// holds what a kernel wrote there. Fed in pieces of any size (Hasher::update) or at once
// (hash_bytes); both give the same value. Not cryptographic: contents that differ by accident are
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

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
