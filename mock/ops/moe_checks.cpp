// Shared parameter rules of the mock MoE ops; see moe_checks.h.
#include "ops/moe_checks.h"
#include "ops/moe_generations.h"
#include "ops/lowp.h"
#include "ops/numerics.h"

#include <cinttypes>
#include <climits>
#include <cstdarg>
#include <cstring>

namespace aclmock {
namespace moe {

int bad(const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string rest = vformat(fmt, ap);
    va_end(ap);
    set_error(std::string(param) + ": " + rest);
    return ACLNN_ERR_PARAM_INVALID;
}

int need(const void *p, const char *param) {
    if (p) return 0;
    set_error(std::string(param) + ": must not be NULL");
    return ACLNN_ERR_PARAM_NULLPTR;
}

std::string format_name(aclFormat f) {
    switch (f) {
    case ACL_FORMAT_UNDEFINED: return "UNDEFINED";
    case ACL_FORMAT_NCHW: return "NCHW";
    case ACL_FORMAT_NHWC: return "NHWC";
    case ACL_FORMAT_ND: return "ND";
    case ACL_FORMAT_NC1HWC0: return "NC1HWC0";
    case ACL_FORMAT_FRACTAL_Z: return "FRACTAL_Z";
    case ACL_FORMAT_FRACTAL_NZ: return "FRACTAL_NZ";
    case ACL_FORMAT_NCDHW: return "NCDHW";
    case ACL_FORMAT_NC: return "NC";
    case ACL_FORMAT_NCL: return "NCL";
    default: return format("format %d", int(f));
    }
}

std::string dims_str(const aclTensor *t) { return shape_str(t->view); }

int check_tensor(const aclTensor *t, const char *param) {
    if (!tensor_alive(t)) return bad(param, "must be a live aclTensor (got a destroyed or unknown handle)");
    // the ops read every tensor as plain row-major ND data; UNDEFINED is taken as ND
    if (t->format != ACL_FORMAT_ND && t->format != ACL_FORMAT_UNDEFINED)
        return bad(param, "format must be ND (or UNDEFINED), FRACTAL_NZ and every other format are rejected "
                   "(got %s)", format_name(t->format).c_str());
    if (numel(*t) > 0 && !is_contiguous(*t)) return bad(param, "must be contiguous (got strides %s for shape %s)",
                                      shape_str(t->strides).c_str(), dims_str(t).c_str());
    return 0;
}

int check_dtype(const aclTensor *t, const char *param, const aclDataType *allowed, int n,
                const char *where) {
    for (int i = 0; i < n; ++i)
        if (t->dtype == allowed[i]) return 0;
    std::string list;
    for (int i = 0; i < n; ++i) {
        if (i) list += (i == n - 1) ? " or " : ", ";
        list += dtype_name(allowed[i]);
    }
    return bad(param, "dtype must be %s%s%s (got %s)", list.c_str(), where ? " " : "", where ? where : "",
               dtype_name(t->dtype));
}

int check_rank(const aclTensor *t, const char *param, size_t nd) {
    if (t->view.size() == nd) return 0;
    return bad(param, "must be %zu-D (got shape %s)", nd, dims_str(t).c_str());
}

int check_context_tensor(const aclTensor *ctx) {
    static const aclDataType i32[] = {ACL_INT32};
    if (int rc = check_dtype(ctx, "context", i32, 1)) return rc;
    return check_rank(ctx, "context", 1);
}

int check_no_tp(const MoeParams &p) {
    if (p.tp_world >= 2)
        return bad("tp_world_size", "must be 0 or 1, tensor parallelism is not supported%s%s (got %" PRId64 ")",
                   p.generation == 5 ? "" : " on ", p.generation == 5 ? "" : p.soc, p.tp_world);
    if (p.tp_rank != 0)
        return bad("tp_rank_id", "must be 0 without tensor parallelism (tp_world_size 0 or 1) (got %" PRId64 ")",
                   p.tp_rank);
    return 0;
}

SocProfile soc_profile() {
    SocProfile prof;
    const Soc soc = config().soc;
    prof.soc950 = soc == Soc::Ascend950;
    prof.a2 = soc == Soc::Ascend910B;
    prof.name = soc_name(soc);
    return prof;
}

int check_attrs(MoeParams &p) {
    const SocProfile prof = soc_profile();
    p.soc950 = prof.soc950;
    p.a2 = prof.a2;
    p.soc = prof.name;
    if (p.a2) return check_attrs_a2(p);
    const char *soc = p.soc;
    const int64_t wmax = p.soc950 ? 1024 : 768;
    if (p.W < 2 || p.W > wmax)
        return bad("ep_world_size", "must be in [2, %" PRId64 "] on %s (got %" PRId64 ")", wmax, soc, p.W);
    if (p.r < 0 || p.r >= p.W)
        return bad("ep_rank_id", "must be in [0, ep_world_size) (got %" PRId64 " with ep_world_size %" PRId64 ")",
                   p.r, p.W);
    // the group-string generations check their TP domain once L is known (check_generation_attrs)
    if (p.generation == 5)
        if (int rc = check_no_tp(p)) return rc;
    if (p.shard != 0) return bad("expert_shard_type", "must be 0 (got %" PRId64 ")", p.shard);
    if (p.S_attr < 0 || p.S_attr > 4)
        return bad("shared_expert_num", "must be in [0, 4] (got %" PRId64 ")", p.S_attr);
    if (p.R < 0 || p.R >= p.W)
        return bad("shared_expert_rank_num", "must be in [0, ep_world_size) (got %" PRId64
                   " with ep_world_size %" PRId64 ")", p.R, p.W);
    p.S = (p.R == 0 && p.S_attr == 1) ? 0 : p.S_attr;
    if ((p.S == 0) != (p.R == 0))
        return bad("shared_expert_rank_num",
                   "shared_expert_num and shared_expert_rank_num must both be 0 or both be non-zero, "
                   "(1, 0) meaning no shared expert (got shared_expert_num %" PRId64
                   ", shared_expert_rank_num %" PRId64 ")", p.S_attr, p.R);
    if (p.S > 0 && p.R % p.S != 0)
        return bad("shared_expert_rank_num", "must be divisible by shared_expert_num (got %" PRId64 " %% %" PRId64 ")",
                   p.R, p.S);
    p.P = p.S > 0 ? p.R / p.S : 1;
    if (p.E <= 0 || p.E > 1024)
        return bad("moe_expert_num", "must be in [1, 1024] (got %" PRId64 ")", p.E);
    if (p.E % (p.W - p.R) != 0)
        return bad("moe_expert_num", "must be divisible by ep_world_size - shared_expert_rank_num (got %" PRId64
                   " %% %" PRId64 ")", p.E, p.W - p.R);
    p.L = p.E / (p.W - p.R);
    if (p.L <= 0 || p.L * p.W > 2048)
        return bad("moe_expert_num", "local experts per MoE rank × ep_world_size must be in [1, 2048] "
                   "(got %" PRId64 " × %" PRId64 " = %" PRId64 ")", p.L, p.W, p.L * p.W);
    if (p.Z < 0) return bad("zero_expert_num", "must be >= 0 (got %" PRId64 ")", p.Z);
    if (p.C < 0) return bad("copy_expert_num", "must be >= 0 (got %" PRId64 ")", p.C);
    if (p.Q < 0) return bad("const_expert_num", "must be >= 0 (got %" PRId64 ")", p.Q);
    if (p.Z > INT32_MAX || p.C > INT32_MAX || p.Q > INT32_MAX || p.E + p.Z + p.C + p.Q > INT32_MAX)
        return bad("const_expert_num", "moe_expert_num + zero_expert_num + copy_expert_num + const_expert_num "
                   "must be <= INT32_MAX (got %" PRId64 " + %" PRId64 " + %" PRId64 " + %" PRId64 ")",
                   p.E, p.Z, p.C, p.Q);
    if (p.comm_alg == "" || p.comm_alg == "fullmesh_v1") {
        p.alg_code = 0;
    } else if (p.comm_alg == "fullmesh_v2") {
        p.alg_code = 2;
        p.fullmesh_v2 = true;
    } else if (p.comm_alg == "hierarchy") {
        return bad("comm_alg", "\"hierarchy\" is not supported %s (got \"hierarchy\")",
                   p.generation == 5 ? "with a context tensor" : "on this profile (an Atlas A2 algorithm)");
    } else {
        return bad("comm_alg", "must be \"\", \"fullmesh_v1\" or \"fullmesh_v2\" (got \"%s\")", p.comm_alg.c_str());
    }
    p.shared_rank = p.r < p.R;
    p.local_experts = p.shared_rank ? 1 : p.L;
    p.recv_slots = p.shared_rank ? p.W : p.W * p.L;
    return p.generation == 5 ? 0 : check_generation_attrs(p);
}

namespace {
int check_window_need(MoeParams &p);
}

int check_sizes(MoeParams &p, const char *bs_param, const char *h_param) {
    const char *soc = p.soc;
    if (p.a2) {
        if (int rc = check_token_sizes_a2(p, bs_param, h_param)) return rc;
    } else {
        if (p.BS < 1 || p.BS > 512)
            return bad(bs_param, "dim 0 (BS) must be in [1, 512] (got %" PRId64 ")", p.BS);
        if (p.H < 1024 || p.H > 8192)
            return bad(h_param, "dim 1 (H) must be in [1024, 8192] (got %" PRId64 ")", p.H);
    }
    if (p.K < 1 || p.K > 16)
        return bad("expert_ids", "dim 1 (K) must be in [1, 16] (got %" PRId64 ")", p.K);
    if (p.K > p.E + p.Z + p.C + p.Q)
        return bad("expert_ids", "dim 1 (K) must be <= moe_expert_num + zero_expert_num + copy_expert_num + "
                   "const_expert_num (got %" PRId64 " > %" PRId64 ")", p.K, p.E + p.Z + p.C + p.Q);
    if (p.global_bs != 0 && (p.global_bs < 0 || p.global_bs % p.W != 0 || p.global_bs < p.BS * p.W))
        return bad("global_bs", "must be 0 or a multiple of ep_world_size that is >= BS * ep_world_size "
                   "(got %" PRId64 " with BS %" PRId64 ", ep_world_size %" PRId64 ")", p.global_bs, p.BS, p.W);
    if (p.fullmesh_v2) {
        const int64_t bsmax = p.soc950 ? 512 : 256;
        if (p.BS > bsmax)
            return bad(bs_param, "dim 0 (BS) must be <= %" PRId64 " with comm_alg \"fullmesh_v2\" on %s (got %" PRId64 ")",
                       bsmax, soc, p.BS);
        if (!p.soc950 && p.K > 12)
            return bad("expert_ids", "dim 1 (K) must be <= 12 with comm_alg \"fullmesh_v2\" on %s (got %" PRId64 ")",
                       soc, p.K);
    }
    p.G = p.global_bs ? p.global_bs : p.BS * p.W;
    p.maxBs = p.G / p.W;
    // No window can hold more than 2^31 rows per rank (it is at most 2^41 bytes and a row takes
    // >= 512 bytes in each of >= 2 receive blocks); bounding maxBs keeps the size arithmetic below
    // (A, the window formula) from overflowing.
    if (p.maxBs > (int64_t(1) << 31))
        return bad("global_bs", "global_bs / ep_world_size (maxBs) must be <= 2^31, no HCCL window holds more "
                   "(got %" PRId64 " with ep_world_size %" PRId64 ")", p.global_bs, p.W);
    if (p.shared_rank) {
        const int64_t per = (p.W + p.P - 1) / p.P;
        p.A = p.maxBs * per;
    } else {
        p.A = p.G * (p.L < p.K ? p.L : p.K);
    }
    if (p.generation == 1)
        if (int rc = check_first_generation_sizes(p, h_param)) return rc;
    return check_window_need(p);
}

int check_mask(const aclTensor *mask, const MoeParams &p) {
    if (!mask) return 0;
    static const aclDataType b[] = {ACL_BOOL};
    if (int rc = check_dtype(mask, "x_active_mask", b, 1)) return rc;
    if (int rc = check_mask_a2(mask, p)) return rc;
    const auto &d = mask->view;
    if (d.size() == 1) {
        if (d[0] != p.BS)
            return bad("x_active_mask", "1-D mask must have shape (BS,) = (%" PRId64 ",) (got %s)", p.BS,
                       dims_str(mask).c_str());
    } else if (d.size() == 2) {
        if (d[0] != p.BS || d[1] != p.K)
            return bad("x_active_mask", "2-D mask must have shape (BS, K) = (%" PRId64 ", %" PRId64 ") (got %s)",
                       p.BS, p.K, dims_str(mask).c_str());
    } else {
        return bad("x_active_mask", "must be 1-D (BS,) or 2-D (BS, K) (got shape %s)", dims_str(mask).c_str());
    }
    if (p.global_bs > p.BS * p.W)
        return bad("x_active_mask", "is not supported with uneven BS, i.e. global_bs > BS * ep_world_size "
                   "(got global_bs %" PRId64 " > %" PRId64 " * %" PRId64 ")", p.global_bs, p.BS, p.W);
    return 0;
}

int check_reserved(const aclTensor *t, const char *param, const MoeParams &p) {
    if (!t || p.soc950) return 0;
    // aclnnMoeDistributeDispatchV3.md / V4.md: elasticInfo (dynamic shrink) on A3
    if (!p.a2 && (p.generation == 3 || p.generation == 4) && std::strcmp(param, "elastic_info") == 0) return 0;
    // aclnnMoeDistributeDispatchV4.md / CombineV4.md: performanceInfo on A2 in every revision
    if (p.a2 && p.generation >= 4 && std::strcmp(param, "performance_info") == 0) return 0;
    return bad(param, "is reserved on %s and must be NULL (got a %s tensor)", p.soc, dims_str(t).c_str());
}

int check_elastic_perf(const aclTensor *elastic, const aclTensor *perf, MoeParams &p) {
    static const aclDataType i32[] = {ACL_INT32};
    static const aclDataType i64[] = {ACL_INT64};
    if (p.a2 && perf) {
        if (int rc = check_dtype(perf, "performance_info", i64, 1)) return rc;
        if (perf->view.size() != 1 || perf->view[0] != p.W)
            return bad("performance_info", "shape must be (ep_world_size,) = (%" PRId64 ",) (got %s)", p.W,
                       dims_str(perf).c_str());
        if (!p.stamp_room)
            return bad("performance_info", "the window has no room after its data for the %" PRId64 " per-rank "
                       "time stamps (ep_world_size * 1024 bytes); the mock refuses rather than write past the "
                       "window: raise HCCL_BUFFSIZE by 1 (got ccl_buffer_size %" PRId64 ")", p.W, p.ccl);
        return 0;
    }
    const bool a3_shrink = !p.soc950 && !p.a2 && elastic && (p.generation == 3 || p.generation == 4);
    if (!p.soc950 && !a3_shrink) return 0;   // A3: reserved otherwise (check_reserved)
    if (a3_shrink && p.tp == 2)
        return bad("elastic_info", "a dynamic shrink is not supported with a TP domain (tp_world_size 2), as "
                   "CANN documents (got a %s tensor)", dims_str(elastic).c_str());
    if (a3_shrink && (p.Z || p.C || p.Q))
        return bad("elastic_info", "a dynamic shrink together with zero / copy / const experts is not simulated by "
                   "the mock (got zero_expert_num %" PRId64 ", copy_expert_num %" PRId64 ", const_expert_num %" PRId64
                   ")", p.Z, p.C, p.Q);
    p.shrink = a3_shrink;
    if (elastic) {
        if (int rc = check_dtype(elastic, "elastic_info", i32, 1)) return rc;
        if (elastic->view.size() != 1 || elastic->view[0] != 4 + 2 * p.W)
            return bad("elastic_info", "shape must be (4 + 2 * ep_world_size,) = (%" PRId64 ",) (got %s)",
                       4 + 2 * p.W, dims_str(elastic).c_str());
        const int64_t shared_a = p.S > 0 ? p.maxBs * ((p.W + p.P - 1) / p.P) : 0;
        const int64_t moe_a = p.G * (p.L < p.K ? p.L : p.K);
        p.A = shared_a > moe_a ? shared_a : moe_a;
        p.local_experts = p.L;
        p.recv_slots = p.W * p.L;
    }
    if (perf && p.soc950) {
        if (int rc = check_dtype(perf, "performance_info", i64, 1)) return rc;
        if (perf->view.size() != 1 || perf->view[0] != p.W)
            return bad("performance_info", "shape must be (ep_world_size,) = (%" PRId64 ",) (got %s)", p.W,
                       dims_str(perf).c_str());
    }
    return 0;
}

namespace {

struct CtxHead {
    uint32_t ep_rank_id;
    uint32_t rank_size_per_server;
    uint64_t kfc_context_addr;
};
static_assert(sizeof(CtxHead) == 16, "context head");
// The whole struct: the head, epHcclBuffer_[1024] and hcommHandle_[1024] (docs/operators.md).
constexpr uint64_t kContextBytes = sizeof(CtxHead) + 8 * 1024 + 8 * 1024;
static_assert(kContextBytes == 16400, "Mc2MoeContext size");
constexpr int kOpTypeAllToAll = HCCL_OP_TYPE_ALLTOALL;   // opType of CANN's MoE context builder

int ctx_fail(int code, const char *op, const char *param, const std::string &msg) {
    std::string m = op ? std::string(op) + ": " : std::string();
    m += param;
    m += ": ";
    m += msg;
    set_error(m);
    return code;
}

}  // namespace

int resolve_context_head(const aclTensor &ctx, const MoeParams &p, hccl::Comm **comm, const uint8_t **entries, int code,
                         const char *op) {
    const uint8_t *base = static_cast<const uint8_t *>(view_ptr(ctx));
    const uint64_t bytes = uint64_t(numel(ctx)) * 4;
    if (bytes < kContextBytes)
        return ctx_fail(code, op, "context", format("must hold the whole Mc2MoeContext struct, %" PRIu64 " bytes "
                                                   "(%" PRIu64 " int32) (got %" PRIu64 " bytes)",
                                                   kContextBytes, kContextBytes / 4, bytes));
    MemBlock blk;
    if (!base || !find_block(base, bytes, &blk))
        return ctx_fail(code, op, "context", format("data is not device memory (got address %p, %" PRIu64 " bytes)",
                                                   static_cast<const void *>(base), bytes));
    CtxHead head;
    std::memcpy(&head, base, sizeof head);
    hccl::OpResCtx *res = hccl::verify_op_res_ctx(head.kfc_context_addr);
    if (!res || !res->comm)
        return ctx_fail(code, op, "context", format("kfcContextAddr is not a live HCCL op-resource context "
                                                   "(got 0x%" PRIx64 "); build the context from a live communicator",
                                                   head.kfc_context_addr));
    // what CANN's context builder asked HcclCreateOpResCtx for: op type all-to-all, engine AIV
    if (res->op_type != kOpTypeAllToAll)
        return ctx_fail(code, op, "context", format("kfcContextAddr must be an op-resource context of op type %d "
                                                   "(all-to-all), as HcclCreateOpResCtx made for the MoE ops (got "
                                                   "op type %u)", kOpTypeAllToAll, unsigned(res->op_type)));
    if (res->comm_engine != HCCL_COMM_ENGINE_AIV)
        return ctx_fail(code, op, "context", format("kfcContextAddr's op-resource context must use comm engine %d "
                                                   "(AIV, HcclKfcOpArgsSetCommEngine) (got comm engine %u)",
                                                   int(HCCL_COMM_ENGINE_AIV), unsigned(res->comm_engine)));
    hccl::Comm *c = res->comm;
    if (c->destroyed())
        return ctx_fail(code, op, "context", "its communicator was destroyed (got a stale context)");
    if (int64_t(c->nranks()) != p.W)
        return ctx_fail(code, op, "ep_world_size", format("must equal the rank count of the context's "
                                                         "communicator (got %" PRId64 ", communicator has %u)",
                                                         p.W, c->nranks()));
    if (int64_t(c->rank()) != p.r)
        return ctx_fail(code, op, "ep_rank_id", format("must equal this rank's id in the context's communicator "
                                                      "(got %" PRId64 ", communicator rank %u)", p.r, c->rank()));
    if (int64_t(head.ep_rank_id) != p.r)
        return ctx_fail(code, op, "context", format("epRankId field must equal ep_rank_id (got %u, ep_rank_id %" PRId64 ")",
                                                   head.ep_rank_id, p.r));
    *comm = c;
    *entries = base + sizeof(CtxHead);
    return 0;
}

int check_window_entry(const uint8_t *entries, const hccl::Comm &comm, uint64_t i, int code, const char *op) {
    static_assert(sizeof(void *) == 8, "epHcclBuffer_ entries are 64-bit addresses");
    uint64_t got;
    std::memcpy(&got, entries + 8 * i, 8);
    const uint64_t want = reinterpret_cast<uint64_t>(comm.windows()[i]);
    if (got == want) return 0;
    return ctx_fail(code, op, "context", format("epHcclBuffer_[%" PRIu64 "] must be rank %" PRIu64 "'s window address "
                                               "(got 0x%" PRIx64 ", window at 0x%" PRIx64 ")", i, i, got, want));
}

int resolve_context(const aclTensor &ctx, const MoeParams &p, hccl::Comm **comm) {
    constexpr int code = ACLNN_ERR_PARAM_INVALID;
    constexpr const char *op = nullptr;   // phase 1 messages name the parameter only
    const uint8_t *entries = nullptr;
    if (int rc = resolve_context_head(ctx, p, comm, &entries, code, op)) return rc;
    // epHcclBuffer_[i] must be rank i's window for every rank of the communicator (the kernels reach
    // their peers through these addresses on hardware): one block compare, entry by entry only to
    // name a difference.
    if (std::memcmp(entries, (*comm)->windows(), 8 * size_t(p.W)) != 0)
        for (uint64_t i = 0; i < uint64_t(p.W); ++i)
            if (int rc = check_window_entry(entries, **comm, i, code, op)) return rc;
    return 0;
}

namespace {
// The window these sizes need (docs/operators.md, "Buffer sizing") must fit in ccl_buffer_size.
int check_window_need(MoeParams &p) {
    if (p.ccl < 0) return bad("ccl_buffer_size", "must be >= 0 (got %" PRId64 ")", p.ccl);
    if (p.a2)
        if (int rc = check_window_a2(p)) return rc;
    Layout l = make_layout(p.W, p.L, p.maxBs, p.H, p.K, p.S, p.fullmesh_v2);
    const uint64_t need_b = window_need_bytes(l, p.W, p.soc950);
    const uint64_t avail = uint64_t(p.ccl) > kMiB ? uint64_t(p.ccl) - kMiB : 0;
    // the 950 reserves the stamps in its formula; on A2 (performance_info from generation 4) they are
    // written when the window has room left after the data, which every rank finds alike
    p.stamp_room = p.soc950 || (p.a2 && window_need_bytes(l, p.W, true) <= avail);
    if (need_b > avail || uint64_t(p.ccl) < kMiB) {
        const uint64_t mib = ceil_div(need_b + kMiB, kMiB);
        const uint64_t buffsize = ceil_div(mib, 2);
        return bad("ccl_buffer_size",
                   "window too small: 2*(maxBs*Td*W*L + maxBs*Tc*(K+S))%s = 2*(%" PRId64 "*%" PRIu64 "*%" PRId64
                   "*%" PRId64 " + %" PRId64 "*%" PRIu64 "*%" PRId64 ")%s = %" PRIu64
                   " bytes must be <= ccl_buffer_size - 1 MiB; set HCCL_BUFFSIZE >= %" PRIu64
                   " (MiB) (got %" PRId64 " bytes)",
                   p.soc950 ? " + W*1024" : "", p.maxBs, l.td, p.W, p.L, p.maxBs, l.tc, p.K + p.S,
                   p.soc950 ? format(" + %" PRId64, p.W * 1024).c_str() : "", need_b, buffsize, p.ccl);
    }
    return 0;
}
}  // namespace

int check_window(const MoeParams &p, const hccl::Comm *comm) {
    if (comm && uint64_t(p.ccl) > comm->window_size())
        return bad("ccl_buffer_size", "must not exceed the window of the context's communicator (%" PRIu64
                   " bytes) (got %" PRId64 ")", comm->window_size(), p.ccl);
    return 0;
}

DispatchWs dispatch_ws(const MoeParams &p) {
    DispatchWs w;
    w.qrow = 0;
    // one staged window row payload (+ the 4-byte dynamic scale after it)
    w.tmp = w.qrow + align_up(dispatch_payload_bytes(p.H) + kScaleSlotBytes, 64);
    w.total = w.tmp + lowp_tmp_floats(p.H) * 4;
    return w;
}

CombineWs combine_ws(const MoeParams &p) {
    CombineWs w;
    w.tmp = 0;
    const uint64_t a = comm_quant_tmp_floats(p.H), b = lowp_tmp_floats(p.H);
    w.total = w.tmp + (a > b ? a : b) * 4;   // >= H floats (dequantised / const rows, MX scratch)
    return w;
}

}  // namespace moe
}  // namespace aclmock
