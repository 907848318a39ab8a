// aclnnMoeDistributeCombineV5 on the mock (SPEC §1.2, §5, §6; window layout in moe_window.h).
// Ascend950 profile (SPEC §6.3, §4.7): comm quant 3 / 4 (MXFP8 e5m2 / e4m3fn, block 32, e8m0
// scales; golden.py choice 8), the fused int8 dequantisation (the same values as A3, choice 9),
// elastic_info (choice 10) and performance_info.
#include <cinttypes>
#include <cstring>
#include <memory>
#include <vector>

#include "aclnnop/aclnn_moe_distribute_combine_v5.h"
#include "ops/lowp.h"
#include "ops/moe_checks.h"
#include "ops/numerics.h"

#pragma GCC visibility push(hidden)

using namespace aclmock;
using namespace aclmock::moe;

namespace {

constexpr const char *kOp = "aclnnMoeDistributeCombineV5";

// input slots (aclSetInputTensorAddr indices), in the operator's input order
enum In {
    kCtx, kExpandX, kIds, kAssist, kSendCounts, kEScales, kTpSend, kMask, kActScale, kWScale, kGroupList,
    kExpandScales, kSharedX, kElastic, kOriX, kAlpha1, kAlpha2, kConstV, kPerf, kNumIn
};
enum Out { kXOut, kNumOut };

struct CombineParams : MoeParams {
    int64_t comm_quant = 0;
    bool has_w = false;            // expert_scales non-empty → weighted
    int mask_dims = 0;
    bool has_shared_x = false;
    int64_t expand_rows = 0;       // expand_x dim0
    bool has_elastic = false;
    bool has_perf = false;
};

class CombineExecutor final : public Executor {
public:
    explicit CombineExecutor(const CombineParams &p) : Executor(kOp), p_(p) {}
    int run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *) override;

private:
    CombineParams p_;
};

int CombineExecutor::run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *) {
    const CombineParams &p = p_;
    hccl::Comm *comm = nullptr;
    if (int rc = begin_kernel(in[kCtx].desc, p, kOp, &comm)) return rc;
    UseGuard guard{comm};

    const uint64_t seq = comm->next_seq();
    const int half = int(seq % 2);
    const int64_t W = p.W, S = p.S, K = p.K, H = p.H, E = p.E, r = p.r, maxBs = p.maxBs;
    const int64_t KS = K + S;
    const bool bf16 = p.dtype == ACL_BF16;
    const Layout lay = make_layout(W, p.L, maxBs, H, K, S, p.fullmesh_v2);
    const uint64_t tc = lay.tc, coff = lay.combine_offset;
    const uint64_t qsoff = comm_quant_scale_offset(H);
    const Fmt mxfmt = p.comm_quant == 3 ? Fmt::E5M2 : Fmt::E4M3;   // comm quant 3 / 4 (SPEC §5)

    const uint16_t *ex = ptr<const uint16_t>(in, kExpandX);
    const int32_t *ids = ptr<const int32_t>(in, kIds);
    const int32_t *assist = ptr<const int32_t>(in, kAssist);
    const int32_t *send_counts = ptr<const int32_t>(in, kSendCounts);
    const float *w = p.has_w ? ptr<const float>(in, kEScales) : nullptr;
    const uint8_t *mask = p.mask_dims ? ptr<const uint8_t>(in, kMask) : nullptr;
    const uint16_t *shared_x = p.has_shared_x ? ptr<const uint16_t>(in, kSharedX) : nullptr;
    const uint16_t *ori = ptr<const uint16_t>(in, kOriX);
    const uint16_t *al1 = ptr<const uint16_t>(in, kAlpha1);
    const uint16_t *al2 = ptr<const uint16_t>(in, kAlpha2);
    const uint16_t *cv = ptr<const uint16_t>(in, kConstV);
    uint16_t *x_out = ptr<uint16_t>(out, kXOut);

    const CombineWs wsl = combine_ws(p);
    uint8_t *ws = static_cast<uint8_t *>(workspace);
    int32_t *sendcnt = reinterpret_cast<int32_t *>(ws + wsl.sendcnt);
    float *acc = reinterpret_cast<float *>(ws + wsl.acc);
    float *tmp = reinterpret_cast<float *>(ws + wsl.tmp);
    std::memset(sendcnt, 0, size_t(W) * 4);

    // ---- send phase (SPEC §6.1) ------------------------------------------------------------------
    std::string err;
    // elastic_info (SPEC §4.7): this physical rank's role (and so its row count) is its logical rank's
    std::vector<int32_t> table, logical;
    elastic_table(p.has_elastic ? ptr<const int32_t>(in, kElastic) : nullptr, p, &table, &logical, &err);
    const int64_t recv_slots = logical[size_t(r)] < p.R ? W : W * p.L;
    int64_t N = send_counts[recv_slots - 1];
    if (N < 0 || N > p.expand_rows) {
        err = format("ep_send_counts[%" PRId64 "] = %" PRId64 " is outside [0, expand_x dim 0 = %" PRId64 "]",
                     recv_slots - 1, N, p.expand_rows);
        N = N < 0 ? 0 : p.expand_rows;
    }
    for (int64_t i = 0; i < N; ++i) {
        const int64_t src = assist[3 * i], t = assist[3 * i + 1], k = assist[3 * i + 2];
        if (src < 0 || src >= W || t < 0 || t >= maxBs || k < 0 || k >= KS) {
            if (err.empty())
                err = format("assist_info_for_combine row %" PRId64 " = (%" PRId64 ", %" PRId64 ", %" PRId64
                             ") is not a valid (rank < %" PRId64 ", token < maxBs = %" PRId64 ", slot < K+S = %" PRId64
                             ") triple", i, src, t, k, W, maxBs, KS);
            continue;
        }
        uint8_t *d = comm->data_half(uint32_t(src), half) + coff + uint64_t(t * KS + k) * tc;
        const uint16_t *row = ex + i * H;
        if (p.comm_quant == 0) {
            std::memcpy(d, row, size_t(H) * 2);
        } else if (p.comm_quant == 2) {
            comm_quant_row(row, bf16, reinterpret_cast<int8_t *>(d), reinterpret_cast<uint16_t *>(d + qsoff), tmp, H);
        } else {
            // MXFP8: H codes, then ceil(H/32) e8m0 bytes at align(H, 32)
            mx_quant_row(row, bf16, mxfmt, false, d, d + qsoff, tmp, H);
        }
        ++sendcnt[src];
    }
    for (int64_t m = 0; m < W; ++m) comm->mailbox(uint32_t(m), half)->counts[r] = sendcnt[m];
    static const char *const names[] = {"ep_world_size", "moe_expert_num", "maxBs (global_bs / ep_world_size)",
                                         "K (expert_ids dim 1)", "H (expand_x dim 1)", "shared_expert_num",
                                         "shared_expert_rank_num", "comm_quant_mode", "zero_expert_num",
                                         "copy_expert_num", "const_expert_num", "expand_x dtype", "comm_alg",
                                         "elastic_info (2 + 4 * a hash of its table)"};
    const int64_t fields[] = {W, E, maxBs, K, H, S, p.R, p.comm_quant, p.Z, p.C, p.Q, int64_t(p.dtype),
                              int64_t(p.alg_code), p.has_elastic ? 2 + 4 * table_hash(table) : 0};
    constexpr uint32_t nf = sizeof(fields) / sizeof(fields[0]);
    static_assert(nf <= hccl::kMailboxFields, "mailbox fields");
    const uint64_t stamps = perf_stamp_offset(lay);
    // publish to this rank first (a delay injected into this call happens there), then to every peer,
    // each entry preceded by this rank's time stamp for the peer's performance_info
    comm->publish(uint32_t(r), seq, hccl::kTagCombine, fields, nf);
    for (int64_t m = 0; m < W; ++m) {
        if (p.soc950) write_perf_stamp(comm->data_half(uint32_t(m), half) + stamps, r);
        if (m != r) comm->publish(uint32_t(m), seq, hccl::kTagCombine, fields, nf);
    }
    const int64_t t_ready = monotonic_ns();
    if (int rc = comm->wait_all(seq, hccl::kTagCombine, fields, names, nf, kOp)) return rc;
    if (p.has_perf) add_perf(ptr<int64_t>(in, kPerf), comm->data_half(uint32_t(r), half) + stamps, W, t_ready);

    // ---- receive and reduce (SPEC §6.2) ---------------------------------------------------------
    const int32_t *mc = comm->mailbox(uint32_t(r), half)->counts;
    int64_t received = 0;
    for (int64_t m = 0; m < W; ++m) received += mc[m];
    const uint8_t *own = comm->data_half(uint32_t(r), half) + coff;
    const int64_t BS = p.BS;
    int64_t ntok = BS;
    if (p.mask_dims == 1) {
        ntok = 0;
        for (int64_t t = 0; t < BS; ++t) ntok += mask[t] != 0;
    }
    const int64_t E_end = E + p.Z + p.C + p.Q;
    int64_t expected = 0;
    // add one received slot (dequantised with comm quant 2) to acc, weighted or not
    auto add_slot = [&](int64_t t, int64_t k, bool weighted, float wt) {
        const uint8_t *s = own + uint64_t(t * KS + k) * tc;
        ++expected;
        if (p.comm_quant == 0) {
            const uint16_t *row = reinterpret_cast<const uint16_t *>(s);
            weighted ? acc_add_row_w(acc, row, bf16, wt, H) : acc_add_row(acc, row, bf16, H);
        } else {
            // dequantised, rounded to the row dtype, then weighted in fp32 (SPEC §6.3; on the 950 the
            // int8 dequantisation is fused with the weighting in this order, golden choice 9)
            if (p.comm_quant == 2)
                comm_dequant_row(reinterpret_cast<const int8_t *>(s), reinterpret_cast<const uint16_t *>(s + qsoff),
                                 bf16, tmp, H);
            else
                mx_dequant_row(s, s + qsoff, mxfmt, bf16, tmp, H);
            weighted ? acc_add_f32_w(acc, tmp, wt, H) : acc_add_f32(acc, tmp, H);
        }
    };
    for (int64_t t = 0; t < ntok; ++t) {
        if (p.mask_dims == 2) {
            bool any = false;
            for (int64_t k = 0; k < K; ++k) any |= mask[t * K + k] != 0;
            if (!any) continue;   // x_out row left untouched
        }
        std::memset(acc, 0, size_t(H) * 4);
        for (int64_t k = 0; k < K; ++k) {
            if (p.mask_dims == 2 && !mask[t * K + k]) continue;
            const int64_t id = ids[t * K + k];
            const float wt = w ? w[t * K + k] : 1.0f;
            if (id >= 0 && id < E) {
                add_slot(t, k, w != nullptr, wt);
            } else if (id >= E && id < E + p.Z) {
                // zero expert: contributes nothing
            } else if (id >= E + p.Z && id < E + p.Z + p.C) {
                const uint16_t *row = ori + t * H;
                w ? acc_add_row_w(acc, row, bf16, wt, H) : acc_add_row(acc, row, bf16, H);
            } else if (id >= E + p.Z + p.C && id < E_end) {
                const int64_t c = id - (E + p.Z + p.C);
                const_expert_row(ori + t * H, al1 + c * H, al2 + c * H, cv + c * H, bf16, tmp, H);
                w ? acc_add_f32_w(acc, tmp, wt, H) : acc_add_f32(acc, tmp, H);
            } else if (err.empty()) {
                err = format("expert_ids[%" PRId64 ", %" PRId64 "] = %" PRId64 " is outside [0, %" PRId64 ")", t, k, id,
                             E_end);
            }
        }
        if (p.R > 0)
            for (int64_t s = 0; s < S; ++s) add_slot(t, K + s, false, 1.0f);
        if (shared_x) acc_add_row(acc, shared_x + t * H, bf16, H);
        f32_to_row(acc, x_out + t * H, bf16, H);
    }
    if (err.empty() && received < expected)
        err = format("received %" PRId64 " expert rows but this rank's expert_ids / x_active_mask need %" PRId64
                     " (assist_info_for_combine / ep_send_counts of the peers do not belong to this round)",
                     received, expected);
    if (!err.empty()) return fail(kKernelFail, "%s: rank %" PRId64 ": %s", kOp, r, err.c_str());
    return 0;
}

Slot slot_of(const aclTensor *t) {
    Slot s;
    if (t) {
        s.present = true;
        s.desc = *t;
    }
    return s;
}

}  // namespace

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
    if (int rc = need(context, "context")) return rc;
    if (int rc = need(expandX, "expand_x")) return rc;
    if (int rc = need(expertIds, "expert_ids")) return rc;
    if (int rc = need(assistInfoForCombine, "assist_info_for_combine")) return rc;
    if (int rc = need(epSendCounts, "ep_send_counts")) return rc;
    if (int rc = need(expertScales, "expert_scales")) return rc;
    if (int rc = need(xOut, "x_out")) return rc;
    if (int rc = need(workspaceSize, "workspaceSize")) return rc;
    if (int rc = need(executor, "executor")) return rc;

    const aclTensor *ins[kNumIn] = {context, expandX, expertIds, assistInfoForCombine, epSendCounts, expertScales,
                                    tpSendCountsOptional, xActiveMaskOptional, activationScaleOptional,
                                    weightScaleOptional, groupListOptional, expandScalesOptional,
                                    sharedExpertXOptional, elasticInfoOptional, oriXOptional,
                                    constExpertAlpha1Optional, constExpertAlpha2Optional, constExpertVOptional,
                                    performanceInfoOptional};
    static const char *const in_names[kNumIn] = {
        "context", "expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts", "expert_scales",
        "tp_send_counts", "x_active_mask", "activation_scale", "weight_scale", "group_list", "expand_scales",
        "shared_expert_x", "elastic_info", "ori_x", "const_expert_alpha_1", "const_expert_alpha_2",
        "const_expert_v", "performance_info"};
    for (int i = 0; i < kNumIn; ++i)
        if (ins[i])
            if (int rc = check_tensor(ins[i], in_names[i])) return rc;
    if (int rc = check_tensor(xOut, "x_out")) return rc;
    if (int rc = check_context_tensor(context)) return rc;

    CombineParams p;
    p.W = epWorldSize; p.r = epRankId; p.E = moeExpertNum; p.ccl = cclBufferSize;
    p.tp_world = tpWorldSize; p.tp_rank = tpRankId; p.shard = expertShardType;
    p.S_attr = sharedExpertNum; p.R = sharedExpertRankNum; p.global_bs = globalBs;
    p.Z = zeroExpertNum; p.C = copyExpertNum; p.Q = constExpertNum;
    p.comm_alg = commAlg ? commAlg : "";
    p.comm_quant = commQuantMode;
    if (int rc = check_attrs(p)) return rc;
    if (p.soc950) {
        if (p.comm_quant != 0 && p.comm_quant != 2 && p.comm_quant != 3 && p.comm_quant != 4)
            return bad("comm_quant_mode", "must be 0, 2, 3 or 4 on Ascend950 (got %" PRId64 ")", p.comm_quant);
    } else if (p.comm_quant != 0 && p.comm_quant != 2) {
        return bad("comm_quant_mode", "must be 0 or 2 on Ascend910_93 (got %" PRId64 ")", p.comm_quant);
    }
    if (outDtype != 0) return bad("out_dtype", "is reserved and must be 0 (got %" PRId64 ")", outDtype);
    if (groupListType != 0)
        return bad("group_list_type", "is reserved and must be 0 (got %" PRId64 ")", groupListType);

    static const aclDataType f16s[] = {ACL_FLOAT16, ACL_BF16};
    static const aclDataType i32[] = {ACL_INT32};
    static const aclDataType f32[] = {ACL_FLOAT};
    if (int rc = check_dtype(expandX, "expand_x", f16s, 2)) return rc;
    if (int rc = check_rank(expandX, "expand_x", 2)) return rc;
    if (int rc = check_dtype(expertIds, "expert_ids", i32, 1)) return rc;
    if (int rc = check_rank(expertIds, "expert_ids", 2)) return rc;
    p.dtype = expandX->dtype;
    p.BS = expertIds->view[0];
    p.K = expertIds->view[1];
    p.H = expandX->view[1];
    if (int rc = check_sizes(p, "expert_ids", "expand_x")) return rc;
    // 950: elastic_info makes A the larger of both roles' (SPEC §2); A3 refuses both further down
    if (int rc = check_elastic_perf(elasticInfoOptional, performanceInfoOptional, p)) return rc;
    p.has_elastic = p.soc950 && elasticInfoOptional != nullptr;
    p.has_perf = p.soc950 && performanceInfoOptional != nullptr;
    if (expandX->view[0] < p.A)
        return bad("expand_x", "dim 0 must be >= A = %" PRId64 " (got %" PRId64 ")", p.A, expandX->view[0]);
    p.expand_rows = expandX->view[0];
    if (int rc = check_dtype(assistInfoForCombine, "assist_info_for_combine", i32, 1)) return rc;
    if (int rc = check_rank(assistInfoForCombine, "assist_info_for_combine", 1)) return rc;
    if (assistInfoForCombine->view[0] < p.A * 128)
        return bad("assist_info_for_combine", "dim 0 must be >= A * 128 = %" PRId64 " (got %" PRId64 ")",
                   p.A * 128, assistInfoForCombine->view[0]);
    if (int rc = check_dtype(epSendCounts, "ep_send_counts", i32, 1)) return rc;
    if (int rc = check_rank(epSendCounts, "ep_send_counts", 1)) return rc;
    if (epSendCounts->view[0] < p.recv_slots)
        return bad("ep_send_counts", "dim 0 must be >= %s = %" PRId64 " (got %" PRId64 ")",
                   p.shared_rank && !p.has_elastic ? "ep_world_size on a shared-expert rank" : "ep_world_size * L", p.recv_slots,
                   epSendCounts->view[0]);
    if (int rc = check_dtype(expertScales, "expert_scales", f32, 1)) return rc;
    if (no_zero_dim(expertScales)) {
        if (expertScales->view.size() != 2 || expertScales->view[0] != p.BS || expertScales->view[1] != p.K)
            return bad("expert_scales", "shape must be (BS, K) = (%" PRId64 ", %" PRId64 ") or empty (got %s)", p.BS,
                       p.K, dims_str(expertScales).c_str());
        p.has_w = true;
    }
    if (int rc = check_mask(xActiveMaskOptional, p)) return rc;
    p.mask_dims = xActiveMaskOptional ? int(xActiveMaskOptional->view.size()) : 0;
    if (activationScaleOptional)
        return bad("activation_scale", "must be NULL (got a %s tensor)", dims_str(activationScaleOptional).c_str());
    if (weightScaleOptional)
        return bad("weight_scale", "must be NULL (got a %s tensor)", dims_str(weightScaleOptional).c_str());
    if (groupListOptional)
        return bad("group_list", "must be NULL (got a %s tensor)", dims_str(groupListOptional).c_str());
    if (expandScalesOptional) {
        if (int rc = check_dtype(expandScalesOptional, "expand_scales", f32, 1)) return rc;
        if (int rc = check_rank(expandScalesOptional, "expand_scales", 1)) return rc;
    }
    const aclDataType same[] = {p.dtype};
    if (sharedExpertXOptional) {
        if (p.R != 0)
            return bad("shared_expert_x", "is only allowed when shared_expert_rank_num is 0 (got "
                       "shared_expert_rank_num %" PRId64 ")", p.R);
        if (int rc = check_dtype(sharedExpertXOptional, "shared_expert_x", same, 1, "(expand_x's dtype)")) return rc;
        const auto &d = sharedExpertXOptional->view;
        bool ok = (d.size() == 2 && d[0] == p.BS && d[1] == p.H) ||
                  (d.size() == 3 && d[0] * d[1] == p.BS && d[2] == p.H);
        if (!ok)
            return bad("shared_expert_x", "shape must be (BS, H) = (%" PRId64 ", %" PRId64 ") or 3-D (a, b, H) with "
                       "a*b == BS (got %s)", p.BS, p.H, dims_str(sharedExpertXOptional).c_str());
        p.has_shared_x = true;
    }
    if (int rc = check_reserved(elasticInfoOptional, "elastic_info", p)) return rc;
    if (int rc = check_reserved(performanceInfoOptional, "performance_info", p)) return rc;
    if (p.C > 0 || p.Q > 0) {
        if (!oriXOptional) {
            set_error(format("ori_x: must not be NULL when copy_expert_num or const_expert_num is > 0 (got %" PRId64
                             ", %" PRId64 ")", p.C, p.Q));
            return ACLNN_ERR_PARAM_NULLPTR;
        }
    }
    if (oriXOptional) {
        if (int rc = check_dtype(oriXOptional, "ori_x", same, 1, "(expand_x's dtype)")) return rc;
        const auto &d = oriXOptional->view;
        if (d.size() != 2 || d[0] != p.BS || d[1] != p.H)
            return bad("ori_x", "shape must be (BS, H) = (%" PRId64 ", %" PRId64 ") (got %s)", p.BS, p.H,
                       dims_str(oriXOptional).c_str());
    }
    const struct { const aclTensor *t; const char *name; } consts[] = {
        {constExpertAlpha1Optional, "const_expert_alpha_1"}, {constExpertAlpha2Optional, "const_expert_alpha_2"},
        {constExpertVOptional, "const_expert_v"}};
    for (const auto &c : consts) {
        if (p.Q > 0 && !c.t) {
            set_error(format("%s: must not be NULL when const_expert_num is > 0 (got %" PRId64 ")", c.name, p.Q));
            return ACLNN_ERR_PARAM_NULLPTR;
        }
        if (!c.t) continue;
        if (int rc = check_dtype(c.t, c.name, same, 1, "(expand_x's dtype)")) return rc;
        const auto &d = c.t->view;
        if (p.Q > 0 && (d.size() != 2 || d[0] != p.Q || d[1] != p.H))
            return bad(c.name, "shape must be (const_expert_num, H) = (%" PRId64 ", %" PRId64 ") (got %s)", p.Q, p.H,
                       dims_str(c.t).c_str());
    }
    if (int rc = check_dtype(xOut, "x_out", same, 1, "(expand_x's dtype)")) return rc;
    if (xOut->view.size() != 2 || xOut->view[0] != p.BS || xOut->view[1] != p.H)
        return bad("x_out", "shape must be (BS, H) = (%" PRId64 ", %" PRId64 ") (got %s)", p.BS, p.H,
                   dims_str(xOut).c_str());

    hccl::Comm *comm = nullptr;
    if (int rc = resolve_context(*context, p, &comm, ACLNN_ERR_PARAM_INVALID, nullptr)) return rc;
    if (int rc = check_window(p, comm)) return rc;

    auto ex = std::make_shared<CombineExecutor>(p);
    for (const aclTensor *t : ins) ex->inputs.push_back(slot_of(t));
    ex->outputs.push_back(slot_of(xOut));
    ex->workspace_size = combine_ws(p).total;
    aclOpExecutor *h = register_executor(ex);
    if (!h) return fail(ACLNN_ERR_INNER_CREATE_EXECUTOR, "%s: could not register the executor", kOp);
    *workspaceSize = ex->workspace_size;
    *executor = h;
    return ACLNN_SUCCESS;
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV5(void *workspace, uint64_t workspaceSize,
                                                               aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, kOp);
}
