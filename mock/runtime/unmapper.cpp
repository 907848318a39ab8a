// Mappings given back in the background (unmap_later, rt_core.h).
//
// Unmapping a block whose pages were written costs the kernel a walk of its page tables and the
// freeing of each page, and a window's last unmapping frees its file's pages too. A thread world's
// teardown releases every rank's windows: the last rank to destroy its communicator unmapped all W
// windows itself (~30 ms at W = 768), on the CPU the ranks share, while the world waited for it. One
// thread per process unmaps instead, on any CPU the process had when this library was loaded (not
// the one CPU a thread world's ranks are bound to), and the release returns at once.
//
// The range stays mapped until that thread has unmapped it, so no new mapping can take its
// addresses meanwhile; the registries forget it at once (the caller unregisters first). When the
// thread falls behind (kMaxPending regions queued) a release unmaps itself, so that a loop releasing
// faster than the thread unmaps cannot pile up mappings (vm.max_map_count) or memory. In a child
// after fork() the thread does not exist: the child unmaps what it releases itself, and leaves the
// regions its parent had queued mapped (the parent unmaps its own).
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "runtime/rt_core.h"
#include "runtime/stream_internal.h"

namespace aclmock {
namespace {
constexpr size_t kMaxPending = 4096;   // far below vm.max_map_count (65530 by default)

// The CPUs of the thread that loaded this library (the process's, before any world bound a thread).
struct LoadAffinity {
    cpu_set_t cpus;
    bool known = false;
    LoadAffinity() { known = sched_getaffinity(0, sizeof cpus, &cpus) == 0; }
};
const LoadAffinity g_load_affinity;

struct Unmapper {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<void *, size_t>> pending;
    bool started = false;
    bool forked_child = false;   // this process is a fork()ed child: no thread, unmap at once
};

Unmapper &unmapper() {
    static Unmapper *u = [] {
        auto *p = new Unmapper;   // never destroyed: its thread runs until the process ends
        pthread_atfork([] { unmapper().mu.lock(); }, [] { unmapper().mu.unlock(); },
                       [] {
                           Unmapper &c = unmapper();
                           c.pending.clear();   // the parent's to unmap (the child leaves them mapped)
                           c.forked_child = true;
                           c.mu.unlock();
                       });
        return p;
    }();
    return *u;
}

void unmapper_loop(Unmapper *u) {
    pthread_setname_np(pthread_self(), "aclmock-unmap");
    // Inherited from whichever thread released first (in a thread world, a rank bound to one CPU and
    // running as a batch thread): this thread runs on the CPUs the process had and at the normal
    // policy, beside the ranks rather than between them.
    if (g_load_affinity.known) sched_setaffinity(0, sizeof g_load_affinity.cpus, &g_load_affinity.cpus);
    sched_param normal{};
    sched_setscheduler(0, SCHED_OTHER, &normal);
    std::unique_lock<std::mutex> lk(u->mu);
    for (;;) {
        u->cv.wait(lk, [&] { return !u->pending.empty(); });
        const auto [addr, len] = u->pending.front();
        u->pending.pop_front();
        lk.unlock();
        munmap(addr, len);
        lk.lock();
    }
}
}  // namespace

void unmap_later(void *addr, size_t len) {
    if (!addr || len == 0) return;
    Unmapper &u = unmapper();
    {
        std::lock_guard<std::mutex> lk(u.mu);
        if (!u.forked_child && u.pending.size() < kMaxPending) {
            if (!u.started) {
                pin_library();   // the thread runs this library's code until the process ends
                std::thread(unmapper_loop, &u).detach();
                u.started = true;
            }
            u.pending.emplace_back(addr, len);
            u.cv.notify_one();
            return;
        }
    }
    munmap(addr, len);
}

}  // namespace aclmock
