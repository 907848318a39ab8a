// The Atlas A2 (Ascend910B) rules of the mock MoE ops: what CANN documents for A2 in
// aclnnMoeDistributeDispatchV2.md / V3.md and aclnnMoeDistributeCombineV2.md / V3.md, applied to the
// context-based V5 entry points (docs/operators.md, "Atlas A2"). The kernels themselves are the A3
// ones: "fullmesh" and "hierarchy" produce the same rows in the same order on the mock, the
// bookkeeping outputs being opaque to callers.
#include <cinttypes>

#include "ops/moe_checks.h"
#include "runtime/rt_core.h"

namespace aclmock {
namespace moe {

namespace {
constexpr int64_t kServerRanks = 8;            // ranks of one A2 server (serverNum = W / 8)
constexpr int64_t kMaxExpertsHierarchy = 512;
constexpr int64_t kMaxExpertsFullmesh = 1024;  // the newest rules; 8.3.RC1 keeps 512 for every comm_alg
constexpr int64_t kMaxLocalFullmesh8_3 = 24;   // 8.3.RC1's L limit without "hierarchy"; the newest has none
constexpr int64_t kMaxBs = 256;
constexpr int64_t kHAlign = 32;
constexpr int64_t kMaxHFullmesh = 7168;
constexpr int64_t kMaxHHierarchy = 10 * 1024;
constexpr int64_t kFullmeshReserve = 2 * int64_t(kMiB);          // the "+ 2MB" of the fullmesh formula
constexpr int64_t kHierarchyReserve = (4 + 100) * int64_t(kMiB);  // the "+ 4MB + 100MB" of hierarchy

// "fullmesh" worlds: the newest documents (aclnnMoeDistributeDispatchV2.md of the revision that lists
// the Ascend 950PR/950DT) add 2 ... 8 (one server), 192 and 384 to the 16 ... 256 of CANN 8.3.RC1's.
bool world_size_ok(int64_t w, bool hierarchy, CannRules rules) {
    if (hierarchy) return w == 16 || w == 32 || w == 64;
    for (int64_t ok : {16, 32, 64, 128, 256})
        if (w == ok) return true;
    if (rules == CannRules::R8_3) return false;
    return (w >= 2 && w <= 8) || w == 192 || w == 384;
}

const char *world_sizes_text(CannRules rules) {
    return rules == CannRules::R8_3 ? "16, 32, 64, 128 or 256 (the CANN 8.3.RC1 rules)"
                                    : "2 ... 8, 16, 32, 64, 128, 192, 256 or 384";
}

int must_be_zero(int64_t v, const char *param, const char *what) {
    if (v == 0) return 0;
    return bad(param, "must be 0 on Ascend910B, %s are not supported (got %" PRId64 ")", what, v);
}
}  // namespace

int check_attrs_a2(MoeParams &p) {
    const CannRules rules = config().rules;
    if (!world_size_ok(p.W, false, rules))
        return bad("ep_world_size", "must be %s on Ascend910B (got %" PRId64 ")", world_sizes_text(rules), p.W);
    if (p.r < 0 || p.r >= p.W)
        return bad("ep_rank_id", "must be in [0, ep_world_size) (got %" PRId64 " with ep_world_size %" PRId64 ")",
                   p.r, p.W);
    if (p.tp_world >= 2)
        return bad("tp_world_size", "must be 0 or 1, tensor parallelism is not supported (got %" PRId64 ")",
                   p.tp_world);
    if (p.tp_rank != 0)
        return bad("tp_rank_id", "must be 0 without tensor parallelism (tp_world_size 0 or 1) (got %" PRId64 ")",
                   p.tp_rank);
    if (p.shard != 0) return bad("expert_shard_type", "must be 0 (got %" PRId64 ")", p.shard);
    // (1, 0) is the "no shared expert" default pair, as on the other profiles
    if (p.S_attr != 0 && p.S_attr != 1)
        return bad("shared_expert_num", "must be 0 or 1 on Ascend910B, shared experts are not supported (got %" PRId64
                   ")", p.S_attr);
    if (int rc = must_be_zero(p.R, "shared_expert_rank_num", "shared experts")) return rc;
    p.S = 0;
    p.P = 1;
    if (p.comm_alg == "hierarchy") {
        p.hierarchy = true;
    } else if (p.comm_alg != "" && p.comm_alg != "fullmesh") {
        return bad("comm_alg", "must be \"\", \"fullmesh\" or \"hierarchy\" on Ascend910B (got \"%s\")",
                   p.comm_alg.c_str());
    }
    if (p.hierarchy && !world_size_ok(p.W, true, rules))
        return bad("ep_world_size", "must be 16, 32 or 64 with comm_alg \"hierarchy\" on Ascend910B (got %" PRId64 ")",
                   p.W);
    const bool r8_3 = rules == CannRules::R8_3;
    const int64_t max_experts = (p.hierarchy || r8_3) ? kMaxExpertsHierarchy : kMaxExpertsFullmesh;
    if (p.E <= 0 || p.E > max_experts)
        return bad("moe_expert_num", "must be in [1, %" PRId64 "] on Ascend910B with comm_alg \"%s\"%s (got %" PRId64
                   ")", max_experts, p.comm_alg.c_str(), r8_3 ? " (the CANN 8.3.RC1 rules)" : "", p.E);
    if (p.E % p.W != 0)
        return bad("moe_expert_num", "must be divisible by ep_world_size - shared_expert_rank_num (got %" PRId64
                   " %% %" PRId64 ")", p.E, p.W);
    p.L = p.E / p.W;
    if (r8_3 && !p.hierarchy && p.L > kMaxLocalFullmesh8_3)
        return bad("moe_expert_num", "local experts per rank (moe_expert_num / ep_world_size) must be <= %" PRId64
                   " on Ascend910B unless comm_alg is \"hierarchy\" (the CANN 8.3.RC1 rules) (got %" PRId64 " / %"
                   PRId64 " = %" PRId64 ")", kMaxLocalFullmesh8_3, p.E, p.W, p.L);
    if (int rc = must_be_zero(p.Z, "zero_expert_num", "zero experts")) return rc;
    if (int rc = must_be_zero(p.C, "copy_expert_num", "copy experts")) return rc;
    if (int rc = must_be_zero(p.Q, "const_expert_num", "const experts")) return rc;
    p.alg_code = 0;
    p.shared_rank = false;
    p.local_experts = p.L;
    p.recv_slots = p.W * p.L;
    return 0;
}

int check_token_sizes_a2(const MoeParams &p, const char *bs_param, const char *h_param) {
    if (p.BS < 1 || p.BS > kMaxBs)
        return bad(bs_param, "dim 0 (BS) must be in [1, %" PRId64 "] on Ascend910B (got %" PRId64 ")", kMaxBs, p.BS);
    const int64_t hmax = p.hierarchy ? kMaxHHierarchy : kMaxHFullmesh;
    if (p.H < kHAlign || p.H > hmax || p.H % kHAlign != 0)
        return bad(h_param, "dim 1 (H) must be a multiple of %" PRId64 " in [%" PRId64 ", %" PRId64 "] on Ascend910B "
                   "with comm_alg \"%s\" (got %" PRId64 ")", kHAlign, kHAlign, hmax, p.comm_alg.c_str(), p.H);
    return 0;
}

int check_window_a2(const MoeParams &p) {
    const uint64_t mib = kMiB;
    uint64_t need;
    std::string how;
    if (p.hierarchy) {
        const uint64_t k8 = uint64_t(p.K + 7) / 8 * 8;
        need = uint64_t(p.E) * uint64_t(p.maxBs) * (uint64_t(p.H) * 2 + 4 * k8 * 4) + uint64_t(kHierarchyReserve);
        how = format("moe_expert_num*maxBs*(H*2 + 4*align8(K)*4) + 104 MiB = %" PRId64 "*%" PRId64 "*(%" PRId64
                     "*2 + 4*%" PRIu64 "*4) + %" PRId64, p.E, p.maxBs, p.H, k8, kHierarchyReserve);
    } else {
        const int64_t rows = p.L < p.K ? p.L : p.K;
        need = 2 * (uint64_t(p.maxBs) * uint64_t(p.W) * uint64_t(rows) * uint64_t(p.H) * 2 + uint64_t(kFullmeshReserve));
        how = format("2*(maxBs*W*min(L,K)*H*2 + 2 MiB) = 2*(%" PRId64 "*%" PRId64 "*%" PRId64 "*%" PRId64 "*2 + %" PRId64
                     ")", p.maxBs, p.W, rows, p.H, kFullmeshReserve);
    }
    if (need <= uint64_t(p.ccl)) return 0;
    const uint64_t buffsize = ceil_div(ceil_div(need, mib), 2);   // the window is 2 x HCCL_BUFFSIZE
    return bad("ccl_buffer_size", "window too small for comm_alg \"%s\" on Ascend910B: %s = %" PRIu64
               " bytes must be <= ccl_buffer_size; set HCCL_BUFFSIZE >= %" PRIu64 " (MiB) (got %" PRId64 " bytes)",
               p.comm_alg.c_str(), how.c_str(), need, buffsize, p.ccl);
}

int check_mask_a2(const aclTensor *mask, const MoeParams &p) {
    if (!p.a2 || mask->view.size() != 2) return 0;
    return bad("x_active_mask", "must be 1-D (BS,) on Ascend910B, a 2-D (BS, K) mask is not supported (got shape %s)",
               dims_str(mask).c_str());
}

int64_t a2_recv_counts_extra(const MoeParams &p) {
    if (!p.a2 || !p.hierarchy) return 0;
    return 2 * p.G * p.K * (p.W / kServerRanks);
}

}  // namespace moe
}  // namespace aclmock
