// Liveness of the processes that own ranks: whether a pid still runs (zombies count as dead).
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {

namespace {
// This process's pid, read once and again in a forked child: liveness checks run in every wait, and
// a system call each time adds up to millions in a large world.
std::atomic<int32_t> g_own_pid{0};
void refresh_own_pid() { g_own_pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed); }
std::atomic<uint64_t> g_probes{0};   // other processes probed (the system calls below)
}  // namespace

uint64_t liveness_probes() { return g_probes.load(std::memory_order_relaxed); }

int32_t own_pid() {
    static std::once_flag once;
    std::call_once(once, [] {
        refresh_own_pid();
        pthread_atfork(nullptr, nullptr, refresh_own_pid);
    });
    return g_own_pid.load(std::memory_order_relaxed);
}

bool pid_alive(int32_t pid) {
    if (pid <= 0) return false;
    if (pid == own_pid()) return true;
    g_probes.fetch_add(1, std::memory_order_relaxed);
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

uint64_t pid_namespace() {
    // Read once: a process never changes pid namespace (unshare affects only its children).
    static const uint64_t ns = [] {
        struct stat st;
        return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
    }();
    return ns;
}

bool process_gone(int32_t pid, uint64_t pid_ns) {
    // pid 0: a slot whose owner has not written its pid yet.
    return pid > 0 && pid_ns == pid_namespace() && !pid_alive(pid);
}

}  // namespace hccl
}  // namespace aclmock
