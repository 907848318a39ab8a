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
#include <cstring>
#include <random>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {
namespace {

uint64_t window_bytes_from_env() {
    double mib = env_double("HCCL_BUFFSIZE", 200);
    if (!(mib >= 1)) mib = mib > 0 ? 1 : 200;
    if (mib > (1 << 20)) mib = 1 << 20;
    return 2 * static_cast<uint64_t>(mib) * (1ull << 20);
}

double connect_timeout() {
    double t = env_double("HCCL_CONNECT_TIMEOUT", 120);
    return t > 0 ? t : 120;
}

constexpr const char *kInit = "HcclCommInitRootInfo";

// The arguments of HcclCommInitRootInfo; the root blob is copied out on success.
int validate_init(uint32_t nranks, const HcclRootInfo *root, uint32_t rank, HcclComm *comm, RootBlob *b) {
    if (!comm) return fail(HCCL_E_PTR, "%s: comm (output) is NULL", kInit);
    if (!root) return fail(HCCL_E_PTR, "%s: rootInfo is NULL", kInit);
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
class Joiner {
public:
    Joiner(const RootBlob &b, uint32_t nranks, uint32_t rank)
        : nranks_(nranks), rank_(rank), wid_(b.world_id), rname_(rdv_name(b.world_id)),
          timeout_(connect_timeout()), deadline_(now_seconds() + timeout_), pid_(getpid()) {
        int32_t device = current_device();
        impl_ = new Comm::Impl();
        impl_->world_id = wid_;
        impl_->rank = rank;
        impl_->nranks = nranks;
        impl_->name = format("hccl_world_%016" PRIx64 "_rank_%u", wid_, rank);
        impl_->device = device < 0 ? 0 : device;
        impl_->window_bytes = window_bytes_from_env();
        impl_->seg_names.resize(nranks);
        impl_->windows.resize(nranks);
        impl_->pids.resize(nranks);
    }
    ~Joiner() { delete impl_; }

    int attach_rendezvous();
    int claim_slot();
    int create_own_window();
    int wait_joined() { return wait_count(h_->ready, true); }
    int map_peer_windows();
    int wait_mapped() {
        h_->mapped.fetch_add(1, std::memory_order_acq_rel);
        return wait_count(h_->mapped, false);
    }
    Comm *finish();
    void abandon();

private:
    int wait_count(std::atomic<uint32_t> &counter, bool joining);
    std::string dead_note(const std::vector<uint32_t> &ranks) const;
    void abort_world() {
        int32_t zero = 0;
        h_->aborted_by.compare_exchange_strong(zero, static_cast<int32_t>(rank_) + 1);
    }

    const uint32_t nranks_, rank_;
    const uint64_t wid_;
    const std::string rname_;
    const double timeout_, deadline_;
    const int32_t pid_;
    RdvHeader *h_ = nullptr;
    bool claimed_ = false;
    Comm::Impl *impl_;   // built as the steps go; its seg_names are the windows this rank maps
};

int Joiner::attach_rendezvous() {
    std::string err;
    bool created = false;
    uint8_t *rp = seg_attach(rname_, kRdvBytes, deadline_, &created, &err);
    if (!rp) return fail(HCCL_E_SYSCALL, "%s: rank %u: %s", kInit, rank_, err.c_str());
    h_ = reinterpret_cast<RdvHeader *>(rp);
    if (created) {
        h_->world_id = wid_;
        h_->creator_pid = pid_;
        h_->nranks = nranks_;
        h_->creator_rank = rank_;
        h_->magic.store(kRdvMagic, std::memory_order_release);
        return HCCL_SUCCESS;
    }
    Backoff bo;
    while (h_->magic.load(std::memory_order_acquire) != kRdvMagic) {
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
        return fail(HCCL_E_TIMEOUT, "%s: rank %u: world %016" PRIx64 " was already abandoned by rank %d after its HCCL_CONNECT_TIMEOUT",
                    kInit, rank_, wid_, ab - 1);
    RdvSlot &slot = h_->slots[rank_];
    uint32_t expect = kSlotFree;
    if (!slot.state.compare_exchange_strong(expect, kSlotClaimed, std::memory_order_acq_rel)) {
        int32_t other = slot.pid;
        return fail(HCCL_E_PARA, "%s: duplicate rank %u in world %016" PRIx64 " (already joined by process %d%s)", kInit,
                    rank_, wid_, other, other == pid_ ? ", this process" : "");
    }
    claimed_ = true;
    h_->present.fetch_add(1, std::memory_order_acq_rel);
    slot.pid = pid_;
    slot.window_bytes = impl_->window_bytes;
    return HCCL_SUCCESS;
}

int Joiner::create_own_window() {
    std::string err, own = window_name(wid_, rank_, pid_);
    uint8_t *w = seg_create(own, impl_->window_bytes, &err);
    if (!w) return fail(HCCL_E_MEMORY, "%s: rank %u: cannot create its window: %s", kInit, rank_, err.c_str());
    impl_->seg_names[rank_] = own;
    impl_->windows[rank_] = w;
    seg_register(own, impl_->device, MemKind::Window);
    auto *wh = reinterpret_cast<WindowHeader *>(w);
    wh->magic = kWindowMagic;
    wh->world_id = wid_;
    wh->rank = rank_;
    wh->nranks = nranks_;
    wh->pid = pid_;
    h_->slots[rank_].state.store(kSlotReady, std::memory_order_release);
    h_->ready.fetch_add(1, std::memory_order_acq_rel);
    return HCCL_SUCCESS;
}

int Joiner::map_peer_windows() {
    const uint64_t wbytes = impl_->window_bytes;
    for (uint32_t r = 0; r < nranks_; ++r) {
        const RdvSlot &s = h_->slots[r];
        impl_->pids[r] = s.pid;
        if (r == rank_) continue;
        if (s.window_bytes != wbytes) {
            abort_world();
            return fail(HCCL_E_PARA, "%s: window size mismatch (HCCL_BUFFSIZE differs between ranks): rank %u has %" PRIu64
                        " bytes, rank %u has %" PRIu64 " bytes", kInit, r, s.window_bytes, rank_, wbytes);
        }
        std::string err, nm = window_name(wid_, r, s.pid);
        uint8_t *p = seg_open(nm, wbytes, &err);
        if (!p) {
            abort_world();
            return fail(HCCL_E_SYSCALL, "%s: rank %u: cannot map the window of rank %u%s: %s", kInit, rank_, r,
                        pid_alive(s.pid) ? "" : " (its process is dead)", err.c_str());
        }
        impl_->seg_names[r] = nm;
        impl_->windows[r] = p;
        seg_register(nm, impl_->device, MemKind::PeerWindow);   // no-op when this process registered it already
    }
    return HCCL_SUCCESS;
}

// Everybody maps everything: the names can go, the mappings stay valid. From here on a crash leaves
// nothing behind in /dev/shm.
Comm *Joiner::finish() {
    seg_unlink(impl_->seg_names[rank_]);
    seg_unlink(rname_);
    seg_release(rname_);
    h_ = nullptr;
    Comm *c = new Comm(impl_);
    impl_ = nullptr;
    register_comm(c);
    return c;
}

// Undo everything: drop mappings, remove this rank's window, leave the rendezvous (the last rank to
// leave an unfinished world removes its rendezvous segment).
void Joiner::abandon() {
    release_windows(*impl_);
    const std::string &own = impl_->seg_names[rank_];
    if (!own.empty()) seg_unlink(own);
    if (h_) {
        if (claimed_) {
            h_->slots[rank_].state.store(kSlotLeft, std::memory_order_release);
            if (h_->present.fetch_sub(1, std::memory_order_acq_rel) == 1) seg_unlink(rname_);
        }
        seg_release(rname_);
        h_ = nullptr;
    }
}

std::string Joiner::dead_note(const std::vector<uint32_t> &ranks) const {
    std::string s;
    for (uint32_t r : ranks) {
        uint32_t st = h_->slots[r].state.load(std::memory_order_acquire);
        if ((st == kSlotClaimed || st == kSlotReady) && !pid_alive(h_->slots[r].pid))
            s += format(" (rank %u: process %d is dead)", r, h_->slots[r].pid);
    }
    return s;
}

// Waits until `counter` reaches nranks.
int Joiner::wait_count(std::atomic<uint32_t> &counter, bool joining) {
    Backoff bo;
    for (;;) {
        if (counter.load(std::memory_order_acquire) >= nranks_) return HCCL_SUCCESS;
        int32_t ab = h_->aborted_by.load(std::memory_order_acquire);
        bool late = now_seconds() > deadline_;
        if (ab != 0 || late) {
            std::vector<uint32_t> missing;
            for (uint32_t r = 0; r < nranks_; ++r) {
                uint32_t st = h_->slots[r].state.load(std::memory_order_acquire);
                if (st == kSlotFree || st == kSlotClaimed) missing.push_back(r);   // never got ready
            }
            if (!joining) {
                // Which ranks have not mapped every window is not tracked per rank; report all that
                // joined but whose process is dead, else the count.
                missing.clear();
                for (uint32_t r = 0; r < nranks_; ++r)
                    if (!pid_alive(h_->slots[r].pid)) missing.push_back(r);
            }
            if (ab == 0) abort_world();
            std::string what = joining
                ? format("waiting for ranks %s to join (%u of %u joined)", rank_list(missing).c_str(),
                         h_->ready.load(), nranks_)
                : format("waiting for all ranks to map the windows (%u of %u done%s%s)",
                         h_->mapped.load(), nranks_, missing.empty() ? "" : "; dead: ",
                         missing.empty() ? "" : rank_list(missing).c_str());
            if (ab != 0 && ab != static_cast<int32_t>(rank_) + 1)
                return fail(HCCL_E_TIMEOUT,
                            "%s: rank %u of world %016" PRIx64 ": rank %d gave up after its "
                            "HCCL_CONNECT_TIMEOUT while %s%s",
                            kInit, rank_, wid_, ab - 1, what.c_str(), dead_note(missing).c_str());
            return fail(HCCL_E_TIMEOUT,
                        "%s: rank %u of world %016" PRIx64 ": timed out after %gs "
                        "(HCCL_CONNECT_TIMEOUT) %s%s",
                        kInit, rank_, wid_, timeout_, what.c_str(), dead_note(missing).c_str());
        }
        bo.pause();
    }
}

}  // namespace
}  // namespace hccl
}  // namespace aclmock

using namespace aclmock;
using namespace aclmock::hccl;

extern "C" HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
    if (!rootInfo) return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclGetRootInfo: rootInfo is NULL"));
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
    if (id == 0) id = 1;
    b.world_id = id;
    gethostname(b.host, sizeof b.host - 1);
    memset(rootInfo->internal, 0, sizeof rootInfo->internal);
    memcpy(rootInfo->internal, &b, sizeof b);
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                           HcclComm *comm) {
    RootBlob b;
    if (int rc = validate_init(nRanks, rootInfo, rank, comm, &b)) return static_cast<HcclResult>(rc);
    sweep_stale_segments();
    Joiner j(b, nRanks, rank);
    int rc = j.attach_rendezvous();
    if (!rc) rc = j.claim_slot();
    if (!rc) rc = j.create_own_window();
    if (!rc) rc = j.wait_joined();
    if (!rc) rc = j.map_peer_windows();
    if (!rc) rc = j.wait_mapped();
    if (rc) {
        j.abandon();
        return static_cast<HcclResult>(rc);
    }
    *comm = j.finish();
    return HCCL_SUCCESS;
}
