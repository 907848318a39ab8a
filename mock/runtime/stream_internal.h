// Helpers of the runtime shared between its own source files (not part of rt_core.h's contract).
#pragma once

#include "runtime/rt_core.h"

namespace aclmock {

// enqueue() of a task that cannot block, then runs or waits for the stream's work up to it (the
// caller's thread runs what it may): for a pageable copy, which returns once it has run. The queue is
// not listed for a later start, as the caller starts it now.
ACLMOCK_API aclError enqueue_and_wait(Stream *s, Task task, const char *name);
// Keeps this library loaded until the process ends (RTLD_NODELETE): called before starting a
// worker thread or registering fork handlers, whose code must outlive any dlclose.
ACLMOCK_API void pin_library();
// The same for the shared library that contains `addr` (for the other mock libraries).
ACLMOCK_API void pin_library_of(const void *addr);

}  // namespace aclmock
