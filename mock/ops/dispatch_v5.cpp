// aclnnMoeDistributeDispatchV5 on the mock (SPEC §1.1, §3, §4; window layout in moe_window.h).
// Ascend950 profile (SPEC §4.6, §4.7, §11): quant modes 1, 3, 4, 5, fp8 outputs of mode 2,
// low-precision inputs with forwarded per-token scales, elastic_info and performance_info; the
// numerics follow the choices listed in aclnn_py/golden.py's docstring (lowp.h).
#include <cinttypes>
#include <cstring>
#include <memory>
#include <vector>

#include "aclnnop/aclnn_moe_distribute_dispatch_v5.h"
#include "ops/lowp.h"
#include "ops/moe_checks.h"
#include "ops/numerics.h"

using namespace aclmock;
using namespace aclmock::moe;

namespace {

constexpr const char *kOp = "aclnnMoeDistributeDispatchV5";

// input slots (aclSetInputTensorAddr indices)
enum In { kCtx, kX, kIds, kScales, kMask, kEScales, kElastic, kPerf, kNumIn };
// output slots (aclSetOutputTensorAddr indices)
enum Out { kExpandX, kDynScales, kAssist, kTokNums, kRecvCounts, kTpRecv, kExpandScales, kNumOut };

struct DispatchParams : MoeParams {
    int64_t quant = 0;
    int64_t ent_type = 1;          // expert_token_nums_type
    bool has_escales = false;      // expert_scales present (non-NULL, no zero dim)
    bool has_smooth = false;       // smooth scales (quant 2 / 3)
    int mask_dims = 0;             // 0 none, 1, 2
    int64_t expand_rows = 0;       // expand_x dim0 (capacity actually given)
    // formats and row layout (SPEC §4.6; window row layout in moe_window.h)
    Fmt yfmt = Fmt::None;          // expand_x format (None: a copy of fp16/bf16 x, quant 0)
    Fmt xfmt = Fmt::None;          // low-precision x (None: fp16/bf16)
    aclDataType ydtype = ACL_DT_UNDEFINED;
    int static_kind = 0;           // quant 1 scales: 0 scalar (1,), 1 row (H,), 2 per expert (E[+S], H)
    int64_t xrow_bytes = 0;        // one x row
    int64_t out_row_bytes = 0;     // one expand_x row
    int64_t tok_scale_bytes = 0;   // low-precision x: one per-token scale row (forwarded)
    int64_t dyn_bytes = 0;         // one dynamic_scales row written (0: none)
    int64_t dyn_off = 0;           // where it travels in the window row
    // Ascend950 inputs (SPEC §4.7, §0)
    bool has_elastic = false;
    bool has_perf = false;
};

// Bytes of n elements of a (possibly 4-bit) type.
inline int64_t bytes_of(aclDataType dt, int64_t n) { return (n * dtype_bits(dt) + 7) / 8; }

Fmt fmt_of(aclDataType dt) {
    switch (dt) {
    case ACL_INT8: return Fmt::Int8;
    case ACL_HIFLOAT8: return Fmt::HiF8;
    case ACL_FLOAT8_E4M3FN: return Fmt::E4M3;
    case ACL_FLOAT8_E5M2: return Fmt::E5M2;
    case ACL_FLOAT4_E2M1: return Fmt::E2M1;
    case ACL_FLOAT4_E1M2: return Fmt::E1M2;
    default: return Fmt::None;
    }
}

class DispatchExecutor final : public Executor {
public:
    explicit DispatchExecutor(const DispatchParams &p) : Executor(kOp), p_(p) {}
    int run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *) override;

private:
    DispatchParams p_;
};

int DispatchExecutor::run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *) {
    const DispatchParams &p = p_;
    hccl::Comm *comm = nullptr;
    if (int rc = begin_kernel(in[kCtx].desc, p, kOp, &comm)) return rc;
    UseGuard guard{comm};

    const uint64_t seq = comm->next_seq();
    const int half = int(seq % 2);
    const int64_t W = p.W, R = p.R, S = p.S, L = p.L, K = p.K, H = p.H, E = p.E, r = p.r;
    const int64_t maxBs = p.maxBs;
    const bool bf16 = p.dtype == ACL_BF16;
    const Layout lay = make_layout(W, L, maxBs, H, K, S, p.fullmesh_v2);
    const uint64_t td = lay.td;
    const uint64_t soff = dispatch_scale_offset(H), woff = dispatch_weight_offset(H), toff = dispatch_triple_offset(H);
    const uint64_t payload = dispatch_payload_bytes(H);

    const uint8_t *xb = ptr<const uint8_t>(in, kX);
    const uint16_t *x = ptr<const uint16_t>(in, kX);
    const int32_t *ids = ptr<const int32_t>(in, kIds);
    const float *scales = ptr<const float>(in, kScales);            // smooth / static (float32)
    const uint8_t *tok_scales = p.xfmt != Fmt::None ? ptr<const uint8_t>(in, kScales) : nullptr;
    const float *smooth = p.has_smooth ? scales : nullptr;
    const uint8_t *mask = p.mask_dims ? ptr<const uint8_t>(in, kMask) : nullptr;
    const float *escales = p.has_escales ? ptr<const float>(in, kEScales) : nullptr;

    const DispatchWs wsl = dispatch_ws(p);
    uint8_t *ws = static_cast<uint8_t *>(workspace);
    int32_t *cnt = reinterpret_cast<int32_t *>(ws + wsl.counts);   // rows sent per MoE expert e
    uint8_t *qrow = ws + wsl.qrow;                                  // staged payload of one row
    float *tmp = reinterpret_cast<float *>(ws + wsl.tmp);
    std::memset(cnt, 0, size_t(E) * 4);

    std::string err;    // first data error; the protocol still completes so peers do not hang
    // elastic_info (SPEC §4.7, golden choice 10): logical rank l is served by physical rank table[l]
    std::vector<int32_t> table, logical;
    elastic_table(p.has_elastic ? ptr<const int32_t>(in, kElastic) : nullptr, p, &table, &logical, &err);
    const int64_t lr = logical[size_t(r)];           // the logical rank this rank serves
    const bool shared_role = lr < R;
    const int64_t recv_slots = shared_role ? W : W * L;

    // ---- send phase -------------------------------------------------------------------------
    const int64_t BS = p.BS;
    int64_t ntok = BS;  // tokens considered (1-D mask: the first sum(mask))
    if (p.mask_dims == 1) {
        ntok = 0;
        for (int64_t t = 0; t < BS; ++t) ntok += mask[t] != 0;
    }
    // The row payload of token t (srow: its smooth / static scale row), written at buf [0, D+4).
    auto fill = [&](uint8_t *buf, int64_t t, int64_t srow) {
        const uint16_t *xr = x + t * H;
        switch (p.quant) {
        case 0:
            std::memcpy(buf, xb + t * p.xrow_bytes, size_t(p.xrow_bytes));
            if (tok_scales)
                std::memcpy(buf + p.dyn_off, tok_scales + t * p.tok_scale_bytes, size_t(p.tok_scale_bytes));
            break;
        case 1: {
            const float *sc = p.static_kind == 2 ? scales + srow * H : scales;
            static_quant_row(xr, bf16, sc, p.static_kind == 0, p.yfmt, buf, tmp, H);
            break;
        }
        case 2: {
            const float *sm = smooth ? smooth + srow * H : nullptr;
            float sc;
            if (p.yfmt == Fmt::Int8)
                sc = quant_int8_row(xr, bf16, sm, reinterpret_cast<int8_t *>(buf), tmp, H);
            else
                fp8_dynamic_row(xr, bf16, sm, p.yfmt, H, buf, &sc, tmp, H);
            std::memcpy(buf + soff, &sc, 4);
            break;
        }
        case 3:
            fp8_dynamic_row(xr, bf16, smooth ? smooth + srow * H : nullptr, p.yfmt, 128, buf,
                            reinterpret_cast<float *>(buf + p.dyn_off), tmp, H);
            break;
        default: {   // 4, 5: MX
            uint8_t *e8 = buf + p.dyn_off;
            mx_quant_row(xr, bf16, p.yfmt, p.quant == 5, buf, e8, tmp, H);
            const int64_t nb = mx_blocks(H);
            if (nb & 1) e8[nb] = 0;   // the padding block of an odd block count: scale 0
            break;
        }
        }
    };
    // Rows whose payload does not depend on the expert are quantised once per token and copied.
    const bool per_expert = (p.quant == 1 && p.static_kind == 2) || ((p.quant == 2 || p.quant == 3) && smooth);
    const size_t staged_bytes = size_t(payload) + 4;
    auto write_row = [&](uint8_t *dst, int64_t t, int64_t srow, float weight, bool with_w, int32_t kslot,
                         int64_t *staged) {
        if (p.quant == 0 || per_expert) {
            fill(dst, t, srow);
        } else {
            if (*staged != t) {
                fill(qrow, t, srow);
                *staged = t;
            }
            std::memcpy(dst, qrow, staged_bytes);
        }
        if (with_w) std::memcpy(dst + woff, &weight, 4);
        int32_t tri[3] = {int32_t(r), int32_t(t), kslot};
        std::memcpy(dst + toff, tri, sizeof tri);
    };

    int64_t staged = -1;
    const int64_t nspecial_end = E + p.Z + p.C + p.Q;
    for (int64_t t = 0; t < ntok; ++t) {
        for (int64_t k = 0; k < K; ++k) {
            if (p.mask_dims == 2 && !mask[t * K + k]) continue;
            const int64_t e = ids[t * K + k];
            if (e >= E) {
                if (e >= nspecial_end && err.empty())
                    err = format("expert_ids[%" PRId64 ", %" PRId64 "] = %" PRId64 " is outside [0, %" PRId64 ")",
                                 t, k, e, nspecial_end);
                continue;   // zero / copy / const experts are never communicated (SPEC §4.1)
            }
            if (e < 0) {
                if (err.empty())
                    err = format("expert_ids[%" PRId64 ", %" PRId64 "] = %" PRId64 " is negative", t, k, e);
                continue;
            }
            const int64_t row = cnt[e];
            if (row >= maxBs) {
                if (err.empty())
                    err = format("expert %" PRId64 " is listed more than once in a row of expert_ids (token %" PRId64
                                 "): more than maxBs = %" PRId64 " rows for one receive block", e, t, maxBs);
                continue;
            }
            cnt[e] = int32_t(row + 1);
            const int64_t dst = table[size_t(e / L + R)], j = e % L;
            uint8_t *d = comm->data_half(uint32_t(dst), half) + (uint64_t((j * W + r) * maxBs + row)) * td;
            write_row(d, t, e + S, escales ? escales[t * K + k] : 0.0f, escales != nullptr, int32_t(k), &staged);
        }
    }
    // shared experts: every valid token once per shared expert, to replica (r % P) + s*P
    int64_t nvalid = 0;
    if (R > 0) {
        for (int64_t t = 0; t < ntok; ++t) {
            if (p.mask_dims == 2) {
                bool any = false;
                for (int64_t k = 0; k < K; ++k) any |= mask[t * K + k] != 0;
                if (!any) continue;
            }
            for (int64_t s = 0; s < S; ++s) {
                const int64_t dst = table[size_t((r % p.P) + s * p.P)];
                uint8_t *d = comm->data_half(uint32_t(dst), half) + uint64_t(r * maxBs + nvalid) * td;
                write_row(d, t, s, 0.0f, false, int32_t(K + s), &staged);
            }
            ++nvalid;
        }
    }
    // counts, then publish (the release in publish makes rows and counts visible to dst)
    for (int64_t m = 0; m < W; ++m) {
        int32_t *mc = comm->mailbox(uint32_t(m), half)->counts;
        const int64_t lm = logical[size_t(m)];
        if (lm < R) {
            mc[r] = (lm % p.P == r % p.P) ? int32_t(nvalid) : 0;
        } else {
            for (int64_t j = 0; j < L; ++j) mc[j * W + r] = cnt[(lm - R) * L + j];
        }
    }
    static const char *const names[] = {"ep_world_size", "moe_expert_num", "maxBs (global_bs / ep_world_size)",
                                         "K (expert_ids dim 1)", "H (x dim 1)", "shared_expert_num",
                                         "shared_expert_rank_num",
                                         "quant_mode",
                                         "zero_expert_num", "copy_expert_num", "const_expert_num",
                                         "x dtype * 1000 + expand_x dtype (+ 10^6 * per-token scale bytes of a low-precision x)",
                                         "comm_alg",
                                         "expert_scales present (1) + elastic_info (2 + 4 * a hash of its table)"};
    const int64_t fields[] = {W, E, maxBs, K, H, S, R, p.quant, p.Z, p.C, p.Q,
                              int64_t(p.dtype) * 1000 + int64_t(p.ydtype) + 1000000 * p.tok_scale_bytes, int64_t(p.alg_code),
                              int64_t(p.has_escales) + (p.has_elastic ? 2 + 4 * table_hash(table) : 0)};
    constexpr uint32_t nf = sizeof(fields) / sizeof(fields[0]);
    static_assert(nf <= hccl::kMailboxFields, "mailbox fields");
    const uint64_t stamps = perf_stamp_offset(lay);
    // publish to this rank first (a delay injected into this call happens there), then to every peer,
    // each entry preceded by this rank's time stamp for the peer's performance_info
    comm->publish(uint32_t(r), seq, hccl::kTagDispatch, fields, nf);
    for (int64_t m = 0; m < W; ++m) {
        if (p.soc950) write_perf_stamp(comm->data_half(uint32_t(m), half) + stamps, r);
        if (m != r) comm->publish(uint32_t(m), seq, hccl::kTagDispatch, fields, nf);
    }
    const int64_t t_ready = monotonic_ns();
    if (int rc = comm->wait_all(seq, hccl::kTagDispatch, fields, names, nf, kOp)) return rc;

    // ---- receive phase: assemble the outputs from this rank's window (SPEC §4.4) ---------------
    uint8_t *expand_x = ptr<uint8_t>(out, kExpandX);
    uint8_t *dyn = p.dyn_bytes ? ptr<uint8_t>(out, kDynScales) : nullptr;
    int32_t *assist = ptr<int32_t>(out, kAssist);
    int64_t *tok_nums = ptr<int64_t>(out, kTokNums);
    int32_t *recv = ptr<int32_t>(out, kRecvCounts);
    float *exp_scales = (p.has_escales && !shared_role) ? ptr<float>(out, kExpandScales) : nullptr;

    const int32_t *mc = comm->mailbox(uint32_t(r), half)->counts;
    const uint8_t *own = comm->data_half(uint32_t(r), half);
    if (p.has_perf) add_perf(ptr<int64_t>(in, kPerf), own + stamps, W, t_ready);
    const uint64_t orow = uint64_t(p.out_row_bytes);
    int64_t N = 0;
    int64_t per_expert_n = 0, cum = 0;
    for (int64_t idx = 0; idx < recv_slots; ++idx) {
        int64_t c = mc[idx];
        if (c < 0 || c > maxBs) {
            if (err.empty())
                err = format("receive slot %" PRId64 " holds %" PRId64 " rows, outside [0, maxBs = %" PRId64 "]",
                             idx, c, maxBs);
            c = c < 0 ? 0 : maxBs;
        }
        if (N + c > p.expand_rows) {
            if (err.empty())
                err = format("%" PRId64 " rows received exceed expand_x dim 0 (%" PRId64 ")", N + c, p.expand_rows);
            c = p.expand_rows - N;
        }
        const uint8_t *blk = own + uint64_t(idx * maxBs) * td;
        for (int64_t i = 0; i < c; ++i, ++N) {
            const uint8_t *row = blk + uint64_t(i) * td;
            std::memcpy(expand_x + uint64_t(N) * orow, row, size_t(orow));
            if (dyn) std::memcpy(dyn + uint64_t(N) * uint64_t(p.dyn_bytes), row + p.dyn_off, size_t(p.dyn_bytes));
            std::memcpy(assist + 3 * N, row + toff, 12);
            if (exp_scales) std::memcpy(exp_scales + N, row + woff, 4);
        }
        recv[idx] = int32_t(N);
        per_expert_n += c;
        if (!shared_role && (idx + 1) % W == 0) {
            const int64_t j = idx / W;
            cum += per_expert_n;
            tok_nums[j] = p.ent_type == 0 ? cum : per_expert_n;
            per_expert_n = 0;
        }
    }
    if (shared_role) tok_nums[0] = N;
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

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV5GetWorkspaceSize(
    const aclTensor *context, const aclTensor *x, const aclTensor *expertIds,
    const aclTensor *scalesOptional, const aclTensor *xActiveMaskOptional,
    const aclTensor *expertScalesOptional, const aclTensor *elasticInfoOptional,
    const aclTensor *performanceInfoOptional, int64_t epWorldSize, int64_t epRankId,
    int64_t moeExpertNum, int64_t cclBufferSize, int64_t tpWorldSize, int64_t tpRankId,
    int64_t expertShardType, int64_t sharedExpertNum, int64_t sharedExpertRankNum, int64_t quantMode,
    int64_t globalBs, int64_t expertTokenNumsType, const char *commAlg, int64_t zeroExpertNum,
    int64_t copyExpertNum, int64_t constExpertNum, aclTensor *expandXOut, aclTensor *dynamicScalesOut,
    aclTensor *assistInfoForCombineOut, aclTensor *expertTokenNumsOut, aclTensor *epRecvCountsOut,
    aclTensor *tpRecvCountsOut, aclTensor *expandScalesOut, uint64_t *workspaceSize,
    aclOpExecutor **executor) {
    // ---- required pointers (161001) ----
    if (int rc = need(context, "context")) return rc;
    if (int rc = need(x, "x")) return rc;
    if (int rc = need(expertIds, "expert_ids")) return rc;
    if (int rc = need(expandXOut, "expand_x")) return rc;
    if (int rc = need(dynamicScalesOut, "dynamic_scales")) return rc;
    if (int rc = need(assistInfoForCombineOut, "assist_info_for_combine")) return rc;
    if (int rc = need(expertTokenNumsOut, "expert_token_nums")) return rc;
    if (int rc = need(epRecvCountsOut, "ep_recv_counts")) return rc;
    if (int rc = need(workspaceSize, "workspaceSize")) return rc;
    if (int rc = need(executor, "executor")) return rc;

    // ---- live, ND, contiguous ----
    const struct { const aclTensor *t; const char *name; } all[] = {
        {context, "context"}, {x, "x"}, {expertIds, "expert_ids"}, {scalesOptional, "scales"},
        {xActiveMaskOptional, "x_active_mask"}, {expertScalesOptional, "expert_scales"},
        {elasticInfoOptional, "elastic_info"}, {performanceInfoOptional, "performance_info"},
        {expandXOut, "expand_x"}, {dynamicScalesOut, "dynamic_scales"},
        {assistInfoForCombineOut, "assist_info_for_combine"}, {expertTokenNumsOut, "expert_token_nums"},
        {epRecvCountsOut, "ep_recv_counts"}, {tpRecvCountsOut, "tp_recv_counts"},
        {expandScalesOut, "expand_scales"}};
    for (const auto &e : all)
        if (e.t)
            if (int rc = check_tensor(e.t, e.name)) return rc;
    if (int rc = check_context_tensor(context)) return rc;

    // ---- attributes (SPEC §3.2) ----
    DispatchParams p;
    p.W = epWorldSize; p.r = epRankId; p.E = moeExpertNum; p.ccl = cclBufferSize;
    p.tp_world = tpWorldSize; p.tp_rank = tpRankId; p.shard = expertShardType;
    p.S_attr = sharedExpertNum; p.R = sharedExpertRankNum; p.global_bs = globalBs;
    p.Z = zeroExpertNum; p.C = copyExpertNum; p.Q = constExpertNum;
    p.comm_alg = commAlg ? commAlg : "";
    p.quant = quantMode; p.ent_type = expertTokenNumsType;
    if (int rc = check_attrs(p)) return rc;
    if (p.soc950) {
        if (p.quant < 0 || p.quant > 5)
            return bad("quant_mode", "must be in [0, 5] on Ascend950 (got %" PRId64 ")", p.quant);
    } else if (p.quant != 0 && p.quant != 2) {
        return bad("quant_mode", "must be 0 or 2 on Ascend910_93%s (got %" PRId64 ")",
                   p.quant == 1 ? ", static quant is not supported" : "", p.quant);
    }
    if (p.ent_type != 0 && p.ent_type != 1)
        return bad("expert_token_nums_type", "must be 0 or 1 (got %" PRId64 ")", p.ent_type);

    // ---- x, expert_ids and sizes ----
    static const aclDataType f16s[] = {ACL_FLOAT16, ACL_BF16};
    static const aclDataType x950[] = {ACL_FLOAT16, ACL_BF16, ACL_HIFLOAT8, ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2,
                                       ACL_FLOAT4_E2M1, ACL_FLOAT4_E1M2};
    if (p.soc950) {
        if (int rc = check_dtype(x, "x", x950, 7, "on Ascend950")) return rc;
    } else {
        if (int rc = check_dtype(x, "x", f16s, 2, "on Ascend910_93")) return rc;
    }
    if (int rc = check_rank(x, "x", 2)) return rc;
    static const aclDataType i32[] = {ACL_INT32};
    static const aclDataType i64[] = {ACL_INT64};
    static const aclDataType f32[] = {ACL_FLOAT};
    static const aclDataType i8[] = {ACL_INT8};
    if (int rc = check_dtype(expertIds, "expert_ids", i32, 1)) return rc;
    if (int rc = check_rank(expertIds, "expert_ids", 2)) return rc;
    p.dtype = x->dtype;
    p.xfmt = fmt_of(x->dtype);
    p.BS = x->view[0];
    p.H = x->view[1];
    p.K = expertIds->view[1];
    if (expertIds->view[0] != p.BS)
        return bad("expert_ids", "dim 0 must equal x dim 0 (BS = %" PRId64 ") (got %" PRId64 ")", p.BS,
                   expertIds->view[0]);
    if (int rc = check_sizes(p, "x", "x")) return rc;
    // low-precision x (SPEC §4.6 "0 + low-precision input", golden choice 7)
    if (p.xfmt != Fmt::None) {
        if (p.quant != 0)
            return bad("x", "a %s input needs quant_mode 0 (got quant_mode %" PRId64 ")", dtype_name(x->dtype), p.quant);
        if (is_fp4(p.xfmt) && p.H % 2)
            return bad("x", "dim 1 (H) must be even for a packed fp4 input (got %" PRId64 ")", p.H);
    }
    p.xrow_bytes = bytes_of(x->dtype, p.H);

    // ---- optional inputs ----
    if (p.xfmt != Fmt::None) {
        if (!scalesOptional) {
            set_error(format("scales: must not be NULL for a %s x: its per-token scales (BS, dim1) are forwarded "
                             "(SPEC §4.6)", dtype_name(x->dtype)));
            return ACLNN_ERR_PARAM_NULLPTR;
        }
        static const aclDataType tsd[] = {ACL_FLOAT, ACL_UINT8, ACL_FLOAT8_E8M0};
        if (int rc = check_dtype(scalesOptional, "scales", tsd, 3, "for a low-precision x")) return rc;
        if (int rc = check_rank(scalesOptional, "scales", 2)) return rc;
        const int64_t d0 = scalesOptional->view[0], d1 = scalesOptional->view[1];
        if (d0 != p.BS || d1 < 1 || d1 > p.H)
            return bad("scales", "shape must be (BS, dim1) = (%" PRId64 ", 1..%" PRId64 ") for a low-precision x "
                       "(got %s)", p.BS, p.H, dims_str(scalesOptional).c_str());
        p.tok_scale_bytes = bytes_of(scalesOptional->dtype, d1);
        // mock rule: the scale row travels in the token's window row after the x bytes (SPEC §9.1)
        const int64_t room = int64_t(dispatch_payload_bytes(p.H)) - p.xrow_bytes;
        if (p.tok_scale_bytes > room)
            return bad("scales", "one row of per-token scales must fit in the token's window row: dim1 * %d bytes "
                       "<= align(2H, 32) - %" PRId64 " bytes of x = %" PRId64 " (got dim1 %" PRId64 ", %" PRId64
                       " bytes)", dtype_bits(scalesOptional->dtype) / 8, p.xrow_bytes, room, d1, p.tok_scale_bytes);
        p.dyn_off = p.xrow_bytes;
        p.dyn_bytes = p.tok_scale_bytes;
    } else if (scalesOptional) {
        if (p.quant == 0)
            return bad("scales", "must be NULL when quant_mode is 0 (got a %s tensor)", dims_str(scalesOptional).c_str());
        if (p.quant == 4 || p.quant == 5)
            return bad("scales", "must be NULL with MX quant_mode %" PRId64 " (got a %s tensor)", p.quant,
                       dims_str(scalesOptional).c_str());
        if (int rc = check_dtype(scalesOptional, "scales", f32, 1)) return rc;
        const int64_t rows = p.R != 0 ? p.E + p.S : p.E;
        const auto &d = scalesOptional->view;
        if (p.quant == 1) {
            // static scales: (1,), (H,) or per expert (SPEC §4.6); the hifloat8 check follows expand_x
            if (d.size() == 1 && d[0] == 1) {
                p.static_kind = 0;
            } else if (d.size() == 1 && d[0] == p.H) {
                p.static_kind = 1;
            } else if (d.size() == 2 && d[0] == rows && d[1] == p.H) {
                p.static_kind = 2;
            } else {
                return bad("scales", "shape must be (1,), (H,) = (%" PRId64 ",) or (%s, H) = (%" PRId64 ", %" PRId64
                           ") with quant_mode 1 (got %s)", p.H,
                           p.R != 0 ? "moe_expert_num + shared_expert_num" : "moe_expert_num", rows, p.H,
                           dims_str(scalesOptional).c_str());
            }
        } else {
            if (int rc = check_rank(scalesOptional, "scales", 2)) return rc;
            if (d[0] != rows || d[1] != p.H)
                return bad("scales", "shape must be (%s, H) = (%" PRId64 ", %" PRId64 ") (got %s)",
                           p.R != 0 ? "moe_expert_num + shared_expert_num" : "moe_expert_num", rows, p.H,
                           dims_str(scalesOptional).c_str());
            p.has_smooth = true;
        }
    } else if (p.quant == 1) {
        set_error("scales: must not be NULL with static quant_mode 1 (SPEC §3.2: the 950 rejects static quant "
                  "without scales)");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (int rc = check_mask(xActiveMaskOptional, p)) return rc;
    p.mask_dims = xActiveMaskOptional ? int(xActiveMaskOptional->view.size()) : 0;
    if (expertScalesOptional && no_zero_dim(expertScalesOptional)) {
        if (int rc = check_dtype(expertScalesOptional, "expert_scales", f32, 1)) return rc;
        if (expertScalesOptional->view.size() != 2 || expertScalesOptional->view[0] != p.BS ||
            expertScalesOptional->view[1] != p.K)
            return bad("expert_scales", "shape must be (BS, K) = (%" PRId64 ", %" PRId64 ") (got %s)", p.BS, p.K,
                       dims_str(expertScalesOptional).c_str());
        p.has_escales = true;
    }
    if (int rc = check_reserved(elasticInfoOptional, "elastic_info", p)) return rc;
    if (int rc = check_reserved(performanceInfoOptional, "performance_info", p)) return rc;
    if (int rc = check_elastic_perf(elasticInfoOptional, performanceInfoOptional, p)) return rc;
    p.has_elastic = elasticInfoOptional != nullptr;
    p.has_perf = performanceInfoOptional != nullptr;

    // ---- outputs (SPEC §2, §3.1, §3.2 output shape minimums; 950: §4.6, §10.4) ----
    if (p.quant == 0) {
        const aclDataType same[] = {p.dtype};
        if (int rc = check_dtype(expandXOut, "expand_x", same, 1, "(x's dtype with quant_mode 0)")) return rc;
    } else if (!p.soc950) {
        if (int rc = check_dtype(expandXOut, "expand_x", i8, 1, "with quant_mode 2")) return rc;
    } else {
        static const aclDataType q1[] = {ACL_INT8, ACL_HIFLOAT8};
        static const aclDataType q2[] = {ACL_INT8, ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2};
        static const aclDataType q3[] = {ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2};
        static const aclDataType q4[] = {ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2, ACL_FLOAT4_E2M1, ACL_FLOAT4_E1M2};
        const aclDataType *allowed = p.quant == 1 ? q1 : p.quant == 2 ? q2 : p.quant == 4 ? q4 : q3;
        const int n = p.quant == 1 ? 2 : p.quant == 2 ? 3 : p.quant == 4 ? 4 : 2;
        const std::string where = format("with quant_mode %" PRId64 " on Ascend950", p.quant);
        if (int rc = check_dtype(expandXOut, "expand_x", allowed, n, where.c_str())) return rc;
    }
    p.ydtype = expandXOut->dtype;
    p.yfmt = p.quant == 0 ? Fmt::None : fmt_of(expandXOut->dtype);
    if (is_fp4(p.yfmt) && p.H % 2)
        return bad("x", "dim 1 (H) must be even for a packed fp4 expand_x (got %" PRId64 ")", p.H);
    if (p.quant == 1 && p.yfmt == Fmt::HiF8 && p.static_kind != 0)
        return bad("scales", "must be a scalar (1,) with quant_mode 1 and a hifloat8 expand_x (got %s)",
                   dims_str(scalesOptional).c_str());
    if (int rc = check_rank(expandXOut, "expand_x", 2)) return rc;
    if (expandXOut->view[0] < p.A || expandXOut->view[1] != p.H)
        return bad("expand_x", "shape must be (>= A, H) = (>= %" PRId64 ", %" PRId64 ") (got %s)", p.A, p.H,
                   dims_str(expandXOut).c_str());
    p.expand_rows = expandXOut->view[0];
    p.out_row_bytes = bytes_of(expandXOut->dtype, p.H);
    if (p.quant == 2) {
        if (int rc = check_dtype(dynamicScalesOut, "dynamic_scales", f32, 1, "with quant_mode 2")) return rc;
        if (int rc = check_rank(dynamicScalesOut, "dynamic_scales", 1)) return rc;
        if (dynamicScalesOut->view[0] < p.A)
            return bad("dynamic_scales", "dim 0 must be >= A = %" PRId64 " (got %" PRId64 ")", p.A,
                       dynamicScalesOut->view[0]);
        p.dyn_off = int64_t(dispatch_scale_offset(p.H));
        p.dyn_bytes = 4;
    } else if (p.quant >= 3 || p.xfmt != Fmt::None) {
        // 2-D scales (SPEC §4.6): (A, ceil(H/128)) float32, (A, align2(ceil(H/32))) e8m0 bytes, or the
        // forwarded per-token scales (A, dim1) in their own dtype
        static const aclDataType e8[] = {ACL_FLOAT8_E8M0, ACL_UINT8};
        const char *what;
        int64_t cols;
        if (p.quant == 3) {
            if (int rc = check_dtype(dynamicScalesOut, "dynamic_scales", f32, 1, "with quant_mode 3")) return rc;
            what = "ceil(H/128)";
            cols = group_cols(p.H);
            p.dyn_bytes = cols * 4;
            p.dyn_off = int64_t(align_up(uint64_t(p.H), 32));
        } else if (p.quant >= 4) {
            const std::string where = format("with quant_mode %" PRId64, p.quant);
            if (int rc = check_dtype(dynamicScalesOut, "dynamic_scales", e8, 2, where.c_str())) return rc;
            what = "align2(ceil(H/32))";
            cols = mx_scale_cols(p.H);
            p.dyn_bytes = cols;
            p.dyn_off = int64_t(align_up(uint64_t(p.out_row_bytes), 32));
        } else {
            const aclDataType same[] = {scalesOptional->dtype};
            if (int rc = check_dtype(dynamicScalesOut, "dynamic_scales", same, 1, "(scales' dtype for a "
                                     "low-precision x)")) return rc;
            what = "scales dim 1";
            cols = scalesOptional->view[1];
        }
        if (int rc = check_rank(dynamicScalesOut, "dynamic_scales", 2)) return rc;
        if (dynamicScalesOut->view[0] < p.A || dynamicScalesOut->view[1] != cols)
            return bad("dynamic_scales", "shape must be (>= A, %s) = (>= %" PRId64 ", %" PRId64 ") (got %s)", what,
                       p.A, cols, dims_str(dynamicScalesOut).c_str());
    }
    if (int rc = check_dtype(assistInfoForCombineOut, "assist_info_for_combine", i32, 1)) return rc;
    if (int rc = check_rank(assistInfoForCombineOut, "assist_info_for_combine", 1)) return rc;
    if (assistInfoForCombineOut->view[0] < p.A * 128)
        return bad("assist_info_for_combine", "dim 0 must be >= A * 128 = %" PRId64 " (got %" PRId64 ")",
                   p.A * 128, assistInfoForCombineOut->view[0]);
    if (int rc = check_dtype(expertTokenNumsOut, "expert_token_nums", i64, 1)) return rc;
    if (int rc = check_rank(expertTokenNumsOut, "expert_token_nums", 1)) return rc;
    if (expertTokenNumsOut->view[0] != p.local_experts)
        return bad("expert_token_nums", "dim 0 must be %s = %" PRId64 " (got %" PRId64 ")",
                   p.has_elastic ? "max(L, 1) with elastic_info"
                                 : p.shared_rank ? "1 on a shared-expert rank" : "the local expert count L",
                   p.local_experts, expertTokenNumsOut->view[0]);
    if (int rc = check_dtype(epRecvCountsOut, "ep_recv_counts", i32, 1)) return rc;
    if (int rc = check_rank(epRecvCountsOut, "ep_recv_counts", 1)) return rc;
    if (epRecvCountsOut->view[0] < p.recv_slots)
        return bad("ep_recv_counts", "dim 0 must be >= %s = %" PRId64 " (got %" PRId64 ")",
                   p.has_elastic || !p.shared_rank ? "ep_world_size * L" : "ep_world_size on a shared-expert rank",
                   p.recv_slots, epRecvCountsOut->view[0]);
    if (tpRecvCountsOut)
        if (int rc = check_dtype(tpRecvCountsOut, "tp_recv_counts", i32, 1)) return rc;
    if (p.has_escales) {
        if (!expandScalesOut) {
            set_error("expand_scales: must not be NULL when expert_scales is given");
            return ACLNN_ERR_PARAM_NULLPTR;
        }
        if (int rc = check_dtype(expandScalesOut, "expand_scales", f32, 1)) return rc;
        if (int rc = check_rank(expandScalesOut, "expand_scales", 1)) return rc;
        if (expandScalesOut->view[0] < p.A)
            return bad("expand_scales", "dim 0 must be >= A = %" PRId64 " (got %" PRId64 ")", p.A,
                       expandScalesOut->view[0]);
    }

    // ---- context and window (SPEC §8, §9.3) ----
    hccl::Comm *comm = nullptr;
    if (int rc = resolve_context(*context, p, &comm, ACLNN_ERR_PARAM_INVALID, nullptr)) return rc;
    if (int rc = check_window(p, comm)) return rc;

    auto ex = std::make_shared<DispatchExecutor>(p);
    const aclTensor *ins[kNumIn] = {context, x, expertIds, scalesOptional, xActiveMaskOptional,
                                    (p.has_escales ? expertScalesOptional : nullptr), elasticInfoOptional,
                                    performanceInfoOptional};
    // an empty expert_scales keeps its slot (so indices stay stable) but is never read
    if (!p.has_escales && expertScalesOptional) ins[kEScales] = expertScalesOptional;
    const aclTensor *outs[kNumOut] = {expandXOut, dynamicScalesOut, assistInfoForCombineOut, expertTokenNumsOut,
                                      epRecvCountsOut, tpRecvCountsOut, expandScalesOut};
    for (const aclTensor *t : ins) ex->inputs.push_back(slot_of(t));
    for (const aclTensor *t : outs) ex->outputs.push_back(slot_of(t));
    ex->workspace_size = dispatch_ws(p).total;
    aclOpExecutor *h = register_executor(ex);
    if (!h) return fail(ACLNN_ERR_INNER_CREATE_EXECUTOR, "%s: could not register the executor", kOp);
    *workspaceSize = ex->workspace_size;
    *executor = h;
    return ACLNN_SUCCESS;
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV5(void *workspace, uint64_t workspaceSize,
                                                                aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, kOp);
}
