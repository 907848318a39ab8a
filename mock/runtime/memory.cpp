// Device memory is host memory tracked in a registry (base → block), so every address a copy,
// memset or kernel touches can be checked.
//
// Decisions:
// * aclrtMalloc pads like CANN: the usable block is align32(size) + 32 bytes, starting 64-byte
//   aligned, filled with the poison byte (0xA5) unless ACLNN_MOCK_POISON=0. Each device pretends to
//   have kDeviceMemBytes (64 GiB) of HBM; going beyond gives ACL_ERROR_RT_MEMORY_ALLOCATION.
//   A block of 64 KiB to 64 MiB reads as poison without being filled (poison_pages.cpp): only the
//   pages something writes take memory.
// * Each block remembers the range written since it last held the poison throughout, so a reused
//   block gets its poison back in that range only (refill_poison).
// * NULL pointer arguments are ACL_ERROR_INVALID_PARAM (100000). Freeing a pointer that is not the
//   base of a live allocation of the right kind (unknown, already freed, interior, pinned host
//   memory passed to aclrtFree or device memory to aclrtFreeHost) is ACL_ERROR_RT_MEMORY_FREE
//   (207002). Copy/memset range violations are ACL_ERROR_INVALID_PARAM.
// * Copies validate by kind: an end the kind names as device must lie wholly inside a registered
//   device-addressable block (Device, Window, PeerWindow); HOST_TO_HOST names none; DEFAULT treats
//   an end as device when it starts inside such a block. Whatever the kind, an end that starts
//   inside any registered block must end inside it too.
// * aclrtMemcpyAsync is stream-ordered. As on CANN it is truly asynchronous only when every host
//   end is pinned (aclrtMallocHost) or device memory; with a pageable host end it returns after the
//   copy has run (unless called from a task on the same stream, where it cannot wait).
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <pthread.h>

#include "runtime/rt_core.h"
#include "runtime/stream_internal.h"

namespace aclmock {
namespace {
constexpr int kMaxDevices = 1024;

struct Entry {
    MemBlock b;
    bool owned = false;  // allocated by aclrtMalloc/aclrtMallocHost (we free it)
    bool mapped = false; // a poison mapping (unmap_poison), else from posix_memalign (free)
    int pins = 0;        // queued stream work that will touch this block (PinSet)
    // Unregistered while pinned, by a stream task (which cannot wait for the pins): no longer found,
    // erased when its last pin goes, so a PinSet's pointer to it stays valid until then.
    bool gone = false;
    // Every byte outside [wr_lo, wr_hi) (offsets from the base) holds the poison.
    bool poison_outside = false;
    size_t wr_lo = 0, wr_hi = 0;
};

void extend_written(Entry &e, uintptr_t p, size_t n) {
    const size_t lo = p - e.b.base, hi = lo + n < e.b.size ? lo + n : e.b.size;
    if (e.wr_lo >= e.wr_hi) {
        e.wr_lo = lo;
        e.wr_hi = hi;
        return;
    }
    if (lo < e.wr_lo) e.wr_lo = lo;
    if (hi > e.wr_hi) e.wr_hi = hi;
}

struct Registry {
    std::shared_mutex mu;
    std::condition_variable_any unpinned;  // notified when a block's pin count drops to 0
    size_t pinned_blocks = 0;
    uint64_t free_waits = 0;
    std::map<uintptr_t, Entry> blocks;
    uint64_t changes = 0;  // entries added or erased so far: a LookupCache is valid while this stands
    size_t live_allocations = 0;
    size_t live_bytes = 0;
    size_t dev_bytes[kMaxDevices] = {};
};

Registry &reg() {
    // Never destroyed: worker threads may still look blocks up during process exit.
    static Registry *r = [] {
        auto *p = new Registry;
        pin_library();
        pthread_atfork([] { reg().mu.lock(); }, [] { reg().mu.unlock(); },
                       [] { reg().mu.unlock(); });
        return p;
    }();
    return *r;
}

// Caller holds the lock. The entry whose range contains address p, or nullptr, by a walk of the map;
// *lo and *size: the range the answer holds for (the entry's, or the gap between two entries).
Entry *walk_locked(Registry &r, uintptr_t p, uintptr_t *lo, size_t *size) {
    auto it = r.blocks.upper_bound(p);
    const uintptr_t hi = it == r.blocks.end() ? UINTPTR_MAX : it->first;
    *lo = 0;
    if (it != r.blocks.begin()) {
        --it;
        const MemBlock &b = it->second.b;
        if (p - b.base < b.size) {
            *lo = b.base;
            *size = b.size;
            return it->second.gone ? nullptr : &it->second;
        }
        *lo = b.base + b.size;
    }
    *size = hi > *lo ? hi - *lo : 0;
    return nullptr;
}

// The entries this thread looked up last, and the gaps between entries its misses fell in. A launch
// pins the same dozen blocks call after call, a copy from host memory looks its source up (a miss),
// and in a thread world the registry holds every rank's blocks: a walk of it costs a cache miss per
// level. Emptied whenever an entry was added or erased, so it never answers for a stale entry nor
// misses a new one.
struct LookupCache {
    // A launch pins up to 32 tensors, a round two launches and some copies: room for all of them,
    // their ranges kept here so that a scan touches no registry entry.
    static constexpr unsigned kSize = 64;
    struct Slot {
        uintptr_t base = 0;
        size_t size = 0;
        Entry *e = nullptr;   // nullptr: no entry holds an address of [base, base + size)
    };
    uint64_t changes = ~uint64_t(0);
    Slot slot[kSize];
    unsigned next = 0;
};
thread_local LookupCache t_lookup_cache;

// Caller holds the lock (shared or not). The entry whose range contains address p, or nullptr,
// through this thread's cache.
Entry *lookup_locked(Registry &r, uintptr_t p) {
    LookupCache &c = t_lookup_cache;
    if (c.changes != r.changes) {
        c = LookupCache{};
        c.changes = r.changes;
    }
    for (const LookupCache::Slot &s : c.slot)
        if (p - s.base < s.size) return s.e;   // below the base the difference wraps: no match
    uintptr_t lo;
    size_t size;
    Entry *e = walk_locked(r, p, &lo, &size);
    c.slot[c.next] = LookupCache::Slot{lo, size, e};
    c.next = (c.next + 1) % LookupCache::kSize;
    return e;
}

bool device_kind(MemKind k) { return k == MemKind::Device || k == MemKind::Window || k == MemKind::PeerWindow; }

const char *kind_name(MemKind k) {
    switch (k) {
    case MemKind::Device: return "device memory";
    case MemKind::Host: return "pinned host memory";
    case MemKind::Window: return "an HCCL window";
    case MemKind::PeerWindow: return "a peer HCCL window";
    }
    return "memory";
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// A new block: filled with the poison when the fill is on (*poisoned), mapped lazily when its size
// allows (*mapped).
void *alloc_block(size_t padded, bool *mapped, bool *poisoned) {
    const Config &c = config();
    *mapped = false;
    *poisoned = c.poison;
    if (c.poison && padded >= kPoisonLazyMin && padded <= kPoisonLazyMax)
        if (void *m = map_poison(padded, c.poison_byte)) {
            *mapped = true;
            return m;
        }
    void *p = nullptr;
    if (posix_memalign(&p, 64, align_up(padded, 64)) != 0) return nullptr;
    if (c.poison) std::memset(p, c.poison_byte, padded);
    return p;
}

void release_block(void *p, size_t size, bool mapped) {
    if (mapped)
        unmap_poison(p, size);
    else
        std::free(p);
}

// Adds a new owned block to the registry (caller holds the lock).
void add_owned_locked(Registry &r, void *p, size_t padded, int32_t device, MemKind kind, bool mapped,
                      bool poisoned) {
    Entry e;
    e.b.base = reinterpret_cast<uintptr_t>(p);
    e.b.size = padded;
    e.b.device = device;
    e.b.kind = kind;
    e.owned = true;
    e.mapped = mapped;
    e.poison_outside = poisoned;
    r.blocks[e.b.base] = e;
    ++r.changes;
    r.live_allocations += 1;
    r.live_bytes += padded;
}

// Waits (lk held on r.mu) until no queued stream work pins the block at `a`, starting work that waits
// for a synchronisation that may never come; the block's entry afterwards (end() once it is gone).
auto wait_unpinned(Registry &r, std::unique_lock<std::shared_mutex> &lk, uintptr_t a) -> decltype(r.blocks.begin()) {
    ++r.free_waits;
    start_waiting_work();
    r.unpinned.wait(lk, [&] {
        auto j = r.blocks.find(a);
        return j == r.blocks.end() || j->second.pins == 0;
    });
    return r.blocks.find(a);
}

}  // namespace

void register_block(void *base, size_t size, int32_t device, MemKind kind) {
    Registry &r = reg();
    std::unique_lock<std::shared_mutex> lk(r.mu);
    Entry e;
    e.b.base = reinterpret_cast<uintptr_t>(base);
    e.b.size = size;
    e.b.device = device;
    e.b.kind = kind;
    r.blocks[e.b.base] = e;
    ++r.changes;
}

// Only blocks registered with register_block can be unregistered; aclrtMalloc'ed blocks are
// released with aclrtFree/aclrtFreeHost (false here).
bool unregister_block(void *base) {
    Registry &r = reg();
    const uintptr_t a = reinterpret_cast<uintptr_t>(base);
    std::unique_lock<std::shared_mutex> lk(r.mu);
    auto it = r.blocks.find(a);
    if (it == r.blocks.end() || it->second.owned || it->second.gone) return false;
    if (it->second.pins > 0 && on_any_stream_worker())
        it->second.gone = true;
    else {
        if (it->second.pins > 0) {
            it = wait_unpinned(r, lk, a);
            if (it == r.blocks.end() || it->second.owned) return false;
        }
        r.blocks.erase(it);
    }
    ++r.changes;
    return true;
}

bool find_block_at(const void *p, MemBlock *out) {
    Registry &r = reg();
    std::shared_lock<std::shared_mutex> lk(r.mu);
    const Entry *e = lookup_locked(r, reinterpret_cast<uintptr_t>(p));
    if (!e) return false;
    if (out) *out = e->b;
    return true;
}

bool find_block(const void *p, size_t nbytes, MemBlock *out) {
    MemBlock b;
    if (!find_block_at(p, &b)) return false;
    uintptr_t off = reinterpret_cast<uintptr_t>(p) - b.base;
    if (nbytes > b.size - off) return false;
    if (out) *out = b;
    return true;
}

// A whole refill costs a memset of the block on every allocation, which dominates a serving loop's
// host time for large outputs (a 64 x 7168 fp16 expand_x: ~15 us). The stripe keeps a stale row read
// by mistake showing poison as long as the read spans a stride, and refills the small blocks (counts,
// flags, scales), where one element matters, whole; but the bytes an operator leaves unwritten are
// then partly stale, so two runs with different allocation histories differ there. Whole is the
// default: tests compare whole outputs across routes.
bool refill_poison(void *p, size_t nbytes) {
    if (!p) return false;
    const Config &c = config();
    const bool stripe = c.poison_stripe && nbytes > kRefillWhole;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    size_t lo = 0, hi = nbytes;   // what to refill, as offsets from p
    {
        Registry &r = reg();
        std::unique_lock<std::shared_mutex> lk(r.mu);
        Entry *e = lookup_locked(r, a);
        if (!e || nbytes > e->b.size - (a - e->b.base) || !device_kind(e->b.kind)) return false;
        if (!c.poison || nbytes == 0) return true;
        const size_t off = a - e->b.base;
        if (e->poison_outside) {   // the rest holds the poison already
            lo = e->wr_lo > off ? e->wr_lo - off : 0;
            hi = e->wr_hi < off + nbytes ? (e->wr_hi > off ? e->wr_hi - off : 0) : nbytes;
            if (lo >= hi) return true;
            if (!stripe && off <= e->wr_lo && off + nbytes >= e->wr_hi) e->wr_lo = e->wr_hi = 0;
        } else if (!stripe && off == 0 && nbytes == e->b.size) {
            e->poison_outside = true;
            e->wr_lo = e->wr_hi = 0;
        }
    }
    auto *bytes = static_cast<unsigned char *>(p);
    if (!stripe) {
        std::memset(bytes + lo, c.poison_byte, hi - lo);
        return true;
    }
    // The stripe keeps its place relative to p: one line in every stride, and the last line.
    auto line = [&](size_t at) {
        const size_t s = at > lo ? at : lo, t = at + kRefillLine < hi ? at + kRefillLine : hi;
        if (s < t) std::memset(bytes + s, c.poison_byte, t - s);
    };
    for (size_t at = lo / kRefillStride * kRefillStride; at < hi && at + kRefillLine <= nbytes; at += kRefillStride)
        line(at);
    line(nbytes - kRefillLine);
    return true;
}

void mark_written(const void *p, size_t nbytes) {
    if (!p || nbytes == 0) return;
    Registry &r = reg();
    std::unique_lock<std::shared_mutex> lk(r.mu);
    if (Entry *e = lookup_locked(r, reinterpret_cast<uintptr_t>(p))) extend_written(*e, reinterpret_cast<uintptr_t>(p), nbytes);
}

bool written_extent(const void *p, WrittenExtent *out) {
    Registry &r = reg();
    std::shared_lock<std::shared_mutex> lk(r.mu);
    const Entry *e = lookup_locked(r, reinterpret_cast<uintptr_t>(p));
    if (!e) return false;
    out->base = e->b.base;
    out->size = e->b.size;
    out->lo = e->wr_lo;
    out->hi = e->wr_hi;
    out->poison_outside = e->poison_outside;
    out->lazy = e->mapped;
    return true;
}

int refill_poison_async(void *const *ptrs, const size_t *sizes, size_t n, aclrtStream stream) {
    if (!config().poison || n == 0) return ACL_SUCCESS;
    aclError err = ACL_SUCCESS;
    Stream *s = resolve_stream(stream, &err, "refill_poison_async");
    if (!s) return err;
    auto pins = std::make_shared<PinSet>();  // the blocks stay allocated until the refill ran
    std::vector<std::pair<void *, size_t>> blocks;
    blocks.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        if (!pins->pin(ptrs[i], sizes[i], "refill_poison_async: block"))
            return fail(ACL_ERROR_INVALID_PARAM, "%s", take_error().c_str());
        blocks.emplace_back(ptrs[i], sizes[i]);
    }
    return enqueue(s, [blocks = std::move(blocks), pins]() -> int {
        for (const auto &[p, size] : blocks) refill_poison(p, size);
        pins->release();
        return ACL_SUCCESS;
    }, "refill_poison_async");
}

// Describes why [p, p+n) is not wholly inside device-addressable memory, or returns "" when it is.
static std::string device_range_problem(const void *p, size_t n) {
    MemBlock b;
    if (!p) return "address is NULL";
    if (!find_block_at(p, &b))
        return format("address %p (+%zu bytes) is not device memory (it lies in no aclrtMalloc "
                      "allocation or HCCL window)", p, n);
    uintptr_t off = reinterpret_cast<uintptr_t>(p) - b.base;
    if (!device_kind(b.kind))
        return format("address %p (+%zu bytes) is %s, not device memory", p, n, kind_name(b.kind));
    if (n > b.size - off)
        return format("range %p (+%zu bytes) runs %zu bytes past the end of its block %p (%zu bytes)",
                      p, n, n - (b.size - off), reinterpret_cast<void *>(b.base), b.size);
    return std::string();
}

bool check_device_range(const void *p, size_t nbytes, const char *what) {
    std::string why = device_range_problem(p, nbytes);
    if (why.empty()) return true;
    set_error(format("%s: %s", what ? what : "device range", why.c_str()));
    return false;
}

MemStats mem_stats() {
    Registry &r = reg();
    std::shared_lock<std::shared_mutex> lk(r.mu);
    MemStats s;
    s.live_allocations = r.live_allocations;
    s.live_bytes = r.live_bytes;
    return s;
}

PinSet::~PinSet() { release(); }

bool PinSet::pin(const void *p, size_t n, const char *what, bool any_kind) {
    const Range r{p, n, what};
    return pin_all(&r, 1, any_kind) == 1;
}

size_t PinSet::pin_all(const Range *ranges, size_t count, bool any_kind) {
    Registry &r = reg();
    std::unique_lock<std::shared_mutex> lk(r.mu);
    for (size_t i = 0; i < count; ++i) {
        const Range &x = ranges[i];
        if (!x.p || x.n == 0) continue;
        const uintptr_t a = reinterpret_cast<uintptr_t>(x.p);
        Entry *e = lookup_locked(r, a);
        if (!e || (!any_kind && !device_kind(e->b.kind)) || x.n > e->b.size - (a - e->b.base)) {
            lk.unlock();
            std::string why = device_range_problem(x.p, x.n);
            if (why.empty()) why = format("address %p (+%zu bytes) is not in a registered block", x.p, x.n);
            set_error(format("%s: %s", x.what ? x.what : "range", why.c_str()));
            return i;
        }
        if (e->pins++ == 0) ++r.pinned_blocks;
        pinned_.push_back(e);
    }
    return count;
}

void PinSet::release() {
    if (pinned_.empty() && writes_.empty()) return;
    Registry &r = reg();
    bool unpinned = false;
    {
        std::unique_lock<std::shared_mutex> lk(r.mu);
        for (const auto &[p, n] : writes_)
            if (Entry *e = lookup_locked(r, p)) extend_written(*e, p, n);
        for (void *v : pinned_) {
            auto *e = static_cast<Entry *>(v);
            if (e->pins > 0 && --e->pins == 0) {
                --r.pinned_blocks;
                unpinned = true;
                if (e->gone) {
                    r.blocks.erase(e->b.base);
                    ++r.changes;
                }
            }
        }
    }
    pinned_.clear();
    writes_.clear();
    if (unpinned) r.unpinned.notify_all();
}

PinStats pin_stats() {
    Registry &r = reg();
    std::shared_lock<std::shared_mutex> lk(r.mu);
    PinStats s;
    s.pinned_blocks = r.pinned_blocks;
    s.free_waits = r.free_waits;
    return s;
}

namespace {
enum class End { Host, Device, Infer };

// Validates one end of a copy. `pageable` is set when the end is host memory outside the registry.
aclError check_end(const char *api, const char *name, const void *p, size_t n, End want,
                   const char *kind_str, bool *pageable) {
    MemBlock b;
    bool in_block = find_block_at(p, &b);
    if (in_block) {
        uintptr_t off = reinterpret_cast<uintptr_t>(p) - b.base;
        if (n > b.size - off)
            return fail(ACL_ERROR_INVALID_PARAM,
                        "%s: %s range %p (+%zu bytes) runs %zu bytes past the end of its block %p "
                        "(%zu bytes, %s)",
                        api, name, p, n, n - (b.size - off), reinterpret_cast<void *>(b.base),
                        b.size, kind_name(b.kind));
    }
    bool is_dev = in_block && device_kind(b.kind);
    if (want == End::Device && !is_dev) {
        if (in_block)
            return fail(ACL_ERROR_INVALID_PARAM,
                        "%s: %s %p is %s, but kind %s says it is device memory", api, name, p,
                        kind_name(b.kind), kind_str);
        return fail(ACL_ERROR_INVALID_PARAM,
                    "%s: %s %p (+%zu bytes) is not device memory (in no aclrtMalloc allocation or "
                    "HCCL window), but kind %s says it is",
                    api, name, p, n, kind_str);
    }
    if (pageable) *pageable = !in_block;
    return ACL_SUCCESS;
}

const char *memcpy_kind_name(int kind) {
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST: return "ACL_MEMCPY_HOST_TO_HOST";
    case ACL_MEMCPY_HOST_TO_DEVICE: return "ACL_MEMCPY_HOST_TO_DEVICE";
    case ACL_MEMCPY_DEVICE_TO_HOST: return "ACL_MEMCPY_DEVICE_TO_HOST";
    case ACL_MEMCPY_DEVICE_TO_DEVICE: return "ACL_MEMCPY_DEVICE_TO_DEVICE";
    case ACL_MEMCPY_DEFAULT: return "ACL_MEMCPY_DEFAULT";
    case ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: return "ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE";
    case ACL_MEMCPY_INNER_DEVICE_TO_DEVICE: return "ACL_MEMCPY_INNER_DEVICE_TO_DEVICE";
    case ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: return "ACL_MEMCPY_INTER_DEVICE_TO_DEVICE";
    }
    return "?";
}

// Shared validation of aclrtMemcpy and aclrtMemcpyAsync. *any_pageable tells whether a host end
// is pageable (not registered).
aclError check_copy(const char *api, void *dst, size_t destMax, const void *src, size_t count,
                    int kind, bool *any_pageable) {
    if (!dst) return fail(ACL_ERROR_INVALID_PARAM, "%s: dst must not be NULL", api);
    if (!src) return fail(ACL_ERROR_INVALID_PARAM, "%s: src must not be NULL", api);
    if (count > destMax)
        return fail(ACL_ERROR_INVALID_PARAM, "%s: count must be <= destMax (got count %zu > destMax %zu)",
                    api, count, destMax);
    if (kind < ACL_MEMCPY_HOST_TO_HOST || kind > ACL_MEMCPY_INTER_DEVICE_TO_DEVICE)
        return fail(ACL_ERROR_INVALID_PARAM, "%s: kind must be an aclrtMemcpyKind in 0..7 (got %d)",
                    api, kind);
    End d = End::Infer, s = End::Infer;
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST: d = End::Host; s = End::Host; break;
    case ACL_MEMCPY_HOST_TO_DEVICE:
    case ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: d = End::Device; s = End::Host; break;
    case ACL_MEMCPY_DEVICE_TO_HOST: d = End::Host; s = End::Device; break;
    case ACL_MEMCPY_DEVICE_TO_DEVICE:
    case ACL_MEMCPY_INNER_DEVICE_TO_DEVICE:
    case ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: d = End::Device; s = End::Device; break;
    default: break;
    }
    const char *ks = memcpy_kind_name(kind);
    bool pd = false, ps = false;
    if (count > 0) {
        if (aclError e = check_end(api, "dst", dst, count, d, ks, &pd)) return e;
        if (aclError e = check_end(api, "src", src, count, s, ks, &ps)) return e;
    }
    if (any_pageable) *any_pageable = pd || ps;
    return ACL_SUCCESS;
}

aclError check_memset(const char *api, void *devPtr, size_t maxCount, size_t count) {
    if (!devPtr) return fail(ACL_ERROR_INVALID_PARAM, "%s: devPtr must not be NULL", api);
    if (count > maxCount)
        return fail(ACL_ERROR_INVALID_PARAM,
                    "%s: count must be <= maxCount (got count %zu > maxCount %zu)", api, count, maxCount);
    if (count == 0) return ACL_SUCCESS;
    std::string why = device_range_problem(devPtr, count);
    if (!why.empty()) return fail(ACL_ERROR_INVALID_PARAM, "%s: devPtr %s", api, why.c_str());
    return ACL_SUCCESS;
}

aclError do_free(const char *api, void *p, MemKind want) {
    if (!p) return fail(ACL_ERROR_INVALID_PARAM, "%s: %s must not be NULL", api,
                        want == MemKind::Host ? "hostPtr" : "devPtr");
    Registry &r = reg();
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    {
        std::unique_lock<std::shared_mutex> lk(r.mu);
        auto it = r.blocks.find(a);
        if (it != r.blocks.end() && it->second.owned && it->second.b.kind == want && it->second.pins > 0) {
            // Work queued on a stream still uses this block: wait until it has run (an implicit
            // synchronisation), unless this thread is a stream worker, which could wait for itself.
            if (on_any_stream_worker())
                return fail(ACL_ERROR_RT_MEMORY_FREE,
                            "%s: %p is still used by work queued on a stream, and this call runs on a "
                            "stream task, which cannot wait for it", api, p);
            it = wait_unpinned(r, lk, a);
        }
        if (it != r.blocks.end() && it->second.owned && it->second.b.kind == want) {
            const MemBlock b = it->second.b;
            const bool mapped = it->second.mapped;
            r.blocks.erase(it);
            ++r.changes;
            r.live_allocations -= 1;
            r.live_bytes -= b.size;
            if (b.kind == MemKind::Device && b.device >= 0 && b.device < kMaxDevices)
                r.dev_bytes[b.device] -= b.size;
            lk.unlock();
            release_block(p, b.size, mapped);
            return ACL_SUCCESS;
        }
        const Entry *e = lookup_locked(r, a);
        if (e && e->b.base == a && e->owned)
            return fail(ACL_ERROR_RT_MEMORY_FREE, "%s: %p is %s; free it with %s", api, p,
                        kind_name(e->b.kind), e->b.kind == MemKind::Host ? "aclrtFreeHost" : "aclrtFree");
        if (e && e->b.base == a)
            return fail(ACL_ERROR_RT_MEMORY_FREE, "%s: %p is %s registered by the mock, not an "
                        "allocation of %s", api, p, kind_name(e->b.kind),
                        want == MemKind::Host ? "aclrtMallocHost" : "aclrtMalloc");
        if (e)
            return fail(ACL_ERROR_RT_MEMORY_FREE,
                        "%s: %p points %zu bytes into the block at %p; pass the base address that "
                        "%s returned", api, p, static_cast<size_t>(a - e->b.base),
                        reinterpret_cast<void *>(e->b.base),
                        want == MemKind::Host ? "aclrtMallocHost" : "aclrtMalloc");
    }
    return fail(ACL_ERROR_RT_MEMORY_FREE,
                "%s: %p is not a live allocation (never allocated by %s, or already freed)", api, p,
                want == MemKind::Host ? "aclrtMallocHost" : "aclrtMalloc");
}
}  // namespace
}  // namespace aclmock

using namespace aclmock;

extern "C" {

ACLMOCK_API aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    if (!devPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: devPtr must not be NULL");
    if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: size must be > 0 (got 0)");
    const unsigned flags = ACL_MEM_TYPE_LOW_BAND_WIDTH | ACL_MEM_TYPE_HIGH_BAND_WIDTH |
                           ACL_MEM_ACCESS_USER_SPACE_READONLY;
    unsigned base_policy = static_cast<unsigned>(policy) & ~flags;
    if (base_policy > ACL_MEM_MALLOC_HUGE1G_ONLY_P2P)
        return fail(ACL_ERROR_INVALID_PARAM,
                    "aclrtMalloc: policy must be an aclrtMemMallocPolicy (0..7, optionally OR-ed "
                    "with the memory-type flags) (got %d)", static_cast<int>(policy));
    int32_t dev = current_device();
    if (dev < 0)
        return fail(ACL_ERROR_RT_CONTEXT_NULL,
                    "aclrtMalloc: no device is set on this thread (call aclrtSetDevice first)");
    if (size > kDeviceMemBytes)
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                    "aclrtMalloc: size %zu exceeds the device's %zu bytes of HBM", size, kDeviceMemBytes);
    size_t padded = align_up(size, 32) + 32;
    Registry &r = reg();
    {
        std::unique_lock<std::shared_mutex> lk(r.mu);
        if (r.dev_bytes[dev] + padded > kDeviceMemBytes)
            return fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                        "aclrtMalloc: out of device memory on device %d (asked %zu bytes, %zu of %zu "
                        "in use)", dev, size, r.dev_bytes[dev], kDeviceMemBytes);
        r.dev_bytes[dev] += padded;  // reserve before allocating outside the lock
    }
    bool mapped, poisoned;
    void *p = alloc_block(padded, &mapped, &poisoned);
    std::unique_lock<std::shared_mutex> lk(r.mu);
    if (!p) {
        r.dev_bytes[dev] -= padded;
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                    "aclrtMalloc: host allocation of %zu bytes failed", padded);
    }
    add_owned_locked(r, p, padded, dev, MemKind::Device, mapped, poisoned);
    *devPtr = p;
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtFree(void *devPtr) { return do_free("aclrtFree", devPtr, MemKind::Device); }

ACLMOCK_API aclError aclrtMallocHost(void **hostPtr, size_t size) {
    if (!hostPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: hostPtr must not be NULL");
    if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: size must be > 0 (got 0)");
    size_t padded = align_up(size, 32) + 32;
    if (size > (size_t(1) << 46)) 
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocHost: size %zu is too large", size);
    bool mapped, poisoned;
    void *p = alloc_block(padded, &mapped, &poisoned);
    if (!p)
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION,
                    "aclrtMallocHost: host allocation of %zu bytes failed", padded);
    Registry &r = reg();
    std::unique_lock<std::shared_mutex> lk(r.mu);
    add_owned_locked(r, p, padded, -1, MemKind::Host, mapped, poisoned);
    *hostPtr = p;
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtFreeHost(void *hostPtr) { return do_free("aclrtFreeHost", hostPtr, MemKind::Host); }

ACLMOCK_API aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                                 aclrtMemcpyKind kind) {
    if (aclError e = check_copy("aclrtMemcpy", dst, destMax, src, count, kind, nullptr)) return e;
    if (count) std::memmove(dst, src, count);
    mark_written(dst, count);
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                                      aclrtMemcpyKind kind, aclrtStream stream) {
    bool pageable = false;
    if (aclError e = check_copy("aclrtMemcpyAsync", dst, destMax, src, count, kind, &pageable))
        return e;
    aclError err = ACL_SUCCESS;
    Stream *s = resolve_stream(stream, &err, "aclrtMemcpyAsync");
    if (!s) return err;
    // Registered ends stay allocated until the copy has run (aclrtFree waits for it).
    auto pins = std::make_shared<PinSet>();
    if (count && find_block_at(dst, nullptr) && !pins->pin(dst, count, "aclrtMemcpyAsync: dst", true))
        return fail(ACL_ERROR_INVALID_PARAM, "%s", take_error().c_str());
    pins->note_write(dst, count);
    if (count && find_block_at(src, nullptr) && !pins->pin(src, count, "aclrtMemcpyAsync: src", true))
        return fail(ACL_ERROR_INVALID_PARAM, "%s", take_error().c_str());
    Task copy = [dst, src, count, pins]() -> int {
        if (count) std::memmove(dst, src, count);
        pins->release();
        return ACL_SUCCESS;
    };
    // From pageable memory it returns once the copy has run (unless called from a task of this stream)
    if (pageable && !on_stream_worker(s)) return enqueue_and_wait(s, std::move(copy), "aclrtMemcpyAsync");
    return enqueue(s, std::move(copy), "aclrtMemcpyAsync", false);
}

ACLMOCK_API aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
    if (aclError e = check_memset("aclrtMemset", devPtr, maxCount, count)) return e;
    if (count) std::memset(devPtr, value & 0xff, count);
    mark_written(devPtr, count);
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count,
                                      aclrtStream stream) {
    if (aclError e = check_memset("aclrtMemsetAsync", devPtr, maxCount, count)) return e;
    aclError err = ACL_SUCCESS;
    Stream *s = resolve_stream(stream, &err, "aclrtMemsetAsync");
    if (!s) return err;
    auto pins = std::make_shared<PinSet>();
    if (!pins->pin(devPtr, count, "aclrtMemsetAsync: devPtr"))
        return fail(ACL_ERROR_INVALID_PARAM, "%s", take_error().c_str());
    pins->note_write(devPtr, count);
    return enqueue(s, [devPtr, value, count, pins]() -> int {
        if (count) std::memset(devPtr, value & 0xff, count);
        pins->release();
        return ACL_SUCCESS;
    }, "aclrtMemsetAsync");
}

ACLMOCK_API aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total) {
    if (!free || !total)
        return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: %s must not be NULL", !free ? "free" : "total");
    if (attr < ACL_DDR_MEM || attr > ACL_MEM_P2P_HUGE1G)
        return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo: attr must be an aclrtMemAttr in 0..17 (got %d)",
                    static_cast<int>(attr));
    int32_t dev = current_device();
    if (dev < 0)
        return fail(ACL_ERROR_RT_CONTEXT_NULL,
                    "aclrtGetMemInfo: no device is set on this thread (call aclrtSetDevice first)");
    // The mock has only HBM; the DDR attributes report none (as on parts without device DDR).
    bool ddr = attr == ACL_DDR_MEM || attr == ACL_DDR_MEM_HUGE || attr == ACL_DDR_MEM_NORMAL ||
               attr == ACL_DDR_MEM_P2P_HUGE || attr == ACL_DDR_MEM_P2P_NORMAL;
    if (ddr) {
        *free = 0;
        *total = 0;
        return ACL_SUCCESS;
    }
    Registry &r = reg();
    std::shared_lock<std::shared_mutex> lk(r.mu);
    *total = kDeviceMemBytes;
    *free = kDeviceMemBytes - r.dev_bytes[dev];
    return ACL_SUCCESS;
}

}  // extern "C"
