// Communicators of the mock HCCL: root info, the shared-memory rendezvous, windows, handles,
// queries, HcclBarrier, HcclGetCommAsyncError and HcclGetErrorString.
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cinttypes>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {

// ---- live handles --------------------------------------------------------------------------------
namespace {
std::mutex g_comm_mu;
std::set<const Comm *> &live_comms() {
    static auto *s = new std::set<const Comm *>();
    return *s;
}
}  // namespace

void register_comm(Comm *c) {
    std::lock_guard<std::mutex> lk(g_comm_mu);
    live_comms().insert(c);
}
bool comm_is_live(const Comm *c) {
    std::lock_guard<std::mutex> lk(g_comm_mu);
    return live_comms().count(c) != 0;
}
void unregister_comm(Comm *c) {
    std::lock_guard<std::mutex> lk(g_comm_mu);
    live_comms().erase(c);
    // Destroyed communicators are kept (see HcclCommDestroy) and stay reachable from here, so the
    // leak checker of the sanitizer build (.ci/sanitize.sh) does not report them.
    static auto *retired = new std::vector<const Comm *>();
    retired->push_back(c);
}
size_t live_comm_count() {
    std::lock_guard<std::mutex> lk(g_comm_mu);
    return live_comms().size();
}
Comm *find_comm_by_name(const std::string &name) {
    std::lock_guard<std::mutex> lk(g_comm_mu);
    for (const Comm *c : live_comms())
        if (c->name() == name) return const_cast<Comm *>(c);
    return nullptr;
}

Comm *from_handle(HcclComm handle) {
    if (!handle) {
        set_error("HcclComm handle is NULL");
        return nullptr;
    }
    Comm *c = static_cast<Comm *>(handle);
    if (!comm_is_live(c)) {
        set_error(format("HcclComm %p is not a live communicator (destroyed, or never returned by "
                         "HcclCommInitRootInfo)", handle));
        return nullptr;
    }
    return c;
}

// Resolve a handle for a public call: NULL → HCCL_E_PTR, not live → HCCL_E_PARA, with messages
// naming the call.
static int get_comm(HcclComm handle, const char *fn, Comm **out) {
    *out = nullptr;
    if (!handle) return fail(HCCL_E_PTR, "%s: comm is NULL", fn);
    Comm *c = static_cast<Comm *>(handle);
    if (!comm_is_live(c))
        return fail(HCCL_E_PARA,
                    "%s: comm %p is not a live communicator (destroyed, or never returned by "
                    "HcclCommInitRootInfo)", fn, handle);
    *out = c;
    return HCCL_SUCCESS;
}

// ---- Comm ------------------------------------------------------------------------------------------
constexpr uint64_t kWindowMagic = 0x574f444e49574341ULL;   // "ACWINDOW"
constexpr uint32_t kWindowLeft = 1;                        // WindowHeader.reserved after a clean destroy
constexpr uint64_t kMailboxOffset = 4096;
static_assert(kMailboxOffset + 2 * sizeof(Mailbox) <= kStatusAreaBytes, "status area layout");
static_assert(sizeof(WindowHeader) <= kMailboxOffset, "window header fits its page");

Comm::Comm(Impl *impl) : impl_(impl) {}
Comm::~Comm() { delete impl_; }

uint32_t Comm::rank() const { return impl_->rank; }
uint32_t Comm::nranks() const { return impl_->nranks; }
const std::string &Comm::name() const { return impl_->name; }
int32_t Comm::device() const { return impl_->device; }
uint64_t Comm::window_size() const { return impl_->window_bytes; }
uint64_t Comm::data_half_bytes() const { return (impl_->window_bytes - kStatusAreaBytes) / 2; }
bool Comm::destroyed() const { return impl_->destroyed.load(std::memory_order_acquire); }
uint64_t Comm::next_seq() { return impl_->seq.fetch_add(1, std::memory_order_relaxed); }

uint8_t *Comm::window(uint32_t r) const {
    if (r >= impl_->windows.size()) return nullptr;
    return impl_->windows[r];
}
uint8_t *Comm::data_half(uint32_t r, int half) const {
    uint8_t *w = window(r);
    return w ? w + kStatusAreaBytes + static_cast<uint64_t>(half & 1) * data_half_bytes() : nullptr;
}
Mailbox *Comm::mailbox(uint32_t r, int half) const {
    uint8_t *w = window(r);
    return w ? reinterpret_cast<Mailbox *>(w + kMailboxOffset + (half & 1) * sizeof(Mailbox)) : nullptr;
}
WindowHeader *Comm::header(uint32_t r) const { return reinterpret_cast<WindowHeader *>(window(r)); }

bool Comm::peer_alive(uint32_t r) const {
    if (r >= impl_->pids.size()) return false;
    return pid_alive(impl_->pids[r]);
}

bool Comm::begin_use() {
    impl_->inflight.fetch_add(1, std::memory_order_acq_rel);
    if (impl_->closing.load(std::memory_order_acquire)) {
        impl_->inflight.fetch_sub(1, std::memory_order_acq_rel);
        return false;
    }
    return true;
}
void Comm::end_use() { impl_->inflight.fetch_sub(1, std::memory_order_acq_rel); }

// ---- configuration ---------------------------------------------------------------------------------
static uint64_t window_bytes_from_env() {
    double mib = env_double("HCCL_BUFFSIZE", 200);
    if (!(mib >= 1)) mib = mib > 0 ? 1 : 200;
    if (mib > (1 << 20)) mib = 1 << 20;
    return 2 * static_cast<uint64_t>(mib) * (1ull << 20);
}

static double connect_timeout() {
    double t = env_double("HCCL_CONNECT_TIMEOUT", 120);
    return t > 0 ? t : 120;
}

static std::string rank_list(const std::vector<uint32_t> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) s += ", ";
        if (i == 32) {
            s += format("... (%zu more)", v.size() - 32);
            break;
        }
        s += std::to_string(v[i]);
    }
    return s + "]";
}

}  // namespace hccl
}  // namespace aclmock

using namespace aclmock;
using namespace aclmock::hccl;

// ---- root info ---------------------------------------------------------------------------------------
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

// ---- init ----------------------------------------------------------------------------------------------
namespace {

struct Joiner {
    const char *fn = "HcclCommInitRootInfo";
    uint32_t nranks, rank;
    uint64_t wid;
    std::string rname;
    RdvHeader *h = nullptr;
    bool claimed = false;
    std::string own_name;
    std::vector<std::string> mapped;   // window segments this rank holds a reference to

    // Undo everything: drop mappings, remove this rank's window, leave the rendezvous (the last
    // rank to leave an unfinished world removes its rendezvous segment).
    void abandon() {
        for (auto &n : mapped) seg_release(n);
        mapped.clear();
        if (!own_name.empty()) seg_unlink(own_name);
        if (h) {
            if (claimed) {
                h->slots[rank].state.store(kSlotLeft, std::memory_order_release);
                if (h->present.fetch_sub(1, std::memory_order_acq_rel) == 1) seg_unlink(rname);
            }
            seg_release(rname);
            h = nullptr;
        }
    }

    std::string dead_note(const std::vector<uint32_t> &ranks) const {
        std::string s;
        for (uint32_t r : ranks) {
            uint32_t st = h->slots[r].state.load(std::memory_order_acquire);
            if ((st == kSlotClaimed || st == kSlotReady) && !pid_alive(h->slots[r].pid))
                s += format(" (rank %u: process %d is dead)", r, h->slots[r].pid);
        }
        return s;
    }

    // Wait until counter reaches nranks. Returns 0, or an HCCL error with the message set.
    int wait_count(std::atomic<uint32_t> &counter, double deadline, double timeout, bool joining) {
        Backoff bo;
        for (;;) {
            if (counter.load(std::memory_order_acquire) >= nranks) return HCCL_SUCCESS;
            int32_t ab = h->aborted_by.load(std::memory_order_acquire);
            bool late = now_seconds() > deadline;
            if (ab != 0 || late) {
                std::vector<uint32_t> missing;
                for (uint32_t r = 0; r < nranks; ++r) {
                    uint32_t st = h->slots[r].state.load(std::memory_order_acquire);
                    if (st == kSlotFree || st == kSlotClaimed) missing.push_back(r);   // never got ready
                }
                if (!joining) {
                    // Which ranks have not mapped every window is not tracked per rank; report all
                    // that joined but whose process is dead, else the count.
                    missing.clear();
                    for (uint32_t r = 0; r < nranks; ++r)
                        if (!pid_alive(h->slots[r].pid)) missing.push_back(r);
                }
                if (ab == 0) {
                    int32_t zero = 0;
                    h->aborted_by.compare_exchange_strong(zero, static_cast<int32_t>(rank) + 1);
                }
                std::string what = joining
                    ? format("waiting for ranks %s to join (%u of %u joined)", rank_list(missing).c_str(),
                             h->ready.load(), nranks)
                    : format("waiting for all ranks to map the windows (%u of %u done%s%s)",
                             h->mapped.load(), nranks, missing.empty() ? "" : "; dead: ",
                             missing.empty() ? "" : rank_list(missing).c_str());
                if (ab != 0 && ab != static_cast<int32_t>(rank) + 1)
                    return fail(HCCL_E_TIMEOUT,
                                "%s: rank %u of world %016" PRIx64 ": rank %d gave up after its "
                                "HCCL_CONNECT_TIMEOUT while %s%s",
                                fn, rank, wid, ab - 1, what.c_str(), dead_note(missing).c_str());
                return fail(HCCL_E_TIMEOUT,
                            "%s: rank %u of world %016" PRIx64 ": timed out after %gs "
                            "(HCCL_CONNECT_TIMEOUT) %s%s",
                            fn, rank, wid, timeout, what.c_str(), dead_note(missing).c_str());
            }
            bo.pause();
        }
    }
};

}  // namespace

extern "C" HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                           HcclComm *comm) {
    const char *fn = "HcclCommInitRootInfo";
    if (!comm) return static_cast<HcclResult>(fail(HCCL_E_PTR, "%s: comm (output) is NULL", fn));
    if (!rootInfo) return static_cast<HcclResult>(fail(HCCL_E_PTR, "%s: rootInfo is NULL", fn));
    RootBlob b;
    memcpy(&b, rootInfo->internal, sizeof b);
    if (b.magic != kRootMagic || b.version != kRootVersion || b.world_id == 0)
        return static_cast<HcclResult>(
            fail(HCCL_E_PARA, "%s: rootInfo was not produced by HcclGetRootInfo of this library", fn));
    if (nRanks < 1 || nRanks > static_cast<uint32_t>(kMaxRanks))
        return static_cast<HcclResult>(
            fail(HCCL_E_PARA, "%s: nRanks must be in [1, %d] (got %u)", fn, kMaxRanks, nRanks));
    if (rank >= nRanks)
        return static_cast<HcclResult>(
            fail(HCCL_E_PARA, "%s: rank must be < nRanks (got rank %u, nRanks %u)", fn, rank, nRanks));

    sweep_stale_segments();
    const double timeout = connect_timeout();
    const double start = now_seconds();
    const double deadline = start + timeout;
    const uint64_t wbytes = window_bytes_from_env();
    int32_t device = current_device();
    if (device < 0) device = 0;
    const int32_t pid = getpid();

    Joiner j;
    j.nranks = nRanks;
    j.rank = rank;
    j.wid = b.world_id;
    j.rname = rdv_name(b.world_id);

    // 1. the rendezvous area
    std::string err;
    bool created = false;
    uint8_t *rp = seg_attach(j.rname, kRdvBytes, deadline, &created, &err);
    if (!rp) return static_cast<HcclResult>(fail(HCCL_E_SYSCALL, "%s: rank %u: %s", fn, rank, err.c_str()));
    j.h = reinterpret_cast<RdvHeader *>(rp);
    if (created) {
        j.h->world_id = b.world_id;
        j.h->creator_pid = pid;
        j.h->nranks = nRanks;
        j.h->creator_rank = rank;
        j.h->magic.store(kRdvMagic, std::memory_order_release);
    } else {
        Backoff bo;
        while (j.h->magic.load(std::memory_order_acquire) != kRdvMagic) {
            if (now_seconds() > deadline) {
                j.abandon();
                return static_cast<HcclResult>(fail(HCCL_E_TIMEOUT,
                    "%s: rank %u: the rendezvous area of world %016" PRIx64 " was never initialised",
                    fn, rank, b.world_id));
            }
            bo.pause();
        }
    }
    if (j.h->nranks != nRanks) {
        uint32_t theirs = j.h->nranks, cr = j.h->creator_rank;
        j.abandon();
        return static_cast<HcclResult>(fail(HCCL_E_PARA,
            "%s: nRanks mismatch in world %016" PRIx64 ": rank %u passed nRanks=%u, rank %u passed nRanks=%u",
            fn, b.world_id, rank, nRanks, cr, theirs));
    }
    if (int32_t ab = j.h->aborted_by.load(std::memory_order_acquire)) {
        j.abandon();
        return static_cast<HcclResult>(fail(HCCL_E_TIMEOUT,
            "%s: rank %u: world %016" PRIx64 " was already abandoned by rank %d after its HCCL_CONNECT_TIMEOUT",
            fn, rank, b.world_id, ab - 1));
    }
    uint32_t expect = kSlotFree;
    if (!j.h->slots[rank].state.compare_exchange_strong(expect, kSlotClaimed, std::memory_order_acq_rel)) {
        int32_t other = j.h->slots[rank].pid;
        j.abandon();
        return static_cast<HcclResult>(fail(HCCL_E_PARA,
            "%s: duplicate rank %u in world %016" PRIx64 " (already joined by process %d%s)", fn, rank,
            b.world_id, other, other == pid ? ", this process" : ""));
    }
    j.claimed = true;
    j.h->present.fetch_add(1, std::memory_order_acq_rel);
    j.h->slots[rank].pid = pid;
    j.h->slots[rank].window_bytes = wbytes;

    // 2. this rank's window: sparse, so untouched pages cost nothing
    std::string own = window_name(b.world_id, rank, pid);
    uint8_t *w = seg_create(own, wbytes, &err);
    if (!w) {
        j.abandon();
        return static_cast<HcclResult>(fail(HCCL_E_MEMORY, "%s: rank %u: cannot create its window: %s", fn,
                                            rank, err.c_str()));
    }
    j.own_name = own;
    j.mapped.push_back(own);
    seg_register(own, device, MemKind::Window);
    auto *wh = reinterpret_cast<WindowHeader *>(w);
    wh->magic = kWindowMagic;
    wh->world_id = b.world_id;
    wh->rank = rank;
    wh->nranks = nRanks;
    wh->pid = pid;
    j.h->slots[rank].state.store(kSlotReady, std::memory_order_release);
    j.h->ready.fetch_add(1, std::memory_order_acq_rel);

    // 3. wait for every rank's window
    if (int rc = j.wait_count(j.h->ready, deadline, timeout, true)) {
        j.abandon();
        return static_cast<HcclResult>(rc);
    }

    // 4. map every peer's window
    auto *impl = new Comm::Impl();
    impl->world_id = b.world_id;
    impl->rank = rank;
    impl->nranks = nRanks;
    impl->name = format("hccl_world_%016" PRIx64 "_rank_%u", b.world_id, rank);
    impl->device = device;
    impl->window_bytes = wbytes;
    impl->seg_names.resize(nRanks);
    impl->windows.resize(nRanks);
    impl->pids.resize(nRanks);
    for (uint32_t r = 0; r < nRanks; ++r) {
        const RdvSlot &s = j.h->slots[r];
        impl->pids[r] = s.pid;
        if (r == rank) {
            impl->seg_names[r] = own;
            impl->windows[r] = w;
            continue;
        }
        if (s.window_bytes != wbytes) {
            delete impl;
            int32_t zero = 0;
            j.h->aborted_by.compare_exchange_strong(zero, static_cast<int32_t>(rank) + 1);
            j.abandon();
            return static_cast<HcclResult>(fail(HCCL_E_PARA,
                "%s: window size mismatch (HCCL_BUFFSIZE differs between ranks): rank %u has %" PRIu64
                " bytes, rank %u has %" PRIu64 " bytes", fn, r, s.window_bytes, rank, wbytes));
        }
        std::string nm = window_name(b.world_id, r, s.pid);
        uint8_t *p = seg_open(nm, wbytes, &err);
        if (!p) {
            delete impl;
            int32_t zero = 0;
            j.h->aborted_by.compare_exchange_strong(zero, static_cast<int32_t>(rank) + 1);
            j.abandon();
            return static_cast<HcclResult>(fail(HCCL_E_SYSCALL, "%s: rank %u: cannot map the window of rank %u%s: %s",
                                                fn, rank, r, pid_alive(s.pid) ? "" : " (its process is dead)",
                                                err.c_str()));
        }
        j.mapped.push_back(nm);
        seg_register(nm, device, MemKind::PeerWindow);   // no-op when this process registered it already
        impl->seg_names[r] = nm;
        impl->windows[r] = p;
    }
    j.h->mapped.fetch_add(1, std::memory_order_acq_rel);
    if (int rc = j.wait_count(j.h->mapped, deadline, timeout, false)) {
        delete impl;
        j.abandon();
        return static_cast<HcclResult>(rc);
    }

    // 5. everybody maps everything: the names can go, the mappings stay valid. From here on a
    //    crash leaves nothing behind in /dev/shm.
    seg_unlink(own);
    seg_unlink(j.rname);
    seg_release(j.rname);
    j.h = nullptr;

    Comm *c = new Comm(impl);
    register_comm(c);
    *comm = c;
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclCommDestroy(HcclComm comm) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclCommDestroy", &c)) return static_cast<HcclResult>(rc);
    unregister_comm(c);
    Comm::Impl *m = c->impl();
    m->closing.store(true, std::memory_order_release);
    // Work in flight (a barrier or a kernel between begin_use/end_use) notices `closing` in its waits.
    double until = now_seconds() + exec_timeout_seconds() + 5;
    Backoff bo;
    while (m->inflight.load(std::memory_order_acquire) > 0 && now_seconds() < until) bo.pause();
    m->destroyed.store(true, std::memory_order_release);
    // Tell the peers this rank left on purpose: its process may now exit without that being
    // reported as a dead peer by HcclGetCommAsyncError.
    if (WindowHeader *h = c->header(c->rank())) __atomic_store_n(&h->reserved, kWindowLeft, __ATOMIC_RELEASE);
    free_comm_op_ctxs(c);
    for (auto &n : m->seg_names)
        if (!n.empty()) seg_release(n);
    m->windows.assign(m->windows.size(), nullptr);
    // The Comm object itself is kept (a few hundred bytes) so that a stale handle or a kernel that
    // still holds the pointer sees destroyed() instead of freed memory.
    return HCCL_SUCCESS;
}

// ---- queries ---------------------------------------------------------------------------------------------
extern "C" HcclResult HcclGetCommName(HcclComm comm, char *commName) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclGetCommName", &c)) return static_cast<HcclResult>(rc);
    if (!commName) return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclGetCommName: commName is NULL"));
    snprintf(commName, COMM_NAME_MAX_LENGTH, "%s", c->name().c_str());
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclGetRankId", &c)) return static_cast<HcclResult>(rc);
    if (!rank) return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclGetRankId: rank is NULL"));
    *rank = c->rank();
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclGetRankSize", &c)) return static_cast<HcclResult>(rc);
    if (!rankSize) return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclGetRankSize: rankSize is NULL"));
    *rankSize = c->nranks();
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclGetCommAsyncError", &c)) return static_cast<HcclResult>(rc);
    if (!asyncError)
        return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclGetCommAsyncError: asyncError is NULL"));
    std::vector<uint32_t> dead;
    for (uint32_t r = 0; r < c->nranks(); ++r)
        if (!c->peer_alive(r) && __atomic_load_n(&c->header(r)->reserved, __ATOMIC_ACQUIRE) != kWindowLeft)
            dead.push_back(r);
    if (dead.empty()) {
        *asyncError = HCCL_SUCCESS;
        return HCCL_SUCCESS;
    }
    std::string s;
    for (uint32_t r : dead) s += format(" (rank %u: process %d is dead)", r, c->impl()->pids[r]);
    set_error(format("HcclGetCommAsyncError: rank %u of %s: peers %s are gone%s", c->rank(),
                     c->name().c_str(), rank_list(dead).c_str(), s.c_str()));
    *asyncError = HCCL_E_REMOTE;
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclCommGetHandleWithName(const char *commName, HcclComm *comm) {
    if (!commName) return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclCommGetHandleWithName: commName is NULL"));
    if (!comm) return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclCommGetHandleWithName: comm is NULL"));
    Comm *c = find_comm_by_name(std::string(commName, strnlen(commName, COMM_NAME_MAX_LENGTH)));
    if (!c)
        return static_cast<HcclResult>(fail(HCCL_E_NOT_FOUND,
            "HcclCommGetHandleWithName: no live communicator named \"%.128s\" in this process", commName));
    *comm = c;
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclGetHcclBuffer(HcclComm comm, void **addr, uint64_t *size) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclGetHcclBuffer", &c)) return static_cast<HcclResult>(rc);
    if (!addr || !size)
        return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclGetHcclBuffer: %s is NULL", !addr ? "addr" : "size"));
    *addr = c->window(c->rank());
    *size = c->window_size();
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclGetRemoteIpcHcclBuf(HcclComm comm, uint64_t remoteRank, void **addr, uint64_t *size) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclGetRemoteIpcHcclBuf", &c)) return static_cast<HcclResult>(rc);
    if (!addr || !size)
        return static_cast<HcclResult>(
            fail(HCCL_E_PTR, "HcclGetRemoteIpcHcclBuf: %s is NULL", !addr ? "addr" : "size"));
    if (remoteRank >= c->nranks())
        return static_cast<HcclResult>(fail(HCCL_E_PARA,
            "HcclGetRemoteIpcHcclBuf: remoteRank must be < rank size %u (got %" PRIu64 ")", c->nranks(), remoteRank));
    *addr = c->window(static_cast<uint32_t>(remoteRank));
    *size = c->window_size();
    return HCCL_SUCCESS;
}

// ---- barrier -----------------------------------------------------------------------------------------------
namespace {
// Keeps the communicator's in-flight count raised while a queued task exists, whether or not it runs.
struct UseToken {
    Comm *c;
    std::atomic<bool> done{false};
    explicit UseToken(Comm *cc) : c(cc) {}
    void finish() {
        if (!done.exchange(true)) c->end_use();
    }
    ~UseToken() { finish(); }
};
}  // namespace

extern "C" HcclResult HcclBarrier(HcclComm comm, aclrtStream stream) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclBarrier", &c)) return static_cast<HcclResult>(rc);
    aclError err = ACL_SUCCESS;
    Stream *s = resolve_stream(stream, &err, "HcclBarrier");
    if (!s) return HCCL_E_PARA;   // message set by the runtime
    if (!c->begin_use())
        return static_cast<HcclResult>(fail(HCCL_E_PARA, "HcclBarrier: communicator %s is being destroyed",
                                            c->name().c_str()));
    auto tok = std::make_shared<UseToken>(c);
    aclError e = enqueue(s, [c, tok]() -> int {
        uint64_t seq = c->next_seq();
        for (uint32_t dst = 0; dst < c->nranks(); ++dst) c->publish(dst, seq, kTagBarrier, nullptr, 0);
        int rc = c->wait_all(seq, kTagBarrier, nullptr, nullptr, 0, "HcclBarrier");
        tok->finish();
        return rc;
    }, "HcclBarrier");
    if (e != ACL_SUCCESS) return HCCL_E_RUNTIME;   // message set by the runtime
    return HCCL_SUCCESS;
}

// ---- error strings ---------------------------------------------------------------------------------------------
extern "C" const char *HcclGetErrorString(HcclResult code) {
    switch (static_cast<int>(code)) {
        case HCCL_SUCCESS: return "HCCL_SUCCESS: success";
        case HCCL_E_PARA: return "HCCL_E_PARA: parameter error";
        case HCCL_E_PTR: return "HCCL_E_PTR: empty pointer";
        case HCCL_E_MEMORY: return "HCCL_E_MEMORY: memory error";
        case HCCL_E_INTERNAL: return "HCCL_E_INTERNAL: internal error";
        case HCCL_E_NOT_SUPPORT: return "HCCL_E_NOT_SUPPORT: feature not supported";
        case HCCL_E_NOT_FOUND: return "HCCL_E_NOT_FOUND: specific resource not found";
        case HCCL_E_UNAVAIL: return "HCCL_E_UNAVAIL: resource unavailable";
        case HCCL_E_SYSCALL: return "HCCL_E_SYSCALL: error calling system API";
        case HCCL_E_TIMEOUT: return "HCCL_E_TIMEOUT: timeout";
        case HCCL_E_OPEN_FILE_FAILURE: return "HCCL_E_OPEN_FILE_FAILURE: open file fail";
        case HCCL_E_TCP_CONNECT: return "HCCL_E_TCP_CONNECT: tcp connect fail";
        case HCCL_E_ROCE_CONNECT: return "HCCL_E_ROCE_CONNECT: roce connect fail";
        case HCCL_E_TCP_TRANSFER: return "HCCL_E_TCP_TRANSFER: tcp transfer fail";
        case HCCL_E_ROCE_TRANSFER: return "HCCL_E_ROCE_TRANSFER: roce transfer fail";
        case HCCL_E_RUNTIME: return "HCCL_E_RUNTIME: call runtime API fail";
        case HCCL_E_DRV: return "HCCL_E_DRV: call driver API fail";
        case HCCL_E_PROFILING: return "HCCL_E_PROFILING: call profiling API fail";
        case HCCL_E_CCE: return "HCCL_E_CCE: call cce API fail";
        case HCCL_E_NETWORK: return "HCCL_E_NETWORK: call network API fail";
        case HCCL_E_AGAIN: return "HCCL_E_AGAIN: try again";
        case HCCL_E_REMOTE: return "HCCL_E_REMOTE: error cqe (a remote peer failed)";
        case HCCL_E_SUSPENDING: return "HCCL_E_SUSPENDING: error communicator suspending";
        case HCCL_E_OPRETRY_FAIL: return "HCCL_E_OPRETRY_FAIL: retry constraint";
        case HCCL_E_OOM: return "HCCL_E_OOM: out of memory";
        case HCCL_E_IN_STATUS: return "HCCL_E_IN_STATUS: operation not allowed in the current status";
        case HCCL_E_RESERVED: return "HCCL_E_RESERVED: reserved";
        default: return "unknown HcclResult code";
    }
}
