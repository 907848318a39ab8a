// aclnnMoeDistributeDispatchV5 on the mock, and the one dispatch operator every generation's entry
// point calls (dispatch.h; the group-string generations' argument lists: dispatch_gens.cpp, their
// group names and TP all-gather: moe_generations.h) (semantics: docs/operators.md; window layout:
// moe_window.h). Phase 1 checks the inputs, then the outputs, then the context and the window, and
// builds the executor; the kernel sends every (token, expert) row into its receiver's window, waits
// for every rank's entry of the call, and assembles its outputs from its own window.
// Ascend950 profile: quant modes 1, 3, 4, 5, fp8 outputs of mode 2, low-precision inputs with
// forwarded per-token scales, elastic_info and performance_info; the numerics follow the choices
// listed in the aclnn_py.golden docstring (lowp.h).
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <optional>
#include <memory>
#include <vector>

#include "aclnnop/aclnn_moe_distribute_dispatch_v5.h"
#include "ops/dispatch.h"
#include "ops/kernel_scratch.h"
#include "ops/lowp.h"
#include "ops/moe_checks.h"
#include "ops/moe_generations.h"
#include "ops/moe_kernel.h"
#include "ops/numerics.h"
#include "ops/peer_copy.h"
#include "ops/round_trace.h"

using namespace aclmock;
using namespace aclmock::moe;

namespace {

constexpr const char *kOp = "aclnnMoeDistributeDispatchV5";

// input slots (aclSetInputTensorAddr indices)
enum In { kCtx, kX, kIds, kScales, kMask, kEScales, kElastic, kPerf, kNumIn };
// output slots (aclSetOutputTensorAddr indices)
enum Out { kExpandX, kDynScales, kAssist, kTokNums, kRecvCounts, kTpRecv, kExpandScales, kNumOut };

struct DispatchParams : DispatchAttrs {
    bool has_escales = false;      // expert_scales present (non-NULL, no zero dim)
    bool has_smooth = false;       // smooth scales (quant 2 / 3)
    int mask_dims = 0;             // 0 none, 1, 2
    int64_t expand_rows = 0;       // expand_x dim0 (capacity actually given)
    // formats and row layout (window row layout in moe_window.h)
    Fmt yfmt = Fmt::None;          // expand_x format (None: a copy of fp16/bf16 x, quant 0)
    Fmt xfmt = Fmt::None;          // low-precision x (None: fp16/bf16)
    aclDataType ydtype = ACL_DT_UNDEFINED;
    int static_kind = 0;           // quant 1 scales: 0 scalar (1,), 1 row (H,), 2 per expert (E[+S], H)
    int64_t xrow_bytes = 0;        // one x row
    int64_t out_row_bytes = 0;     // one expand_x row
    int64_t tok_scale_bytes = 0;   // low-precision x: one per-token scale row (forwarded)
    int64_t dyn_bytes = 0;         // one dynamic_scales row written (0: none)
    int64_t dyn_off = 0;           // where it travels in the window row
    // Ascend950 inputs
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

const aclDataType kI32[] = {ACL_INT32};
const aclDataType kI64[] = {ACL_INT64};
const aclDataType kF32[] = {ACL_FLOAT};

// ================================================================================================
// Phase 1
// ================================================================================================

int check_pointers(const DispatchArgs &a, const DispatchParams &p, const uint64_t *workspace_size,
                   aclOpExecutor **executor) {
    if (p.generation == 5)
        if (int rc = need(a.context, "context")) return rc;
    if (int rc = need(a.x, "x")) return rc;
    if (int rc = need(a.expert_ids, "expert_ids")) return rc;
    if (int rc = need(a.expand_x, "expand_x")) return rc;
    if (int rc = need(a.dynamic_scales, "dynamic_scales")) return rc;
    if (int rc = need(a.assist_info, routing_name(p))) return rc;
    if (int rc = need(a.expert_token_nums, "expert_token_nums")) return rc;
    if (int rc = need(a.ep_recv_counts, "ep_recv_counts")) return rc;
    if (int rc = need(workspace_size, "workspaceSize")) return rc;
    return need(executor, "executor");
}

// Every descriptor given: live, ND, contiguous; the context (generation 5) 1-D int32.
int check_descriptors(const DispatchArgs &a, const DispatchParams &p) {
    const struct { const aclTensor *t; const char *name; } all[] = {
        {a.context, "context"}, {a.x, "x"}, {a.expert_ids, "expert_ids"}, {a.scales, "scales"},
        {a.x_active_mask, "x_active_mask"}, {a.expert_scales, "expert_scales"},
        {a.elastic_info, "elastic_info"}, {a.performance_info, "performance_info"},
        {a.expand_x, "expand_x"}, {a.dynamic_scales, "dynamic_scales"},
        {a.assist_info, routing_name(p)}, {a.expert_token_nums, "expert_token_nums"},
        {a.ep_recv_counts, "ep_recv_counts"}, {a.tp_recv_counts, "tp_recv_counts"},
        {a.expand_scales, "expand_scales"}};
    for (const auto &e : all)
        if (e.t)
            if (int rc = check_tensor(e.t, e.name)) return rc;
    return a.context ? check_context_tensor(a.context) : 0;
}

// The attribute rules shared with combine, then dispatch's own modes.
int check_modes(DispatchParams &p) {
    if (int rc = check_attrs(p)) return rc;
    if (p.soc950) {
        if (p.quant < 0 || p.quant > 5)
            return bad("quant_mode", "must be in [0, 5] on Ascend950 (got %" PRId64 ")", p.quant);
    } else if (p.quant != 0 && p.quant != 2) {
        return bad("quant_mode", "must be 0 or 2 on %s%s (got %" PRId64 ")", p.soc,
                   p.quant == 1 ? ", static quant is not supported" : "", p.quant);
    }
    if (p.ent_type != 0 && p.ent_type != 1)
        return bad("expert_token_nums_type", "must be 0 or 1 (got %" PRId64 ")", p.ent_type);
    return 0;
}

// x, expert_ids and the sizes they give (BS, H, K).
int check_tokens(const DispatchArgs &a, DispatchParams &p) {
    static const aclDataType f16s[] = {ACL_FLOAT16, ACL_BF16};
    static const aclDataType x950[] = {ACL_FLOAT16, ACL_BF16, ACL_HIFLOAT8, ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2,
                                       ACL_FLOAT4_E2M1, ACL_FLOAT4_E1M2};
    const aclTensor *x = a.x, *ids = a.expert_ids;
    if (p.soc950) {
        if (int rc = check_dtype(x, "x", x950, 7, "on Ascend950")) return rc;
    } else {
        const std::string where = format("on %s", p.soc);
        if (int rc = check_dtype(x, "x", f16s, 2, where.c_str())) return rc;
    }
    if (int rc = check_rank(x, "x", 2)) return rc;
    if (int rc = check_dtype(ids, "expert_ids", kI32, 1)) return rc;
    if (int rc = check_rank(ids, "expert_ids", 2)) return rc;
    p.dtype = x->dtype;
    p.xfmt = fmt_of(x->dtype);
    p.BS = x->view[0];
    p.H = x->view[1];
    p.K = ids->view[1];
    if (ids->view[0] != p.BS)
        return bad("expert_ids", "dim 0 must equal x dim 0 (BS = %" PRId64 ") (got %" PRId64 ")", p.BS,
                   ids->view[0]);
    if (int rc = check_sizes(p, "x", "x")) return rc;
    // low-precision x (golden choice 7)
    if (p.xfmt != Fmt::None) {
        if (p.quant != 0)
            return bad("x", "a %s input needs quant_mode 0 (got quant_mode %" PRId64 ")", dtype_name(x->dtype), p.quant);
        if (is_fp4(p.xfmt) && p.H % 2)
            return bad("x", "dim 1 (H) must be even for a packed fp4 input (got %" PRId64 ")", p.H);
    }
    p.xrow_bytes = bytes_of(x->dtype, p.H);
    return 0;
}

// Per-token scales of a low-precision x (BS, dim1), forwarded as dynamic_scales.
int check_token_scales(const DispatchArgs &a, DispatchParams &p) {
    const aclTensor *sc = a.scales;
    if (!sc) {
        set_error(format("scales: must not be NULL for a %s x: its per-token scales (BS, dim1) are forwarded",
                         dtype_name(a.x->dtype)));
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    static const aclDataType tsd[] = {ACL_FLOAT, ACL_UINT8, ACL_FLOAT8_E8M0};
    if (int rc = check_dtype(sc, "scales", tsd, 3, "for a low-precision x")) return rc;
    if (int rc = check_rank(sc, "scales", 2)) return rc;
    const int64_t d0 = sc->view[0], d1 = sc->view[1];
    if (d0 != p.BS || d1 < 1 || d1 > p.H)
        return bad("scales", "shape must be (BS, dim1) = (%" PRId64 ", 1..%" PRId64 ") for a low-precision x "
                   "(got %s)", p.BS, p.H, dims_str(sc).c_str());
    p.tok_scale_bytes = bytes_of(sc->dtype, d1);
    // mock rule: the scale row travels in the token's window row after the x bytes
    const int64_t room = int64_t(dispatch_payload_bytes(p.H)) - p.xrow_bytes;
    if (p.tok_scale_bytes > room)
        return bad("scales", "one row of per-token scales must fit in the token's window row: dim1 * %d bytes "
                   "<= align(2H, 32) - %" PRId64 " bytes of x = %" PRId64 " (got dim1 %" PRId64 ", %" PRId64
                   " bytes)", dtype_bits(sc->dtype) / 8, p.xrow_bytes, room, d1, p.tok_scale_bytes);
    p.dyn_off = p.xrow_bytes;
    p.dyn_bytes = p.tok_scale_bytes;
    return 0;
}

// Smooth scales (quant 2 / 3) or static scales (quant 1), float32.
int check_quant_scales(const DispatchArgs &a, DispatchParams &p) {
    const aclTensor *sc = a.scales;
    if (!sc) {
        if (p.quant != 1) return 0;
        set_error("scales: must not be NULL with static quant_mode 1 (the 950 rejects static quant without "
                  "scales)");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (p.quant == 0)
        return bad("scales", "must be NULL when quant_mode is 0 (got a %s tensor)", dims_str(sc).c_str());
    if (p.hierarchy)
        return bad("scales", "must be NULL with comm_alg \"hierarchy\" on Ascend910B (got a %s tensor)",
                   dims_str(sc).c_str());
    if (p.quant == 4 || p.quant == 5)
        return bad("scales", "must be NULL with MX quant_mode %" PRId64 " (got a %s tensor)", p.quant,
                   dims_str(sc).c_str());
    if (int rc = check_dtype(sc, "scales", kF32, 1)) return rc;
    const int64_t rows = p.R != 0 ? p.E + p.S : p.E;
    const char *rows_name = p.R != 0 ? "moe_expert_num + shared_expert_num" : "moe_expert_num";
    const auto &d = sc->view;
    if (p.quant == 1) {
        // static scales: (1,), (H,) or per expert; the hifloat8 check follows expand_x
        if (d.size() == 1 && d[0] == 1) {
            p.static_kind = 0;
        } else if (d.size() == 1 && d[0] == p.H) {
            p.static_kind = 1;
        } else if (d.size() == 2 && d[0] == rows && d[1] == p.H) {
            p.static_kind = 2;
        } else {
            return bad("scales", "shape must be (1,), (H,) = (%" PRId64 ",) or (%s, H) = (%" PRId64 ", %" PRId64
                       ") with quant_mode 1 (got %s)", p.H, rows_name, rows, p.H, dims_str(sc).c_str());
        }
        return 0;
    }
    if (int rc = check_rank(sc, "scales", 2)) return rc;
    if (d[0] != rows || d[1] != p.H)
        return bad("scales", "shape must be (%s, H) = (%" PRId64 ", %" PRId64 ") (got %s)", rows_name, rows, p.H,
                   dims_str(sc).c_str());
    p.has_smooth = true;
    return 0;
}

int check_inputs(const DispatchArgs &a, DispatchParams &p) {
    if (int rc = check_tokens(a, p)) return rc;
    if (p.xfmt != Fmt::None) {
        if (int rc = check_token_scales(a, p)) return rc;
    } else if (int rc = check_quant_scales(a, p)) {
        return rc;
    }
    if (int rc = check_mask(a.x_active_mask, p)) return rc;
    p.mask_dims = a.x_active_mask ? int(a.x_active_mask->view.size()) : 0;
    const aclTensor *es = a.expert_scales;
    if (es && no_zero_dim(es)) {
        if (int rc = check_dtype(es, "expert_scales", kF32, 1)) return rc;
        if (es->view.size() != 2 || es->view[0] != p.BS || es->view[1] != p.K)
            return bad("expert_scales", "shape must be (BS, K) = (%" PRId64 ", %" PRId64 ") (got %s)", p.BS, p.K,
                       dims_str(es).c_str());
        p.has_escales = true;
    }
    if (int rc = check_reserved(a.elastic_info, "elastic_info", p)) return rc;
    if (int rc = check_reserved(a.performance_info, "performance_info", p)) return rc;
    if (int rc = check_elastic_perf(a.elastic_info, a.performance_info, p)) return rc;
    p.has_elastic = a.elastic_info != nullptr;
    p.has_perf = a.performance_info != nullptr;
    return 0;
}

// expand_x: x's dtype with quant 0, the quantised format otherwise; (>= A, H).
int check_expand_x(const DispatchArgs &a, DispatchParams &p) {
    aclTensor *ex = a.expand_x;
    if (p.quant == 0) {
        const aclDataType same[] = {p.dtype};
        if (int rc = check_dtype(ex, "expand_x", same, 1, "(x's dtype with quant_mode 0)")) return rc;
    } else if (!p.soc950) {
        static const aclDataType i8[] = {ACL_INT8};
        if (int rc = check_dtype(ex, "expand_x", i8, 1, "with quant_mode 2")) return rc;
    } else {
        static const aclDataType q1[] = {ACL_INT8, ACL_HIFLOAT8};
        static const aclDataType q2[] = {ACL_INT8, ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2};
        static const aclDataType q3[] = {ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2};
        static const aclDataType q4[] = {ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2, ACL_FLOAT4_E2M1, ACL_FLOAT4_E1M2};
        const aclDataType *allowed = p.quant == 1 ? q1 : p.quant == 2 ? q2 : p.quant == 4 ? q4 : q3;
        const int n = p.quant == 1 ? 2 : p.quant == 2 ? 3 : p.quant == 4 ? 4 : 2;
        const std::string where = format("with quant_mode %" PRId64 " on Ascend950", p.quant);
        if (int rc = check_dtype(ex, "expand_x", allowed, n, where.c_str())) return rc;
    }
    p.ydtype = ex->dtype;
    p.yfmt = p.quant == 0 ? Fmt::None : fmt_of(ex->dtype);
    if (is_fp4(p.yfmt) && p.H % 2)
        return bad("x", "dim 1 (H) must be even for a packed fp4 expand_x (got %" PRId64 ")", p.H);
    if (p.quant == 1 && p.yfmt == Fmt::HiF8 && p.static_kind != 0)
        return bad("scales", "must be a scalar (1,) with quant_mode 1 and a hifloat8 expand_x (got %s)",
                   dims_str(a.scales).c_str());
    if (int rc = check_rank(ex, "expand_x", 2)) return rc;
    if (ex->view[0] < p.A * p.tp || ex->view[1] != p.H)
        return bad("expand_x", "shape must be (>= %s, H) = (>= %" PRId64 ", %" PRId64 ") (got %s)",
                   p.tp == 2 ? "A * tp_world_size" : "A", p.A * p.tp, p.H, dims_str(ex).c_str());
    p.expand_rows = ex->view[0];
    p.out_row_bytes = bytes_of(ex->dtype, p.H);
    return 0;
}

// dynamic_scales: (>= A,) float32 with quant 2; 2-D on the 950 for modes 3, 4, 5 and the forwarded
// per-token scales of a low-precision x; not written otherwise.
int check_dynamic_scales(const DispatchArgs &a, DispatchParams &p) {
    aclTensor *ds = a.dynamic_scales;
    if (p.quant == 2) {
        if (int rc = check_dtype(ds, "dynamic_scales", kF32, 1, "with quant_mode 2")) return rc;
        if (int rc = check_rank(ds, "dynamic_scales", 1)) return rc;
        if (ds->view[0] < p.A * p.tp)
            return bad("dynamic_scales", "dim 0 must be >= %s = %" PRId64 " (got %" PRId64 ")",
                       p.tp == 2 ? "A * tp_world_size" : "A", p.A * p.tp, ds->view[0]);
        p.dyn_off = int64_t(dispatch_scale_offset(p.H));
        p.dyn_bytes = 4;
        return 0;
    }
    if (p.quant < 3 && p.xfmt == Fmt::None) return 0;
    // 2-D: (A, ceil(H/128)) float32, (A, align2(ceil(H/32))) e8m0 bytes, or the forwarded per-token
    // scales (A, dim1) in their own dtype
    static const aclDataType e8[] = {ACL_FLOAT8_E8M0, ACL_UINT8};
    const char *what;
    int64_t cols;
    if (p.quant == 3) {
        if (int rc = check_dtype(ds, "dynamic_scales", kF32, 1, "with quant_mode 3")) return rc;
        what = "ceil(H/128)";
        cols = group_cols(p.H);
        p.dyn_bytes = cols * 4;
        p.dyn_off = int64_t(align_up(uint64_t(p.H), 32));
    } else if (p.quant >= 4) {
        const std::string where = format("with quant_mode %" PRId64, p.quant);
        if (int rc = check_dtype(ds, "dynamic_scales", e8, 2, where.c_str())) return rc;
        what = "align2(ceil(H/32))";
        cols = mx_scale_cols(p.H);
        p.dyn_bytes = cols;
        p.dyn_off = int64_t(align_up(uint64_t(p.out_row_bytes), 32));
    } else {
        const aclDataType same[] = {a.scales->dtype};
        if (int rc = check_dtype(ds, "dynamic_scales", same, 1, "(scales' dtype for a low-precision x)"))
            return rc;
        what = "scales dim 1";
        cols = a.scales->view[1];
    }
    if (int rc = check_rank(ds, "dynamic_scales", 2)) return rc;
    if (ds->view[0] < p.A || ds->view[1] != cols)
        return bad("dynamic_scales", "shape must be (>= A, %s) = (>= %" PRId64 ", %" PRId64 ") (got %s)", what, p.A,
                   cols, dims_str(ds).c_str());
    return 0;
}

// assist_info_for_combine, expert_token_nums, ep_recv_counts, tp_recv_counts, expand_scales.
int check_routing_outputs(const DispatchArgs &a, const DispatchParams &p) {
    aclTensor *ai = a.assist_info, *tn = a.expert_token_nums, *rc_ = a.ep_recv_counts;
    if (int rc = check_dtype(ai, routing_name(p), kI32, 1)) return rc;
    if (int rc = check_rank(ai, routing_name(p), 1)) return rc;
    if (p.generation == 1) {
        // one entry per (token, k) pair: its position in its expert's receive block
        if (ai->view[0] < p.BS * p.K)
            return bad("expand_idx", "dim 0 must be >= BS * K = %" PRId64 " (got %" PRId64 ")", p.BS * p.K,
                       ai->view[0]);
    } else if (ai->view[0] < p.A * 128)
        return bad("assist_info_for_combine", "dim 0 must be >= A * 128 = %" PRId64 " (got %" PRId64 ")",
                   p.A * 128, ai->view[0]);
    if (int rc = check_dtype(tn, "expert_token_nums", kI64, 1)) return rc;
    if (int rc = check_rank(tn, "expert_token_nums", 1)) return rc;
    if (tn->view[0] != p.local_experts)
        return bad("expert_token_nums", "dim 0 must be %s = %" PRId64 " (got %" PRId64 ")",
                   p.has_elastic ? "max(L, 1) with elastic_info"
                                 : p.shared_rank ? "1 on a shared-expert rank" : "the local expert count L",
                   p.local_experts, tn->view[0]);
    if (int rc = check_dtype(rc_, "ep_recv_counts", kI32, 1)) return rc;
    if (int rc = check_rank(rc_, "ep_recv_counts", 1)) return rc;
    if (rc_->view[0] < p.recv_slots * p.tp)
        return bad("ep_recv_counts", "dim 0 must be >= %s%s = %" PRId64 " (got %" PRId64 ")",
                   p.has_elastic || !p.shared_rank ? "ep_world_size * L" : "ep_world_size on a shared-expert rank",
                   p.tp == 2 ? " * tp_world_size" : "", p.recv_slots * p.tp, rc_->view[0]);
    if (const int64_t extra = a2_recv_counts_extra(p))
        if (rc_->view[0] < p.recv_slots + extra)
            return bad("ep_recv_counts", "dim 0 must be >= ep_world_size * L + 2 * G * K * (ep_world_size / 8) = "
                       "%" PRId64 " on Ascend910B with comm_alg \"hierarchy\", whose reduce information follows the counts (got %" PRId64 ")", p.recv_slots + extra,
                       rc_->view[0]);
    if (p.tp == 2 && !a.tp_recv_counts) {
        set_error("tp_recv_counts: must not be NULL with tp_world_size 2");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (a.tp_recv_counts) {
        if (int rc = check_dtype(a.tp_recv_counts, "tp_recv_counts", kI32, 1)) return rc;
        if (p.tp == 2 && (a.tp_recv_counts->view.size() != 1 || a.tp_recv_counts->view[0] < 2))
            return bad("tp_recv_counts", "shape must be (tp_world_size,) = (2,) (got %s)",
                       dims_str(a.tp_recv_counts).c_str());
    }
    if (p.has_escales) {
        aclTensor *es = a.expand_scales;
        if (!es) {
            set_error("expand_scales: must not be NULL when expert_scales is given");
            return ACLNN_ERR_PARAM_NULLPTR;
        }
        if (int rc = check_dtype(es, "expand_scales", kF32, 1)) return rc;
        if (int rc = check_rank(es, "expand_scales", 1)) return rc;
        if (es->view[0] < p.A)
            return bad("expand_scales", "dim 0 must be >= A = %" PRId64 " (got %" PRId64 ")", p.A, es->view[0]);
    }
    return 0;
}

int check_outputs(const DispatchArgs &a, DispatchParams &p) {
    if (int rc = check_expand_x(a, p)) return rc;
    if (int rc = check_dynamic_scales(a, p)) return rc;
    return check_routing_outputs(a, p);
}

class DispatchExecutor final : public Executor {
public:
    explicit DispatchExecutor(const DispatchParams &p) : Executor(p.op), p_(p) {}
    int run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *,
            std::unique_ptr<KernelRest> *rest) override;
    bool may_block() const override { return p_.tp == 2; }   // its TP all-gather holds the thread

private:
    DispatchParams p_;
};

int make_executor(const DispatchArgs &a, const DispatchParams &p, uint64_t *workspace_size,
                  aclOpExecutor **executor) {
    // an empty expert_scales keeps its slot (so indices stay stable) but is never read
    const aclTensor *ins[kNumIn] = {a.context, a.x, a.expert_ids, a.scales, a.x_active_mask, a.expert_scales,
                                    a.elastic_info, a.performance_info};
    const aclTensor *outs[kNumOut] = {a.expand_x, a.dynamic_scales, a.assist_info, a.expert_token_nums,
                                      a.ep_recv_counts, a.tp_recv_counts, a.expand_scales};
    return register_moe_executor(std::make_shared<DispatchExecutor>(p), p.generation, ins, kNumIn, outs, kNumOut,
                                 dispatch_ws(p).total, p.op, workspace_size, executor);
}

// ================================================================================================
// Kernel
// ================================================================================================

// One run of the dispatch kernel: send() writes this rank's rows and counts into the receivers'
// windows, wait() exchanges the call's mailbox entries, receive() assembles the outputs from this
// rank's own window. A data error (bad expert id, overfull block) is remembered in err_ and reported
// after the exchange, so the peers never wait for a rank that gave up.
class DispatchKernel {
public:
    DispatchKernel(const DispatchParams &p, KernelCall &call, const std::vector<Slot> &in,
                   const std::vector<Slot> &out, void *workspace);
    void send();
    int wait();
    int receive();
    int all_gather();   // with a TP domain, after receive()
    void note_received_rows() const;   // without one, after receive()

private:
    void fill(uint8_t *buf, int64_t t, int64_t srow);
    void write_row(uint8_t *dst, int64_t t, int64_t srow, const float *weight, int32_t kslot);
    void send_moe_rows();
    void send_shared_rows();
    void publish_counts();
    void record(int64_t N);

    const DispatchParams &p_;
    KernelCall &call_;
    const std::vector<Slot> &in_, &out_;
    // inputs
    const uint8_t *xb_;
    const uint16_t *x_;
    const int32_t *ids_;
    const float *scales_;        // smooth / static (float32)
    const uint8_t *tok_scales_;  // per-token scales of a low-precision x
    const float *smooth_;
    const uint8_t *mask_;
    const float *escales_;
    int32_t *expand_idx_;        // the first generation's expand_idx (else nullptr)
    // outside the workspace (kernel_scratch.h)
    CallCounters *cnt_ = nullptr;   // rows sent per MoE expert e, during send()
    // workspace
    uint8_t *qrow_;              // staged payload of one row
    float *tmp_;
    // per call
    std::string err_;            // first data error
    RankTable ranks_;            // elastic_info's re-mapping (after err_, which it may set)
    std::vector<int32_t> sent_experts_;   // MoE experts given rows, in first-row order
    bool shared_role_ = false;
    int64_t recv_slots_ = 0;
    int64_t nvalid_ = 0;         // valid tokens (sent once per shared expert)
    int64_t received_ = 0;       // N, rows received from the EP domain
    int64_t staged_ = -1;        // token whose payload qrow_ holds
    bool stream_ = false;        // rows go to the windows by streaming stores (peer_copy.h)
    bool per_expert_ = false;    // payload depends on the expert (per-expert scales)
    int64_t t_ready_ = 0;
};

DispatchKernel::DispatchKernel(const DispatchParams &p, KernelCall &call, const std::vector<Slot> &in,
                               const std::vector<Slot> &out, void *workspace)
    : p_(p), call_(call), in_(in), out_(out),
      ranks_(p.has_elastic ? ptr<const int32_t>(in, kElastic) : nullptr, p, &err_) {
    xb_ = ptr<const uint8_t>(in, kX);
    x_ = ptr<const uint16_t>(in, kX);
    ids_ = ptr<const int32_t>(in, kIds);
    scales_ = ptr<const float>(in, kScales);
    tok_scales_ = p.xfmt != Fmt::None ? ptr<const uint8_t>(in, kScales) : nullptr;
    smooth_ = p.has_smooth ? scales_ : nullptr;
    mask_ = p.mask_dims ? ptr<const uint8_t>(in, kMask) : nullptr;
    escales_ = p.has_escales ? ptr<const float>(in, kEScales) : nullptr;
    expand_idx_ = p.generation == 1 ? ptr<int32_t>(out, kAssist) : nullptr;

    const DispatchWs wsl = dispatch_ws(p);
    uint8_t *ws = static_cast<uint8_t *>(workspace);
    qrow_ = ws + wsl.qrow;
    tmp_ = reinterpret_cast<float *>(ws + wsl.tmp);

    shared_role_ = ranks_.logical(p.r) < p.R;
    recv_slots_ = shared_role_ ? p.W : p.W * p.L;
    per_expert_ = (p.quant == 1 && p.static_kind == 2) || ((p.quant == 2 || p.quant == 3) && smooth_);
}

// The row payload of token t (srow: its smooth / static scale row), written at buf [0, D+4).
void DispatchKernel::fill(uint8_t *buf, int64_t t, int64_t srow) {
    const int64_t H = p_.H;
    const bool bf16 = p_.dtype == ACL_BF16;
    const uint16_t *xr = x_ + t * H;
    switch (p_.quant) {
    case 0:
        copy_to_peer(buf, xb_ + t * p_.xrow_bytes, size_t(p_.xrow_bytes), stream_);   // quant 0: buf is the window row
        if (tok_scales_)
            std::memcpy(buf + p_.dyn_off, tok_scales_ + t * p_.tok_scale_bytes, size_t(p_.tok_scale_bytes));
        break;
    case 1: {
        const float *sc = p_.static_kind == 2 ? scales_ + srow * H : scales_;
        static_quant_row(xr, bf16, sc, p_.static_kind == 0, p_.yfmt, buf, tmp_, H);
        break;
    }
    case 2: {
        const float *sm = smooth_ ? smooth_ + srow * H : nullptr;
        float sc;
        if (p_.yfmt == Fmt::Int8)
            sc = quant_int8_row(xr, bf16, sm, reinterpret_cast<int8_t *>(buf), tmp_, H);
        else
            fp8_dynamic_row(xr, bf16, sm, p_.yfmt, H, buf, &sc, tmp_, H);
        std::memcpy(buf + dispatch_scale_offset(H), &sc, 4);
        break;
    }
    case 3:
        fp8_dynamic_row(xr, bf16, smooth_ ? smooth_ + srow * H : nullptr, p_.yfmt, 128, buf,
                        reinterpret_cast<float *>(buf + p_.dyn_off), tmp_, H);
        break;
    default: {   // 4, 5: MX
        uint8_t *e8 = buf + p_.dyn_off;
        mx_quant_row(xr, bf16, p_.yfmt, p_.quant == 5, buf, e8, tmp_, H);
        const int64_t nb = mx_blocks(H);
        if (nb & 1) e8[nb] = 0;   // the padding block of an odd block count: scale 0
        break;
    }
    }
}

// One window row: the payload (quantised once per token and copied when it does not depend on the
// expert), the top-k weight when given, and the triple (src_rank, src_token_index, k_slot).
void DispatchKernel::write_row(uint8_t *dst, int64_t t, int64_t srow, const float *weight, int32_t kslot) {
    const int64_t H = p_.H;
    if (p_.quant == 0 || per_expert_) {
        fill(dst, t, srow);
    } else {
        if (staged_ != t) {
            fill(qrow_, t, srow);
            staged_ = t;
        }
        copy_to_peer(dst, qrow_, size_t(dispatch_payload_bytes(H)) + 4, stream_);
    }
    if (weight) std::memcpy(dst + dispatch_weight_offset(H), weight, 4);
    const int32_t tri[3] = {int32_t(p_.r), int32_t(t), kslot};
    std::memcpy(dst + dispatch_triple_offset(H), tri, sizeof tri);
}

// Valid (t, k) pairs with a MoE expert, in flattened t*K + k order, each to block j*W + r of the
// expert's rank; zero / copy / const experts are never communicated.
void DispatchKernel::send_moe_rows() {
    const int64_t W = p_.W, K = p_.K, E = p_.E, L = p_.L, R = p_.R, S = p_.S, r = p_.r, maxBs = p_.maxBs;
    const uint64_t td = call_.layout.td;
    const int64_t ntok = tokens_considered(mask_, p_.mask_dims, p_.BS);
    const int64_t special_end = E + p_.Z + p_.C + p_.Q;
    cnt_ = &CallCounters::begin(size_t(E));
    for (int64_t t = 0; t < ntok; ++t) {
        for (int64_t k = 0; k < K; ++k) {
            if (p_.mask_dims == 2 && !mask_[t * K + k]) continue;
            const int64_t e = ids_[t * K + k];
            if (e >= E) {
                if (e >= special_end && err_.empty())
                    err_ = format("expert_ids[%" PRId64 ", %" PRId64 "] = %" PRId64 " is outside [0, %" PRId64 ")",
                                  t, k, e, special_end);
                continue;
            }
            if (e < 0) {
                if (err_.empty())
                    err_ = format("expert_ids[%" PRId64 ", %" PRId64 "] = %" PRId64 " is negative", t, k, e);
                continue;
            }
            const int64_t row = cnt_->get(size_t(e));
            if (row >= maxBs) {
                if (err_.empty())
                    err_ = format("expert %" PRId64 " is listed more than once in a row of expert_ids (token %" PRId64
                                  "): more than maxBs = %" PRId64 " rows for one receive block", e, t, maxBs);
                continue;
            }
            cnt_->set(size_t(e), int32_t(row + 1));
            if (row == 0) sent_experts_.push_back(int32_t(e));
            if (expand_idx_) expand_idx_[t * K + k] = int32_t(row);
            const int64_t dst = ranks_.physical(e / L + R), j = e % L;
            uint8_t *d = call_.data(dst) + uint64_t((j * W + r) * maxBs + row) * td;
            write_row(d, t, e + S, escales_ ? &escales_[t * K + k] : nullptr, int32_t(k));
        }
    }
}

// Every valid token once per shared expert s, to replica (r % P) + s*P, block r.
void DispatchKernel::send_shared_rows() {
    if (p_.R == 0) return;
    const int64_t ntok = tokens_considered(mask_, p_.mask_dims, p_.BS);
    const uint64_t td = call_.layout.td;
    for (int64_t t = 0; t < ntok; ++t) {
        if (!token_valid(mask_, p_.mask_dims, t, p_.K)) continue;
        for (int64_t s = 0; s < p_.S; ++s) {
            const int64_t dst = ranks_.physical((p_.r % p_.P) + s * p_.P);
            uint8_t *d = call_.data(dst) + uint64_t(p_.r * p_.maxBs + nvalid_) * td;
            write_row(d, t, s, nullptr, int32_t(p_.K + s));
        }
        ++nvalid_;
    }
}

// Each receiver's count of this rank's rows per receive slot (made visible by the arrival), written
// only where rows go: a slot this call did not write reads as 0 (hccl::count_of), so a rank touches
// the windows of the few ranks it sends to, not all W, and walks its rows' experts, not the world.
void DispatchKernel::publish_counts() {
    const int64_t W = p_.W, r = p_.r, L = p_.L, R = p_.R, P = p_.P;
    if (nvalid_)   // the shared-expert ranks of this rank's replica group (logical lm < R, lm = r mod P)
        for (int64_t lm = r % P; lm < R; lm += P)
            hccl::put_count(call_.mailbox(ranks_.physical(lm)), call_.seq, r, int32_t(nvalid_));
    for (const int32_t e : sent_experts_)
        hccl::put_count(call_.mailbox(ranks_.physical(e / L + R)), call_.seq, (e % L) * W + r, cnt_->get(size_t(e)));
}

void DispatchKernel::send() {
    stream_ = stream_rows(p_.W, uint64_t(p_.BS) * uint64_t(p_.K + p_.S) * call_.layout.td);
    send_moe_rows();
    send_shared_rows();
    publish_counts();
}

int DispatchKernel::wait() {
    const DispatchParams &p = p_;
    static const char *const names[] = {"ep_world_size", "moe_expert_num", "maxBs (global_bs / ep_world_size)",
                                         "K (expert_ids dim 1)", "H (x dim 1)", "shared_expert_num",
                                         "shared_expert_rank_num",
                                         "quant_mode",
                                         "zero_expert_num", "copy_expert_num", "const_expert_num",
                                         "x dtype * 1000 + expand_x dtype (+ 10^6 * per-token scale bytes of a low-precision x)",
                                         "comm_alg",
                                         "expert_scales present (1) + elastic_info (2 + 4 * a hash of its table)"};
    const int64_t fields[] = {p.W, p.E, p.maxBs, p.K, p.H, p.S, p.R, p.quant, p.Z, p.C, p.Q,
                              int64_t(p.dtype) * 1000 + int64_t(p.ydtype) + 1000000 * p.tok_scale_bytes,
                              int64_t(p.alg_code),
                              int64_t(p.has_escales) + (p.has_elastic ? 2 + 4 * ranks_.hash() : 0)};
    constexpr uint32_t nf = sizeof(fields) / sizeof(fields[0]);
    static_assert(nf <= hccl::kMailboxFields, "mailbox fields");
    return call_.exchange(hccl::kTagDispatch, fields, names, nf, &t_ready_);
}

// The outputs, from this rank's window: rows walked in receive-slot order (docs/operators.md).
int DispatchKernel::receive() {
    const DispatchParams &p = p_;
    const int64_t W = p.W, maxBs = p.maxBs;
    const uint64_t td = call_.layout.td;
    const uint64_t woff = dispatch_weight_offset(p.H), toff = dispatch_triple_offset(p.H);
    uint8_t *expand_x = ptr<uint8_t>(out_, kExpandX);
    uint8_t *dyn = p.dyn_bytes ? ptr<uint8_t>(out_, kDynScales) : nullptr;
    int32_t *assist = ptr<int32_t>(out_, kAssist);
    int64_t *tok_nums = ptr<int64_t>(out_, kTokNums);
    int32_t *recv = ptr<int32_t>(out_, kRecvCounts);
    float *exp_scales = (p.has_escales && !shared_role_) ? ptr<float>(out_, kExpandScales) : nullptr;

    hccl::Mailbox *mb = call_.mailbox(p.r);
    const uint8_t *own = call_.data(p.r);
    if (p.has_perf) add_perf(ptr<int64_t>(in_, kPerf), call_, t_ready_);
    const uint64_t orow = uint64_t(p.out_row_bytes);
    int64_t N = 0, next = 0;   // rows so far; the first slot whose recv entry is not written yet
    // the few slots that senders wrote, in slot order; the others get no row (recv holds N for them)
    hccl::for_each_count(mb, call_.seq, recv_slots_, [&](int64_t idx, int32_t count) {
        std::fill(recv + next, recv + idx, int32_t(N));
        int64_t c = count;
        if (c < 0 || c > maxBs) {
            if (err_.empty())
                err_ = format("receive slot %" PRId64 " holds %" PRId64 " rows, outside [0, maxBs = %" PRId64 "]",
                              idx, c, maxBs);
            c = c < 0 ? 0 : maxBs;
        }
        if (N + c > p.expand_rows) {
            if (err_.empty())
                err_ = format("%" PRId64 " rows received exceed expand_x dim 0 (%" PRId64 ")", N + c, p.expand_rows);
            c = p.expand_rows - N;
        }
        const uint8_t *blk = own + uint64_t(idx * maxBs) * td;
        for (int64_t i = 0; i < c; ++i, ++N) {
            const uint8_t *row = blk + uint64_t(i) * td;
            std::memcpy(expand_x + uint64_t(N) * orow, row, size_t(orow));
            if (dyn) std::memcpy(dyn + uint64_t(N) * uint64_t(p.dyn_bytes), row + p.dyn_off, size_t(p.dyn_bytes));
            if (!expand_idx_) std::memcpy(assist + 3 * N, row + toff, 12);
            if (exp_scales) std::memcpy(exp_scales + N, row + woff, 4);
        }
        recv[idx] = int32_t(N);
        next = idx + 1;
    });
    std::fill(recv + next, recv + recv_slots_, int32_t(N));
    if (shared_role_) {
        tok_nums[0] = N;
    } else {   // per local expert j, from the running count at the end of its block of W slots
        for (int64_t j = 0; j < p.L; ++j) {
            const int64_t upto = recv[(j + 1) * W - 1], before = j ? recv[j * W - 1] : 0;
            tok_nums[j] = p.ent_type == 0 ? upto : upto - before;
        }
    }
    hccl::forget_counts(mb, recv_slots_);
    if (!err_.empty()) return fail(kKernelFail, "%s: rank %" PRId64 ": %s", p.op, p.r, err_.c_str());
    if (!expand_idx_) record(N);   // the round trace follows assist_info_for_combine's triples
    received_ = N;
    return 0;
}

// The outputs sized for every row a rank could receive hold the N received ones at their front: a
// refill of the reused outputs restores only those (the rest still holds the poison).
void DispatchKernel::note_received_rows() const {
    const uint64_t N = uint64_t(received_);
    note_output_written(kExpandX, N * uint64_t(p_.out_row_bytes));
    if (p_.dyn_bytes) note_output_written(kDynScales, N * uint64_t(p_.dyn_bytes));
    if (!expand_idx_) note_output_written(kAssist, N * 12);
    if (p_.has_escales) note_output_written(kExpandScales, shared_role_ ? 0 : N * 4);
}

int DispatchKernel::all_gather() {
    const DispatchParams &p = p_;
    TpGather g{ptr<uint8_t>(out_, kExpandX), p.out_row_bytes, p.dyn_bytes ? ptr<uint8_t>(out_, kDynScales) : nullptr,
               p.dyn_bytes, ptr<int32_t>(out_, kRecvCounts), recv_slots_, ptr<int64_t>(out_, kTokNums),
               ptr<int32_t>(out_, kTpRecv), received_, p.expand_rows};
    return tp_all_gather(p, g, p.op);
}

// What this call wrote, so that a combine can tell which dispatch its inputs come from.
void DispatchKernel::record(int64_t N) {
    const DispatchParams &p = p_;
    DispatchRecord rec;
    rec.round = int64_t(call_.seq);
    rec.assist = traced(out_[kAssist].desc.serial, ptr<int32_t>(out_, kAssist), uint64_t(N) * 12);
    rec.counts = traced(out_[kRecvCounts].desc.serial, ptr<int32_t>(out_, kRecvCounts), uint64_t(recv_slots_) * 4);
    rec.ids = traced(in_[kIds].desc.serial, ids_, uint64_t(p.BS * p.K) * 4);
    if (p.quant == 0 && p.xfmt == Fmt::None)   // rows a combine could take back unchanged (fp16 / bf16)
        rec.expand_x = sampled(out_[kExpandX].desc.serial, ptr<uint8_t>(out_, kExpandX),
                               uint64_t(N) * uint64_t(p.out_row_bytes));
    record_dispatch(*call_.comm, rec);
}

// A launch between its steps: the call, the params it runs with and the kernel, which refers to both.
struct DispatchFlight final : KernelRest {
    KernelCall call;
    DispatchParams q;
    std::optional<DispatchKernel> k;
    bool tp = false;

    int step() override {
        if (int rc = k->wait()) return rc;   // kTaskPending while peers are missing
        if (int rc = k->receive()) return rc;
        if (tp) return k->all_gather();
        k->note_received_rows();
        return 0;
    }
};

static_assert(sizeof(DispatchFlight) <= KernelRest::kRestBytes, "a dispatch's rest shares the size of every rest");

int DispatchExecutor::run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *,
                          std::unique_ptr<KernelRest> *rest) {
    auto f = std::make_unique<DispatchFlight>();
    if (int rc = begin_call(f->call, &f->q, p_, in, kCtx, kElastic)) return rc;
    f->tp = p_.tp == 2;
    f->k.emplace(f->q, f->call, in, out, workspace);
    f->k->send();
    return first_step(std::move(f), rest);
}

}  // namespace

// Phase 1 of every generation: the context (generation 5) or the group strings (2 to 4) name the
// communicator; the window rule then checks the window it has.
aclnnStatus aclmock::moe::dispatch_phase1(const DispatchArgs &a, const DispatchAttrs &attrs,
                                          uint64_t *workspace_size, aclOpExecutor **executor) {
    DispatchParams p;
    static_cast<DispatchAttrs &>(p) = attrs;
    if (int rc = check_pointers(a, p, workspace_size, executor)) return rc;
    if (int rc = check_descriptors(a, p)) return rc;
    if (int rc = check_modes(p)) return rc;
    hccl::Comm *comm = nullptr, *tp = nullptr;
    if (p.generation != 5)
        if (int rc = resolve_groups(p, &comm, &tp)) return rc;
    if (int rc = check_inputs(a, p)) return rc;
    if (int rc = check_outputs(a, p)) return rc;
    if (p.generation == 5)
        if (int rc = resolve_context(*a.context, p, &comm)) return rc;
    if (int rc = check_window(p, comm)) return rc;
    if (int rc = check_tp_window(p, tp, p.A, align_up(uint64_t(p.out_row_bytes + p.dyn_bytes), 32))) return rc;
    return make_executor(a, p, workspace_size, executor);
}

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
    const DispatchArgs a{context, x, expertIds, scalesOptional, xActiveMaskOptional, expertScalesOptional,
                         elasticInfoOptional, performanceInfoOptional, expandXOut, dynamicScalesOut,
                         assistInfoForCombineOut, expertTokenNumsOut, epRecvCountsOut, tpRecvCountsOut,
                         expandScalesOut};
    DispatchAttrs p;
    p.op = kOp;
    p.W = epWorldSize; p.r = epRankId; p.E = moeExpertNum; p.ccl = cclBufferSize;
    p.tp_world = tpWorldSize; p.tp_rank = tpRankId; p.shard = expertShardType;
    p.S_attr = sharedExpertNum; p.R = sharedExpertRankNum; p.global_bs = globalBs;
    p.Z = zeroExpertNum; p.C = copyExpertNum; p.Q = constExpertNum;
    p.comm_alg = commAlg ? commAlg : "";
    p.quant = quantMode; p.ent_type = expertTokenNumsType;
    return dispatch_phase1(a, p, workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV5(void *workspace, uint64_t workspaceSize,
                                                                aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, kOp);
}
