// Helpers of the runtime shared between its own source files (not part of rt_core.h's contract).
#pragma once

#include "runtime/rt_core.h"

namespace aclmock {

// enqueue() of a task that cannot block, reporting its ticket (1-based position in the stream's queue
// history). `waited_at_once`: the caller calls wait_ticket right after, which runs or starts it, so the
// queue is not listed for a later start (a pageable copy, which returns once it has run).
ACLMOCK_API aclError enqueue_ticket(Stream *s, Task task, const char *name, uint64_t *ticket, bool waited_at_once);
// Blocks until the task with that ticket has run (and its captures were released).
ACLMOCK_API void wait_ticket(Stream *s, uint64_t ticket);
// Keeps this library loaded until the process ends (RTLD_NODELETE): called before starting a
// worker thread or registering fork handlers, whose code must outlive any dlclose.
ACLMOCK_API void pin_library();
// The same for the shared library that contains `addr` (for the other mock libraries).
ACLMOCK_API void pin_library_of(const void *addr);

}  // namespace aclmock
