// The mailbox primitives shared by HcclBarrier and the dispatch/combine kernels: publish an entry
// into a peer's status area, wait for every rank's entry of one call, report mismatches and peers
// that never arrive.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstring>
#include <thread>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {

const char *op_tag_name(uint32_t tag) {
    switch (tag) {
        case kTagBarrier: return "HcclBarrier";
        case kTagDispatch: return "MoeDistributeDispatchV5";
        case kTagCombine: return "MoeDistributeCombineV5";
        case kTagTpAllGather: return "the TP all-gather of MoeDistributeDispatch";
        case kTagTpReduceScatter: return "the TP reduce-scatter of MoeDistributeCombine";
        default: return "unknown op";
    }
}

double exec_timeout_seconds() {
    // Read at every wait so that a test may change it between calls. 0: as HCCL, no limit. A value
    // that cannot be read fails the wait itself (wait_all); here, for the grace periods that follow
    // it, the default.
    double t = 120;
    std::string why;
    if (!hccl_exec_timeout(&t, &why)) t = 120;
    return t > 0 ? t : 1e12;
}

// ---- fault injection hook (aclnn_py._mock.inject_fault; the registry is in the runtime) -----------
// Consulted once per collective call, at its first publish, on the thread running the call: Delay
// sleeps there, Crash SIGKILLs the process there (after a kernel wrote its data, before any peer
// sees its entry), Skip makes the call publish nothing and fail at once on this rank.
namespace {
struct CallFault {
    const Comm *comm = nullptr;
    uint64_t seq = UINT64_MAX;
    FaultKind kind = FaultKind::None;
};
thread_local CallFault t_call_fault;

FaultKind call_fault(const Comm *c, uint32_t rank, uint64_t seq, uint32_t tag) {
    if (t_call_fault.comm == c && t_call_fault.seq == seq) return t_call_fault.kind;
    const char *op = tag == kTagDispatch ? "dispatch" : tag == kTagCombine ? "combine" : "barrier";
    FaultHit h = take_fault(op, static_cast<int>(rank));
    t_call_fault = CallFault{c, seq, h.kind};
    if (h.kind == FaultKind::Delay && h.seconds > 0)
        std::this_thread::sleep_for(std::chrono::duration<double>(h.seconds));
    if (h.kind == FaultKind::Crash) kill(getpid(), SIGKILL);
    return h.kind;
}
}  // namespace

void Comm::publish(uint32_t dst, uint64_t seq, uint32_t tag, const int64_t *fields, uint32_t nfields) {
    if (call_fault(this, impl_->rank, seq, tag) == FaultKind::Skip) return;
    Mailbox *mb = mailbox(dst, static_cast<int>(seq % 2));
    if (!mb) return;   // destroyed, or dst out of range: the waits report it
    MailboxEntry &e = mb->from[impl_->rank];
    if (nfields > static_cast<uint32_t>(kMailboxFields)) nfields = kMailboxFields;
    e.tag = tag;
    e.nfields = nfields;
    if (nfields && fields) memcpy(e.fields, fields, nfields * sizeof(int64_t));
    e.seq.store(seq + 1, std::memory_order_release);
    // Ring after the entry; sequentially consistent with the owner's sleepers/ring pair in wait_all,
    // so either the owner sees this entry before it sleeps or this publish sees it asleep.
    mb->ring.fetch_add(1, std::memory_order_seq_cst);
    if (mb->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&mb->ring);
}

int Comm::wait_all(uint64_t seq, uint32_t tag, const int64_t *fields, const char *const *field_names,
                   uint32_t nfields, const char *op_name, const uint8_t *members) {
    const char *op = op_name ? op_name : op_tag_name(tag);
    const uint32_t me = impl_->rank, W = impl_->nranks;
    if (nfields > static_cast<uint32_t>(kMailboxFields)) nfields = kMailboxFields;
    Mailbox *mb = mailbox(me, static_cast<int>(seq % 2));
    if (!mb || impl_->closing.load(std::memory_order_acquire))
        return fail(ACL_ERROR_RT_AICORE_EXCEPTION, "%s on rank %u: the communicator %s was destroyed", op, me,
                    impl_->name.c_str());
    if (call_fault(this, me, seq, tag) == FaultKind::Skip)
        return fail(ACL_ERROR_RT_AICORE_EXCEPTION, "%s on rank %u: injected fault: this rank skipped collective "
                    "call #%" PRIu64, op, me, seq);
    const uint64_t want = seq + 1;
    {
        double t;
        std::string why;
        if (!hccl_exec_timeout(&t, &why)) return fail(ACL_ERROR_INVALID_PARAM, "%s on rank %u: %s", op, me, why.c_str());
    }
    const double timeout = exec_timeout_seconds();
    const double start = now_seconds();
    std::vector<uint8_t> done(W, 0);
    uint32_t remaining = W;
    if (members)
        for (uint32_t src = 0; src < W; ++src)
            if (!members[src]) {
                done[src] = 1;
                --remaining;
            }
    Backoff bo;
    LivenessPacer pacer(start);
    for (;;) {
        for (uint32_t src = 0; src < W; ++src) {
            if (done[src]) continue;
            MailboxEntry &e = mb->from[src];
            uint64_t s = e.seq.load(std::memory_order_acquire);
            if (s < want) continue;
            if (s > want)
                return fail(ACL_ERROR_RT_AICORE_EXCEPTION,
                            "%s on rank %u: call-order mismatch: rank %u is already at collective call #%" PRIu64
                            " (%s) while this rank waits for call #%" PRIu64 " (%s)",
                            op, me, src, s - 1, op_tag_name(e.tag), seq, op_tag_name(tag));
            if (e.tag != tag)
                return fail(ACL_ERROR_RT_AICORE_EXCEPTION,
                            "%s on rank %u: call-order mismatch at collective call #%" PRIu64
                            ": rank %u runs %s, rank %u runs %s",
                            op, me, seq, src, op_tag_name(e.tag), me, op_tag_name(tag));
            if (e.nfields != nfields)
                return fail(ACL_ERROR_RT_AICORE_EXCEPTION,
                            "%s on rank %u: rank %u published %u parameters, rank %u has %u", op, me, src,
                            e.nfields, me, nfields);
            for (uint32_t i = 0; i < nfields; ++i) {
                if (e.fields[i] == fields[i]) continue;
                std::string fname = field_names && field_names[i] ? field_names[i] : format("parameter %u", i);
                return fail(ACL_ERROR_RT_AICORE_EXCEPTION, "%s on rank %u: %s: rank %u has %" PRId64
                            ", rank %u has %" PRId64, op, me, fname.c_str(), src, e.fields[i], me, fields[i]);
            }
            done[src] = 1;
            --remaining;
        }
        if (remaining == 0) return 0;
        if (impl_->closing.load(std::memory_order_acquire))
            return fail(ACL_ERROR_RT_AICORE_EXCEPTION,
                        "%s on rank %u: the communicator %s was destroyed while waiting", op, me,
                        impl_->name.c_str());
        const double now = now_seconds();
        // A peer that is gone will never publish this call, so waiting for the timeout is pointless.
        // Its entry may have landed just before it went: only a peer still without one counts.
        std::string gone;
        if (pacer.due(now))
            pacer.probe_batch(W, [&](uint32_t src) { return !done[src]; }, [&](uint32_t src) {
                std::string why;
                if (peer_gone(src, &why) && mb->from[src].seq.load(std::memory_order_acquire) < want) gone += why;
            });
        const double waited = now - start;
        if (!gone.empty() || waited > timeout) {
            std::vector<uint32_t> missing;
            for (uint32_t src = 0; src < W; ++src)
                if (!done[src]) missing.push_back(src);
            if (!gone.empty())
                return fail(ACL_ERROR_RT_AICORE_TIMEOUT,
                            "%s on rank %u: gave up after %.1fs waiting for ranks %s: a peer is gone, so collective "
                            "call #%" PRIu64 " can never complete (HCCL_EXEC_TIMEOUT=%g not reached)%s",
                            op, me, waited, rank_list(missing).c_str(), seq, timeout, gone.c_str());
            std::string notes;
            for (uint32_t src : missing) peer_gone(src, &notes);
            return fail(ACL_ERROR_RT_AICORE_TIMEOUT,
                        "%s on rank %u: timed out after %.1fs waiting for ranks %s (HCCL_EXEC_TIMEOUT=%g, "
                        "collective call #%" PRIu64 ")%s",
                        op, me, waited, rank_list(missing).c_str(), timeout, seq, notes.c_str());
        }
        if (!bo.long_wait()) {
            bo.pause();
            continue;
        }
        // A long wait sleeps on the doorbell, at most 50 ms at a time (destruction, liveness and the
        // timeout are checked between sleeps).
        mb->sleepers.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t rung = mb->ring.load(std::memory_order_seq_cst);
        bool arrived = false;
        for (uint32_t src = 0; src < W && !arrived; ++src)
            arrived = !done[src] && mb->from[src].seq.load(std::memory_order_acquire) >= want;
        if (!arrived) futex_wait(&mb->ring, rung, 0.05);
        mb->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
}

}  // namespace hccl
}  // namespace aclmock
