// POSIX shared-memory segments of the mock HCCL: process-wide refcounted mappings, liveness of
// owner processes, and the sweep that removes segments of worlds whose processes died.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <thread>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {

std::string rdv_name(uint64_t world_id) {
    return format("/%s%016" PRIx64 "_rdv", kShmPrefix, world_id);
}

std::string window_name(uint64_t world_id, uint32_t rank, int32_t pid) {
    return format("/%s%016" PRIx64 "_w%u_p%d", kShmPrefix, world_id, rank, pid);
}

double now_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void Backoff::pause() {
    // A short spin catches a peer that is just about to publish; after that, sleep with a growing
    // interval capped at 200 us so that many waiting ranks on few cores leave the senders CPU time.
    ++n;
    if (n < 64) {
        std::this_thread::yield();
        return;
    }
    unsigned k = n - 64;
    unsigned us = k < 8 ? (1u << k) : 200u;
    if (us > 200) us = 200;
    struct timespec ts{0, static_cast<long>(us) * 1000};
    nanosleep(&ts, nullptr);
}

// ---- liveness ------------------------------------------------------------------------------------
bool pid_alive(int32_t pid) {
    if (pid <= 0) return false;
    if (pid == getpid()) return true;
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    // kill() succeeds on a zombie (dead, not yet reaped by its parent): look at its state.
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return errno != ENOENT;
    char buf[512];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');   // "pid (comm) S ..."; comm may contain spaces or ')'
    if (!rp || rp[1] != ' ') return true;
    char state = rp[2];
    return state != 'Z' && state != 'X' && state != 'x';
}

// ---- segments ------------------------------------------------------------------------------------
namespace {
std::mutex g_seg_mu;
std::map<std::string, Segment> &segs() {
    static auto *m = new std::map<std::string, Segment>();   // never destroyed: used at exit
    return *m;
}

uint8_t *map_fd(int fd, size_t size, std::string *err, const std::string &name) {
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
        *err = format("mmap of %s (%zu bytes) failed: %s", name.c_str(), size, strerror(errno));
        return nullptr;
    }
    return static_cast<uint8_t *>(p);
}
}  // namespace

uint8_t *seg_ref(const std::string &name) {
    std::lock_guard<std::mutex> lk(g_seg_mu);
    auto it = segs().find(name);
    if (it == segs().end()) return nullptr;
    ++it->second.refs;
    return it->second.addr;
}

uint8_t *seg_create(const std::string &name, size_t size, std::string *err) {
    std::lock_guard<std::mutex> lk(g_seg_mu);
    if (segs().count(name)) {
        *err = format("shared memory segment %s already exists in this process", name.c_str());
        return nullptr;
    }
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        // Left over by a dead process whose pid was reused (names carry pid and a random world id,
        // so this is rare): replace it.
        shm_unlink(name.c_str());
        fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    }
    if (fd < 0) {
        *err = format("shm_open(%s) failed: %s", name.c_str(), strerror(errno));
        return nullptr;
    }
    // ftruncate gives a sparse file: pages cost memory only once touched.
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
        *err = format("ftruncate(%s, %zu) failed: %s", name.c_str(), size, strerror(errno));
        close(fd);
        shm_unlink(name.c_str());
        return nullptr;
    }
    uint8_t *p = map_fd(fd, size, err, name);
    close(fd);
    if (!p) {
        shm_unlink(name.c_str());
        return nullptr;
    }
    Segment &s = segs()[name];
    s.name = name;
    s.addr = p;
    s.size = size;
    s.refs = 1;
    return p;
}

uint8_t *seg_open(const std::string &name, size_t expect_size, std::string *err) {
    std::lock_guard<std::mutex> lk(g_seg_mu);
    auto it = segs().find(name);
    if (it != segs().end()) {
        ++it->second.refs;
        return it->second.addr;
    }
    int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) {
        *err = format("shm_open(%s) failed: %s", name.c_str(), strerror(errno));
        return nullptr;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *err = format("fstat(%s) failed: %s", name.c_str(), strerror(errno));
        close(fd);
        return nullptr;
    }
    if (static_cast<size_t>(st.st_size) != expect_size) {
        *err = format("shared memory segment %s has %lld bytes, expected %zu", name.c_str(),
                      static_cast<long long>(st.st_size), expect_size);
        close(fd);
        return nullptr;
    }
    uint8_t *p = map_fd(fd, expect_size, err, name);
    close(fd);
    if (!p) return nullptr;
    Segment &s = segs()[name];
    s.name = name;
    s.addr = p;
    s.size = expect_size;
    s.refs = 1;
    return p;
}

uint8_t *seg_attach(const std::string &name, size_t size, double deadline, bool *created,
                    std::string *err) {
    // One thread of this process at a time: a second thread of the same process must find the
    // first one's mapping rather than race it to create the file.
    static std::mutex attach_mu;
    std::lock_guard<std::mutex> alk(attach_mu);
    *created = false;
    if (uint8_t *p = seg_ref(name)) return p;
    std::lock_guard<std::mutex> lk(g_seg_mu);
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
        if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
            *err = format("ftruncate(%s, %zu) failed: %s", name.c_str(), size, strerror(errno));
            close(fd);
            shm_unlink(name.c_str());
            return nullptr;
        }
        *created = true;
    } else if (errno == EEXIST) {
        fd = shm_open(name.c_str(), O_RDWR, 0600);
        if (fd < 0) {
            *err = format("shm_open(%s) failed: %s", name.c_str(), strerror(errno));
            return nullptr;
        }
        // The creator may not have sized it yet.
        Backoff bo;
        for (;;) {
            struct stat st;
            if (fstat(fd, &st) != 0) {
                *err = format("fstat(%s) failed: %s", name.c_str(), strerror(errno));
                close(fd);
                return nullptr;
            }
            if (static_cast<size_t>(st.st_size) == size) break;
            if (st.st_size != 0 && static_cast<size_t>(st.st_size) != size) {
                *err = format("shared memory segment %s has %lld bytes, expected %zu (another version of "
                              "the mock?)", name.c_str(), static_cast<long long>(st.st_size), size);
                close(fd);
                return nullptr;
            }
            if (now_seconds() > deadline) {
                *err = format("shared memory segment %s was never sized by its creator", name.c_str());
                close(fd);
                return nullptr;
            }
            bo.pause();
        }
    } else {
        *err = format("shm_open(%s) failed: %s", name.c_str(), strerror(errno));
        return nullptr;
    }
    uint8_t *p = map_fd(fd, size, err, name);
    close(fd);
    if (!p) {
        if (*created) shm_unlink(name.c_str());
        return nullptr;
    }
    Segment &s = segs()[name];
    s.name = name;
    s.addr = p;
    s.size = size;
    s.refs = 1;
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
    munmap(it->second.addr, it->second.size);
    segs().erase(it);
}

void seg_unlink(const std::string &name) {
    if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
        // Nothing a caller can do about it; the sweep of a later world retries.
    }
}

HcclStats hccl_stats() {
    HcclStats st;
    st.live_comms = live_comm_count();
    std::lock_guard<std::mutex> lk(g_seg_mu);
    for (auto &kv : segs()) {
        if (!kv.second.is_window) continue;
        ++st.mapped_windows;
        st.mapped_bytes += kv.second.size;
    }
    return st;
}

// ---- the sweep of dead worlds ----------------------------------------------------------------------
namespace {
bool rdv_is_stale(const std::string &path_name) {
    int fd = shm_open(path_name.c_str(), O_RDONLY, 0);
    if (fd < 0) return false;
    struct stat st;
    bool stale = false;
    if (fstat(fd, &st) == 0) {
        if (static_cast<size_t>(st.st_size) < sizeof(RdvHeader)) {
            // Being created right now, or its creator died between shm_open and ftruncate.
            stale = time(nullptr) - st.st_mtime > 60;
        } else {
            void *p = mmap(nullptr, sizeof(RdvHeader), PROT_READ, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) {
                auto *h = static_cast<const RdvHeader *>(p);
                if (h->magic.load(std::memory_order_acquire) != kRdvMagic) {
                    stale = time(nullptr) - st.st_mtime > 60;
                } else {
                    bool any_alive = pid_alive(h->creator_pid);
                    uint32_t n = h->nranks <= static_cast<uint32_t>(kMaxRanks) ? h->nranks : kMaxRanks;
                    for (uint32_t r = 0; r < n && !any_alive; ++r) {
                        uint32_t s = h->slots[r].state.load(std::memory_order_acquire);
                        if ((s == kSlotClaimed || s == kSlotReady) && pid_alive(h->slots[r].pid))
                            any_alive = true;
                    }
                    stale = !any_alive;
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
    const size_t plen = strlen(kShmPrefix);
    std::vector<std::string> doomed;
    while (struct dirent *e = readdir(d)) {
        const char *n = e->d_name;
        if (strncmp(n, kShmPrefix, plen) != 0) continue;
        const char *rest = n + plen;
        if (strlen(rest) < 17 || rest[16] != '_') continue;
        const char *kind = rest + 17;
        if (kind[0] == 'w') {
            const char *pp = strstr(kind, "_p");
            if (!pp) continue;
            long pid = strtol(pp + 2, nullptr, 10);
            if (!pid_alive(static_cast<int32_t>(pid))) doomed.push_back(std::string("/") + n);
        } else if (strcmp(kind, "rdv") == 0) {
            std::string nm = std::string("/") + n;
            if (rdv_is_stale(nm)) doomed.push_back(nm);
        }
    }
    closedir(d);
    for (auto &nm : doomed) shm_unlink(nm.c_str());
}

}  // namespace hccl
}  // namespace aclmock
