// Waiting helpers of the mock HCCL: the clock, the back-off of polling loops, and futexes on shared
// memory for the long waits.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <thread>

#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {

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

void futex_wait(std::atomic<uint32_t> *word, uint32_t seen, double seconds) {
    static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word");
    if (seconds <= 0) return;
    struct timespec ts;
    ts.tv_sec = static_cast<time_t>(seconds);
    ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
    // Not FUTEX_PRIVATE_FLAG: the word may be in memory shared with other processes.
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t> *word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace hccl
}  // namespace aclmock
