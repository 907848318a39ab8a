// Window layout of the mock MoeDistributeDispatchV5 / CombineV5 kernels (private to mock/ops).
//
// Every rank's HCCL window (mock/hccl/hccl_core.h) is
//   [0, 1 MiB)     status area: header + two Mailbox halves (per-slot counts; in rank 0's window
//                  also the world's hub of entries and arrivals), owned by mock/hccl
//   [1 MiB, end)   data area, two halves; a call with sequence number seq uses half seq % 2
//                  (Comm::data_half(rank, seq % 2)).
//
// Inside one data half of a receiving rank the ops use:
//
//   offset 0                         DISPATCH REGION, maxBs * Td * W * L bytes
//     block b = idx * maxBs rows of Td bytes, where idx is the receiver's status slot:
//       MoE rank:    idx = j*W + src   (local expert j, source rank src), idx < L*W
//       shared rank: idx = src                                          , idx < W
//     row i of block idx = the i-th row sender src wrote for that slot, in the sender's ascending
//     flattened t*K+k order (shared rank: compacted valid-token order). One row (Td bytes):
//       [0, D)            payload, D = align(2H, 32): quant 0 → H elements of x's dtype (2H bytes,
//                         copied), quant 2 → H int8
//       [D, D+32)         the "32-byte scale slot": float32 dynamic scale (quant 2) at D+0,
//                         float32 top-k weight (expert_scales[t,k]) at D+4, rest unused
//       [D+32, D+44)      int32 triple (src_rank, src_token_index, k_slot)
//     so one row uses D + 44 bytes <= Td (Td = align(D+44, 512), fullmesh_v2: ceil((D+44)/480)*512).
//     The per-slot row counts travel in the receiver's Mailbox counts[idx] (same half), written
//     only for slots that get rows (hccl::put_count; the others read 0 through hccl::count_of).
//
//   offset maxBs * Td * W * L         COMBINE REGION, maxBs * Tc * (K+S) bytes, Tc = align(2H, 512)
//     slot (t, k) = t*(K+S) + k holds the expert output for token t of the receiving rank, top-k
//     slot k (k >= K: shared expert k-K). One slot (Tc bytes):
//       comm_quant 0: H elements of the row dtype (2H bytes)
//       comm_quant 2: H int8 at 0, then at align(H, 32) the per-8-element block scales in the row
//                     dtype (ceil(H/16)*2 of them)
//     The number of rows each sender wrote travels in the receiver's Mailbox counts[src], written only
//     by senders with rows for it (hccl::put_count, as dispatch's).
//
// The first generation's combine (no triples; its sources hold expand_idx) pulls instead: each
// expert rank writes its rows into ITS OWN half at the dispatch region's block positions, Tc bytes
// per row (block idx = j*W + src, row = the position expand_idx names), and after the exchange every
// source reads its rows from the expert ranks' windows. Tc <= Td, so the blocks fit the region.
//
// A TP communicator (group-string generations, tp_world_size 2) has windows of its own: its data
// half of a call holds the rows one TP rank sends the other (the all-gather's rows with their scales,
// or the reduce-scatter's partial rows), their count in the Mailbox counts[0] (the all-gather adds
// the sender's ep_recv_counts at counts[1...]); moe_generations.cpp.
//
// The window check guarantees 2*(dispatch region + combine region) <= cclBufferSize - 1 MiB <= window
// size - 1 MiB, i.e. both regions fit in one data half. A rank can be at most one call ahead of any
// peer (it must see every rank arrive at call n before it starts call n+1, and a peer arrives at
// call n+1 only after reading its own half of call n), so two halves are enough.
#pragma once

#include <cstdint>

#pragma GCC visibility push(hidden)  // nothing but the four aclnn entry points is exported

namespace aclmock {
namespace moe {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kScaleSlotBytes = 32;   // the sizing's 32-byte scale slot ...
constexpr uint64_t kTripleBytes = 12;      // ... plus three int32 index entries = +44

inline uint64_t align_up(uint64_t v, uint64_t b) { return (v + b - 1) / b * b; }
inline uint64_t ceil_div(uint64_t v, uint64_t b) { return (v + b - 1) / b; }

// Payload bytes of a dispatch row: align(2H, 32) ("tal" of the buffer sizing, without the +44).
inline uint64_t dispatch_payload_bytes(int64_t H) { return align_up(uint64_t(H) * 2, 32); }
inline uint64_t dispatch_scale_offset(int64_t H) { return dispatch_payload_bytes(H); }
inline uint64_t dispatch_weight_offset(int64_t H) { return dispatch_payload_bytes(H) + 4; }
inline uint64_t dispatch_triple_offset(int64_t H) { return dispatch_payload_bytes(H) + kScaleSlotBytes; }

// Td and Tc of the buffer sizing (docs/operators.md).
inline uint64_t token_bytes_dispatch(int64_t H, bool fullmesh_v2) {
    uint64_t tal = dispatch_payload_bytes(H) + kScaleSlotBytes + kTripleBytes;
    return fullmesh_v2 ? ceil_div(tal, 480) * 512 : align_up(tal, 512);
}
inline uint64_t token_bytes_combine(int64_t H) { return align_up(uint64_t(H) * 2, 512); }

// Combine comm-quant 2 slot: int8 data, then the block scales.
inline uint64_t comm_quant_scale_count(int64_t H) { return ceil_div(uint64_t(H), 16) * 2; }
inline uint64_t comm_quant_scale_offset(int64_t H) { return align_up(uint64_t(H), 32); }

struct Layout {
    uint64_t td = 0, tc = 0;
    uint64_t dispatch_region = 0;   // maxBs*Td*W*L
    uint64_t combine_region = 0;    // maxBs*Tc*(K+S)
    uint64_t combine_offset = 0;    // = dispatch_region
};

inline Layout make_layout(int64_t W, int64_t L, int64_t maxBs, int64_t H, int64_t K, int64_t S,
                          bool fullmesh_v2) {
    Layout l;
    l.td = token_bytes_dispatch(H, fullmesh_v2);
    l.tc = token_bytes_combine(H);
    l.dispatch_region = uint64_t(maxBs) * l.td * uint64_t(W) * uint64_t(L);
    l.combine_region = uint64_t(maxBs) * l.tc * uint64_t(K + S);
    l.combine_offset = l.dispatch_region;
    return l;
}

// Left-hand side of the window requirement (bytes): 2*(maxBs*Td*W*L + maxBs*Tc*(K+S)) [+ W*1024 on
// the 950]; it must be <= cclBufferSize - 1 MiB.
inline uint64_t window_need_bytes(const Layout &l, int64_t W, bool soc950) {
    return 2 * (l.dispatch_region + l.combine_region) + (soc950 ? uint64_t(W) * 1024 : 0);
}

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
