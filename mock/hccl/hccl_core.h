// Internal C++ interface of the mock HCCL (libhccl.so): communicators, windows, op-resource
// contexts and the mailbox/wait primitives that the dispatch and combine kernels share.
//
// Window layout (every rank's window is 2 * HCCL_BUFFSIZE MiB of POSIX shared memory, mapped by all
// ranks of the world):
//   [0, 1 MiB)            status area: WindowHeader, then two Mailbox halves (rank 0's: the hub)
//   [1 MiB, end)          data area, split in two halves; a call with sequence number `seq` uses
//                         half (seq % 2), so a rank one call ahead never overwrites data a slower
//                         rank is still reading (the hardware double-buffers the same way).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hccl/hccl_comm.h"
#include "hccl/hccl_kfc.h"
#include "runtime/rt_core.h"

namespace aclmock {
namespace hccl {

constexpr uint64_t kStatusAreaBytes = 1ull << 20;
constexpr int kMaxRanks = 1024;
constexpr int kMailboxCounts = 4096;   // int32 per half (dispatch uses index j*W+src < L*W <= 2048)
constexpr int kMailboxFields = 14;

// What every rank publishes for each call, once, into the hub (below). `seq` is written last
// (release) and read first (acquire); the other fields are valid once seq matches.
struct alignas(128) MailboxEntry {
    std::atomic<uint64_t> seq;    // call sequence number + 1 (0 = never written)
    uint32_t tag;                 // which op (OpTag)
    uint32_t nfields;
    int64_t fields[kMailboxFields];  // op parameters, so mismatches across ranks are reported by name
};
static_assert(sizeof(MailboxEntry) == 128, "mailbox entry layout");

struct Mailbox;

// One per data half of every window. `counts` is what senders tell this window's owner (e.g. rows
// per receive slot). The rest is used only in rank 0's window, the world's hub for that half: each
// rank writes its entry into from[rank] and counts itself into `arrivals`; the last rank to arrive
// compares every entry with rank 0's, records the first that differs and wakes the sleepers on
// `done` once. A call thus costs O(W) for the whole world, however many ranks wait.
struct Mailbox {
    MailboxEntry from[kMaxRanks];     // hub only: from[src] is rank src's entry of the newest call
    int32_t counts[kMailboxCounts];   // per-(slot) counts written by senders, e.g. [j*W+src]
    // Low 32 bits of seq + 1 of the call that last wrote counts[i], for counts that only senders
    // with rows write: a count no sender wrote in the current call reads as 0 (counts_of()).
    uint32_t counted[kMailboxCounts];
    // Bit i: a sender wrote counts[i] since the owner last read this half (put_count), so that the
    // owner visits the few slots written instead of reading all of them; it clears the bits it read
    // (forget_counts) before it arrives at its next call, and no sender writes this half again before
    // that. A bit left from a call the owner never read is harmless: count_of checks the stamp.
    std::atomic<uint64_t> written[kMailboxCounts / 64];
    // hub only: (seq + 1) << 16 | ranks counted, for the newest call of this half any rank reached
    alignas(64) std::atomic<uint64_t> arrivals;
    // hub only: low 32 bits of seq + 1 of the newest call every rank arrived at (a futex word)
    alignas(64) std::atomic<uint32_t> done;
    std::atomic<uint32_t> sleepers;   // ranks asleep on `done`; the last arriver wakes them if any
    int32_t differs;                  // for the call `done` names: first rank whose entry is not rank 0's, or -1
};

// Count i of call `seq` in mailbox `mb`: counts[i] when a sender wrote it in that call (put_count),
// else 0.
inline void put_count(Mailbox *mb, uint64_t seq, int64_t i, int32_t value) {
    mb->counts[i] = value;
    mb->counted[i] = static_cast<uint32_t>(seq + 1);
    mb->written[i >> 6].fetch_or(uint64_t(1) << (i & 63), std::memory_order_relaxed);   // published by the arrival
}
inline int32_t count_of(const Mailbox *mb, uint64_t seq, int64_t i) {
    return mb->counted[i] == static_cast<uint32_t>(seq + 1) ? mb->counts[i] : 0;
}
// Which of slots [64 w, 64 w + 64) a sender wrote since the owner last read them (bit i % 64).
inline uint64_t written_word(const Mailbox *mb, int64_t w) { return mb->written[w].load(std::memory_order_relaxed); }
// Calls fn(i, count) for each slot i < n that a sender wrote in call `seq`, in ascending order: the
// owner's read of its counts, O(slots written) plus n / 64 words.
template <class Fn>
inline void for_each_count(const Mailbox *mb, uint64_t seq, int64_t n, Fn &&fn) {
    for (int64_t w = 0; w * 64 < n; ++w) {
        uint64_t bits = written_word(mb, w);
        while (bits) {
            const int64_t i = w * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            if (i >= n) break;
            if (const int32_t c = count_of(mb, seq, i)) fn(i, c);
        }
    }
}
// The owner has read slots [0, n) of this half: the next call on it starts with none written.
inline void forget_counts(Mailbox *mb, int64_t n) {
    for (int64_t w = 0; w * 64 < n; ++w) mb->written[w].store(0, std::memory_order_relaxed);
}

struct WindowHeader {
    uint64_t magic;
    uint64_t world_id;
    uint32_t rank;
    uint32_t nranks;
    int32_t pid;                      // process owning this window, for dead-peer reports
    uint32_t left;                    // 1 once the owner destroyed its communicator cleanly
    uint32_t dead;                    // 1 once a peer found the owner's process dead (LivenessPacer)
};

enum OpTag : uint32_t {
    kTagBarrier = 1, kTagDispatch = 2, kTagCombine = 3,
    kTagTpAllGather = 4, kTagTpReduceScatter = 5   // the TP domain of the group-string MoE ops
};
const char *op_tag_name(uint32_t tag);

class Comm;

// What an op library keeps per communicator (the MoE kernels' records of their dispatch calls):
// Comm::state makes it at first use and drops it when the communicator is destroyed.
struct CommState {
    virtual ~CommState() = default;
};

// The object HcclCreateOpResCtx returns and the context tensor stores as kfcContextAddr.
struct OpResCtx {
    uint64_t magic;                  // kOpResCtxMagic while alive
    Comm *comm;
    uint8_t op_type;
    uint8_t comm_engine;
    char alg_config[128];
};
constexpr uint64_t kOpResCtxMagic = 0x4b4643434f4e5458ULL;

// Returns the live op-resource context at `addr` (taken from a context tensor), or nullptr.
ACLMOCK_API OpResCtx *verify_op_res_ctx(uint64_t addr);

// Paces the liveness checks of a wait on peers: due() is true at most every kPeriod seconds. A check
// looks at every peer it waits for, reading what the waiting ranks found so far (a dead peer is
// marked where every rank reads it: a memory read), and probes (system calls) only this rank's share
// of them: the peers waited for divided by the ranks waiting with it, at least kMinProbes, at most
// kMaxProbes. The waiting ranks take consecutive shares in rank order (turning by a round of shares
// each look), so together they probe every peer waited for about once a period: O(W) probes a
// period, not O(W * W). A peer that died is marked within a period, and every waiting rank names it
// at its next look.
class LivenessPacer {
public:
    static constexpr double kPeriod = 0.2;
    static constexpr uint32_t kMinProbes = 2;
    static constexpr uint32_t kMaxProbes = 128;
    LivenessPacer(double start, uint32_t rank) : next_(start + kPeriod), rank_(rank) {}
    bool due(double now) {
        if (now < next_) return false;
        next_ = now + kPeriod;
        return true;
    }
    // What rank r is to this wait (role(r), a bit set): a peer it waits for, and/or a rank waiting
    // with it (sharing the probes; this rank counts as one).
    static constexpr unsigned kAwaited = 1, kWaiting = 2;
    // Calls look(r, probe) for every rank r < n whose role has kAwaited; `probe` is true for this
    // rank's share.
    template <class Role, class Look>
    void look_all(uint32_t n, Role &&role, Look &&look) {
        uint32_t peers = 0, waiters = 1, before = 0;   // before: waiting ranks ahead of this one
        for (uint32_t r = 0; r < n; ++r) {
            const unsigned is = role(r);
            if (is & kAwaited) ++peers;
            if (r != rank_ && (is & kWaiting)) {
                ++waiters;
                if (r < rank_) ++before;
            }
        }
        if (!peers) return;
        const uint32_t share = std::min(kMaxProbes, std::max(kMinProbes, (peers + waiters - 1) / waiters));
        const uint32_t first = static_cast<uint32_t>((uint64_t{before + looks_ * waiters} * share) % peers);
        ++looks_;
        uint32_t k = 0;   // r's place among the peers awaited
        for (uint32_t r = 0; r < n; ++r) {
            if (!(role(r) & kAwaited)) continue;
            look(r, (k + peers - first) % peers < share);
            ++k;
        }
    }

private:
    double next_;
    uint32_t rank_;
    uint64_t looks_ = 0;
};

// One rank's wait for one collective call, kept between the looks a kernel that gives its thread
// back while peers are missing takes at it (Comm::poll_all).
struct CallWait {
    bool begun = false;
    bool skipped = false;   // this rank skips the call (an injected fault): it fails here
    double start = 0;
    double timeout = 0;
    LivenessPacer pacer{0, 0};
};

class ACLMOCK_API Comm {
public:
    uint32_t rank() const;
    uint32_t nranks() const;
    const std::string &name() const;
    int32_t device() const;              // device current when the communicator was created
    uint8_t *window(uint32_t r) const;   // local mapping of rank r's window (own when r == rank())
    // The local mappings of every rank's window, by rank (nranks() of them).
    const uint8_t *const *windows() const;
    uint64_t window_size() const;        // bytes, 2 * HCCL_BUFFSIZE MiB
    uint64_t data_half_bytes() const;    // (window_size - 1 MiB) / 2
    // Start of data half `half` in rank r's window.
    uint8_t *data_half(uint32_t r, int half) const;
    Mailbox *mailbox(uint32_t r, int half) const;   // in rank r's window
    WindowHeader *header(uint32_t r) const;
    bool destroyed() const;
    // The state kept under `key` (any address the caller owns), made by `make` at the first call;
    // nullptr once the communicator is destroyed. The state is per rank, so that thread ranks of one
    // process never look through one another's; the shared_ptr keeps it alive for a kernel holding
    // it while the communicator goes.
    std::shared_ptr<CommState> state(const void *key, std::shared_ptr<CommState> (*make)());

    // Sequence numbers: every collective call (barrier, dispatch, combine) takes the next one, in
    // the stream order in which the calls execute.
    uint64_t next_seq();

    // This rank's entry for call `seq` (op tag and parameter fields) into the hub of half seq % 2.
    // Any data and counts written into peers' windows before this call are visible to every rank
    // once wait_all() of the same call returns.
    void arrive(uint64_t seq, uint32_t tag, const int64_t *fields, uint32_t nfields,
                const uint8_t *members = nullptr);
    // The fault injected into call `seq` on this rank (aclnn_py._mock.inject_fault), taken once per
    // call: a crash kills the process here, a delay is reported in *delay (seconds) for the caller to
    // wait out without holding its thread (CallSteps). arrive() and wait_all() take it too, sleeping
    // through a delay. True when the call is to be skipped.
    bool take_fault(uint64_t seq, uint32_t tag, double *delay);
    // arrive() for a caller that took the call's fault itself (take_fault) and was not told to skip.
    void publish(uint64_t seq, uint32_t tag, const int64_t *fields, uint32_t nfields,
                 const uint8_t *members = nullptr);

    // Wait until every rank (this one included) has arrived at call `seq`, asleep on the hub.
    // Bounded by HCCL_EXEC_TIMEOUT seconds (default 120). Returns 0, or an aclError with the
    // message set:
    //   - ACL_ERROR_RT_AICORE_TIMEOUT: "<op> on rank r: timed out after Ns waiting for ranks [..]
    //     (rank 3: process 1234 is dead)"; or, within about a second of a missing peer's process
    //     dying or its communicator being destroyed, "<op> on rank r: gave up after Ns waiting for
    //     ranks [..]: a peer is gone (rank 3: process 1234 is dead), ..." / "(rank 3 destroyed its
    //     communicator)"
    //   - ACL_ERROR_RT_AICORE_EXCEPTION: a peer published a different op or a newer sequence
    //     number (call-order mismatch), or one of `fields` differs ("moe_expert_num: rank 2 has 64,
    //     rank 0 has 32"); field_names names each field for that message; or this communicator was
    //     destroyed while waiting.
    // `members` (W flags), when given to both arrive() and wait_all(), limits the call to the ranks
    // flagged: the live ranks of a dynamic shrink, where ranks left out of the communicator never
    // arrive; the first member's entry is the one the others are compared with.
    int wait_all(uint64_t seq, uint32_t tag, const int64_t *fields, const char *const *field_names,
                 uint32_t nfields, const char *op_name, const uint8_t *members = nullptr);
    // One look at call `seq` for a wait that does not hold its thread: wait_all's outcome, or
    // kTaskPending while ranks are still missing (then sleep_on_call and look again). `w` starts
    // default-constructed, with `skipped` set when take_fault said so.
    int poll_all(CallWait &w, uint64_t seq, uint32_t tag, const int64_t *fields, const char *const *field_names,
                 uint32_t nfields, const char *op_name, const uint8_t *members = nullptr);
    // Sleeps on the hub of call `seq` until its last rank arrives or `seconds` pass.
    void sleep_on_call(uint64_t seq, double seconds);

    // Whether peer r's process is alive (always true for thread ranks of this process, and for a
    // process of another pid namespace, whose liveness cannot be known).
    bool peer_alive(uint32_t r) const;
    // Whether peer r will never take part in another call: it destroyed its communicator or its
    // process is dead; *why (when given) gets " (rank r: process P is dead)" or " (rank r destroyed
    // its communicator)". Without `probe`, only what the peers found so far counts (no system call);
    // a probe that finds the process dead marks it so for them.
    bool peer_gone(uint32_t r, std::string *why, bool probe = true) const;

    // Work that touches the windows (a kernel task) brackets itself with begin_use()/end_use() so
    // that HcclCommDestroy waits for it instead of unmapping the windows under it. begin_use()
    // returns false (and the caller must not touch the windows) once destruction has started;
    // wait_all() returns an error soon after destruction starts.
    bool begin_use();
    void end_use();

    struct Impl;
    explicit Comm(Impl *impl);
    ~Comm();
    Impl *impl() const { return impl_; }

private:
    int verdict(uint64_t seq, uint32_t tag, const int64_t *fields, const char *const *field_names, uint32_t nfields,
                const char *op, const uint8_t *members) const;

    Impl *impl_;
};

// One rank's part in one collective call, run by a task that gives its thread back while it waits
// (kTaskPending, see enqueue): an injected delay, its arrival, the wait for the other ranks. The
// task's first step calls begin(); each step then calls delayed() until it is false, arrive() once,
// and wait() until it is not kTaskPending; the task's pending wait is set whenever one says to come
// back later.
class ACLMOCK_API CallSteps {
public:
    // Takes call `seq`'s injected fault (Comm::take_fault).
    void begin(Comm *c, uint64_t seq, uint32_t tag);
    bool started() const { return stage_ > 0; }
    // True while an injected delay lasts.
    bool delayed();
    bool arrived() const { return stage_ == 2; }
    // Publishes this rank's entry (Comm::publish; nothing for a call it skips).
    void arrive(const int64_t *fields, uint32_t nfields, const uint8_t *members = nullptr);
    // Comm::poll_all of the call.
    int wait(const int64_t *fields, const char *const *field_names, uint32_t nfields, const char *op_name,
             const uint8_t *members = nullptr);

private:
    static void sleep(void *self, double seconds);
    Comm *c_ = nullptr;
    uint64_t seq_ = 0;
    uint32_t tag_ = 0;
    int stage_ = 0;          // 0: not started, 1: fault taken, 2: arrived
    double resume_at_ = 0;   // end of an injected delay
    CallWait wait_;
};

// The live communicator of this process whose HcclGetCommName is `name`, or nullptr. Every rank's
// communicator has its own name, so thread ranks of one process never share one.
ACLMOCK_API Comm *find_comm_by_name(const std::string &name);

// The Comm behind a public handle, or nullptr (and a message) when the handle is not live.
ACLMOCK_API Comm *from_handle(HcclComm handle);

// HCCL_EXEC_TIMEOUT in seconds (default 120 in the mock).
ACLMOCK_API double exec_timeout_seconds();

struct HcclStats {
    size_t live_comms = 0;
    size_t mapped_windows = 0;       // window mappings held by this process
    uint64_t mapped_bytes = 0;
    uint64_t liveness_probes = 0;    // peer processes probed by this process (system calls)
};
ACLMOCK_API HcclStats hccl_stats();

}  // namespace hccl
}  // namespace aclmock
