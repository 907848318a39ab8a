// How a world forms: HcclGetRootInfo makes a world id; HcclCommInitRootInfo runs the rendezvous of
// one rank through a shared-memory area named after the world:
//   validate → attach the rendezvous area → claim the rank's slot → create the rank's window →
//   wait until every rank's window exists → map every peer's window → wait until every rank mapped
//   every window → unlink the names and hand out the communicator.
// Any failure undoes this rank's part (mappings, its window, its slot), so a world that does not
// form leaves nothing in /dev/shm once its last rank has given up.
#include <time.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {
namespace {

// Both read after validate_init refused a value that cannot be read (hccl_env_error).
uint64_t window_bytes_from_env() {
    long long mib = 200;
    std::string why;
    (void)hccl_window_mib(&mib, &why);
    return 2 * static_cast<uint64_t>(mib) * (1ull << 20);
}

double connect_timeout() {
    double t = 120;
    std::string why;
    (void)hccl_connect_timeout(&t, &why);
    return t;
}

constexpr const char *kInit = "HcclCommInitRootInfo";

// The arguments of HcclCommInitRootInfo; the root blob is copied out on success.
int validate_init(uint32_t nranks, const HcclRootInfo *root, uint32_t rank, HcclComm *comm, RootBlob *b) {
    if (!comm) return fail(HCCL_E_PTR, "%s: comm (output) is NULL", kInit);
    if (!root) return fail(HCCL_E_PTR, "%s: rootInfo is NULL", kInit);
    if (std::string why = hccl_env_error(); !why.empty()) return fail(HCCL_E_PARA, "%s: %s", kInit, why.c_str());
    memcpy(b, root->internal, sizeof *b);
    if (b->magic != kRootMagic || b->version != kRootVersion || b->world_id == 0)
        return fail(HCCL_E_PARA, "%s: rootInfo was not produced by HcclGetRootInfo of this library", kInit);
    if (nranks < 1 || nranks > static_cast<uint32_t>(kMaxRanks))
        return fail(HCCL_E_PARA, "%s: nRanks must be in [1, %d] (got %u)", kInit, kMaxRanks, nranks);
    if (rank >= nranks)
        return fail(HCCL_E_PARA, "%s: rank must be < nRanks (got rank %u, nRanks %u)", kInit, rank, nranks);
    return HCCL_SUCCESS;
}

// One rank's way through the rendezvous. Each step returns 0 or an HCCL error with the message set;
// after a failed step the caller calls abandon().
//
// What this rank put into the shared world (its claimed slot, its window's name) is taken back by
// leave_world(), which the exit handler of this library also calls for joins still in progress when
// the process exits (e.g. its main thread ends while a helper thread waits here), so /dev/shm stays
// clean and the peers learn at once that this rank is gone. state_mu_ orders the two: the steps that
// change shared state check left_ under it.
class Joiner {
public:
    Joiner(const RootBlob &b, uint32_t nranks, uint32_t rank, int32_t device)
        : nranks_(nranks), rank_(rank), wid_(b.world_id), rname_(rdv_name(b.world_id)),
          own_name_(window_name(b.world_id, rank, pid_namespace(), own_pid())), timeout_(connect_timeout()),
          start_(now_seconds()), deadline_(start_ + timeout_), pid_(own_pid()) {
        impl_ = new Comm::Impl();
        impl_->world_id = wid_;
        impl_->rank = rank;
        impl_->nranks = nranks;
        impl_->name = format("hccl_world_%016" PRIx64 "_rank_%u", wid_, rank);
        impl_->device = device;
        impl_->pid = pid_;
        impl_->window_bytes = window_bytes_from_env();
        impl_->windows.resize(nranks);
        impl_->pids.resize(nranks);
        impl_->pid_ns.resize(nranks);
    }
    ~Joiner() { delete impl_; }

    int attach_rendezvous();
    int claim_slot();
    int create_own_window();
    int wait_joined() { return wait_for_all(h_->ready, kSlotReady); }
    int map_peer_windows();
    int wait_mapped();
    // Success: the communicator (the names are unlinked). nullptr (message set) when the process
    // began exiting meanwhile.
    Comm *finish();
    void abandon();
    // Takes back what this rank put into the shared world; once, from whichever thread comes first.
    void leave_world();

private:
    int wait_for_all(std::atomic<uint32_t> &counter, SlotState done);
    bool only_dead_ranks_remain() const;
    int give_up(int32_t aborted_by, bool late, const std::vector<uint32_t> &missing, const std::string &gone,
                SlotState done);
    int exiting() const { return fail(HCCL_E_INTERNAL, "%s: rank %u: the process is exiting", kInit, rank_); }
    void abort_world() {
        int32_t zero = 0;
        h_->aborted_by.compare_exchange_strong(zero, static_cast<int32_t>(rank_) + 1);
        wake_waiters();
    }
    // Counts this rank into `counter`; the rank that completes it wakes the sleepers, once.
    void count_in(std::atomic<uint32_t> &counter) {
        if (counter.fetch_add(1, std::memory_order_acq_rel) + 1 >= nranks_) futex_wake_all(&counter);
    }
    // Waiting ranks sleep on the two counters; anything they must notice wakes them.
    void wake_waiters() {
        futex_wake_all(&h_->ready);
        futex_wake_all(&h_->mapped);
    }

    const uint32_t nranks_, rank_;
    const uint64_t wid_;
    const std::string rname_, own_name_;
    const double timeout_, start_, deadline_;
    const int32_t pid_;
    std::mutex state_mu_;            // h_ (while shared state changes), claimed_, left_
    RdvHeader *h_ = nullptr;
    bool claimed_ = false;
    bool left_ = false;
    Comm::Impl *impl_;   // built as the steps go: the windows this rank maps
};

// ---- joins in progress, for the exit handler ------------------------------------------------------
std::mutex g_joins_mu;
std::set<Joiner *> &joins_in_progress() {
    static auto *s = new std::set<Joiner *>();   // never destroyed: used by the exit handler
    return *s;
}

void leave_worlds_at_exit() {
    std::lock_guard<std::mutex> lk(g_joins_mu);
    for (Joiner *j : joins_in_progress()) j->leave_world();
}

// Registers a join for the exit handler while it is in scope.
struct JoinInProgress {
    Joiner *j;
    explicit JoinInProgress(Joiner *jj) : j(jj) {
        static std::once_flag once;
        std::call_once(once, [] { std::atexit(leave_worlds_at_exit); });
        std::lock_guard<std::mutex> lk(g_joins_mu);
        joins_in_progress().insert(j);
    }
    void end() {
        std::lock_guard<std::mutex> lk(g_joins_mu);
        joins_in_progress().erase(j);
    }
    ~JoinInProgress() { end(); }
};

int Joiner::attach_rendezvous() {
    std::string err;
    bool created = false;
    uint8_t *rp = seg_attach(rname_, kRdvBytes, deadline_, &created, &err);
    if (!rp) return fail(HCCL_E_SYSCALL, "%s: rank %u: %s", kInit, rank_, err.c_str());
    auto *h = reinterpret_cast<RdvHeader *>(rp);
    {
        std::lock_guard<std::mutex> lk(state_mu_);
        h_ = h;
    }
    if (created) {
        h->world_id = wid_;
        h->creator_pid = pid_;
        h->creator_ns = pid_namespace();
        h->nranks = nranks_;
        h->creator_rank = rank_;
        h->magic.store(kRdvMagic, std::memory_order_release);
        return HCCL_SUCCESS;
    }
    Backoff bo;
    while (h->magic.load(std::memory_order_acquire) != kRdvMagic) {
        if (now_seconds() > deadline_)
            return fail(HCCL_E_TIMEOUT, "%s: rank %u: the rendezvous area of world %016" PRIx64 " was never initialised",
                        kInit, rank_, wid_);
        bo.pause();
    }
    return HCCL_SUCCESS;
}

int Joiner::claim_slot() {
    if (h_->nranks != nranks_)
        return fail(HCCL_E_PARA, "%s: nRanks mismatch in world %016" PRIx64 ": rank %u passed nRanks=%u, rank %u passed nRanks=%u",
                    kInit, wid_, rank_, nranks_, h_->creator_rank, h_->nranks);
    if (int32_t ab = h_->aborted_by.load(std::memory_order_acquire))
        return fail(HCCL_E_TIMEOUT, "%s: rank %u: world %016" PRIx64 " was already abandoned by rank %d", kInit, rank_,
                    wid_, ab - 1);
    std::lock_guard<std::mutex> lk(state_mu_);
    if (left_) return exiting();
    RdvSlot &slot = h_->slots[rank_];
    uint32_t expect = kSlotFree;
    if (!slot.state.compare_exchange_strong(expect, kSlotClaimed, std::memory_order_acq_rel)) {
        int32_t other = slot.pid;
        return fail(HCCL_E_PARA, "%s: duplicate rank %u in world %016" PRIx64 " (already joined by process %d%s)", kInit,
                    rank_, wid_, other, other == pid_ ? ", this process" : "");
    }
    // The claim is visible before the pid: a peer that looks at this slot meanwhile sees pid 0 or
    // namespace 0, which process_gone never judges.
    claimed_ = true;
    h_->present.fetch_add(1, std::memory_order_acq_rel);
    slot.pid = pid_;
    slot.pid_ns = pid_namespace();
    slot.window_bytes = impl_->window_bytes;
    return HCCL_SUCCESS;
}

int Joiner::create_own_window() {
    std::string err;
    std::unique_lock<std::mutex> lk(state_mu_);
    if (left_) return exiting();
    uint8_t *w = seg_create(own_name_, impl_->window_bytes, &err);
    if (!w) return fail(HCCL_E_MEMORY, "%s: rank %u: cannot create its window: %s", kInit, rank_, err.c_str());
    lk.unlock();
    impl_->own_seg = own_name_;
    impl_->windows[rank_] = w;
    seg_register(own_name_, impl_->device, MemKind::Window);
    auto *wh = reinterpret_cast<WindowHeader *>(w);
    wh->magic = kWindowMagic;
    wh->world_id = wid_;
    wh->rank = rank_;
    wh->nranks = nranks_;
    wh->pid = pid_;
    h_->slots[rank_].state.store(kSlotReady, std::memory_order_release);
    count_in(h_->ready);
    return HCCL_SUCCESS;
}

int Joiner::map_peer_windows() {
    const uint64_t wbytes = impl_->window_bytes;
    for (uint32_t r = 0; r < nranks_; ++r) {
        const RdvSlot &s = h_->slots[r];
        impl_->pids[r] = s.pid;
        impl_->pid_ns[r] = s.pid_ns;
        if (s.window_bytes != wbytes) {
            abort_world();
            return fail(HCCL_E_PARA, "%s: window size mismatch (HCCL_BUFFSIZE differs between ranks): rank %u has %" PRIu64
                        " bytes, rank %u has %" PRIu64 " bytes", kInit, r, s.window_bytes, rank_, wbytes);
        }
    }
    auto name_of = [this](uint32_t r) {
        return r == rank_ ? own_name_ : window_name(wid_, r, h_->slots[r].pid_ns, h_->slots[r].pid);
    };
    std::string err;
    std::vector<uint8_t *> addrs;
    const int bad = world_windows_acquire(wid_, nranks_, name_of, wbytes, impl_->device, &addrs, &err);
    if (bad >= 0) {
        abort_world();
        const RdvSlot &s = h_->slots[bad];
        return fail(HCCL_E_SYSCALL, "%s: rank %u: cannot map the window of rank %d%s: %s", kInit, rank_, bad,
                    process_gone(s.pid, s.pid_ns) ? " (its process is dead)" : "", err.c_str());
    }
    impl_->world_mapped = true;
    impl_->windows = std::move(addrs);
    return HCCL_SUCCESS;
}

int Joiner::wait_mapped() {
    h_->slots[rank_].state.store(kSlotMapped, std::memory_order_release);
    count_in(h_->mapped);
    return wait_for_all(h_->mapped, kSlotMapped);
}

Comm *Joiner::finish() {
    {
        std::lock_guard<std::mutex> lk(state_mu_);
        if (left_) {
            exiting();
            return nullptr;
        }
        // Everybody maps everything: the names can go, the mappings stay valid. From here on a crash
        // leaves nothing behind in /dev/shm.
        seg_unlink(own_name_);
        seg_unlink(rname_);
        claimed_ = false;
        left_ = true;   // nothing of this rank is left in the shared world to take back
    }
    seg_release(rname_);
    h_ = nullptr;
    Comm *c = new Comm(impl_);
    impl_ = nullptr;
    register_comm(c);
    return c;
}

void Joiner::leave_world() {
    std::lock_guard<std::mutex> lk(state_mu_);
    if (left_) return;
    left_ = true;
    seg_unlink(own_name_);   // whether or not it was created yet: nobody else uses this name
    if (h_ && claimed_) {
        h_->slots[rank_].state.store(kSlotLeft, std::memory_order_release);
        // The last live rank to leave an unfinished world removes what is left of it: the rendezvous
        // area and the windows of ranks whose processes died in it.
        if (h_->present.fetch_sub(1, std::memory_order_acq_rel) == 1 || only_dead_ranks_remain()) {
            for (uint32_t r = 0; r < nranks_; ++r) {
                const RdvSlot &s = h_->slots[r];
                uint32_t st = s.state.load(std::memory_order_acquire);
                if (st != kSlotFree && st != kSlotLeft && s.pid > 0) seg_unlink(window_name(wid_, r, s.pid_ns, s.pid));
            }
            seg_unlink(rname_);
        }
        wake_waiters();
    }
}

bool Joiner::only_dead_ranks_remain() const {
    for (uint32_t r = 0; r < nranks_; ++r) {
        const RdvSlot &s = h_->slots[r];
        uint32_t st = s.state.load(std::memory_order_acquire);
        if (st != kSlotFree && st != kSlotLeft && !process_gone(s.pid, s.pid_ns)) return false;
    }
    return true;
}

// Undo everything: leave the shared world, then drop this process's mappings.
void Joiner::abandon() {
    leave_world();
    release_windows(*impl_);
    if (h_) {
        seg_release(rname_);
        h_ = nullptr;
    }
}

// Waits until `counter` reaches nranks: every rank's slot got to state `done`. Fails at the
// HCCL_CONNECT_TIMEOUT, as soon as a rank that has not got there is gone (its process died, or it
// left), or when another rank gave up.
int Joiner::wait_for_all(std::atomic<uint32_t> &counter, SlotState done) {
    LivenessPacer pacer(start_, rank_);
    // Every rank that claimed a slot is needed until the world forms, whatever step it is at.
    auto joined = [&](uint32_t r) {
        return r != rank_ && h_->slots[r].state.load(std::memory_order_acquire) != kSlotFree;
    };
    // ... and waits here too: each is both waited for and waiting
    auto role = [&](uint32_t r) { return joined(r) ? LivenessPacer::kAwaited | LivenessPacer::kWaiting : 0u; };
    for (;;) {
        if (counter.load(std::memory_order_acquire) >= nranks_) return HCCL_SUCCESS;
        const double now = now_seconds();
        const int32_t ab = h_->aborted_by.load(std::memory_order_acquire);
        std::string gone;
        if (pacer.due(now))
            pacer.look_all(nranks_, role, [&](uint32_t r, bool probe) {
                RdvSlot &s = h_->slots[r];
                if (s.state.load(std::memory_order_acquire) == kSlotLeft) {
                    gone += format(" (rank %u left: it gave up or its process exited)", r);
                    return;
                }
                bool dead = s.dead.load(std::memory_order_acquire) != 0;
                if (!dead && probe && process_gone(s.pid, s.pid_ns)) {
                    dead = true;
                    s.dead.store(1, std::memory_order_release);   // the ranks waiting for it read this
                }
                if (dead) gone += format(" (rank %u: process %d is dead)", r, s.pid);
            });
        // A rank may finish and exit as soon as the count is complete: only a count still short of
        // nranks makes a gone rank fatal.
        if (!gone.empty() && counter.load(std::memory_order_acquire) >= nranks_) return HCCL_SUCCESS;
        const bool late = now > deadline_;
        if (ab != 0 || late || !gone.empty()) {
            // Ranks that left are not missing: the notes name them.
            std::vector<uint32_t> missing;
            for (uint32_t r = 0; r < nranks_; ++r) {
                uint32_t st = h_->slots[r].state.load(std::memory_order_acquire);
                if (st != done && st != kSlotLeft && !(done == kSlotReady && st == kSlotMapped)) missing.push_back(r);
            }
            if (gone.empty())   // timed out, or another rank gave up: say which ranks are gone, if any
                for (uint32_t r = 0; r < nranks_; ++r) {
                    const RdvSlot &s = h_->slots[r];
                    if (joined(r) && s.state.load(std::memory_order_acquire) != kSlotLeft &&
                        process_gone(s.pid, s.pid_ns))
                        gone += format(" (rank %u: process %d is dead)", r, s.pid);
                }
            return give_up(ab, late, missing, gone, done);
        }
        // Asleep, not spinning: ranks still starting need the CPU. Woken by the last arrival, an
        // abort or a rank leaving; between sleeps, liveness and the deadline are checked.
        const uint32_t seen = counter.load(std::memory_order_acquire);
        if (seen < nranks_) futex_wait(&counter, seen, 0.1);
    }
}

int Joiner::give_up(int32_t ab, bool late, const std::vector<uint32_t> &missing, const std::string &gone,
                    SlotState done) {
    if (ab == 0) abort_world();
    const uint32_t count = (done == kSlotReady ? h_->ready : h_->mapped).load(std::memory_order_acquire);
    std::string what = done == kSlotReady
        ? format("waiting for ranks %s to join (%u of %u joined)", rank_list(missing).c_str(), count, nranks_)
        : format("waiting for ranks %s to map every window (%u of %u done)", rank_list(missing).c_str(), count,
                 nranks_);
    if (ab != 0 && ab != static_cast<int32_t>(rank_) + 1)
        return fail(HCCL_E_TIMEOUT, "%s: rank %u of world %016" PRIx64 ": rank %d gave up on the world while %s%s",
                    kInit, rank_, wid_, ab - 1, what.c_str(), gone.c_str());
    if (late)
        return fail(HCCL_E_TIMEOUT, "%s: rank %u of world %016" PRIx64 ": timed out after %gs (HCCL_CONNECT_TIMEOUT) %s%s",
                    kInit, rank_, wid_, timeout_, what.c_str(), gone.c_str());
    return fail(HCCL_E_TIMEOUT,
                "%s: rank %u of world %016" PRIx64 ": gave up after %.1fs %s: a rank is gone, so the world can never "
                "form (HCCL_CONNECT_TIMEOUT=%g not reached)%s",
                kInit, rank_, wid_, now_seconds() - start_, what.c_str(), timeout_, gone.c_str());
}

}  // namespace

RootBlob new_root_blob() {
    sweep_stale_segments();
    RootBlob b;
    memset(&b, 0, sizeof b);
    b.magic = kRootMagic;
    b.version = kRootVersion;
    b.creator_pid = getpid();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    b.created_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
    std::random_device rd;
    uint64_t rnd = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    static std::atomic<uint64_t> counter{0};
    uint64_t id = rnd ^ (static_cast<uint64_t>(getpid()) << 40) ^ b.created_ns ^
                  (counter.fetch_add(1) * 0x9e3779b97f4a7c15ULL);
    b.world_id = id ? id : 1;
    gethostname(b.host, sizeof b.host - 1);
    return b;
}

int join_world(const RootBlob &b, uint32_t nranks, uint32_t rank, int32_t device, HcclComm *comm) {
    sweep_stale_segments_every(1.0);
    Joiner j(b, nranks, rank, device);
    JoinInProgress registered(&j);
    int rc = j.attach_rendezvous();
    if (!rc) rc = j.claim_slot();
    if (!rc) rc = j.create_own_window();
    if (!rc) rc = j.wait_joined();
    if (!rc) rc = j.map_peer_windows();
    if (!rc) rc = j.wait_mapped();
    if (rc) {
        registered.end();   // the exit handler no longer looks at j: its mappings may go
        j.abandon();
        return rc;
    }
    Comm *c = j.finish();
    registered.end();
    if (!c) {
        j.abandon();
        return HCCL_E_INTERNAL;
    }
    *comm = c;
    return HCCL_SUCCESS;
}

}  // namespace hccl
}  // namespace aclmock

using namespace aclmock;
using namespace aclmock::hccl;

extern "C" HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
    if (!rootInfo) return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclGetRootInfo: rootInfo is NULL"));
    RootBlob b = new_root_blob();
    memset(rootInfo->internal, 0, sizeof rootInfo->internal);
    memcpy(rootInfo->internal, &b, sizeof b);
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                           HcclComm *comm) {
    RootBlob b;
    if (int rc = validate_init(nRanks, rootInfo, rank, comm, &b)) return static_cast<HcclResult>(rc);
    // the window belongs to the device current at creation (device 0 when none is set)
    int32_t device = current_device();
    return static_cast<HcclResult>(join_world(b, nRanks, rank, device < 0 ? 0 : device, comm));
}
