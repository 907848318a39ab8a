// Liveness of the processes that own ranks: whether a pid still runs (zombies count as dead).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {

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

}  // namespace hccl
}  // namespace aclmock
