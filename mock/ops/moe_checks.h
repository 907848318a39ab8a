// Parameter rules shared by the mock MoeDistributeDispatchV5 and CombineV5,
// with one message style: "<param>: <rule> (got <value>)".
//
// Status codes: a required tensor/pointer that is NULL → ACLNN_ERR_PARAM_NULLPTR (161001), message
// "<param>: must not be NULL"; every other broken rule → ACLNN_ERR_PARAM_INVALID (161002).
// Parameter names in messages are the snake_case names of docs/operators.md (x, expert_ids, scales,
// x_active_mask, expert_scales, expand_x, ..., ep_world_size, moe_expert_num, ccl_buffer_size, ...),
// so Python pre-checks can use the same wording.
#pragma once

#include <cstdint>
#include <string>

#include "aclnn/executor.h"
#include "hccl/hccl_core.h"
#include "ops/moe_window.h"

#pragma GCC visibility push(hidden)  // nothing but the four aclnn entry points is exported

namespace aclmock {
namespace moe {

// Attributes and derived sizes common to dispatch and combine (notation of docs/operators.md).
struct MoeParams {
    // attributes as passed
    int64_t W = 0, r = 0, E = 0, ccl = 0, tp_world = 0, tp_rank = 0, shard = 0;
    int64_t S_attr = 0, R = 0, global_bs = 0, Z = 0, C = 0, Q = 0;
    std::string comm_alg;
    // derived
    int64_t S = 0;           // normalised: 0 when R == 0 && S_attr == 1
    int64_t P = 1;           // ranks per shared expert, R / S (1 when no shared ranks)
    int64_t L = 0;           // E / (W - R)
    int64_t BS = 0, H = 0, K = 0;
    int64_t G = 0, maxBs = 0;
    int64_t A = 0;           // expand_x row capacity
    int64_t local_experts = 0;
    int64_t recv_slots = 0;  // W*L on a MoE rank, W on a shared rank
    bool shared_rank = false;
    bool fullmesh_v2 = false;
    int alg_code = 0;        // 0 "" / fullmesh_v1 (same kernel), 2 fullmesh_v2
    bool soc950 = false;     // the Ascend950 profile (else Ascend910_93 or Ascend910B)
    bool a2 = false;         // the Ascend910B (Atlas A2) profile: profile_a2.cpp
    bool hierarchy = false;  // A2 with comm_alg "hierarchy"
    bool stamp_room = false; // the window holds the W per-rank time stamps of performance_info
    bool shrink = false;     // A3 elastic_info (generations 3 and 4): CANN's dynamic shrink
    const char *soc = "";    // the profile's name, for messages
    aclDataType dtype = ACL_DT_UNDEFINED;   // x (dispatch) / expand_x (combine)
    // the generation of the entry point: 5 names its communicator by a context tensor, 2 to 4 by
    // group strings and may have a TP domain (moe_generations.h)
    int generation = 5;
    const char *op = "";     // the aclnn entry point, for messages
    std::string group_ep, group_tp;
    int64_t tp = 1;          // ranks of the TP domain: 2 with TP (tp_world_size 2), else 1
};

// The SoC profile the ops apply, taken once per phase-1 call: the one place mock/ops reads the
// configured SoC. A suffixed name (Ascend910_9391, ...) selects its family's profile; messages name
// the family.
struct SocProfile {
    bool soc950 = false;
    bool a2 = false;
    const char *name = "Ascend910_93";
};
SocProfile soc_profile();

// 161002 with "<param>: <formatted rest>".
int bad(const char *param, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// 161001 "<param>: must not be NULL" when p is NULL, else 0.
int need(const void *p, const char *param);
// Live aclTensor, ND (or UNDEFINED) format, contiguous: else 161002.
int check_tensor(const aclTensor *t, const char *param);

std::string dims_str(const aclTensor *t);
std::string format_name(aclFormat f);   // "ND", "FRACTAL_NZ", ..., or "format <n>"
inline bool no_zero_dim(const aclTensor *t) {
    for (int64_t d : t->view) if (d == 0) return false;
    return true;
}

// 1-D int32 context.
int check_context_tensor(const aclTensor *ctx);
// dtype must be one of `allowed` (n entries), with a message listing them.
int check_dtype(const aclTensor *t, const char *param, const aclDataType *allowed, int n,
                const char *where = nullptr);
int check_rank(const aclTensor *t, const char *param, size_t nd);

// tp_world_size 0 or 1 and tp_rank_id 0: the rule of every profile without a TP domain.
int check_no_tp(const MoeParams &p);
// Attribute rules shared by both ops (ranks, placement, expert counts, comm_alg), under the SoC
// profile (soc_profile()). Fills the profile and the derived fields that need no tensor shapes.
int check_attrs(MoeParams &p);
// Size rules: BS, H, K, K <= E+Z+C+Q, global_bs, fullmesh_v2 limits; derives G, maxBs, A, ...;
// then the window rule (ccl_buffer_size >= 0 and large enough for these sizes). `bs_param`/`h_param`
// name the tensors the sizes come from. The attribute, size and window rules run as one block right
// after the checks of the token tensors, so that aclnn-py's Python pre-checks, which check exactly this
// block, give the same first error as phase 1.
int check_sizes(MoeParams &p, const char *bs_param, const char *h_param);
// x_active_mask: bool, (BS,) or (BS,K), and no uneven BS.
int check_mask(const aclTensor *mask, const MoeParams &p);
// A3: must be NULL (reserved). 950: accepted here, checked by check_elastic_perf; A2 takes
// performance_info from generation 4 on.
int check_reserved(const aclTensor *t, const char *param, const MoeParams &p);
// 950: elastic_info int32 (4 + 2W,), performance_info int64 (W,); A2: performance_info (W,); A3,
// generations 3 and 4: elastic_info (4 + 2W,), a dynamic shrink (p.shrink), not with a TP domain. With elastic_info
// every rank may serve either role (the table is read at run time), so A = max of the shared and MoE
// formulas, expert_token_nums holds max(L, 1) entries and ep_recv_counts W * L.
int check_elastic_perf(const aclTensor *elastic, const aclTensor *perf, MoeParams &p);

// The context (the Mc2MoeContext struct of docs/operators.md) read from the context tensor's memory: the live op-resource context at
// kfcContextAddr, its communicator matching ep_world_size / ep_rank_id, epRankId and the window
// addresses matching: phase 1's check, 161002 naming `context` (or the attribute).
int resolve_context(const aclTensor &ctx, const MoeParams &p, hccl::Comm **comm);
// resolve_context without the window addresses, failing with `code` and `op` prefixed (a kernel's):
// *entries points at the tensor's epHcclBuffer_ array, for a kernel that checks the entries of the
// peers it reaches (check_window_entry) rather than all W at every launch.
int resolve_context_head(const aclTensor &ctx, const MoeParams &p, hccl::Comm **comm, const uint8_t **entries, int code,
                         const char *op);
// 0 when epHcclBuffer_[i] (entries[i]) is rank i's window, else the failure naming the entry.
int check_window_entry(const uint8_t *entries, const hccl::Comm &comm, uint64_t i, int code, const char *op);
// ccl_buffer_size <= the window of the context's communicator.
int check_window(const MoeParams &p, const hccl::Comm *comm);

// ---- Atlas A2 (Ascend910B) rules, profile_a2.cpp ------------------------------------------------
// Each replaces or adds to a block above when p.a2, at the same place in the order of checks, so that
// the Python pre-checks (aclnn_py/ops/prechecks_a2.py) give the same first error.
// The whole attribute block on A2 (in place of check_attrs' rules).
int check_attrs_a2(MoeParams &p);
// BS and H on A2 (in place of the A3 / 950 ranges).
int check_token_sizes_a2(const MoeParams &p, const char *bs_param, const char *h_param);
// The window formula CANN documents for A2's comm_alg, before the mock's own layout check.
int check_window_a2(const MoeParams &p);
// x_active_mask: 1-D only on A2.
int check_mask_a2(const aclTensor *mask, const MoeParams &p);
// ep_recv_counts entries beyond W * L that A2's "hierarchy" algorithm writes (its reduce information):
// 2 * G * K * (W / 8); 0 for "fullmesh", which writes the W * L counts only, and on other profiles.
int64_t a2_recv_counts_extra(const MoeParams &p);

// Workspace sizes (bytes), always > 0; the kernels use every part.
struct DispatchWs {
    uint64_t qrow = 0, tmp = 0, total = 0;
};
DispatchWs dispatch_ws(const MoeParams &p);
struct CombineWs {
    uint64_t tmp = 0, total = 0;
};
CombineWs combine_ws(const MoeParams &p);

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
