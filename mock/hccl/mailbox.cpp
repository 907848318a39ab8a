// The mailbox primitives shared by HcclBarrier and the dispatch/combine kernels: a rank's arrival
// at a call (its entry into the world's hub, one count), the wait for every rank's arrival, and the
// reports of mismatches and of peers that never arrive.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
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
// Consulted once per collective call, at its arrival, on the thread running the call: Delay
// sleeps there, Crash SIGKILLs the process there (after a kernel wrote its data, before any peer
// sees its entry), Skip makes the call arrive nowhere and fail at once on this rank.
namespace {
struct CallFault {
    const Comm *comm = nullptr;
    uint64_t seq = UINT64_MAX;
    FaultKind kind = FaultKind::None;
};
thread_local CallFault t_call_fault;

// With `delay` given, a delay is reported there instead of slept.
FaultKind call_fault(const Comm *c, uint32_t rank, uint64_t seq, uint32_t tag, double *delay = nullptr) {
    if (t_call_fault.comm == c && t_call_fault.seq == seq) return t_call_fault.kind;
    const char *op = tag == kTagDispatch ? "dispatch" : tag == kTagCombine ? "combine" : "barrier";
    FaultHit h = take_fault(op, static_cast<int>(rank));
    t_call_fault = CallFault{c, seq, h.kind};
    if (h.kind == FaultKind::Delay && h.seconds > 0) {
        if (delay)
            *delay = h.seconds;
        else
            std::this_thread::sleep_for(std::chrono::duration<double>(h.seconds));
    }
    if (h.kind == FaultKind::Crash) kill(own_pid(), SIGKILL);
    return h.kind;
}
}  // namespace

namespace {
// Mailbox::arrivals packs the call (seq + 1) above a count of the ranks that arrived at it.
constexpr unsigned kCountBits = 16;
constexpr uint64_t kCountMask = (uint64_t(1) << kCountBits) - 1;
static_assert(kMaxRanks <= static_cast<int>(kCountMask), "arrival count fits");

// Whether the hub's `done` word names call `want` (seq + 1) or a newer one of the same half; the
// word holds the low 32 bits, so compare by wrapping difference.
bool reached(uint32_t done, uint64_t want) { return static_cast<int32_t>(done - static_cast<uint32_t>(want)) >= 0; }

bool same_entry(const MailboxEntry &a, const MailboxEntry &b) {
    if (a.tag != b.tag || a.nfields != b.nfields) return false;
    const uint32_t n = a.nfields < static_cast<uint32_t>(kMailboxFields) ? a.nfields : kMailboxFields;
    return n == 0 || memcmp(a.fields, b.fields, n * sizeof(int64_t)) == 0;
}

// Whether rank `src` takes part in the call: every rank, or those `members` flags (a dynamic shrink).
bool member(const uint8_t *members, uint32_t src) { return !members || members[src]; }

// The rank every entry is compared with: rank 0, or the first member.
uint32_t reference(const uint8_t *members, uint32_t W) {
    uint32_t src = 0;
    while (src + 1 < W && !member(members, src)) ++src;
    return src;
}

uint32_t member_count(const uint8_t *members, uint32_t W) {
    if (!members) return W;
    uint32_t n = 0;
    for (uint32_t src = 0; src < W; ++src) n += members[src] != 0;
    return n;
}

// The first member whose entry differs from the reference's, or -1: run once per call, by its last
// arriver.
int32_t first_differing(const Mailbox &hub, uint32_t W, const uint8_t *members) {
    const uint32_t ref = reference(members, W);
    for (uint32_t src = ref + 1; src < W; ++src)
        if (member(members, src) && !same_entry(hub.from[src], hub.from[ref])) return static_cast<int32_t>(src);
    return -1;
}
}  // namespace

bool Comm::take_fault(uint64_t seq, uint32_t tag, double *delay) {
    return call_fault(this, impl_->rank, seq, tag, delay) == FaultKind::Skip;
}

void Comm::arrive(uint64_t seq, uint32_t tag, const int64_t *fields, uint32_t nfields, const uint8_t *members) {
    if (call_fault(this, impl_->rank, seq, tag) == FaultKind::Skip) return;
    publish(seq, tag, fields, nfields, members);
}

void Comm::publish(uint64_t seq, uint32_t tag, const int64_t *fields, uint32_t nfields, const uint8_t *members) {
    Mailbox *hub = mailbox(0, static_cast<int>(seq % 2));
    if (!hub) return;   // destroyed: the wait reports it
    MailboxEntry &e = hub->from[impl_->rank];
    if (nfields > static_cast<uint32_t>(kMailboxFields)) nfields = kMailboxFields;
    e.tag = tag;
    e.nfields = nfields;
    if (nfields && fields) memcpy(e.fields, fields, nfields * sizeof(int64_t));
    const uint64_t want = seq + 1;
    e.seq.store(want, std::memory_order_release);
    // The first arrival at a call restarts the count; a rank behind the newest call of this half
    // (a call-order mismatch) is not counted and finds out in wait_all. acq_rel: the last arriver
    // acquires every earlier arriver's writes (entries, rows, counts), and passes them on through
    // `done`.
    uint64_t cur = hub->arrivals.load(std::memory_order_acquire), next;
    do {
        const uint64_t at = cur >> kCountBits;
        if (at > want) return;
        next = at < want ? (want << kCountBits) | 1 : cur + 1;
    } while (!hub->arrivals.compare_exchange_weak(cur, next, std::memory_order_acq_rel, std::memory_order_acquire));
    if ((next & kCountMask) < member_count(members, impl_->nranks)) return;
    hub->differs = first_differing(*hub, impl_->nranks, members);
    // Sequentially consistent with the sleepers' count in wait_all: either a sleeper sees `done`
    // before it sleeps, or this store's wake finds it counted.
    hub->done.store(static_cast<uint32_t>(want), std::memory_order_seq_cst);
    if (hub->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&hub->done);
}

// The outcome of a call every member arrived at: 0, or the mismatch between this rank's entry and
// the first one that differs from it (the reference's - rank 0's, or the first member's - when this
// rank's differs from it, else the first member that differs from the reference) - the
// lowest-numbered member that differs from this one.
int Comm::verdict(uint64_t seq, uint32_t tag, const int64_t *fields, const char *const *field_names,
                  uint32_t nfields, const char *op, const uint8_t *members) const {
    const uint32_t me = impl_->rank;
    const Mailbox *hub = mailbox(0, static_cast<int>(seq % 2));
    const int32_t d = hub->differs;
    if (d < 0) return 0;
    const uint32_t ref = reference(members, impl_->nranks);
    const uint32_t src = me != ref && !same_entry(hub->from[me], hub->from[ref]) ? ref : static_cast<uint32_t>(d);
    if (src == me) return 0;
    const MailboxEntry &e = hub->from[src];
    if (e.tag != tag)
        return fail(ACL_ERROR_RT_AICORE_EXCEPTION,
                    "%s on rank %u: call-order mismatch at collective call #%" PRIu64 ": rank %u runs %s, rank %u runs %s",
                    op, me, seq, src, op_tag_name(e.tag), me, op_tag_name(tag));
    if (e.nfields != nfields)
        return fail(ACL_ERROR_RT_AICORE_EXCEPTION, "%s on rank %u: rank %u published %u parameters, rank %u has %u",
                    op, me, src, e.nfields, me, nfields);
    for (uint32_t i = 0; i < nfields; ++i) {
        if (e.fields[i] == fields[i]) continue;
        std::string fname = field_names && field_names[i] ? field_names[i] : format("parameter %u", i);
        return fail(ACL_ERROR_RT_AICORE_EXCEPTION, "%s on rank %u: %s: rank %u has %" PRId64 ", rank %u has %" PRId64,
                    op, me, fname.c_str(), src, e.fields[i], me, fields[i]);
    }
    return 0;
}

int Comm::wait_all(uint64_t seq, uint32_t tag, const int64_t *fields, const char *const *field_names,
                   uint32_t nfields, const char *op_name, const uint8_t *members) {
    CallWait w;
    w.skipped = call_fault(this, impl_->rank, seq, tag) == FaultKind::Skip;
    for (;;) {
        const int rc = poll_all(w, seq, tag, fields, field_names, nfields, op_name, members);
        if (rc != kTaskPending) return rc;
        // Asleep on the hub until the last arriver rings, at most 50 ms at a time (destruction, a
        // newer call, liveness and the timeout are checked between sleeps).
        sleep_on_call(seq, 0.05);
    }
}

void Comm::sleep_on_call(uint64_t seq, double seconds) {
    Mailbox *hub = mailbox(0, static_cast<int>(seq % 2));
    if (!hub || seconds <= 0) return;
    hub->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t d = hub->done.load(std::memory_order_seq_cst);
    if (!reached(d, seq + 1) && !impl_->closing.load(std::memory_order_acquire)) futex_wait(&hub->done, d, seconds);
    hub->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

int Comm::poll_all(CallWait &w, uint64_t seq, uint32_t tag, const int64_t *fields, const char *const *field_names,
                   uint32_t nfields, const char *op_name, const uint8_t *members) {
    const char *op = op_name ? op_name : op_tag_name(tag);
    const uint32_t me = impl_->rank, W = impl_->nranks;
    if (nfields > static_cast<uint32_t>(kMailboxFields)) nfields = kMailboxFields;
    Mailbox *hub = mailbox(0, static_cast<int>(seq % 2));
    if (!w.begun) {
        if (!hub || impl_->closing.load(std::memory_order_acquire))
            return fail(ACL_ERROR_RT_AICORE_EXCEPTION, "%s on rank %u: the communicator %s was destroyed", op, me,
                        impl_->name.c_str());
        if (w.skipped)
            return fail(ACL_ERROR_RT_AICORE_EXCEPTION, "%s on rank %u: injected fault: this rank skipped collective "
                        "call #%" PRIu64, op, me, seq);
        // read once per call: a test may change it between calls
        std::string why;
        if (!hccl_exec_timeout(&w.timeout, &why))
            return fail(ACL_ERROR_INVALID_PARAM, "%s on rank %u: %s", op, me, why.c_str());
        if (w.timeout <= 0) w.timeout = 1e12;   // as HCCL: 0 is no limit
        w.start = now_seconds();
        w.pacer = LivenessPacer(w.start, me);
        w.begun = true;
    }
    const uint64_t want = seq + 1;
    auto pending = [&](uint32_t src) {
        return member(members, src) && hub->from[src].seq.load(std::memory_order_acquire) < want;
    };
    if (reached(hub->done.load(std::memory_order_acquire), want))
        return verdict(seq, tag, fields, field_names, nfields, op, members);
    // A newer call of this half counts arrivals while this one never completed: some rank is
    // ahead of this one (or this one was not counted because it is behind).
    if ((hub->arrivals.load(std::memory_order_acquire) >> kCountBits) > want) {
        for (uint32_t src = 0; src < W; ++src) {
            const MailboxEntry &e = hub->from[src];
            const uint64_t s = e.seq.load(std::memory_order_acquire);
            if (member(members, src) && s > want)
                return fail(ACL_ERROR_RT_AICORE_EXCEPTION,
                            "%s on rank %u: call-order mismatch: rank %u is already at collective call #%" PRIu64
                            " (%s) while this rank waits for call #%" PRIu64 " (%s)",
                            op, me, src, s - 1, op_tag_name(e.tag), seq, op_tag_name(tag));
        }
    }
    if (impl_->closing.load(std::memory_order_acquire))
        return fail(ACL_ERROR_RT_AICORE_EXCEPTION,
                    "%s on rank %u: the communicator %s was destroyed while waiting", op, me,
                    impl_->name.c_str());
    const double now = now_seconds();
    // A peer that is gone will never arrive at this call, so waiting for the timeout is pointless.
    // Its entry may have landed just before it went: only a peer still without one counts.
    std::string gone;
    uint32_t n_gone = 0;
    if (w.pacer.due(now)) {
        auto role = [&](uint32_t src) {
            if (!member(members, src)) return 0u;
            return pending(src) ? LivenessPacer::kAwaited : LivenessPacer::kWaiting;
        };
        w.pacer.look_all(W, role, [&](uint32_t src, bool probe) {
            std::string why;
            if (peer_gone(src, &why, probe) && pending(src)) {
                gone += why;
                ++n_gone;
            }
        });
    }
    const double waited = now - w.start;
    if (gone.empty() && waited <= w.timeout) return kTaskPending;
    if (reached(hub->done.load(std::memory_order_acquire), want))
        return verdict(seq, tag, fields, field_names, nfields, op, members);
    std::vector<uint32_t> missing;
    for (uint32_t src = 0; src < W; ++src)
        if (pending(src)) missing.push_back(src);
    // The gone peers are named next to the verdict: in a large world the ranks still awaited are
    // mostly live ones that had not arrived yet.
    if (!gone.empty())
        return fail(ACL_ERROR_RT_AICORE_TIMEOUT,
                    "%s on rank %u: gave up after %.1fs waiting for ranks %s: %s%s, so collective call #%" PRIu64
                    " can never complete (HCCL_EXEC_TIMEOUT=%g not reached)",
                    op, me, waited, rank_list(missing).c_str(), n_gone > 1 ? "peers are gone" : "a peer is gone",
                    gone.c_str(), seq, w.timeout);
    std::string notes;
    for (uint32_t src : missing) peer_gone(src, &notes);
    return fail(ACL_ERROR_RT_AICORE_TIMEOUT,
                "%s on rank %u: timed out after %.1fs waiting for ranks %s (HCCL_EXEC_TIMEOUT=%g, "
                "collective call #%" PRIu64 ")%s",
                op, me, waited, rank_list(missing).c_str(), w.timeout, seq, notes.c_str());
}

void CallSteps::begin(Comm *c, uint64_t seq, uint32_t tag) {
    c_ = c;
    seq_ = seq;
    tag_ = tag;
    double delay = 0;
    wait_.skipped = c->take_fault(seq, tag, &delay);
    resume_at_ = now_seconds() + delay;
    stage_ = 1;
}

bool CallSteps::delayed() {
    if (stage_ != 1 || now_seconds() >= resume_at_) return false;
    set_pending_wait(PendingWait{&CallSteps::sleep, this});
    return true;
}

void CallSteps::arrive(const int64_t *fields, uint32_t nfields, const uint8_t *members) {
    if (!wait_.skipped) c_->publish(seq_, tag_, fields, nfields, members);
    stage_ = 2;
}

int CallSteps::wait(const int64_t *fields, const char *const *field_names, uint32_t nfields, const char *op_name,
                    const uint8_t *members) {
    const int rc = c_->poll_all(wait_, seq_, tag_, fields, field_names, nfields, op_name, members);
    if (rc == kTaskPending) set_pending_wait(PendingWait{&CallSteps::sleep, this});
    return rc;
}

void CallSteps::sleep(void *self, double seconds) {
    auto *s = static_cast<CallSteps *>(self);
    if (s->stage_ == 2) {
        s->c_->sleep_on_call(s->seq_, seconds);
        return;
    }
    const double left = s->resume_at_ - now_seconds();
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, seconds)));
}

}  // namespace hccl
}  // namespace aclmock
