// Communicators of the mock HCCL once formed (the rendezvous is in rendezvous.cpp): handles, windows,
// HcclCommDestroy, queries, HcclBarrier, HcclGetCommAsyncError and HcclGetErrorString.
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <unordered_map>

#include "hccl/hccl_internal.h"
#include "hccl/live_set.h"

namespace aclmock {
namespace hccl {

// ---- live handles --------------------------------------------------------------------------------
// Every HCCL call checks its handle here (live_set.h); the by-name index changes with the set, under
// its lock, so that a lookup by name never finds a communicator the set no longer holds.
namespace {
LiveSet<Comm> &live_comms() {
    static auto *s = new LiveSet<Comm>();
    return *s;
}
std::unordered_map<std::string, Comm *> &comms_by_name() {
    static auto *m = new std::unordered_map<std::string, Comm *>();
    return *m;
}
}  // namespace

void register_comm(Comm *c) {
    live_comms().add(c, [c] { comms_by_name()[c->name()] = c; });
}
bool comm_is_live(const Comm *c) { return live_comms().contains(c); }
void unregister_comm(Comm *c) {
    live_comms().remove(c, [c](bool was_live) {
        if (was_live) comms_by_name().erase(c->name());
        // Destroyed communicators are kept (see HcclCommDestroy) and stay reachable from here, so the
        // leak checker of the sanitizer build (.ci/sanitize.sh) does not report them.
        static auto *retired = new std::vector<const Comm *>();
        retired->push_back(c);
    });
}
size_t live_comm_count() { return live_comms().size(); }
Comm *find_comm_by_name(const std::string &name) {
    return live_comms().read([&name]() -> Comm * {
        auto it = comms_by_name().find(name);
        return it == comms_by_name().end() ? nullptr : it->second;
    });
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
std::shared_ptr<CommState> Comm::state(const void *key, std::shared_ptr<CommState> (*make)()) {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (destroyed()) return nullptr;   // HcclCommDestroy clears the states under this lock after setting it
    std::shared_ptr<CommState> &slot = impl_->states[key];
    if (!slot) slot = make();
    return slot;
}

uint64_t Comm::next_seq() { return impl_->seq.fetch_add(1, std::memory_order_relaxed); }

uint8_t *Comm::window(uint32_t r) const {
    if (r >= impl_->windows.size()) return nullptr;
    return impl_->windows[r];
}
const uint8_t *const *Comm::windows() const { return impl_->windows.data(); }
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
    if (impl_->pids[r] == impl_->pid && impl_->pid_ns[r] == pid_namespace()) return true;   // a thread rank: no probe
    return !process_gone(impl_->pids[r], impl_->pid_ns[r]);
}

bool Comm::peer_gone(uint32_t r, std::string *why, bool probe) const {
    WindowHeader *h = header(r);
    if (!h) return false;
    if (__atomic_load_n(&h->left, __ATOMIC_ACQUIRE) == kWindowLeft) {
        if (why) *why += format(" (rank %u destroyed its communicator)", r);
        return true;
    }
    bool dead = __atomic_load_n(&h->dead, __ATOMIC_ACQUIRE) != 0;
    if (!dead && probe && !peer_alive(r)) {
        dead = true;
        __atomic_store_n(&h->dead, 1u, __ATOMIC_RELEASE);   // the peers waiting for it read this
    }
    if (dead && why) *why += format(" (rank %u: process %d is dead)", r, impl_->pids[r]);
    return dead;
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

void release_windows(Comm::Impl &m) {
    if (m.world_mapped) world_windows_release(m.world_id);
    m.world_mapped = false;
    if (!m.own_seg.empty()) seg_release(m.own_seg);
    m.own_seg.clear();
    m.windows.assign(m.windows.size(), nullptr);
}

std::string rank_list(const std::vector<uint32_t> &v) {
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

extern "C" HcclResult HcclCommDestroy(HcclComm comm) {
    Comm *c;
    if (int rc = get_comm(comm, "HcclCommDestroy", &c)) return static_cast<HcclResult>(rc);
    unregister_comm(c);
    Comm::Impl *m = c->impl();
    m->closing.store(true, std::memory_order_release);
    // Work in flight (a barrier or a kernel between begin_use/end_use) notices `closing` in its waits,
    // woken from its sleep on the hub.
    if (m->inflight.load(std::memory_order_acquire) > 0)
        for (int half = 0; half < 2; ++half)
            if (Mailbox *hub = c->mailbox(0, half)) futex_wake_all(&hub->done);
    start_waiting_work();   // queued calls that hold it run (and fail) now rather than later
    double until = now_seconds() + exec_timeout_seconds() + 5;
    Backoff bo;
    while (m->inflight.load(std::memory_order_acquire) > 0 && now_seconds() < until) bo.pause();
    m->destroyed.store(true, std::memory_order_release);
    // Tell the peers this rank left on purpose: its process may now exit without that being
    // reported as a dead peer by HcclGetCommAsyncError.
    if (WindowHeader *h = c->header(c->rank())) __atomic_store_n(&h->left, kWindowLeft, __ATOMIC_RELEASE);
    free_comm_op_ctxs(c);
    {
        std::lock_guard<std::mutex> lk(m->mu);
        m->states.clear();
    }
    release_windows(*m);
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
        if (!c->peer_alive(r) && __atomic_load_n(&c->header(r)->left, __ATOMIC_ACQUIRE) != kWindowLeft)
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

// One rank's barrier, as a task that gives its thread back while it waits.
struct BarrierCall {
    Comm *c;
    CallSteps steps;
    explicit BarrierCall(Comm *cc) : c(cc) {}
    int step() {
        if (!steps.started()) steps.begin(c, c->next_seq(), kTagBarrier);
        if (!steps.arrived()) {
            if (steps.delayed()) return kTaskPending;
            steps.arrive(nullptr, 0);
        }
        return steps.wait(nullptr, nullptr, 0, "HcclBarrier");
    }
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
    auto call = std::make_shared<BarrierCall>(c);
    aclError e = enqueue(s, [call, tok]() -> int {
        const int rc = call->step();
        if (rc != kTaskPending) tok->finish();
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
