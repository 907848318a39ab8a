// Group strings and the TP domain of the group-string generations; see moe_generations.h.
#include "ops/moe_generations.h"

#include <cinttypes>
#include <cstring>

#include "ops/moe_kernel.h"
#include "ops/numerics.h"

namespace aclmock {
namespace moe {

namespace {

// The profile whose documents allow a TP domain (aclnnMoeDistributeDispatchV2.md: tpWorldSize 2 on
// Atlas A3 only; the Atlas A2 and 950 entries say "not supported, pass 0").
bool tp_profile(const MoeParams &p) { return std::strcmp(p.soc, "Ascend910_93") == 0; }

int group_fail(int code, const char *op, const char *param, const std::string &msg) {
    std::string m = op ? std::string(op) + ": " : std::string();
    set_error(m + param + ": " + msg);
    return code;
}

// One call on the TP communicator: it holds the communicator, takes the next sequence number of the
// TP domain and owns that number's data half of both windows.
class TpCall {
public:
    TpCall(const MoeParams &p, const char *op) : p_(p), op_(op) {}
    TpCall(const TpCall &) = delete;
    TpCall &operator=(const TpCall &) = delete;
    ~TpCall() {
        if (held_) comm_->end_use();
    }

    int begin() {
        if (int rc = find_group(p_.group_tp, "group_tp", 2, p_.tp_rank, &comm_, kKernelFail, op_)) return rc;
        if (!comm_->begin_use())
            return fail(kKernelFail, "%s: rank %" PRId64 ": the TP communicator is being destroyed", op_, p_.r);
        held_ = true;
        seq_ = comm_->next_seq();
        half_ = int(seq_ % 2);
        return 0;
    }
    uint32_t me() const { return uint32_t(p_.tp_rank); }
    uint32_t peer() const { return 1 - me(); }
    uint8_t *data(uint32_t rank) const { return comm_->data_half(rank, half_); }
    int32_t *counts(uint32_t rank) const { return comm_->mailbox(rank, half_)->counts; }
    uint64_t half_bytes() const { return comm_->data_half_bytes(); }

    // Arrives at the call (what was written into the peer's window before is visible to it once
    // both arrived) and waits for the peer's arrival at the same call.
    int exchange(uint32_t tag, const int64_t *fields, const char *const *names, uint32_t nfields) {
        comm_->arrive(seq_, tag, fields, nfields);
        return comm_->wait_all(seq_, tag, fields, names, nfields, op_);
    }

private:
    const MoeParams &p_;
    const char *op_;
    hccl::Comm *comm_ = nullptr;
    bool held_ = false;
    uint64_t seq_ = 0;
    int half_ = 0;
};

inline uint64_t gather_stride(int64_t row_bytes, int64_t dyn_bytes) {
    return align_up(uint64_t(row_bytes + dyn_bytes), 32);
}

}  // namespace

int group_arg(const char *value, const char *param, int too_long, std::string *out) {
    if (int rc = need(value, param)) return rc;
    const size_t n = strnlen(value, COMM_NAME_MAX_LENGTH);
    if (n == 0) {
        set_error(std::string(param) + ": must name a communicator (HcclGetCommName), an empty name counts as "
                  "missing (got \"\")");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (n >= COMM_NAME_MAX_LENGTH) {
        set_error(format("%s: must be shorter than %d characters (got \"%.40s...\")", param, COMM_NAME_MAX_LENGTH,
                         value));
        return too_long;
    }
    out->assign(value, n);
    return 0;
}

namespace {

// aclnnMoeDistributeDispatch.md / aclnnMoeDistributeCombine.md, Atlas A3 (and 950) entries.
int check_first_generation_attrs(const MoeParams &p) {
    static const int64_t a3_worlds[] = {8, 16, 32, 64, 128, 144, 256, 288};
    bool listed = p.soc950 && (p.W == 2 || p.W == 4);
    for (int64_t w : a3_worlds) listed = listed || p.W == w;
    if (!listed)
        return bad("ep_world_size", "must be one of %s8, 16, 32, 64, 128, 144, 256, 288 for the first generation on "
                   "%s (got %" PRId64 ")", p.soc950 ? "2, 4, " : "", p.soc, p.W);
    if (p.E > 512)
        return bad("moe_expert_num", "must be in [1, 512] for the first generation (got %" PRId64 ")", p.E);
    // aclnnMoeDistributeDispatch.md: a non-zero sharedExpertRankNum divides epWorldSize. The mock sends
    // a source's tokens to the shared replica src % P, as in the later generations (the row order on
    // a shared-expert rank is opaque to callers; combine takes every row back to its token).
    if (p.R != 0 && p.W % p.R != 0)
        return bad("shared_expert_rank_num", "must divide ep_world_size for the first generation (got %" PRId64
                   " with ep_world_size %" PRId64 ")", p.R, p.W);
    return 0;
}

}  // namespace

int check_generation_attrs(MoeParams &p) {
    if (p.generation == 1)
        if (int rc = check_first_generation_attrs(p)) return rc;
    return check_tp_domain(p);
}

int check_first_generation_sizes(const MoeParams &p, const char *h_param) {
    if (p.H != 7168)
        return bad(h_param, "dim 1 (H) must be 7168 for the first generation (got %" PRId64 ")", p.H);
    if (p.K > 8)
        return bad("expert_ids", "dim 1 (K) must be in [1, 8] for the first generation (got %" PRId64 ")", p.K);
    return 0;
}

int check_tp_domain(MoeParams &p) {
    p.tp = 1;
    if (!tp_profile(p)) return check_no_tp(p);
    if (p.tp_world < 0 || p.tp_world > 2)
        return bad("tp_world_size", "must be 0 or 1 (no TP domain) or 2 on %s (got %" PRId64 ")", p.soc, p.tp_world);
    if (!p.group_tp.empty() && p.group_tp == p.group_ep)
        return bad("group_tp", "must differ from group_ep (got \"%s\" for both)", p.group_tp.c_str());
    if (p.tp_world < 2) {
        if (p.tp_rank != 0)
            return bad("tp_rank_id", "must be 0 without a TP domain (tp_world_size 0 or 1) (got %" PRId64 ")",
                       p.tp_rank);
        return 0;
    }
    if (p.tp_rank < 0 || p.tp_rank > 1)
        return bad("tp_rank_id", "must be 0 or 1 with tp_world_size 2 (got %" PRId64 ")", p.tp_rank);
    if (p.group_tp.empty())
        return bad("group_tp", "must name the TP communicator (HcclGetCommName) with tp_world_size 2 (got \"\")");
    if (!p.shared_rank && p.L > 1)
        return bad("moe_expert_num", "a TP domain needs one local expert per MoE rank: moe_expert_num / "
                   "(ep_world_size - shared_expert_rank_num) must be 1 with tp_world_size 2 (got %" PRId64 ")", p.L);
    p.tp = 2;
    return 0;
}

int find_group(const std::string &name, const char *param, int64_t nranks, int64_t rank, hccl::Comm **comm,
               int code, const char *op) {
    const bool ep = std::strcmp(param, "group_ep") == 0;
    hccl::Comm *c = hccl::find_comm_by_name(name);
    if (!c)
        return group_fail(code, op, param, format("no live communicator of this process is named \"%s\" (the "
                                                  "names come from HcclGetCommName)", name.c_str()));
    if (int64_t(c->nranks()) != nranks)
        return group_fail(code, op, param, format("communicator \"%s\" has %u ranks, %s is %" PRId64, name.c_str(),
                                                  c->nranks(), ep ? "ep_world_size" : "tp_world_size", nranks));
    if (int64_t(c->rank()) != rank)
        return group_fail(code, op, param, format("this process's communicator \"%s\" is rank %u, %s is %" PRId64,
                                                  name.c_str(), c->rank(), ep ? "ep_rank_id" : "tp_rank_id", rank));
    *comm = c;
    return 0;
}

int resolve_groups(MoeParams &p, hccl::Comm **ep, hccl::Comm **tp) {
    *tp = nullptr;
    if (int rc = find_group(p.group_ep, "group_ep", p.W, p.r, ep, ACLNN_ERR_PARAM_INVALID, nullptr)) return rc;
    p.ccl = int64_t((*ep)->window_size());
    if (p.tp != 2) return 0;
    return find_group(p.group_tp, "group_tp", 2, p.tp_rank, tp, ACLNN_ERR_PARAM_INVALID, nullptr);
}

int check_tp_window(const MoeParams &p, const hccl::Comm *tp, int64_t rows, uint64_t row_stride) {
    if (!tp) return 0;
    const uint64_t need = uint64_t(rows) * row_stride;
    if (need > tp->data_half_bytes())
        return bad("group_tp", "the TP communicator's window is too small: %" PRId64 " rows of %" PRIu64
                   " bytes = %" PRIu64 " bytes must fit in (window - 1 MiB) / 2 = %" PRIu64 " bytes; raise "
                   "HCCL_BUFFSIZE", rows, row_stride, need, tp->data_half_bytes());
    return 0;
}

int tp_all_gather(const MoeParams &p, const TpGather &g, const char *op) {
    TpCall call(p, op);
    if (int rc = call.begin()) return rc;
    const uint64_t stride = gather_stride(g.row_bytes, g.dyn_bytes);
    uint8_t *dst = call.data(call.peer());
    for (int64_t i = 0; i < g.n; ++i) {
        uint8_t *row = dst + uint64_t(i) * stride;
        std::memcpy(row, g.expand_x + i * g.row_bytes, size_t(g.row_bytes));
        if (g.dyn_bytes) std::memcpy(row + g.row_bytes, g.dynamic_scales + i * g.dyn_bytes, size_t(g.dyn_bytes));
    }
    int32_t *pc = call.counts(call.peer());
    pc[0] = int32_t(g.n);
    std::memcpy(pc + 1, g.ep_recv_counts, size_t(g.recv_slots) * 4);
    static const char *const names[] = {"expand_x row bytes", "dynamic_scales row bytes", "ep_recv_counts slots"};
    const int64_t fields[] = {g.row_bytes, g.dyn_bytes, g.recv_slots};
    if (int rc = call.exchange(hccl::kTagTpAllGather, fields, names, 3)) return rc;

    const int32_t *mc = call.counts(call.me());
    const int64_t n_peer = mc[0];
    if (n_peer < 0 || g.n + n_peer > g.capacity)
        return fail(kKernelFail, "%s: rank %" PRId64 ": the TP peer sent %" PRId64 " rows; with this rank's %" PRId64
                    " they exceed expand_x dim 0 (%" PRId64 ")", op, p.r, n_peer, g.n, g.capacity);
    const uint8_t *src = call.data(call.me());
    for (int64_t i = 0; i < n_peer; ++i) {
        const uint8_t *row = src + uint64_t(i) * stride;
        std::memcpy(g.expand_x + (g.n + i) * g.row_bytes, row, size_t(g.row_bytes));
        if (g.dyn_bytes)
            std::memcpy(g.dynamic_scales + (g.n + i) * g.dyn_bytes, row + g.row_bytes, size_t(g.dyn_bytes));
    }
    std::memcpy(g.ep_recv_counts + g.recv_slots, mc + 1, size_t(g.recv_slots) * 4);
    g.tp_recv_counts[call.me()] = int32_t(g.n);
    g.tp_recv_counts[call.peer()] = int32_t(n_peer);
    g.expert_token_nums[0] = g.n + n_peer;
    return 0;
}

int tp_reduce_scatter(const MoeParams &p, const uint16_t *expand_x, int64_t capacity, const int32_t *tp_send_counts,
                      uint16_t *summed, int64_t *n, std::string *err, const char *op) {
    TpCall call(p, op);
    if (int rc = call.begin()) return rc;
    const int64_t H = p.H;
    const bool bf16 = p.dtype == ACL_BF16;
    const int64_t own = tp_send_counts[call.me()], other = tp_send_counts[call.peer()];
    *n = 0;
    int64_t sent = other;
    if (own < 0 || other < 0 || own + other > capacity) {
        *err = format("tp_send_counts = (%d, %d) do not fit in expand_x dim 0 (%" PRId64 ")", tp_send_counts[0],
                     tp_send_counts[1], capacity);
        sent = 0;   // still take part, so the peer does not wait for a rank that gave up
    }
    const uint64_t stride = align_up(uint64_t(H) * 2, 32);
    uint8_t *dst = call.data(call.peer());
    for (int64_t i = 0; i < sent; ++i)
        std::memcpy(dst + uint64_t(i) * stride, expand_x + (own + i) * H, size_t(H) * 2);
    call.counts(call.peer())[0] = int32_t(sent);
    static const char *const names[] = {"H (expand_x dim 1)", "expand_x dtype"};
    const int64_t fields[] = {H, int64_t(p.dtype)};
    if (int rc = call.exchange(hccl::kTagTpReduceScatter, fields, names, 2)) return rc;
    const int64_t got = call.counts(call.me())[0];
    if (err->empty() && got != own)
        *err = format("the TP peer sent %" PRId64 " rows for this rank's %" PRId64 " (tp_send_counts[tp_rank_id]): "
                     "the two ranks' tp_send_counts do not come from one dispatch", got, own);
    if (!err->empty()) return 0;
    const uint8_t *src = call.data(call.me());
    for (int64_t i = 0; i < own; ++i) {
        const uint16_t *mine = expand_x + i * H;
        const uint16_t *theirs = reinterpret_cast<const uint16_t *>(src + uint64_t(i) * stride);
        uint16_t *out = summed + i * H;
        // one float32 add of the two partial sums, rounded once to the row dtype (a choice: see
        // docs/operators.md, "TP reduce-scatter")
        for (int64_t h = 0; h < H; ++h) out[h] = from_f32(to_f32(mine[h], bf16) + to_f32(theirs[h], bf16), bf16);
    }
    *n = own;
    return 0;
}

}  // namespace moe
}  // namespace aclmock
