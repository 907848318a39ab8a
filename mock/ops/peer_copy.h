// Rows copied into a peer's window (private to mock/ops).
//
// A rank writes each row it sends into the receiver's window, and the receiver reads it on its own
// turn. When a round moves more than the last-level cache holds, the row has left every cache by
// then, and an ordinary copy only costs more: it first reads each destination line (to write part of
// it) and leaves the line in the sender's cache, evicting what the sender uses again. Streaming
// stores write the row to memory directly. In a small world they would cost instead: the receiver,
// often running at the same time, then reads from memory what it found in the shared cache. So the
// kernels stream when the world's rows of a call (W times what this rank sends, the ranks' loads
// taken alike) exceed a quarter of the last-level cache. With a 32 MiB cache a W = 256 process world
// (~140 KiB per rank and call) and the W = 8 reference round (15 MB per rank) stream, a W = 16
// process world and a thread world of 768 ranks with one 2 KiB row each do not.
//
// Streaming stores are not ordered with the stores after them: a streamed copy ends with a store
// fence, so whatever publishes the row afterwards (a count, the arrival) is seen after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#endif

#pragma GCC visibility push(hidden)

namespace aclmock {
namespace moe {

// Below this a row is a few lines: the fence would cost more than the reads it saves.
constexpr size_t kStreamingCopyMin = 512;

// Whether a call whose rank sends `bytes_per_rank` in a world of `W` ranks streams its rows.
bool stream_rows(int64_t W, uint64_t bytes_per_rank);

// `streaming`: stream_rows' answer for the call.
inline void copy_to_peer(void *dst, const void *src, size_t n, bool streaming) {
#if defined(__x86_64__) || defined(__i386__)
    if (streaming && n >= kStreamingCopyMin && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
        auto *d = static_cast<__m128i *>(dst);
        const auto *s = static_cast<const __m128i *>(src);
        const size_t blocks = n / 16;
        for (size_t i = 0; i < blocks; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(s + i));
        if (const size_t tail = n % 16)
            std::memcpy(static_cast<uint8_t *>(dst) + blocks * 16, static_cast<const uint8_t *>(src) + blocks * 16, tail);
        _mm_sfence();
        return;
    }
#endif
    std::memcpy(dst, src, n);
}

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
