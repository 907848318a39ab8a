// Run-time pieces shared by the mock MoE kernels; see moe_kernel.h.
#include "ops/moe_kernel.h"
#include "ops/moe_generations.h"
#include "ops/peer_copy.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include <unistd.h>

namespace aclmock {
namespace moe {

KernelCall::~KernelCall() {
    if (held_) comm->end_use();
}

int KernelCall::begin(const aclTensor *ctx, const MoeParams &p, const char *op_name) {
    params = &p;
    op = op_name;
    if (int rc = ctx ? resolve_context_head(*ctx, p, &comm, &entries_, kKernelFail, op)
                     : find_group(p.group_ep, "group_ep", p.W, p.r, &comm, kKernelFail, op))
        return rc;
    if (entries_) (void)reached(p.r);   // its own window, read after the exchange
    if (!comm->begin_use())
        return fail(kKernelFail, "%s: rank %" PRId64 ": the communicator is being destroyed", op, p.r);
    held_ = true;
    seq = comm->next_seq();
    half = int(seq % 2);
    layout = make_layout(p.W, p.L, p.maxBs, p.H, p.K, p.S, p.fullmesh_v2);
    return 0;
}

void KernelCall::use_subworld(const MoeParams &q, std::vector<int32_t> phys) {
    params = &q;
    members_.assign(comm->nranks(), 0);
    for (int32_t ph : phys) members_[size_t(ph)] = 1;
    phys_ = std::move(phys);
    layout = make_layout(q.W, q.L, q.maxBs, q.H, q.K, q.S, q.fullmesh_v2);
}

int KernelCall::exchange(uint32_t tag, const int64_t *fields, const char *const *names, uint32_t nfields,
                         int64_t *t_ready) {
    const uint8_t *members = members_.empty() ? nullptr : members_.data();
    if (!steps_.started()) steps_.begin(comm, seq, tag);
    if (!steps_.arrived()) {
        if (steps_.delayed()) return kTaskPending;   // a delay comes before the stamps
        if (params->stamp_room) write_perf_stamp(*this);
        steps_.arrive(fields, nfields, members);
        *t_ready = monotonic_ns();
    }
    if (int rc = steps_.wait(fields, names, nfields, op, members)) return rc;
    // after the exchange, so that the peers never wait for a rank that gave up
    return bad_entry_ >= 0 ? check_window_entry(entries_, *comm, uint64_t(bad_entry_), kKernelFail, op) : 0;
}

int read_shrink(const int32_t *info, const MoeParams &p, MoeParams *q, std::vector<int32_t> *phys) {
    *q = p;
    phys->clear();
    if (!info || info[0] == 0) return 0;
    const int64_t W = p.W, Wl = info[1], Rl = info[2], El = info[3];
    auto bad_info = [&](const std::string &why) {
        return fail(kKernelFail, "%s: rank %" PRId64 ": elastic_info: %s", p.op, p.r, why.c_str());
    };
    if (Wl < 1 || Wl > W)
        return bad_info(format("[1] (ranks after the shrink) must be in [1, ep_world_size = %" PRId64 "] (got %" PRId64
                               ")", W, Wl));
    if (Rl < 0 || Rl >= Wl || (p.S == 0) != (Rl == 0) || (Rl > 0 && Rl % p.S != 0))
        return bad_info(format("[2] (shared-expert ranks after the shrink) must be in [0, [1]) and, like "
                               "shared_expert_rank_num, 0 exactly when there is no shared expert and a multiple of "
                               "shared_expert_num (got %" PRId64 " of %" PRId64 " ranks, shared_expert_num %" PRId64 ")",
                               Rl, Wl, p.S));
    if (El != p.L * (Wl - Rl))
        return bad_info(format("[3] (MoE experts after the shrink) must be L * ([1] - [2]) = %" PRId64 " * %" PRId64
                               " = %" PRId64 ": every MoE rank keeps its local experts (got %" PRId64 ")",
                               p.L, Wl - Rl, p.L * (Wl - Rl), El));
    std::vector<int32_t> logical(static_cast<size_t>(W));
    int64_t live = 0;
    for (int64_t i = 0; i < W; ++i) {
        logical[size_t(i)] = info[4 + i];
        if (info[4 + i] < -1 || info[4 + i] >= Wl)
            return bad_info(format("[4 + %" PRId64 "] (rank %" PRId64 "'s new id) must be -1 or in [0, [1]) (got %d)",
                                   i, i, info[4 + i]));
        live += info[4 + i] >= 0;
    }
    if (live != Wl)
        return bad_info(format("the first table gives %" PRId64 " ranks a new id, [1] says %" PRId64, live, Wl));
    phys->resize(size_t(Wl));
    for (int64_t l = 0; l < Wl; ++l) {
        const int32_t ph = info[4 + W + l];
        if (ph < 0 || ph >= W || logical[size_t(ph)] != l)
            return bad_info(format("[4 + W + %" PRId64 "] must be the rank whose new id is %" PRId64 " in the first "
                                   "table (got %d)", l, l, ph));
        (*phys)[size_t(l)] = ph;
    }
    const int32_t me = logical[size_t(p.r)];
    if (me < 0)
        return bad_info(format("this rank is left out of the communicator (its new id is -1): a rank removed by "
                               "the shrink does not call the operator"));
    q->W = Wl;
    q->R = Rl;
    q->E = El;
    q->r = me;
    q->P = p.S > 0 ? Rl / p.S : 1;
    q->G = q->maxBs * Wl;
    q->shared_rank = me < Rl;
    q->local_experts = q->shared_rank ? 1 : p.L;
    q->recv_slots = q->shared_rank ? Wl : Wl * p.L;
    return 0;
}

int register_moe_executor(std::shared_ptr<Executor> ex, int generation, const aclTensor *const *ins, size_t n_in,
                          const aclTensor *const *outs, size_t n_out, uint64_t workspace_bytes, const char *op,
                          uint64_t *workspace_size, aclOpExecutor **executor) {
    ex->hidden_inputs = generation < 5 ? 1 : 0;
    ex->inputs.reserve(n_in);
    ex->outputs.reserve(n_out);
    for (size_t i = 0; i < n_in; ++i) ex->inputs.push_back(slot_of(ins[i]));
    for (size_t i = 0; i < n_out; ++i) ex->outputs.push_back(slot_of(outs[i]));
    ex->workspace_size = workspace_bytes;
    aclOpExecutor *h = register_executor(std::move(ex));
    if (!h) return fail(ACLNN_ERR_INNER_CREATE_EXECUTOR, "%s: could not register the executor", op);
    *workspace_size = workspace_bytes;
    *executor = h;
    return ACLNN_SUCCESS;
}

int64_t tokens_considered(const uint8_t *mask, int mask_dims, int64_t BS) {
    if (mask_dims != 1) return BS;
    int64_t n = 0;
    for (int64_t t = 0; t < BS; ++t) n += mask[t] != 0;
    return n;
}

RankTable::RankTable(const int32_t *info, const MoeParams &p, std::string *err) : W_(p.W) {
    if (!info || info[0] == 0) return;
    const int64_t W = p.W;
    if (info[1] != W || info[2] != p.R || info[3] != p.E) {
        if (err->empty())
            *err = format("elastic_info: [1], [2], [3] must equal ep_world_size, shared_expert_rank_num, "
                          "moe_expert_num (got %d, %d, %d vs %" PRId64 ", %" PRId64 ", %" PRId64 "; the mock models "
                          "a re-mapping of the same world)", info[1], info[2], info[3], W, p.R, p.E);
        return;
    }
    std::vector<int32_t> logi(size_t(W), -1);
    for (int64_t l = 0; l < W; ++l) {
        const int32_t ph = info[4 + W + l];
        if (ph < 0 || ph >= W || logi[size_t(ph)] >= 0) {
            if (err->empty())
                *err = format("elastic_info: the rank table [4+W, 4+2W) must be a permutation of 0..%" PRId64
                              " (entry %" PRId64 " is %d)", W - 1, l, ph);
            return;
        }
        logi[size_t(ph)] = int32_t(l);
    }
    phys_.assign(info + 4 + W, info + 4 + 2 * W);
    logi_ = std::move(logi);
}

int64_t RankTable::hash() const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t l = 0; l < W_; ++l) h = (h ^ uint64_t(uint32_t(physical(l)))) * 1099511628211ull;
    return int64_t(h & 0xfffffull);
}

namespace {
// The last-level cache of CPU 0 as the kernel describes it (sysfs: the cache of the highest level;
// the C library's figure can be a whole processor's, ten times what one core reaches in a VM);
// 32 MiB where neither says.
uint64_t last_level_cache_bytes() {
    uint64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 8; ++i) {
        const std::string dir = format("/sys/devices/system/cpu/cpu0/cache/index%d/", i);
        FILE *lv = std::fopen((dir + "level").c_str(), "r");
        if (!lv) break;
        int level = 0;
        const bool got_level = std::fscanf(lv, "%d", &level) == 1;
        std::fclose(lv);
        FILE *sz = std::fopen((dir + "size").c_str(), "r");
        if (!sz) continue;
        unsigned long long n = 0;
        char unit = 0;
        const int got = std::fscanf(sz, "%llu%c", &n, &unit);
        std::fclose(sz);
        if (!got_level || got < 1) continue;
        const uint64_t bytes = unit == 'K' ? n << 10 : unit == 'M' ? n << 20 : n;
        if (level > best_level) {
            best_level = level;
            best = bytes;
        }
    }
    if (best) return best;
    const long n = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return n > 0 ? uint64_t(n) : uint64_t(32) << 20;
}
}  // namespace

bool stream_rows(int64_t W, uint64_t bytes_per_rank) {
    if (const int mode = row_streaming(); mode >= 0) return mode == 1;
    static const uint64_t llc = last_level_cache_bytes();
    return uint64_t(W) * bytes_per_rank > llc / 4;
}

int64_t monotonic_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void write_perf_stamp(const KernelCall &call) {
    const int64_t now = monotonic_ns(), r = call.params->r;
    std::memcpy(call.data(r) + perf_stamp_offset(call.layout) + uint64_t(r) * 512, &now, 8);
}

void add_perf(int64_t *perf, const KernelCall &call, int64_t t_ready) {
    const uint64_t stamps = perf_stamp_offset(call.layout);
    for (int64_t src = 0; src < call.params->W; ++src) {
        int64_t stamp;
        std::memcpy(&stamp, call.data(src) + stamps + uint64_t(src) * 512, 8);
        perf[src] += stamp > t_ready ? (stamp - t_ready) / 1000 : 0;
    }
}

}  // namespace moe
}  // namespace aclmock
