// aclnnMoeDistributeCombineV5 on the mock, and the one combine operator every generation's entry
// point calls (combine.h; the group-string generations' argument lists: combine_gens.cpp, their group
// names and TP reduce-scatter: moe_generations.h) (semantics: docs/operators.md; window layout:
// moe_window.h). Phase 1 checks the inputs, then the output, then the context and the window, and
// builds the executor; the kernel sends every expert row back to the slot of the token it came from,
// waits for every rank's entry of the call, and reduces each token's slots into x_out.
// Ascend950 profile: comm quant 3 / 4 (MXFP8 e5m2 / e4m3fn, block 32, e8m0 scales; golden choice 8),
// the fused int8 dequantisation (the same values as A3, choice 9), elastic_info (choice 10) and
// performance_info.
#include <cinttypes>
#include <cstring>
#include <optional>
#include <memory>
#include <vector>

#include "aclnnop/aclnn_moe_distribute_combine_v5.h"
#include "ops/combine.h"
#include "ops/kernel_scratch.h"
#include "ops/lowp.h"
#include "ops/moe_checks.h"
#include "ops/peer_copy.h"
#include "ops/moe_generations.h"
#include "ops/moe_kernel.h"
#include "ops/numerics.h"
#include "ops/round_trace.h"

#pragma GCC visibility push(hidden)

using namespace aclmock;
using namespace aclmock::moe;

namespace {

constexpr const char *kOp = "aclnnMoeDistributeCombineV5";

enum Out { kXOut, kNumOut };

const char *const kInNames[kNumIn] = {
    "context", "expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts", "expert_scales",
    "tp_send_counts", "x_active_mask", "activation_scale", "weight_scale", "group_list", "expand_scales",
    "shared_expert_x", "elastic_info", "ori_x", "const_expert_alpha_1", "const_expert_alpha_2",
    "const_expert_v", "performance_info"};

struct CombineParams : CombineAttrs {
    bool has_w = false;            // expert_scales non-empty → weighted
    int mask_dims = 0;
    bool has_shared_x = false;
    int64_t expand_rows = 0;       // expand_x dim0
    bool has_elastic = false;
    bool has_perf = false;
};

const aclDataType kI32[] = {ACL_INT32};
const aclDataType kF32[] = {ACL_FLOAT};

// ================================================================================================
// Phase 1
// ================================================================================================

int check_pointers(const CombineArgs &a, const CombineParams &p, const uint64_t *workspace_size,
                   aclOpExecutor **executor) {
    for (int i : {kCtx, kExpandX, kIds, kAssist, kSendCounts, kEScales})
        if (i != kCtx || p.generation == 5)
            if (int rc = need(a[i], i == kAssist ? routing_name(p) : kInNames[i])) return rc;
    if (int rc = need(a.x_out, "x_out")) return rc;
    if (int rc = need(workspace_size, "workspaceSize")) return rc;
    return need(executor, "executor");
}

// Every descriptor given: live, ND, contiguous; the context 1-D int32.
int check_descriptors(const CombineArgs &a, const CombineParams &p) {
    for (int i = 0; i < kNumIn; ++i)
        if (a[i])
            if (int rc = check_tensor(a[i], i == kAssist ? routing_name(p) : kInNames[i])) return rc;
    if (int rc = check_tensor(a.x_out, "x_out")) return rc;
    return a[kCtx] ? check_context_tensor(a[kCtx]) : 0;
}

// The attribute rules shared with dispatch, then combine's own modes.
int check_modes(CombineParams &p) {
    if (int rc = check_attrs(p)) return rc;
    if (p.soc950) {
        if (p.comm_quant != 0 && p.comm_quant != 2 && p.comm_quant != 3 && p.comm_quant != 4)
            return bad("comm_quant_mode", "must be 0, 2, 3 or 4 on Ascend950 (got %" PRId64 ")", p.comm_quant);
    } else if (p.comm_quant != 0 && p.comm_quant != 2) {
        return bad("comm_quant_mode", "must be 0 or 2 on %s (got %" PRId64 ")", p.soc, p.comm_quant);
    } else if (p.a2 && p.comm_quant == 2 && !p.hierarchy) {
        return bad("comm_quant_mode", "2 needs comm_alg \"hierarchy\" on Ascend910B (got comm_alg \"%s\")",
                   p.comm_alg.c_str());
    }
    if (p.tp == 2 && p.comm_quant != 0)
        return bad("comm_quant_mode", "must be 0 with tp_world_size 2 (got %" PRId64 ")", p.comm_quant);
    if (p.out_dtype != 0) return bad("out_dtype", "is reserved and must be 0 (got %" PRId64 ")", p.out_dtype);
    // group_list_type is reserved and no CANN tiling reads it (CANN's own CombineV2 sample passes 1):
    // any value is accepted and ignored
    return 0;
}

// expand_x, expert_ids and the sizes they give, then the routing inputs from dispatch
// (assist_info_for_combine, ep_send_counts).
int check_rows(const CombineArgs &a, CombineParams &p) {
    static const aclDataType f16s[] = {ACL_FLOAT16, ACL_BF16};
    const aclTensor *ex = a[kExpandX], *ids = a[kIds], *assist = a[kAssist], *counts = a[kSendCounts];
    if (int rc = check_dtype(ex, "expand_x", f16s, 2)) return rc;
    if (int rc = check_rank(ex, "expand_x", 2)) return rc;
    if (int rc = check_dtype(ids, "expert_ids", kI32, 1)) return rc;
    if (int rc = check_rank(ids, "expert_ids", 2)) return rc;
    p.dtype = ex->dtype;
    p.BS = ids->view[0];
    p.K = ids->view[1];
    p.H = ex->view[1];
    if (int rc = check_sizes(p, "expert_ids", "expand_x")) return rc;
    // 950: elastic_info makes A the larger of both roles'; A3 refuses both in check_options
    if (int rc = check_elastic_perf(a[kElastic], a[kPerf], p)) return rc;
    p.has_elastic = (p.soc950 || p.shrink) && a[kElastic] != nullptr;
    p.has_perf = (p.soc950 || p.a2) && a[kPerf] != nullptr;
    // A caller who slices dispatch's expand_x to the rows it received ends here: say what to pass.
    if (ex->view[0] < p.A * p.tp)
        return bad("expand_x", "dim 0 must be >= %s = %" PRId64 " (got %" PRId64 "): pass all %s rows of "
                   "dispatch's expand_x; rows >= N are not read (N = the rows this rank received, the last running "
                   "total of ep_send_counts%s)", p.tp == 2 ? "A * tp_world_size" : "A", p.A * p.tp, ex->view[0],
                   p.tp == 2 ? "A * tp_world_size" : "A", p.tp == 2 ? ", plus the TP peer's rows" : "");
    p.expand_rows = ex->view[0];
    if (int rc = check_dtype(assist, routing_name(p), kI32, 1)) return rc;
    if (int rc = check_rank(assist, routing_name(p), 1)) return rc;
    if (p.generation == 1) {
        if (assist->view[0] < p.BS * p.K)
            return bad("expand_idx", "dim 0 must be >= BS * K = %" PRId64 " (got %" PRId64 ")", p.BS * p.K,
                       assist->view[0]);
    } else if (assist->view[0] < p.A * 128)
        return bad("assist_info_for_combine", "dim 0 must be >= A * 128 = %" PRId64 " (got %" PRId64 ")",
                   p.A * 128, assist->view[0]);
    if (int rc = check_dtype(counts, "ep_send_counts", kI32, 1)) return rc;
    if (int rc = check_rank(counts, "ep_send_counts", 1)) return rc;
    if (counts->view[0] < p.recv_slots * p.tp)
        return bad("ep_send_counts", "dim 0 must be >= %s%s = %" PRId64 " (got %" PRId64 ")",
                   p.shared_rank && !p.has_elastic ? "ep_world_size on a shared-expert rank" : "ep_world_size * L",
                   p.tp == 2 ? " * tp_world_size" : "", p.recv_slots * p.tp, counts->view[0]);
    return 0;
}

// tp_send_counts: int32 (2,) with a TP domain (NULL → 161001). Without one it is accepted and never
// read, as CANN's tilings ignore it there (its newer samples pass dispatch's tp_recv_counts anyway).
int check_tp_send_counts(const aclTensor *t, const CombineParams &p) {
    if (p.tp != 2) return 0;
    if (!t) {
        set_error("tp_send_counts: must not be NULL with tp_world_size 2");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (int rc = check_dtype(t, "tp_send_counts", kI32, 1)) return rc;
    if (t->view.size() != 1 || t->view[0] < 2)
        return bad("tp_send_counts", "shape must be (tp_world_size,) = (2,) (got %s)", dims_str(t).c_str());
    return 0;
}

// expert_scales (empty → unweighted), x_active_mask, tp_send_counts, the tensors that must be NULL
// (activation_scale, weight_scale, group_list), expand_scales,
// shared_expert_x, elastic_info / performance_info on A3.
int check_options(const CombineArgs &a, CombineParams &p) {
    const aclTensor *es = a[kEScales];
    if (int rc = check_dtype(es, "expert_scales", kF32, 1)) return rc;
    if (no_zero_dim(es)) {
        if (es->view.size() != 2 || es->view[0] != p.BS || es->view[1] != p.K)
            return bad("expert_scales", "shape must be (BS, K) = (%" PRId64 ", %" PRId64 ") or empty (got %s)", p.BS,
                       p.K, dims_str(es).c_str());
        p.has_w = true;
    }
    if (int rc = check_mask(a[kMask], p)) return rc;
    p.mask_dims = a[kMask] ? int(a[kMask]->view.size()) : 0;
    if (int rc = check_tp_send_counts(a[kTpSend], p)) return rc;
    for (int i : {kActScale, kWScale, kGroupList})
        if (a[i]) return bad(kInNames[i], "must be NULL (got a %s tensor)", dims_str(a[i]).c_str());
    if (const aclTensor *xs = a[kExpandScales]) {
        if (int rc = check_dtype(xs, "expand_scales", kF32, 1)) return rc;
        if (int rc = check_rank(xs, "expand_scales", 1)) return rc;
    }
    if (const aclTensor *sx = a[kSharedX]) {
        if (p.a2)
            return bad("shared_expert_x", "is reserved on Ascend910B and must be NULL (got a %s tensor)",
                       dims_str(sx).c_str());
        if (p.R != 0)
            return bad("shared_expert_x", "is only allowed when shared_expert_rank_num is 0 (got "
                       "shared_expert_rank_num %" PRId64 ")", p.R);
        const aclDataType same[] = {p.dtype};
        if (int rc = check_dtype(sx, "shared_expert_x", same, 1, "(expand_x's dtype)")) return rc;
        const auto &d = sx->view;
        const bool ok = (d.size() == 2 && d[0] == p.BS && d[1] == p.H) ||
                        (d.size() == 3 && d[0] * d[1] == p.BS && d[2] == p.H);
        if (!ok)
            return bad("shared_expert_x", "shape must be (BS, H) = (%" PRId64 ", %" PRId64 ") or 3-D (a, b, H) with "
                       "a*b == BS (got %s)", p.BS, p.H, dims_str(sx).c_str());
        p.has_shared_x = true;
    }
    if (int rc = check_reserved(a[kElastic], "elastic_info", p)) return rc;
    return check_reserved(a[kPerf], "performance_info", p);
}

// ori_x (copy and const experts) and the const-expert tensors.
int check_special_experts(const CombineArgs &a, const CombineParams &p) {
    const aclDataType same[] = {p.dtype};
    const aclTensor *ori = a[kOriX];
    if ((p.C > 0 || p.Q > 0) && !ori) {
        set_error(format("ori_x: must not be NULL when copy_expert_num or const_expert_num is > 0 (got %" PRId64
                         ", %" PRId64 ")", p.C, p.Q));
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (ori) {
        if (int rc = check_dtype(ori, "ori_x", same, 1, "(expand_x's dtype)")) return rc;
        const auto &d = ori->view;
        if (d.size() != 2 || d[0] != p.BS || d[1] != p.H)
            return bad("ori_x", "shape must be (BS, H) = (%" PRId64 ", %" PRId64 ") (got %s)", p.BS, p.H,
                       dims_str(ori).c_str());
    }
    for (int i : {kAlpha1, kAlpha2, kConstV}) {
        const aclTensor *t = a[i];
        const char *name = kInNames[i];
        if (p.Q > 0 && !t) {
            set_error(format("%s: must not be NULL when const_expert_num is > 0 (got %" PRId64 ")", name, p.Q));
            return ACLNN_ERR_PARAM_NULLPTR;
        }
        if (!t) continue;
        if (int rc = check_dtype(t, name, same, 1, "(expand_x's dtype)")) return rc;
        const auto &d = t->view;
        if (p.Q > 0 && (d.size() != 2 || d[0] != p.Q || d[1] != p.H))
            return bad(name, "shape must be (const_expert_num, H) = (%" PRId64 ", %" PRId64 ") (got %s)", p.Q, p.H,
                       dims_str(t).c_str());
    }
    return 0;
}

int check_inputs(const CombineArgs &a, CombineParams &p) {
    if (int rc = check_rows(a, p)) return rc;
    if (int rc = check_options(a, p)) return rc;
    return check_special_experts(a, p);
}

// x_out: (BS, H) in expand_x's dtype.
int check_outputs(const CombineArgs &a, const CombineParams &p) {
    const aclDataType same[] = {p.dtype};
    if (int rc = check_dtype(a.x_out, "x_out", same, 1, "(expand_x's dtype)")) return rc;
    const auto &d = a.x_out->view;
    if (d.size() != 2 || d[0] != p.BS || d[1] != p.H)
        return bad("x_out", "shape must be (BS, H) = (%" PRId64 ", %" PRId64 ") (got %s)", p.BS, p.H,
                   dims_str(a.x_out).c_str());
    return 0;
}

// With a TP domain the workspace also holds the A reduce-scattered rows, after combine_ws's parts.
uint64_t tp_rows_offset(const CombineParams &p) { return align_up(combine_ws(p).total, 64); }
uint64_t combine_workspace(const CombineParams &p) {
    return p.tp == 2 ? tp_rows_offset(p) + uint64_t(p.A * p.H) * 2 : combine_ws(p).total;
}

class CombineExecutor final : public Executor {
public:
    explicit CombineExecutor(const CombineParams &p) : Executor(p.op), p_(p) {}
    int run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *,
            std::unique_ptr<KernelRest> *rest) override;
    bool may_block() const override { return p_.tp == 2; }   // its TP reduce-scatter holds the thread

private:
    CombineParams p_;
};

int make_executor(const CombineArgs &a, const CombineParams &p, uint64_t *workspace_size,
                  aclOpExecutor **executor) {
    const aclTensor *outs[] = {a.x_out};
    return register_moe_executor(std::make_shared<CombineExecutor>(p), p.generation, a.in, kNumIn, outs, 1,
                                 combine_workspace(p), p.op, workspace_size, executor);
}

// ================================================================================================
// Kernel
// ================================================================================================

// One run of the combine kernel: send() writes every expert row this rank holds into the slot of
// its token in the source rank's window, wait() exchanges the call's mailbox entries, receive()
// reduces this rank's tokens from its own window into x_out. A data error is remembered in err_ and
// reported after the exchange, so the peers never wait for a rank that gave up.
class CombineKernel {
public:
    CombineKernel(const CombineParams &p, KernelCall &call, const std::vector<Slot> &in,
                  const std::vector<Slot> &out, void *workspace);
    int reduce_scatter();   // with a TP domain, before send()
    void send();
    int wait();
    int receive();

private:
    void trace_round(int64_t recv_slots);
    bool rounds_agree();
    void count_rows_to(int64_t src, int64_t n);
    void tell_receivers();
    void add_slot(int64_t t, int64_t k, const float *weight);
    const uint8_t *slot(int64_t t, int64_t k);
    void send_blocks(int64_t N, int64_t recv_slots);
    void reduce_token(int64_t t);

    const CombineParams &p_;
    KernelCall &call_;
    const std::vector<Slot> &in_, &out_;
    void *workspace_;
    bool bf16_;
    Fmt mxfmt_;                  // comm quant 3 / 4
    // inputs and output
    const uint16_t *ex_;
    const uint16_t *rows_;       // the rows send() returns: expand_x, or with TP the reduce-scattered sums
    int64_t tp_rows_ = -1;       // with TP: this rank's own rows (tp_send_counts[tp_rank_id])
    const int32_t *ids_, *assist_, *send_counts_;
    const float *w_;
    const uint8_t *mask_;
    const uint16_t *shared_x_, *ori_, *al1_, *al2_, *cv_;
    uint16_t *x_out_;
    // workspace
    float *tmp_;
    // outside the workspace (kernel_scratch.h)
    CallCounters *sendcnt_ = nullptr;   // rows sent to each rank, during send()
    std::vector<int32_t> receivers_;   // the ranks given rows, in first-row order
    float *acc_ = nullptr;             // the token being reduced, during receive()
    // per call
    std::string err_;
    RankTable ranks_;            // elastic_info's re-mapping (after err_, which it may set)
    int64_t round_ = kUnknownRound;   // the dispatch this rank's routing inputs come from
    int64_t expected_ = 0;       // slots this rank's tokens read
    int64_t t_ready_ = 0;        // when this rank's wait for the exchange began
};

CombineKernel::CombineKernel(const CombineParams &p, KernelCall &call, const std::vector<Slot> &in,
                             const std::vector<Slot> &out, void *workspace)
    : p_(p), call_(call), in_(in), out_(out), workspace_(workspace),
      ranks_(p.has_elastic ? ptr<const int32_t>(in, kElastic) : nullptr, p, &err_) {
    bf16_ = p.dtype == ACL_BF16;
    mxfmt_ = p.comm_quant == 3 ? Fmt::E5M2 : Fmt::E4M3;
    ex_ = ptr<const uint16_t>(in, kExpandX);
    rows_ = ex_;
    ids_ = ptr<const int32_t>(in, kIds);
    assist_ = ptr<const int32_t>(in, kAssist);
    send_counts_ = ptr<const int32_t>(in, kSendCounts);
    w_ = p.has_w ? ptr<const float>(in, kEScales) : nullptr;
    mask_ = p.mask_dims ? ptr<const uint8_t>(in, kMask) : nullptr;
    shared_x_ = p.has_shared_x ? ptr<const uint16_t>(in, kSharedX) : nullptr;
    ori_ = ptr<const uint16_t>(in, kOriX);
    al1_ = ptr<const uint16_t>(in, kAlpha1);
    al2_ = ptr<const uint16_t>(in, kAlpha2);
    cv_ = ptr<const uint16_t>(in, kConstV);
    x_out_ = ptr<uint16_t>(out, kXOut);

    const CombineWs wsl = combine_ws(p);
    uint8_t *ws = static_cast<uint8_t *>(workspace);
    tmp_ = reinterpret_cast<float *>(ws + wsl.tmp);
}

// Row i < N (N = the last ep_send_counts entry of this rank's role) goes to slot t*(K+S) + k of
// rank src, from the triple (src, t, k) of assist_info_for_combine.
void CombineKernel::send() {
    const CombineParams &p = p_;
    const int64_t W = p.W, H = p.H, KS = p.K + p.S, maxBs = p.maxBs;
    const uint64_t tc = call_.layout.tc, coff = call_.layout.combine_offset;
    const uint64_t qsoff = comm_quant_scale_offset(H);
    // elastic_info: this physical rank's role (and so its row count) is its logical rank's
    const int64_t recv_slots = ranks_.logical(p.r) < p.R ? W : W * p.L;
    sendcnt_ = &CallCounters::begin(size_t(W));
    if (p.generation != 1) trace_round(recv_slots);   // the round trace follows the triples
    int64_t N = send_counts_[recv_slots - 1];
    if (N < 0 || N > p.expand_rows) {
        err_ = format("ep_send_counts[%" PRId64 "] = %" PRId64 " is outside [0, expand_x dim 0 = %" PRId64 "]",
                      recv_slots - 1, N, p.expand_rows);
        N = N < 0 ? 0 : p.expand_rows;
    }
    if (tp_rows_ >= 0 && N != tp_rows_) {
        if (err_.empty())
            err_ = format("ep_send_counts[%" PRId64 "] = %" PRId64 " differs from tp_send_counts[tp_rank_id] = %" PRId64
                          " (both count this rank's own rows)", recv_slots - 1, N, tp_rows_);
        N = N < tp_rows_ ? N : tp_rows_;
    }
    if (p.generation == 1) {
        send_blocks(N, recv_slots);
        return;
    }
    const bool streaming = stream_rows(W, uint64_t(N) * tc);
    for (int64_t i = 0; i < N; ++i) {
        const int64_t src = assist_[3 * i], t = assist_[3 * i + 1], k = assist_[3 * i + 2];
        if (src < 0 || src >= W || t < 0 || t >= maxBs || k < 0 || k >= KS) {
            if (err_.empty())
                err_ = format("assist_info_for_combine row %" PRId64 " = (%" PRId64 ", %" PRId64 ", %" PRId64
                              ") is not a valid (rank < %" PRId64 ", token < maxBs = %" PRId64 ", slot < K+S = %" PRId64
                              ") triple", i, src, t, k, W, maxBs, KS);
            continue;
        }
        uint8_t *d = call_.data(src) + coff + uint64_t(t * KS + k) * tc;
        const uint16_t *row = rows_ + i * H;
        if (p.comm_quant == 0) {
            copy_to_peer(d, row, size_t(H) * 2, streaming);
        } else if (p.comm_quant == 2) {
            comm_quant_row(row, bf16_, reinterpret_cast<int8_t *>(d), reinterpret_cast<uint16_t *>(d + qsoff), tmp_,
                           H);
        } else {
            // MXFP8: H codes, then ceil(H/32) e8m0 bytes at align(H, 32)
            mx_quant_row(row, bf16_, mxfmt_, false, d, d + qsoff, tmp_, H);
        }
        count_rows_to(src, 1);
    }
    tell_receivers();
}

void CombineKernel::count_rows_to(int64_t src, int64_t n) {
    if (n == 0) return;
    const int32_t sent = sendcnt_->get(size_t(src));
    if (sent == 0) receivers_.push_back(int32_t(src));
    sendcnt_->set(size_t(src), sent + int32_t(n));
}

// Each rank that gets rows learns how many and from which dispatch round (counts stamped with this
// call: a rank this one sends nothing reads 0 for it, and is not written: O(rows) pages, not O(W)).
void CombineKernel::tell_receivers() {
    for (const int32_t m : receivers_) {
        hccl::Mailbox *mb = call_.mailbox(m);
        hccl::put_count(mb, call_.seq, p_.r, sendcnt_->get(size_t(m)));
        put_round(mb->counts, p_.r, round_);
    }
}

// Which dispatch this rank's assist_info_for_combine / ep_send_counts come from (round_trace.h); a
// combine whose inputs belong to different traced dispatch calls fails.
void CombineKernel::trace_round(int64_t recv_slots) {
    const CombineParams &p = p_;
    CombineInputs ci;
    ci.assist = {in_[kAssist].desc.serial, assist_, uint64_t(numel(in_[kAssist].desc)) * 4};
    ci.counts = {in_[kSendCounts].desc.serial, send_counts_, uint64_t(recv_slots) * 4};
    ci.ids = {in_[kIds].desc.serial, ids_, uint64_t(p.BS * p.K) * 4};
    ci.expand_x = {in_[kExpandX].desc.serial, ex_, uint64_t(p.expand_rows * p.H) * 2};
    CombineRound cr = trace_combine(*call_.comm, ci);
    round_ = cr.round;
    if (!cr.error.empty() && err_.empty()) err_ = cr.error;
}

// Every sender's rows must belong to the same dispatch call as this rank's (where known).
bool CombineKernel::rounds_agree() {
    const CombineParams &p = p_;
    const hccl::Mailbox *mb = call_.mailbox(p.r);
    int64_t ref = round_, ref_rank = p.r;
    bool agree = true;
    hccl::for_each_count(mb, call_.seq, p.W, [&](int64_t src, int32_t) {   // the ranks that sent rows
        const int64_t rs = get_round(mb->counts, src);
        if (!agree || rs == kUnknownRound || rs == ref) return;
        if (ref == kUnknownRound) {
            ref = rs;
            ref_rank = src;
            return;
        }
        if (err_.empty())
            err_ = format("the rows of rank %" PRId64 " belong to the dispatch of collective call #%" PRId64
                          ", those of rank %" PRId64 "%s to the dispatch of call #%" PRId64 ": the ranks paired "
                          "this combine with different dispatch calls (every rank must call dispatch and combine "
                          "in the same order on a communicator)", src, rs, ref_rank,
                          ref_rank == p.r ? " (this rank)" : "", ref);
        agree = false;
    });
    return agree;
}

int CombineKernel::reduce_scatter() {
    uint16_t *summed = reinterpret_cast<uint16_t *>(static_cast<uint8_t *>(workspace_) + tp_rows_offset(p_));
    int64_t n = 0;
    std::string err;
    if (int rc = tp_reduce_scatter(p_, ex_, p_.expand_rows, ptr<const int32_t>(in_, kTpSend), summed, &n, &err,
                                   p_.op))
        return rc;
    if (!err.empty()) {
        err_ = err;
        return 0;
    }
    rows_ = summed;
    tp_rows_ = n;
    return 0;
}

int CombineKernel::wait() {
    const CombineParams &p = p_;
    static const char *const names[] = {"ep_world_size", "moe_expert_num", "maxBs (global_bs / ep_world_size)",
                                         "K (expert_ids dim 1)", "H (expand_x dim 1)", "shared_expert_num",
                                         "shared_expert_rank_num", "comm_quant_mode", "zero_expert_num",
                                         "copy_expert_num", "const_expert_num", "expand_x dtype", "comm_alg",
                                         "elastic_info (2 + 4 * a hash of its table)"};
    const int64_t fields[] = {p.W, p.E, p.maxBs, p.K, p.H, p.S, p.R, p.comm_quant, p.Z, p.C, p.Q, int64_t(p.dtype),
                              int64_t(p.alg_code), p.has_elastic ? 2 + 4 * ranks_.hash() : 0};
    constexpr uint32_t nf = sizeof(fields) / sizeof(fields[0]);
    static_assert(nf <= hccl::kMailboxFields, "mailbox fields");
    if (int rc = call_.exchange(hccl::kTagCombine, fields, names, nf, &t_ready_)) return rc;
    if (p.has_perf)
        add_perf(ptr<int64_t>(in_, kPerf), call_, t_ready_);
    return 0;
}

// Where the row of (token t, slot k) arrived: slot t*(K+S) + k of this rank's window, or in the
// first generation, which pulls, the row at expand_idx[t*K+k] of block j*W + r in the expert rank's
// window (send_blocks); nullptr, with err_ set, for a position outside the block.
const uint8_t *CombineKernel::slot(int64_t t, int64_t k) {
    const CombineParams &p = p_;
    const uint64_t tc = call_.layout.tc;
    if (p.generation != 1)
        return call_.data(p.r) + call_.layout.combine_offset + uint64_t(t * (p.K + p.S) + k) * tc;
    if (k >= p.K) {
        // shared expert s: dispatch sent every token (the first generation has no mask) to replica
        // (r % P) + s*P, receive block r, row t
        const int64_t m = (p.r % p.P) + (k - p.K) * p.P;
        return call_.data(m) + uint64_t(p.r * p.maxBs + t) * tc;
    }
    const int64_t e = ids_[t * p.K + k], pos = assist_[t * p.K + k];
    if (pos < 0 || pos >= p.maxBs) {
        if (err_.empty())
            err_ = format("expand_idx[%" PRId64 "] = %" PRId64 " is outside [0, maxBs = %" PRId64 ")", t * p.K + k, pos,
                          p.maxBs);
        return nullptr;
    }
    const int64_t m = e / p.L + p.R, j = e % p.L;
    return call_.data(m) + uint64_t((j * p.W + p.r) * p.maxBs + pos) * tc;
}

// The first generation: the rows of receive slot j*W + src (ep_send_counts' running totals) go to
// block j*W + src of this rank's own window, where their source rank reads them after the exchange;
// each source is told how many rows this rank holds for it.
void CombineKernel::send_blocks(int64_t N, int64_t recv_slots) {
    const CombineParams &p = p_;
    const int64_t W = p.W, H = p.H;
    const uint64_t tc = call_.layout.tc, qsoff = comm_quant_scale_offset(H);
    uint8_t *own = call_.data(p.r);
    int64_t start = 0;
    for (int64_t idx = 0; idx < recv_slots; ++idx) {
        const int64_t end = send_counts_[idx];
        if (end < start || end > N || end - start > p.maxBs) {
            if (err_.empty())
                err_ = format("ep_send_counts[%" PRId64 "] = %" PRId64 " is not a running total within [%" PRId64
                              ", %" PRId64 "] with at most maxBs = %" PRId64 " rows per slot", idx, end, start, N,
                              p.maxBs);
            break;
        }
        for (int64_t i = 0; start + i < end; ++i) {
            uint8_t *d = own + uint64_t(idx * p.maxBs + i) * tc;
            const uint16_t *row = rows_ + (start + i) * H;
            if (p.comm_quant == 0)
                std::memcpy(d, row, size_t(H) * 2);
            else
                comm_quant_row(row, bf16_, reinterpret_cast<int8_t *>(d), reinterpret_cast<uint16_t *>(d + qsoff),
                               tmp_, H);
        }
        count_rows_to(idx % W, end - start);
        start = end;
    }
    tell_receivers();
}

// Adds one received slot to acc_ (dequantised with comm quant 2 / 3 / 4), weighted or not.
void CombineKernel::add_slot(int64_t t, int64_t k, const float *weight) {
    const int64_t H = p_.H, KS = p_.K + p_.S;
    const uint8_t *s = k < KS ? slot(t, k) : nullptr;
    const uint64_t qsoff = comm_quant_scale_offset(H);
    ++expected_;
    if (!s) return;
    if (p_.comm_quant == 0) {
        const uint16_t *row = reinterpret_cast<const uint16_t *>(s);
        weight ? acc_add_row_w(acc_, row, bf16_, *weight, H) : acc_add_row(acc_, row, bf16_, H);
        return;
    }
    // dequantised, rounded to the row dtype, then weighted in fp32 (on the 950 the int8
    // dequantisation is fused with the weighting in this order, golden choice 9)
    if (p_.comm_quant == 2)
        comm_dequant_row(reinterpret_cast<const int8_t *>(s), reinterpret_cast<const uint16_t *>(s + qsoff), bf16_,
                         tmp_, H);
    else
        mx_dequant_row(s, s + qsoff, mxfmt_, bf16_, tmp_, H);
    weight ? acc_add_f32_w(acc_, tmp_, *weight, H) : acc_add_f32(acc_, tmp_, H);
}

// acc = sum over k of the (weighted) expert values in k order, then the shared-expert slots, then
// shared_expert_x; x_out[t] = acc rounded to the row dtype.
void CombineKernel::reduce_token(int64_t t) {
    const CombineParams &p = p_;
    const int64_t H = p.H, K = p.K, E = p.E;
    const int64_t E_end = E + p.Z + p.C + p.Q;
    std::memset(acc_, 0, size_t(H) * 4);
    for (int64_t k = 0; k < K; ++k) {
        if (p.mask_dims == 2 && !mask_[t * K + k]) continue;
        const int64_t id = ids_[t * K + k];
        const float *wt = w_ ? &w_[t * K + k] : nullptr;
        if (id >= 0 && id < E) {
            add_slot(t, k, wt);
        } else if (id >= E && id < E + p.Z) {
            // zero expert: contributes nothing
        } else if (id >= E + p.Z && id < E + p.Z + p.C) {
            const uint16_t *row = ori_ + t * H;
            wt ? acc_add_row_w(acc_, row, bf16_, *wt, H) : acc_add_row(acc_, row, bf16_, H);
        } else if (id >= E + p.Z + p.C && id < E_end) {
            const int64_t c = id - (E + p.Z + p.C);
            const_expert_row(ori_ + t * H, al1_ + c * H, al2_ + c * H, cv_ + c * H, bf16_, tmp_, H);
            wt ? acc_add_f32_w(acc_, tmp_, *wt, H) : acc_add_f32(acc_, tmp_, H);
        } else if (err_.empty()) {
            err_ = format("expert_ids[%" PRId64 ", %" PRId64 "] = %" PRId64 " is outside [0, %" PRId64 ")", t, k, id,
                          E_end);
        }
    }
    if (p.R > 0)
        for (int64_t s = 0; s < p.S; ++s) add_slot(t, K + s, nullptr);
    if (shared_x_) acc_add_row(acc_, shared_x_ + t * H, bf16_, H);
    f32_to_row(acc_, x_out_ + t * H, bf16_, H);
}

int CombineKernel::receive() {
    const CombineParams &p = p_;
    hccl::Mailbox *mb = call_.mailbox(p.r);
    int64_t received = 0;
    hccl::for_each_count(mb, call_.seq, p.W, [&](int64_t, int32_t c) { received += c; });
    if (rounds_agree()) {
        const ScratchFloats acc(size_t(p.H));
        acc_ = acc.data();
        const int64_t ntok = tokens_considered(mask_, p.mask_dims, p.BS);
        for (int64_t t = 0; t < ntok; ++t)
            if (token_valid(mask_, p.mask_dims, t, p.K)) reduce_token(t);   // x_out rows of others untouched
        acc_ = nullptr;
    }
    hccl::forget_counts(mb, p.W);
    if (err_.empty() && received < expected_)
        err_ = format("received %" PRId64 " expert rows but this rank's expert_ids / x_active_mask need %" PRId64
                      " (assist_info_for_combine / ep_send_counts of the peers do not belong to this round)",
                      received, expected_);
    if (!err_.empty()) return fail(kKernelFail, "%s: rank %" PRId64 ": %s", p.op, p.r, err_.c_str());
    return 0;
}

// A launch between its steps: the call, the params it runs with and the kernel, which refers to both.
struct CombineFlight final : KernelRest {
    KernelCall call;
    CombineParams q;
    std::optional<CombineKernel> k;

    int step() override {
        if (int rc = k->wait()) return rc;   // kTaskPending while peers are missing
        return k->receive();
    }
};

static_assert(sizeof(CombineFlight) <= KernelRest::kRestBytes, "a combine's rest shares the size of every rest");

int CombineExecutor::run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *,
                         std::unique_ptr<KernelRest> *rest) {
    auto f = std::make_unique<CombineFlight>();
    if (int rc = begin_call(f->call, &f->q, p_, in, kCtx, kElastic)) return rc;
    f->k.emplace(f->q, f->call, in, out, workspace);
    if (p_.tp == 2)
        if (int rc = f->k->reduce_scatter()) return rc;
    f->k->send();
    return first_step(std::move(f), rest);
}

}  // namespace

// Phase 1 of every generation: the context (generation 5) or the group strings (2 to 4) name the
// communicator; the window rule then checks the window it has.
aclnnStatus aclmock::moe::combine_phase1(const CombineArgs &a, const CombineAttrs &attrs, uint64_t *workspace_size,
                                         aclOpExecutor **executor) {
    CombineParams p;
    static_cast<CombineAttrs &>(p) = attrs;
    if (int rc = check_pointers(a, p, workspace_size, executor)) return rc;
    if (int rc = check_descriptors(a, p)) return rc;
    if (int rc = check_modes(p)) return rc;
    hccl::Comm *comm = nullptr, *tp = nullptr;
    if (p.generation != 5)
        if (int rc = resolve_groups(p, &comm, &tp)) return rc;
    if (int rc = check_inputs(a, p)) return rc;
    if (int rc = check_outputs(a, p)) return rc;
    if (p.generation == 5)
        if (int rc = resolve_context(*a[kCtx], p, &comm)) return rc;
    if (int rc = check_window(p, comm)) return rc;
    if (int rc = check_tp_window(p, tp, p.A, align_up(uint64_t(p.H) * 2, 32))) return rc;
    return make_executor(a, p, workspace_size, executor);
}

#pragma GCC visibility pop

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV5GetWorkspaceSize(
    const aclTensor *context, const aclTensor *expandX, const aclTensor *expertIds,
    const aclTensor *assistInfoForCombine, const aclTensor *epSendCounts, const aclTensor *expertScales,
    const aclTensor *tpSendCountsOptional, const aclTensor *xActiveMaskOptional,
    const aclTensor *activationScaleOptional, const aclTensor *weightScaleOptional,
    const aclTensor *groupListOptional, const aclTensor *expandScalesOptional,
    const aclTensor *sharedExpertXOptional, const aclTensor *elasticInfoOptional,
    const aclTensor *oriXOptional, const aclTensor *constExpertAlpha1Optional,
    const aclTensor *constExpertAlpha2Optional, const aclTensor *constExpertVOptional,
    const aclTensor *performanceInfoOptional, int64_t epWorldSize, int64_t epRankId,
    int64_t moeExpertNum, int64_t cclBufferSize, int64_t tpWorldSize, int64_t tpRankId,
    int64_t expertShardType, int64_t sharedExpertNum, int64_t sharedExpertRankNum, int64_t globalBs,
    int64_t outDtype, int64_t commQuantMode, int64_t groupListType, const char *commAlg,
    int64_t zeroExpertNum, int64_t copyExpertNum, int64_t constExpertNum, aclTensor *xOut,
    uint64_t *workspaceSize, aclOpExecutor **executor) {
    const CombineArgs a{{context, expandX, expertIds, assistInfoForCombine, epSendCounts, expertScales,
                         tpSendCountsOptional, xActiveMaskOptional, activationScaleOptional, weightScaleOptional,
                         groupListOptional, expandScalesOptional, sharedExpertXOptional, elasticInfoOptional,
                         oriXOptional, constExpertAlpha1Optional, constExpertAlpha2Optional, constExpertVOptional,
                         performanceInfoOptional},
                        xOut};
    CombineAttrs p;
    p.op = kOp;
    p.W = epWorldSize; p.r = epRankId; p.E = moeExpertNum; p.ccl = cclBufferSize;
    p.tp_world = tpWorldSize; p.tp_rank = tpRankId; p.shard = expertShardType;
    p.S_attr = sharedExpertNum; p.R = sharedExpertRankNum; p.global_bs = globalBs;
    p.Z = zeroExpertNum; p.C = copyExpertNum; p.Q = constExpertNum;
    p.comm_alg = commAlg ? commAlg : "";
    p.comm_quant = commQuantMode; p.out_dtype = outDtype; p.group_list_type = groupListType;
    return combine_phase1(a, p, workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV5(void *workspace, uint64_t workspaceSize,
                                                               aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, kOp);
}
