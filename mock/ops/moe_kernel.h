// What the dispatch and combine kernels share at run time (private to mock/ops): the start of a
// kernel call (context, communicator, sequence number, data half), the exchange (one arrival at the
// world's hub, then the wait for all), token validity under x_active_mask, elastic_info's rank table and the
// performance_info stamps.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "aclnn/executor.h"
#include "hccl/hccl_core.h"
#include "ops/moe_checks.h"
#include "ops/moe_window.h"

#pragma GCC visibility push(hidden)  // nothing but the four aclnn entry points is exported

namespace aclmock {
namespace moe {

// Failure code of a kernel that finds bad data at run time (call-order and parameter mismatches
// reported by Comm::wait_all use the same code).
constexpr int kKernelFail = ACL_ERROR_RT_AICORE_EXCEPTION;

// One run of a kernel on its communicator. begin() resolves and checks the context (its head and this
// rank's window entry; a peer's entry is checked when data() or mailbox() reach it), or without one
// (the group-string generations) looks group_ep up again (as phase 1 does, with the kernel's
// failure code), holds the communicator for the call (Comm::begin_use,
// released by the destructor) and takes the call's sequence number; the call then owns data half
// seq % 2 of every rank's window (moe_window.h).
class KernelCall {
public:
    KernelCall() = default;
    KernelCall(const KernelCall &) = delete;
    KernelCall &operator=(const KernelCall &) = delete;
    ~KernelCall();

    int begin(const aclTensor *ctx, const MoeParams &p, const char *op);
    // After begin(): run the call in the live sub-world of a dynamic shrink. `q` holds the sub-world's
    // sizes and this rank's logical id; rank numbers given to data(), mailbox() and exchange() are
    // logical from then on, phys[l] the physical rank of logical rank l.
    void use_subworld(const MoeParams &q, std::vector<int32_t> phys);

    // One step of the call's exchange, taken again by each step of the kernel's task until it is not
    // kTaskPending: after a fault injected into the call (a delay is waited out between steps), it
    // stamps, on the 950, this rank's time for performance_info, arrives with this rank's entry
    // (tag, fields), then waits for every rank's arrival (Comm::wait_all's outcomes: timeouts,
    // call-order and parameter mismatches). *t_ready is when the wait began.
    int exchange(uint32_t tag, const int64_t *fields, const char *const *names, uint32_t nfields,
                 int64_t *t_ready);

    hccl::Comm *comm = nullptr;
    uint64_t seq = 0;
    int half = 0;
    Layout layout;
    const MoeParams *params = nullptr;
    const char *op = nullptr;

    // A peer's data half and mailbox. The kernel reaches a peer through its context entry on
    // hardware, so each one reached is checked (an entry that is not the peer's window fails the call
    // at its exchange): O(peers reached) per launch, not W.
    uint8_t *data(int64_t rank) const { return comm->data_half(reached(rank), half); }
    hccl::Mailbox *mailbox(int64_t rank) const { return comm->mailbox(reached(rank), half); }

private:
    uint32_t physical(int64_t rank) const { return uint32_t(phys_.empty() ? rank : phys_[size_t(rank)]); }
    uint32_t reached(int64_t rank) const {
        const uint32_t ph = physical(rank);
        if (entries_ && bad_entry_ < 0 &&
            std::memcmp(entries_ + 8 * size_t(ph), &comm->windows()[ph], 8) != 0)
            bad_entry_ = ph;
        return ph;
    }
    const uint8_t *entries_ = nullptr;   // the context's epHcclBuffer_ (none without a context)
    mutable int64_t bad_entry_ = -1;     // the first entry reached that is not its rank's window
    bool held_ = false;
    hccl::CallSteps steps_;
    std::vector<int32_t> phys_;      // logical → physical in a shrunk sub-world, else empty
    std::vector<uint8_t> members_;   // the physical ranks taking part (empty: all)
};

// A3 elastic_info at run time: CANN's dynamic shrink (aclnnMoeDistributeDispatchV3.md / V4.md). With
// flag [0] set, [1] = W' ranks still taking part, [2] = R' of them shared-expert ranks, [3] = E' MoE
// experts (each MoE rank keeps its L), [4, 4+W) maps each physical rank to its logical id or -1 (left
// out), [4+W, 4+W+W') each logical id to its physical rank. *q becomes the sub-world of W' ranks
// (this rank's logical id, R', E', the roles and receive slots) and *phys its logical → physical table;
// phys stays empty with the flag clear. 0, or a kernel failure naming the broken entry.
int read_shrink(const int32_t *info, const MoeParams &p, MoeParams *q, std::vector<int32_t> *phys);

// Typed address of slot i's view, or nullptr for an absent optional tensor.
template <class T>
T *ptr(const std::vector<Slot> &v, int i) {
    return v[i].present ? static_cast<T *>(view_ptr(v[i].desc)) : nullptr;
}

// Phase 1's end, the same for both operators: `ex` gets a slot per input and output tensor (absent
// optional ones included, so indices stay the operator function's), is registered, and its handle and
// workspace size are handed out. The group-string generations (before 5) take no context tensor.
int register_moe_executor(std::shared_ptr<Executor> ex, int generation, const aclTensor *const *ins, size_t n_in,
                          const aclTensor *const *outs, size_t n_out, uint64_t workspace_bytes, const char *op,
                          uint64_t *workspace_size, aclOpExecutor **executor);

// The start both operators' launches share: the call on the communicator of input `ctx`, and in *q the
// params it runs with (under A3 elastic_info, input `elastic`, the ranks still in the communicator
// run the call as a world of their own). 0, or the failure with its message set.
template <class Params>
int begin_call(KernelCall &call, Params *q, const Params &p, const std::vector<Slot> &in, int ctx, int elastic) {
    if (int rc = call.begin(in[ctx].present ? &in[ctx].desc : nullptr, p, p.op)) return rc;
    *q = p;
    if (p.shrink) {
        std::vector<int32_t> phys;
        if (int rc = read_shrink(ptr<const int32_t>(in, elastic), p, q, &phys)) return rc;
        q->has_elastic = false;   // the 950's re-mapping table is not read
        if (!phys.empty()) call.use_subworld(*q, std::move(phys));
    }
    return 0;
}

// A launch's first step (Executor::run): what is left of it goes to *rest when it pauses.
template <class Flight>
int first_step(std::unique_ptr<Flight> f, std::unique_ptr<KernelRest> *rest) {
    const int rc = f->step();
    if (rc == kTaskPending) *rest = std::move(f);
    return rc;
}

// Tokens a kernel considers (docs/operators.md): all BS without a mask; with a 1-D mask only the
// count of true flags matters (the first sum(mask) tokens); with a 2-D mask all BS, each token valid
// when any of its K flags is true.
int64_t tokens_considered(const uint8_t *mask, int mask_dims, int64_t BS);
inline bool token_valid(const uint8_t *mask, int mask_dims, int64_t t, int64_t K) {
    if (mask_dims != 2) return true;
    for (int64_t k = 0; k < K; ++k)
        if (mask[t * K + k]) return true;
    return false;
}

// elastic_info at run time (docs/operators.md; aclnn_py.golden choice 10): physical(l) = the
// physical rank serving logical rank l, logical(m) its inverse. Identity without elastic_info or with
// flag [0] == 0. With the flag set, [1], [2], [3] must equal W, R, E and [4+W, 4+2W) must be a
// permutation of 0..W-1; otherwise *err is set (first error only) and the identity is used so the
// protocol still completes. The identity holds no table: a launch without a re-mapping does no O(W)
// work for it.
class RankTable {
public:
    RankTable(const int32_t *info, const MoeParams &p, std::string *err);
    int64_t physical(int64_t l) const { return phys_.empty() ? l : phys_[size_t(l)]; }
    int64_t logical(int64_t m) const { return logi_.empty() ? m : logi_[size_t(m)]; }
    // A small hash of the table, published so that ranks with different tables fail loudly.
    int64_t hash() const;

private:
    int64_t W_;
    std::vector<int32_t> phys_, logi_;   // both empty: the identity
};

// performance_info (docs/operators.md): each sender stamps CLOCK_MONOTONIC (ns, system-wide) just before
// it publishes; a receiver given performance_info adds max(0, stamp - t_ready) / 1000 µs per source
// rank, t_ready being when it started to wait. The stamps live in the W*1024 bytes the 950's window
// check reserves (W*512 per data half, 8 bytes per source rank at src*512): a sender writes its slot in
// its own window once, and only a receiver that asks reads the W senders' windows (a stamp written into
// every peer's window would touch W pages per rank and call, W² for the world).
inline uint64_t perf_stamp_offset(const Layout &l) { return l.dispatch_region + l.combine_region; }
int64_t monotonic_ns();
void write_perf_stamp(const KernelCall &call);
void add_perf(int64_t *perf, const KernelCall &call, int64_t t_ready);

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
