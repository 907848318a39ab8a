// POSIX shared-memory segments of the mock HCCL: their names, process-wide refcounted mappings, and
// the sweep that removes segments of worlds whose processes died.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {

// ---- names -----------------------------------------------------------------------------------------
std::string rdv_name(uint64_t world_id) {
    return format("/%s%016" PRIx64 "_rdv", kShmPrefix, world_id);
}

std::string window_name(uint64_t world_id, uint32_t rank, uint64_t pid_ns, int32_t pid) {
    return format("/%s%016" PRIx64 "_w%u_n%" PRIu64 "_p%d", kShmPrefix, world_id, rank, pid_ns, pid);
}

bool parse_segment_name(const char *n, SegmentName *out) {
    const size_t plen = strlen(kShmPrefix);
    if (*n == '/') ++n;
    if (strncmp(n, kShmPrefix, plen) != 0) return false;
    const char *rest = n + plen;
    if (strlen(rest) < 17 || rest[16] != '_') return false;
    char *end = nullptr;
    *out = SegmentName{};
    out->world_id = strtoull(rest, &end, 16);
    if (end != rest + 16) return false;
    const char *kind = rest + 17;
    if (strcmp(kind, "rdv") == 0) {
        out->rdv = true;
        return true;
    }
    int rank = -1, pid = -1, used = 0;
    unsigned long long ns = 0;
    if (sscanf(kind, "w%d_n%llu_p%d%n", &rank, &ns, &pid, &used) != 3 || kind[used] != '\0' || rank < 0 ||
        pid <= 0)
        return false;
    out->rank = static_cast<uint32_t>(rank);
    out->pid_ns = ns;
    out->pid = pid;
    return true;
}

// ---- segments ----------------------------------------------------------------------------------------
namespace {
std::mutex g_seg_mu;   // guards segs()
std::map<std::string, Segment> &segs() {
    static auto *m = new std::map<std::string, Segment>();   // never destroyed: used at exit
    return *m;
}

// Another reference to a mapping this process holds; nullptr when it holds none. Caller holds g_seg_mu.
uint8_t *ref_locked(const std::string &name) {
    auto it = segs().find(name);
    if (it == segs().end()) return nullptr;
    ++it->second.refs;
    return it->second.addr;
}

// Maps fd (and closes it), recording the mapping of `name` with one reference. Caller holds g_seg_mu.
uint8_t *adopt_locked(const std::string &name, int fd, size_t size, std::string *err) {
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        *err = format("mmap of %s (%zu bytes) failed: %s", name.c_str(), size, strerror(errno));
        return nullptr;
    }
    Segment &s = segs()[name];
    s = Segment{};
    s.name = name;
    s.addr = static_cast<uint8_t *>(p);
    s.size = size;
    s.refs = 1;
    return s.addr;
}

// Creates `name` exclusively and sizes it (sparse: pages cost memory only once touched). Returns the
// fd; -1 with *exists set when the name is taken; -1 with *err set on any other failure.
int create_sized(const std::string &name, size_t size, bool *exists, std::string *err) {
    *exists = false;
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            *exists = true;
        else
            *err = format("shm_open(%s) failed: %s", name.c_str(), strerror(errno));
        return -1;
    }
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
        *err = format("ftruncate(%s, %zu) failed: %s", name.c_str(), size, strerror(errno));
        close(fd);
        shm_unlink(name.c_str());
        return -1;
    }
    return fd;
}

// Opens an existing segment of `size` bytes. A segment still at 0 bytes is being created: with a
// `deadline` (a now_seconds() value, 0 = none) wait for its creator to size it.
int open_sized(const std::string &name, size_t size, double deadline, std::string *err) {
    int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) {
        *err = format("shm_open(%s) failed: %s", name.c_str(), strerror(errno));
        return -1;
    }
    Backoff bo;
    for (;;) {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            *err = format("fstat(%s) failed: %s", name.c_str(), strerror(errno));
            break;
        }
        if (static_cast<size_t>(st.st_size) == size) return fd;
        if (st.st_size != 0 || deadline <= 0) {
            *err = format("shared memory segment %s has %lld bytes, expected %zu%s", name.c_str(),
                          static_cast<long long>(st.st_size), size,
                          st.st_size != 0 ? " (another version of the mock?)" : "");
            break;
        }
        if (now_seconds() > deadline) {
            *err = format("shared memory segment %s was never sized by its creator", name.c_str());
            break;
        }
        bo.pause();
    }
    close(fd);
    return -1;
}
}  // namespace

uint8_t *seg_ref(const std::string &name) {
    std::lock_guard<std::mutex> lk(g_seg_mu);
    return ref_locked(name);
}

uint8_t *seg_create(const std::string &name, size_t size, std::string *err) {
    std::lock_guard<std::mutex> lk(g_seg_mu);
    if (segs().count(name)) {
        *err = format("shared memory segment %s already exists in this process", name.c_str());
        return nullptr;
    }
    bool exists = false;
    int fd = create_sized(name, size, &exists, err);
    if (exists) {
        // Left over by a dead process whose pid was reused (names carry pid and a random world id,
        // so this is rare): replace it.
        shm_unlink(name.c_str());
        fd = create_sized(name, size, &exists, err);
        if (exists) *err = format("shm_open(%s) failed: %s", name.c_str(), strerror(EEXIST));
    }
    if (fd < 0) return nullptr;
    uint8_t *p = adopt_locked(name, fd, size, err);
    if (!p) shm_unlink(name.c_str());
    return p;
}

uint8_t *seg_open(const std::string &name, size_t expect_size, std::string *err) {
    std::lock_guard<std::mutex> lk(g_seg_mu);
    if (uint8_t *p = ref_locked(name)) return p;
    int fd = open_sized(name, expect_size, 0, err);
    return fd < 0 ? nullptr : adopt_locked(name, fd, expect_size, err);
}

uint8_t *seg_attach(const std::string &name, size_t size, double deadline, bool *created,
                    std::string *err) {
    // One thread of this process at a time: a second thread of the same process must find the
    // first one's mapping rather than race it to create the file.
    static std::mutex attach_mu;
    std::lock_guard<std::mutex> alk(attach_mu);
    *created = false;
    if (uint8_t *p = seg_ref(name)) return p;
    bool exists = false;
    int fd = create_sized(name, size, &exists, err);
    if (fd >= 0)
        *created = true;
    else if (exists)
        fd = open_sized(name, size, deadline, err);   // another process created it
    if (fd < 0) return nullptr;
    std::lock_guard<std::mutex> lk(g_seg_mu);
    uint8_t *p = adopt_locked(name, fd, size, err);
    if (!p && *created) shm_unlink(name.c_str());
    return p;
}

void seg_register(const std::string &name, int32_t device, MemKind kind) {
    std::lock_guard<std::mutex> lk(g_seg_mu);
    auto it = segs().find(name);
    if (it == segs().end() || it->second.registered) return;
    register_block(it->second.addr, it->second.size, device, kind);
    it->second.registered = true;
    it->second.is_window = true;
}

void seg_release(const std::string &name) {
    std::lock_guard<std::mutex> lk(g_seg_mu);
    auto it = segs().find(name);
    if (it == segs().end()) return;
    if (--it->second.refs > 0) return;
    if (it->second.registered) unregister_block(it->second.addr);
    unmap_later(it->second.addr, it->second.size);
    segs().erase(it);
}

// ---- the windows of one world, mapped once per process ------------------------------------------
// The ranks of a thread world all map the same W windows: the first of them maps each window (one
// reference per segment), the others copy the addresses, and the last to let go drops the
// references. Forming and destroying a world thus cost O(W) per process, not O(W) per rank.
namespace {
struct WorldWindows {
    std::vector<std::string> names;
    std::vector<uint8_t *> addrs;
    int users = 0;
};
std::mutex g_world_mu;   // guards worlds(); taken before g_seg_mu
std::map<uint64_t, WorldWindows> &worlds() {
    static auto *m = new std::map<uint64_t, WorldWindows>();   // never destroyed: used at exit
    return *m;
}
}  // namespace

int world_windows_acquire(uint64_t world_id, uint32_t nranks, const std::function<std::string(uint32_t)> &name_of,
                          size_t bytes, int32_t device, std::vector<uint8_t *> *addrs, std::string *err) {
    std::lock_guard<std::mutex> lk(g_world_mu);
    auto it = worlds().find(world_id);
    if (it == worlds().end()) {
        WorldWindows w;
        w.names.reserve(nranks);
        w.addrs.assign(nranks, nullptr);
        for (uint32_t r = 0; r < nranks; ++r) {
            w.names.push_back(name_of(r));
            w.addrs[r] = seg_open(w.names[r], bytes, err);
            if (!w.addrs[r]) {
                for (uint32_t q = 0; q < r; ++q) seg_release(w.names[q]);
                return static_cast<int>(r);
            }
            seg_register(w.names[r], device, MemKind::PeerWindow);   // no-op for a window registered already
        }
        it = worlds().emplace(world_id, std::move(w)).first;
    }
    ++it->second.users;
    *addrs = it->second.addrs;
    return -1;
}

void world_windows_release(uint64_t world_id) {
    std::lock_guard<std::mutex> lk(g_world_mu);
    auto it = worlds().find(world_id);
    if (it == worlds().end() || --it->second.users > 0) return;
    for (auto &n : it->second.names) seg_release(n);
    worlds().erase(it);
}

void seg_unlink(const std::string &name) {
    // ENOENT (unlinked already, e.g. by a sweep) and other failures are left to a later sweep.
    shm_unlink(name.c_str());
}

HcclStats hccl_stats() {
    HcclStats st;
    st.live_comms = live_comm_count();
    st.liveness_probes = liveness_probes();
    std::lock_guard<std::mutex> lk(g_seg_mu);
    for (auto &kv : segs()) {
        if (!kv.second.is_window) continue;
        ++st.mapped_windows;
        st.mapped_bytes += kv.second.size;
    }
    return st;
}

// ---- the sweep of dead worlds ----------------------------------------------------------------------
// A segment goes only when its owners are provably dead: a window when its owner process is dead (in
// this pid namespace); a rendezvous area when its creator and every rank that claimed a slot are dead
// (all in this pid namespace), or when it has stayed uninitialised for a minute (its creator died
// between creating and initialising it). A world still forming always has a live owner.
namespace {
constexpr int64_t kUninitialisedGraceSeconds = 60;

bool rdv_is_stale(const std::string &path_name) {
    int fd = shm_open(path_name.c_str(), O_RDONLY, 0);
    if (fd < 0) return false;
    struct stat st;
    bool stale = false;
    if (fstat(fd, &st) == 0) {
        const bool old = time(nullptr) - st.st_mtime > kUninitialisedGraceSeconds;
        if (static_cast<size_t>(st.st_size) < sizeof(RdvHeader)) {
            stale = old;   // being created right now, or its creator died before sizing it
        } else {
            void *p = mmap(nullptr, sizeof(RdvHeader), PROT_READ, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) {
                auto *h = static_cast<const RdvHeader *>(p);
                if (h->magic.load(std::memory_order_acquire) != kRdvMagic) {
                    stale = old;
                } else {
                    bool gone = process_gone(h->creator_pid, h->creator_ns);
                    uint32_t n = h->nranks <= static_cast<uint32_t>(kMaxRanks) ? h->nranks : kMaxRanks;
                    for (uint32_t r = 0; r < n && gone; ++r) {
                        const RdvSlot &sl = h->slots[r];
                        uint32_t s = sl.state.load(std::memory_order_acquire);
                        if (s != kSlotFree && s != kSlotLeft && !process_gone(sl.pid, sl.pid_ns)) gone = false;
                    }
                    stale = gone;
                }
                munmap(p, sizeof(RdvHeader));
            }
        }
    }
    close(fd);
    return stale;
}
}  // namespace

void sweep_stale_segments() {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    std::vector<std::string> doomed;
    while (struct dirent *e = readdir(d)) {
        SegmentName sn;
        if (!parse_segment_name(e->d_name, &sn)) continue;
        std::string nm = std::string("/") + e->d_name;
        if (sn.rdv ? rdv_is_stale(nm) : process_gone(sn.pid, sn.pid_ns)) doomed.push_back(nm);
    }
    closedir(d);
    for (auto &nm : doomed) shm_unlink(nm.c_str());
}

void sweep_stale_segments_every(double min_interval) {
    // The ranks of a thread world join at the same time: one sweep serves them all.
    static std::mutex mu;
    static double last = -1e300;
    {
        std::lock_guard<std::mutex> lk(mu);
        double now = now_seconds();
        if (now - last < min_interval) return;
        last = now;
    }
    sweep_stale_segments();
}

}  // namespace hccl
}  // namespace aclmock
