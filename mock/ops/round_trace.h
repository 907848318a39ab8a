// Pairing of combine calls with the dispatch calls whose outputs they consume (private to mock/ops).
//
// Every rank must run dispatch and combine in the same order on a communicator; a combine then
// returns each expert row to the token that the same dispatch call sent (docs/operators.md, call
// order). Ranks that disagree about which dispatch a combine belongs to would mix rows of different
// calls with matching shapes, so the mock traces it:
//
//  * each dispatch records, per communicator (in its hccl::Comm::state), what it wrote: its
//    collective call number (the "round"), and in which aclTensor (its serial: the very descriptor,
//    not an address that a later allocation may reuse) and with what content its assist_info_for_combine triples [0, 3N), its
//    ep_recv_counts [0, slots) and (fp16 / bf16 outputs) its expand_x rows [0, N) are (a sampled
//    fingerprint, content_hash.h), and what its expert_ids input held;
//  * a combine finds the dispatch its assist_info_for_combine and ep_send_counts come from (the
//    newest record of the same descriptor whose content still matches, else the newest record written
//    at the same address whose content still matches — a repeatable executor reads and writes through
//    descriptors of its own, rebound to the caller's memory —, else the only round whose content
//    matches, empty content matching nothing), refuses inputs of two different traced
//    rounds, and expert_ids or an unchanged expand_x (the same descriptor) that belong to another
//    traced round than its routing inputs;
//  * the combine carries its round with its rows to every receiver of them (two int32 of the
//    receiver's mailbox counts, kRoundSlotBase + 2*src, next to the row count stamped with the call),
//    and every receiver compares the rounds of the senders whose rows it got with its own: a
//    difference fails the kernel, naming the ranks and both rounds.
//
// Inputs that cannot be traced (built by hand, copied and then changed, their dispatch's record
// evicted, empty, or content shared by several rounds in another descriptor) have an unknown round
// and are accepted as before. The records of the last kRecordsPerComm dispatches of each communicator are
// kept.
#pragma once

#include <cstdint>
#include <string>

#include "hccl/hccl_core.h"

#include "ops/content_hash.h"

#pragma GCC visibility push(hidden)  // nothing but the four aclnn entry points is exported

namespace aclmock {
namespace moe {

// Mailbox counts [kRoundSlotBase, kRoundSlotBase + 2 * W) carry each sender's round + 1 (0 =
// unknown), low word first; dispatch uses counts below L*W <= 2048 and combine below W.
constexpr int kRoundSlotBase = 2048;
constexpr int64_t kUnknownRound = -1;
constexpr size_t kRecordsPerComm = 64;

// The aclTensor (serial) a region was read through or written to, its address, and the fingerprint
// of its first `bytes` bytes (sample_hash when `sampled`, else hash_bytes).
struct Traced {
    uint64_t desc = 0;
    uint64_t addr = 0;
    uint64_t bytes = 0;
    uint64_t hash = 0;
    bool sampled = false;
};

// What one dispatch wrote (and read, for expert_ids).
struct DispatchRecord {
    int64_t round = kUnknownRound;
    Traced assist;     // int32 triples [0, 3N)
    Traced counts;     // int32 [0, receive slots)
    Traced ids;        // the expert_ids input (BS, K)
    Traced expand_x;   // rows [0, N) when expand_x is fp16 / bf16 (else addr is null)
};

inline Traced traced(uint64_t desc, const void *p, uint64_t n) {
    return Traced{desc, uint64_t(uintptr_t(p)), n, hash_bytes(p, n), false};
}
inline Traced sampled(uint64_t desc, const void *p, uint64_t n) {
    return Traced{desc, uint64_t(uintptr_t(p)), n, sample_hash(p, n), true};
}

void record_dispatch(hccl::Comm &comm, const DispatchRecord &r);

// The inputs of one combine, with the bytes each tensor holds (what may be hashed).
struct CombineInputs {
    struct Input {
        uint64_t desc = 0;       // aclTensor serial
        const void *data = nullptr;
        uint64_t bytes = 0;      // what may be hashed
    };
    Input assist, counts, ids, expand_x;   // counts: the receive slots of this rank's role
};

// The round a combine's routing inputs belong to (kUnknownRound when untraced), or a message when
// its inputs belong to different traced rounds.
struct CombineRound {
    int64_t round = kUnknownRound;
    std::string error;
};
CombineRound trace_combine(hccl::Comm &comm, const CombineInputs &in);

// The two mailbox words of a round, and back.
inline void put_round(int32_t *counts, int64_t src, int64_t round) {
    const uint64_t v = uint64_t(round + 1);
    counts[kRoundSlotBase + 2 * src] = int32_t(uint32_t(v));
    counts[kRoundSlotBase + 2 * src + 1] = int32_t(uint32_t(v >> 32));
}
inline int64_t get_round(const int32_t *counts, int64_t src) {
    const uint64_t v = uint64_t(uint32_t(counts[kRoundSlotBase + 2 * src])) |
                       (uint64_t(uint32_t(counts[kRoundSlotBase + 2 * src + 1])) << 32);
    return int64_t(v) - 1;
}

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
