// What the group-string generations of the MoE ops (aclnnMoeDistributeDispatch/CombineV2, V3, V4)
// add to the shared machinery (private to mock/ops): communicators named by group strings, and the
// TP domain of two ranks (docs/operators.md, "Group-string generations").
//
// A group string is a communicator's name as HcclGetCommName gives it; the ops look it up among
// the live communicators of the process. With tp_world_size 2 the ranks (e, 0) and (e, 1) of two
// EP domains form a TP communicator: dispatch follows its EP all-to-all with a TP all-gather, and
// combine starts with a TP reduce-scatter (tp_all_gather / tp_reduce_scatter below). The TP data
// travel through the TP communicator's windows, in the data half of its own call sequence number.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "hccl/hccl_core.h"
#include "ops/moe_checks.h"

#pragma GCC visibility push(hidden)

namespace aclmock {
namespace moe {

// A group-string argument: NULL or "" → 161001 (CANN's aclnn layer refuses both before any tensor);
// a name of COMM_NAME_MAX_LENGTH characters or more → `too_long` (161001 from CANN's dispatch entry
// points, 161002 from its combine ones), each naming `param`.
int group_arg(const char *value, const char *param, int too_long, std::string *out);

// The attributes every group-string generation has, dispatch and combine alike, in their common order.
struct GroupAttrs {
    const char *group_ep;
    int64_t W, r, E;
    const char *group_tp;
    int64_t tp_world, tp_rank, shard, S, R, global_bs;
    const char *comm_alg;  // NULL in the first generation, which has none
    int64_t Z, C, Q;
};

// `g` into an operator's attributes (DispatchAttrs or CombineAttrs): 0, or the status of a bad
// group_ep / group_tp. group_tp is optional: NULL or "" mean no TP communicator.
template <class Attrs>
int group_attrs(int generation, const char *op, const GroupAttrs &g, Attrs *p) {
    p->generation = generation;
    p->op = op;
    const int too_long = std::strncmp(op, "aclnnMoeDistributeDispatch", 26) == 0 ? ACLNN_ERR_PARAM_NULLPTR
                                                                               : ACLNN_ERR_PARAM_INVALID;
    if (int rc = group_arg(g.group_ep, "group_ep", too_long, &p->group_ep)) return rc;
    if (g.group_tp && g.group_tp[0])
        if (int rc = group_arg(g.group_tp, "group_tp", too_long, &p->group_tp)) return rc;
    p->W = g.W; p->r = g.r; p->E = g.E;
    p->tp_world = g.tp_world; p->tp_rank = g.tp_rank; p->shard = g.shard;
    p->S_attr = g.S; p->R = g.R; p->global_bs = g.global_bs;
    p->Z = g.Z; p->C = g.C; p->Q = g.Q;
    p->comm_alg = g.comm_alg ? g.comm_alg : "";
    return 0;
}

// The attribute rules of a group-string generation, once L is known (called by check_attrs): those
// of the first generation (aclnnMoeDistributeDispatch.md), then check_tp_domain.
int check_generation_attrs(MoeParams &p);
// The first generation's size rules (H, K), called by check_sizes.
int check_first_generation_sizes(const MoeParams &p, const char *h_param);
// The name of dispatch's routing output and combine's routing input: expand_idx in the first
// generation, assist_info_for_combine after it.
inline const char *routing_name(const MoeParams &p) {
    return p.generation == 1 ? "expand_idx" : "assist_info_for_combine";
}

// The TP rules of a group-string generation, once L is known (called by check_attrs): tp_world_size
// 0 or 1 (no TP domain; tp_rank_id 0) or 2 on Ascend910_93 (tp_rank_id 0 or 1, a group_tp that
// differs from group_ep, one local expert on a MoE rank). Sets p.tp.
int check_tp_domain(MoeParams &p);

// Phase 1: group_ep (and group_tp with a TP domain) → live communicators whose size and rank
// match ep_world_size / ep_rank_id (tp_world_size / tp_rank_id); p.ccl becomes group_ep's window
// size, the bytes the window rule checks. *tp is nullptr without a TP domain.
int resolve_groups(MoeParams &p, hccl::Comm **ep, hccl::Comm **tp);
// The same lookup at run time, with the kernel's failure code and `op` prefixed.
int find_group(const std::string &name, const char *param, int64_t nranks, int64_t rank, hccl::Comm **comm,
               int code, const char *op);

// With a TP domain, `rows` rows of `row_stride` bytes must fit in one data half of the TP
// communicator's window (the TP half of the buffer sizing in docs/operators.md).
int check_tp_window(const MoeParams &p, const hccl::Comm *tp, int64_t rows, uint64_t row_stride);

// Dispatch's TP all-gather, after the EP receive filled rows [0, n) of expand_x (and of
// dynamic_scales when dyn_bytes > 0) and ep_recv_counts[0, recv_slots): the peer's n' rows land at
// [n, n + n'), its counts at ep_recv_counts[recv_slots, 2 * recv_slots); tp_recv_counts[tp_rank_id]
// = n, [peer] = n'; expert_token_nums[0] (one local expert with TP) = n + n'.
struct TpGather {
    uint8_t *expand_x;
    int64_t row_bytes;
    uint8_t *dynamic_scales;
    int64_t dyn_bytes;
    int32_t *ep_recv_counts;
    int64_t recv_slots;
    int64_t *expert_token_nums;
    int32_t *tp_recv_counts;
    int64_t n;
    int64_t capacity;   // expand_x dim 0
};
int tp_all_gather(const MoeParams &p, const TpGather &g, const char *op);

// Combine's TP reduce-scatter: this rank's n = tp_send_counts[tp_rank_id] own rows [0, n) and the
// peer's n' = tp_send_counts[peer] rows [n, n + n') of expand_x; the peer's rows go to the peer,
// and summed[i] = round_to_row_dtype(float32(expand_x[i]) + float32(peer's row for i)), i < n.
// A failed exchange returns its code; bad counts set *err (and *n = 0) and return 0, so that the
// caller still takes part in the EP all-to-all and reports the error after it.
int tp_reduce_scatter(const MoeParams &p, const uint16_t *expand_x, int64_t capacity, const int32_t *tp_send_counts,
                      uint16_t *summed, int64_t *n, std::string *err, const char *op);

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
