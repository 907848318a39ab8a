// Private parts of the mock HCCL shared by mock/hccl/*.cpp (not part of the kernel contract in
// hccl_core.h): shared-memory segments, the rendezvous area, the Comm implementation and the
// registries of live handles.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hccl/hccl_core.h"

namespace aclmock {
namespace hccl {

// ---- names ---------------------------------------------------------------------------------------
// Every segment of this mock lives in /dev/shm under this prefix:
//   aclmock_hccl_<world id, 16 hex>_rdv                      rendezvous area of one world
//   aclmock_hccl_<world id, 16 hex>_w<rank>_n<pidns>_p<pid>  window of one rank, owned by process
//                                                            pid of pid namespace pidns
// /dev/shm may be shared by processes of several pid namespaces (containers); a pid says whether its
// process lives only to a reader in the same namespace, so names and the rendezvous carry it.
constexpr const char *kShmPrefix = "aclmock_hccl_";
std::string rdv_name(uint64_t world_id);
std::string window_name(uint64_t world_id, uint32_t rank, uint64_t pid_ns, int32_t pid);
// The parts of a segment name of this mock (with or without the leading '/'); false for any other.
struct SegmentName {
    uint64_t world_id = 0;
    bool rdv = false;     // the rendezvous area; else a window with rank, pid namespace and pid
    uint32_t rank = 0;
    uint64_t pid_ns = 0;
    int32_t pid = 0;
};
bool parse_segment_name(const char *name, SegmentName *out);

// ---- the root info blob (HcclRootInfo.internal, 4108 bytes) -------------------------------------
constexpr uint64_t kRootMagic = 0x484b434f4d4c4341ULL;   // "ACLMOCKH"
constexpr uint32_t kRootVersion = 1;
struct RootBlob {
    uint64_t magic;
    uint32_t version;
    int32_t creator_pid;
    uint64_t world_id;
    uint64_t created_ns;     // CLOCK_REALTIME
    char host[64];           // creator's host name, for messages
};
static_assert(sizeof(RootBlob) <= 4108, "root blob fits HcclRootInfo");
// A fresh root (unique world id), as HcclGetRootInfo hands out.
RootBlob new_root_blob();
// One rank's rendezvous in the world of `b` (rendezvous.cpp), its window on `device`. HCCL_SUCCESS
// and *comm set, or an HCCL error with this thread's message set; nothing is left behind on failure.
int join_world(const RootBlob &b, uint32_t nranks, uint32_t rank, int32_t device, HcclComm *comm);

// ---- the rendezvous area (one POSIX shm segment per world, unlinked once all ranks mapped) ------
// A slot moves Free → Claimed (pid known) → Ready (window exists) → Mapped (maps every window), or
// to Left when its rank gives up (or its process exits) before the world formed.
enum SlotState : uint32_t { kSlotFree = 0, kSlotClaimed = 1, kSlotReady = 2, kSlotLeft = 3, kSlotMapped = 4 };
struct RdvSlot {
    std::atomic<uint32_t> state;
    int32_t pid;
    uint64_t window_bytes;
    uint64_t pid_ns;
    std::atomic<uint32_t> dead;   // 1 once a waiting rank found this slot's process dead (LivenessPacer)
    uint32_t reserved;
};
constexpr uint64_t kRdvMagic = 0x5644524b434d4341ULL;
struct RdvHeader {
    std::atomic<uint64_t> magic;       // written last by the creator
    uint64_t world_id;
    int32_t creator_pid;
    uint32_t nranks;                   // set by the creator (the first rank to arrive)
    uint64_t creator_ns;               // pid namespace of creator_pid
    uint32_t creator_rank;
    std::atomic<uint32_t> ready;       // ranks whose window exists
    std::atomic<uint32_t> mapped;      // ranks that mapped every window
    std::atomic<uint32_t> present;     // ranks attached (claimed and not yet left)
    std::atomic<int32_t> aborted_by;   // rank + 1 of the first rank that gave up, 0 = none
    uint32_t reserved;
    RdvSlot slots[kMaxRanks];
};
constexpr size_t kRdvBytes = (sizeof(RdvHeader) + 4095) & ~size_t(4095);

// ---- process-wide, refcounted segment mappings ---------------------------------------------------
// Ranks that are threads of one process share one mapping per segment. The first mapping of a
// window is registered in the runtime memory registry (own window: Window, else PeerWindow).
struct Segment {
    std::string name;
    uint8_t *addr = nullptr;
    size_t size = 0;
    int refs = 0;
    bool registered = false;
    bool is_window = false;
};
// Create (exclusively) or open the named segment and map it; returns nullptr and sets *err
// (message text) on failure. `expect_size` is checked when opening.
uint8_t *seg_create(const std::string &name, size_t size, std::string *err);
uint8_t *seg_open(const std::string &name, size_t expect_size, std::string *err);
// Rendezvous: create the segment exclusively (*created = true) or open the existing one, waiting
// until its creator has sized it (bounded by `deadline`, a now_seconds() value).
uint8_t *seg_attach(const std::string &name, size_t size, double deadline, bool *created,
                    std::string *err);
// Same mapping again (refcount) if this process already maps `name`; nullptr otherwise.
uint8_t *seg_ref(const std::string &name);
void seg_register(const std::string &name, int32_t device, MemKind kind);
void seg_release(const std::string &name);
void seg_unlink(const std::string &name);
// Every window of world `world_id` (`nranks` of `bytes` each; name_of(r): rank r's segment) as mapped
// in this process, into *addrs: mapped by the first rank of this process to ask, shared with the
// others (each caller holds one use, given back by world_windows_release). Only that first rank
// asks for the names: W ranks each formatting W names made forming a thread world W².
// Returns -1, or the rank whose window could not be mapped (*err set; nothing is held then).
int world_windows_acquire(uint64_t world_id, uint32_t nranks, const std::function<std::string(uint32_t)> &name_of,
                          size_t bytes, int32_t device, std::vector<uint8_t *> *addrs, std::string *err);
void world_windows_release(uint64_t world_id);

// Remove segments of this mock whose owners are provably dead (see shm.cpp).
void sweep_stale_segments();
// The same, at most once per `min_interval` seconds in this process.
void sweep_stale_segments_every(double min_interval);

// ---- liveness ----------------------------------------------------------------------------------------
// getpid() of this process, without a system call (kept right across fork).
int32_t own_pid();
// Whether process pid exists and is not a zombie.
bool pid_alive(int32_t pid);
// How many times this process probed another process (pid_alive past its own pid).
uint64_t liveness_probes();
// This process's pid namespace (inode of /proc/self/ns/pid; 0 when it cannot be read).
uint64_t pid_namespace();
// Whether the process (pid, pid_ns) is known to be gone: dead, in this pid namespace. A process of
// another namespace is never judged dead.
bool process_gone(int32_t pid, uint64_t pid_ns);

// ---- waiting (wait.cpp) ---------------------------------------------------------------------------
double now_seconds();
// Back-off of polling loops: yields briefly, then sleeps with a growing interval up to ~200 us.
// After about half a millisecond of that a wait is "long" (long_wait()): loops that have a doorbell
// (below) then sleep on it instead of polling, so hundreds of waiting ranks on two cores leave the
// CPU to the ranks they wait for.
struct Backoff {
    unsigned n = 0;
    void pause();
    bool long_wait() const { return n >= kLongAfter; }
    static constexpr unsigned kLongAfter = 72;
};
// Sleeps until *word no longer holds `seen` or `seconds` pass (a futex: works on shared memory
// between processes). Spurious returns are possible; callers re-check their condition.
void futex_wait(std::atomic<uint32_t> *word, uint32_t seen, double seconds);
// Wakes every thread or process sleeping in futex_wait on *word.
void futex_wake_all(std::atomic<uint32_t> *word);

// ---- windows ---------------------------------------------------------------------------------------
constexpr uint64_t kWindowMagic = 0x574f444e49574341ULL;   // "ACWINDOW"
constexpr uint32_t kWindowLeft = 1;                        // WindowHeader.left after a clean destroy

// ---- the communicator ----------------------------------------------------------------------------
struct OpArgs {
    uint64_t magic;
    uint8_t comm_engine;
    bool engine_set;
    bool alg_set;
    char alg_config[128];
};
constexpr uint64_t kOpArgsMagic = 0x5347524150434b46ULL;

struct Comm::Impl {
    uint64_t world_id = 0;
    uint32_t rank = 0;
    uint32_t nranks = 0;
    std::string name;
    int32_t device = 0;
    uint64_t window_bytes = 0;
    std::string own_seg;                  // this rank's window segment (its own reference)
    bool world_mapped = false;            // holds a use of the world's windows (world_windows_acquire)
    std::vector<uint8_t *> windows;       // local mapping of each rank's window
    std::vector<int32_t> pids;            // owner process of each rank's window
    int32_t pid = 0;                      // this rank's process: peers of the same pid are threads, alive
    std::vector<uint64_t> pid_ns;         // pid namespace of each of those processes
    std::atomic<uint64_t> seq{0};
    std::atomic<bool> closing{false};     // HcclCommDestroy started
    std::atomic<bool> destroyed{false};   // windows unmapped
    std::atomic<int> inflight{0};         // begin_use() without end_use() (queued tasks, kernels)
    std::mutex mu;                        // op_ctx, states
    std::map<uint8_t, OpResCtx *> op_ctx;
    std::map<const void *, std::shared_ptr<CommState>> states;   // Comm::state
};

// Drops this rank's references to every window it maps (windows become NULL).
void release_windows(Comm::Impl &m);

// "[0, 1, 2]", shortened after 32 entries.
std::string rank_list(const std::vector<uint32_t> &ranks);

// Live-handle registries (thread-safe).
void register_comm(Comm *c);
bool comm_is_live(const Comm *c);
void unregister_comm(Comm *c);
size_t live_comm_count();

void register_op_ctx(OpResCtx *ctx);
void unregister_op_ctx(OpResCtx *ctx);
void free_comm_op_ctxs(Comm *c);

}  // namespace hccl
}  // namespace aclmock
