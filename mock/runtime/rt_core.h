// Internal C++ interface of the mock runtime (libascendcl.so). The other mock libraries
// (libnnopbase, libhccl, libcust_opapi) and the pybind11 control module link against it and use
// these calls; they are exported with default visibility under namespace aclmock, never part of the
// public C ABI in include/.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "acl/acl_rt.h"

#define ACLMOCK_API __attribute__((visibility("default")))

namespace aclmock {

// ---- error messages (aclGetRecentErrMsg): per thread, cleared on read -------------------------
// set_error replaces this thread's recent message. fail() formats, sets and returns the code so a
// check reads `return fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: size must be > 0");`.
ACLMOCK_API void set_error(const std::string &msg);
ACLMOCK_API std::string take_error();          // read and clear (what aclGetRecentErrMsg does)
ACLMOCK_API const std::string &peek_error();   // read without clearing
ACLMOCK_API int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ACLMOCK_API std::string vformat(const char *fmt, va_list ap);
ACLMOCK_API std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- configuration, read from the environment at first use and resettable for tests ----------
enum class Soc { Ascend910_93, Ascend950, Ascend910B };
// The CANN release whose published rules the ops apply where releases differ (docs/testing_with_the_mock.md,
// "The CANN release"): Newest = the newest published documents; R8_3 = CANN 8.3.RC1 and earlier.
enum class CannRules { Newest, R8_3 };
struct Config {
    int device_count = 16;       // ACLNN_MOCK_DEVICE_COUNT
    Soc soc = Soc::Ascend910_93; // ACLNN_MOCK_SOC
    bool poison = true;          // ACLNN_MOCK_POISON (0 turns it off)
    bool poison_stripe = false;  // ACLNN_MOCK_POISON=stripe: a large reused block is refilled striped
    uint8_t poison_byte = 0xA5;
    CannRules rules = CannRules::Newest;   // ACLNN_MOCK_CANN_VERSION
    std::string release = "";              // the value as given ("" = newest)
};
ACLMOCK_API const Config &config();
ACLMOCK_API void reload_config();                 // re-read the environment
ACLMOCK_API void set_soc(Soc soc);
ACLMOCK_API void set_poison(bool on);
ACLMOCK_API void set_poison_stripe(bool stripe);
// Benchmark switch: when on, phase 2 of every op does all its checks and queues a task that does
// nothing, so host overhead can be measured without the kernels' own work (never on by default).
ACLMOCK_API void set_skip_kernels(bool on);
ACLMOCK_API bool skip_kernels();
// Whether the kernels write the rows they send with streaming stores (mock/ops/peer_copy.h): -1 by
// the world's volume (the default), 0 never, 1 always. Tests set it to run both copies on any machine.
ACLMOCK_API void set_row_streaming(int mode);
ACLMOCK_API int row_streaming();
ACLMOCK_API const char *soc_name(Soc soc);   // the profile's own (family) name
// ACLNN_MOCK_CANN_VERSION: "" / "newest" (the newest published rules), or a release number
// <major>.<minor>.<RCn | n>[.<suffix>] (8.3.RC1, 8.2.RC1, 8.5.0, ...); releases before 8.5 answer with
// the 8.3.RC1 rules, later ones with the newest. Anything else: false, *why naming the accepted values.
ACLMOCK_API bool cann_rules_of(const std::string &value, CannRules *rules, std::string *why);
// Selects the rules of `value` (as the variable would); a value refused changes nothing.
ACLMOCK_API bool set_cann_version(const std::string &value, std::string *why);
// The active rule set's name, as doctor prints it: "newest" or "8.3.RC1".
ACLMOCK_API const char *cann_rules_name(CannRules rules);
// SoC names by family (case-insensitive prefix): a name beginning "Ascend910_93" (the A3 line,
// e.g. Ascend910_9391, Ascend910_9392) selects Ascend910_93, one beginning "Ascend950" selects
// Ascend950, one beginning "Ascend910B" (the Atlas A2 line: Ascend910B1 ... Ascend910B4) selects
// Ascend910B. Any other name: false, with *why saying what is accepted.
ACLMOCK_API bool soc_profile_of(const std::string &name, Soc *soc, std::string *why);
// Selects the profile of `name` and makes aclrtGetSocName report `name` exactly; an unknown name is
// refused (false, *why set) and changes nothing.
ACLMOCK_API bool set_soc_name(const std::string &name, std::string *why);
// What aclrtGetSocName reports: the name configured, or the profile's own name after set_soc.
// NULL while the configuration is refused (config_error()).
ACLMOCK_API const char *reported_soc_name();
// Why the configuration read from the environment is refused (an ACLNN_MOCK_SOC of no known
// family, an ACLNN_MOCK_CANN_VERSION that is no release); empty when it is accepted. aclInit fails with this message until a valid profile is set.
ACLMOCK_API std::string config_error();
// A numeric environment variable, or dflt when unset/unparsable.
// Environment values (runtime/env.cpp). Unset or empty: *out = the default, true. A value that
// cannot be read: false, *why = one line naming the variable and what it accepts.
// The value between leading and trailing blanks ("" when there is none): every variable is read so.
ACLMOCK_API std::string env_trimmed(const char *v);
// The variable `name` read so ("" when unset).
ACLMOCK_API std::string env_text(const char *name);
ACLMOCK_API bool env_whole(const char *name, long long lo, long long hi, long long dflt, long long *out,
                           std::string *why);
ACLMOCK_API bool env_seconds(const char *name, bool zero_ok, double dflt, double *out, std::string *why);
constexpr long long kMaxBuffsizeMib = 1 << 20;
ACLMOCK_API bool hccl_window_mib(long long *mib, std::string *why);         // HCCL_BUFFSIZE, MiB (200)
ACLMOCK_API bool hccl_exec_timeout(double *seconds, std::string *why);      // HCCL_EXEC_TIMEOUT (120; 0: none)
ACLMOCK_API bool hccl_connect_timeout(double *seconds, std::string *why);   // HCCL_CONNECT_TIMEOUT (120)
// The first HCCL_* value that cannot be read, "" when all can: communicator creation refuses it.
ACLMOCK_API std::string hccl_env_error();

// ---- init / devices -------------------------------------------------------------------------
ACLMOCK_API bool acl_initialized();
// The calling thread's current device, or -1 when none was set (aclrtSetDevice).
ACLMOCK_API int32_t current_device();

// ---- memory registry --------------------------------------------------------------------------
// Every byte a tensor or a copy may address belongs to a registered block. Device allocations,
// pinned host allocations and HCCL windows (own and peer mappings) are registered.
enum class MemKind : int { Device = 0, Host = 1, Window = 2, PeerWindow = 3 };
struct MemBlock {
    uintptr_t base = 0;
    size_t size = 0;      // usable bytes (the range that may be addressed)
    int32_t device = -1;  // owning device (-1 for pinned host)
    MemKind kind = MemKind::Device;
};
ACLMOCK_API void register_block(void *base, size_t size, int32_t device, MemKind kind);
ACLMOCK_API bool unregister_block(void *base);
// The block that contains [p, p+nbytes) entirely; false when p is in no block or the range runs
// past the end of its block.
ACLMOCK_API bool find_block(const void *p, size_t nbytes, MemBlock *out);
// True when p..p+nbytes lies in device-addressable memory (Device, Window, PeerWindow). On failure
// sets a message "<what>: address 0x.. (+N bytes) is not device memory ..." and returns false.
ACLMOCK_API bool check_device_range(const void *p, size_t nbytes, const char *what);
// The block whose range contains the single address p (whatever its kind); false when none does.
ACLMOCK_API bool find_block_at(const void *p, MemBlock *out);
// Simulated HBM per device (64 GiB), as reported by aclrtGetMemInfo and enforced by aclrtMalloc.
constexpr size_t kDeviceMemBytes = size_t(64) << 30;
struct MemStats {
    size_t live_allocations = 0; // aclrtMalloc + aclrtMallocHost blocks not yet freed
    size_t live_bytes = 0;
};
ACLMOCK_API MemStats mem_stats();
// A block a caching allocator hands out again gets the poison of a new one (when the fill is on):
// whole, or with poison_stripe and above kRefillWhole bytes one kRefillLine in every kRefillStride
// bytes plus the last line. False when [p, p+nbytes) is not inside one device block.
constexpr size_t kRefillWhole = size_t(64) << 10;
constexpr size_t kRefillStride = 512;
constexpr size_t kRefillLine = 64;
//
// Only the bytes written since the block last held the poison throughout are refilled: each
// writer the mock runs (copies, memsets, kernels, the DLPack exports of aclnn_py) records the
// range it wrote (mark_written), so a worst-case-sized output whose kernel wrote a few rows is
// refilled in a few rows.
ACLMOCK_API bool refill_poison(void *p, size_t nbytes);
// Records that [p, p+nbytes) was written (nothing when p lies in no registered block).
ACLMOCK_API void mark_written(const void *p, size_t nbytes);
// Test hook: the written range of the block that contains p, as offsets from its base, and whether
// every byte outside it holds the poison. False when p lies in no registered block.
struct WrittenExtent {
    uintptr_t base = 0;
    size_t size = 0, lo = 0, hi = 0;
    bool poison_outside = false;
    bool lazy = false;   // a poison mapping: its unwritten pages take no memory
};
ACLMOCK_API bool written_extent(const void *p, WrittenExtent *out);

// Poison pages (poison_pages.cpp): a block of kPoisonLazyMin..kPoisonLazyMax bytes is a private
// mapping of a kPoisonChunk-byte memory file holding the poison; larger blocks would take too many
// mappings (one per chunk) and are filled instead.
constexpr size_t kPoisonChunk = size_t(2) << 20;
constexpr size_t kPoisonLazyMin = size_t(64) << 10;
constexpr size_t kPoisonLazyMax = size_t(64) << 20;
// A mapping of at least `bytes` whose pages read as `byte` until written; nullptr when it cannot be
// made (no memfd, out of mappings).
void *map_poison(size_t bytes, uint8_t byte);
void unmap_poison(void *p, size_t bytes);
// Gives [addr, addr + len) back to the system soon, on a thread of its own (unmapper.cpp): a release
// that unmaps costs its caller nothing. The caller must not use the range again.
ACLMOCK_API void unmap_later(void *addr, size_t len);
// Makes the poison file now (once per process; nothing with the poison off): aclrtSetDevice calls it,
// so that opening a device, not a process's first large allocation, pays for filling it.
void prepare_poison_pages();
size_t poison_map_bytes(size_t bytes);
// refill_poison of `n` blocks queued on `stream` (a reused block still read by earlier work on it):
// 0, or an aclError with the message set. Nothing is queued with the poison off.
ACLMOCK_API int refill_poison_async(void *const *ptrs, const size_t *sizes, size_t n, aclrtStream stream);

// ---- streams ------------------------------------------------------------------------------------
// A stream is an in-order queue served by its own worker thread. A task returns an aclError; the
// first failure (code + message) is kept on the stream and returned, with its message, by the next
// aclrtSynchronizeStream; tasks queued after a failure still run (as on hardware, later kernels
// run on whatever their inputs hold).
class Stream;
using Task = std::function<int()>;
// Resolve a user handle: NULL means the current device's default stream. Returns nullptr and sets
// *err (and the message) when the handle is not a live stream or no device is set.
ACLMOCK_API Stream *resolve_stream(aclrtStream handle, aclError *err);
// Same, with the calling API's name at the start of the error message.
ACLMOCK_API Stream *resolve_stream(aclrtStream handle, aclError *err, const char *api);
// `name` (for messages) must stay valid until the task has run: the callers pass string literals.
// A task runs on the stream's worker or, when it cannot block (`may_block` false), on a thread that
// synchronises the stream: a launch followed by a synchronisation then costs no hand-over between
// threads. Work nobody synchronises starts on the worker kLazyStartMs later, rounded up to the lazy
// starter's 2 ms tick (or at once when some thread waits for it: an event, a free of memory it uses,
// a communicator's destruction).
ACLMOCK_API aclError enqueue(Stream *s, Task task, const char *name, bool may_block = false);
constexpr int kLazyStartMs = 5;
// A task paused at a wait for peers when its synchronisation's time ran out, on a stream without a
// worker thread, stays queued for the next synchronisation; a worker is made for it after this long
// if none comes (a stream that has its worker hands the task over at once).
constexpr int kPausedLazyStartMs = 200;
// A task that waits for peers returns kTaskPending instead of blocking, after set_pending_wait()
// told its runner how to sleep until it may go on; the runner calls it again later (on the same or
// another thread) and it resumes from the state it captured. A synchronisation whose time runs out
// leaves such a task to the worker.
constexpr int kTaskPending = 0x7ffffff0;
struct PendingWait {
    void (*sleep)(void *arg, double seconds) = nullptr;   // returns early when the task may go on
    void *arg = nullptr;
};
ACLMOCK_API void set_pending_wait(PendingWait w);
// Starts the work queued on any stream of this process that waits to be run by a synchronisation:
// called before a thread waits for stream work it does not run itself.
ACLMOCK_API void start_waiting_work();
ACLMOCK_API int32_t stream_device(const Stream *s);
struct StreamStats {
    size_t live_streams = 0;
    size_t live_events = 0;
    uint64_t tasks_run = 0;
    // added: lazily created per-device default streams (not counted in live_streams), and tasks
    // that returned a failure
    size_t default_streams = 0;
    uint64_t tasks_failed = 0;
    // tasks run by a thread that synchronised their stream (not by its worker), and queues the
    // lazy starter had to start because no thread synchronised them within kLazyStartMs
    uint64_t tasks_run_by_synchronise = 0;
    uint64_t stream_workers_started = 0;   // worker threads made (a stream makes one when work first needs it)
    uint64_t late_starts = 0;
};
// True when the calling thread is the worker of stream s (a task running on it).
ACLMOCK_API bool on_stream_worker(const Stream *s);
ACLMOCK_API StreamStats stream_stats();

// True when the calling thread is the worker of any stream (a task is running on it).
ACLMOCK_API bool on_any_stream_worker();

// ---- memory in use by queued work ----------------------------------------------------------------
// Work queued on a stream (a kernel launch, an async copy or memset) pins the blocks it will touch
// when it is enqueued and unpins them when it has run. aclrtFree / aclrtFreeHost of a pinned block
// waits until the work has run (an implicit synchronisation), so memory never disappears under a
// kernel; called from a stream task it fails instead (207002) because it would wait for itself.
class PinSet {
public:
    PinSet() = default;
    PinSet(PinSet &&) noexcept = default;
    PinSet(const PinSet &) = delete;
    PinSet &operator=(const PinSet &) = delete;
    ~PinSet();
    // Room for n pins and n noted writes, so a launch allocates at most once for each.
    void reserve(size_t n) {
        pinned_.reserve(n);
        writes_.reserve(n);
    }
    // Checks that [p, p+n) lies inside one registered device-addressable block (or any registered
    // block when `any_kind`) and pins it. False (message set, "<what>: ...") when it does not;
    // n == 0 or p == NULL pins nothing and succeeds.
    bool pin(const void *p, size_t n, const char *what, bool any_kind = false);
    // pin() of each range, under one lock of the registry: the index of the first that fails (its
    // message set; those before it stay pinned), or count when all are pinned.
    struct Range {
        const void *p;
        size_t n;
        const char *what;
    };
    size_t pin_all(const Range *ranges, size_t count, bool any_kind = false);
    // [p, p+n) will have been written when release() runs: recorded then (mark_written), under the
    // lock release takes anyway.
    void note_write(const void *p, size_t n) {
        if (p && n) writes_.push_back({reinterpret_cast<uintptr_t>(p), n});
    }
    void release();

private:
    // The registry entries pinned (memory.cpp's Entry): a pinned entry is never erased (a free
    // waits for it; an unregistration by a stream task defers the erase to the last pin), so
    // release() reaches them without looking them up again.
    std::vector<void *> pinned_;
    std::vector<std::pair<uintptr_t, size_t>> writes_;
};
struct PinStats {
    size_t pinned_blocks = 0;   // blocks with pending work
    uint64_t free_waits = 0;    // frees that had to wait for pending work
};
ACLMOCK_API PinStats pin_stats();

// ---- fault injection (aclnn_py._mock.inject_fault) -----------------------------------------------
// A process-wide table of armed faults, consulted by the HCCL mailbox once per collective call
// (op "dispatch", "combine" or "barrier"; rank = the calling communicator's rank).
//   Skip:  the rank never takes part in that call (publishes nothing; its own call fails at once)
//   Delay: the rank sleeps `seconds` before taking part
//   Crash: the rank's process is SIGKILLed in the middle of the call (after publishing to some
//          peers); meant for process worlds
enum class FaultKind { None = 0, Skip, Delay, Crash };
struct FaultHit {
    FaultKind kind = FaultKind::None;
    double seconds = 0;
};
// rank -1 matches any rank; count -1 fires every time.
ACLMOCK_API void inject_fault(const std::string &op, int rank, FaultKind kind, double seconds, int count);
ACLMOCK_API void clear_faults();
// Consumes one firing of the first fault that matches (kind None when none does).
ACLMOCK_API FaultHit take_fault(const char *op, int rank);
struct FaultStats {
    size_t armed = 0;
    uint64_t fired = 0;
};
ACLMOCK_API FaultStats fault_stats();
ACLMOCK_API const char *fault_kind_name(FaultKind k);

// ---- reset for tests ---------------------------------------------------------------------------
// Drops the recent error message of this thread; used by the control module between tests.
ACLMOCK_API void clear_error();

}  // namespace aclmock
