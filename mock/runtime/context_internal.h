// The runtime's per-thread binding (device + context) and device references, shared by device.cpp,
// context.cpp and stream.cpp (not part of rt_core.h's contract).
#pragma once

#include <cstdint>

#include "runtime/rt_core.h"

namespace aclmock {

// ---- device references (device.cpp) -----------------------------------------------------------
bool valid_device(int32_t id);
void take_device_ref(int32_t dev);
// Drops one reference; the references left, or -1 (nothing dropped) when the device held none.
// When the count reaches 0 the device's default-context streams are released.
int64_t drop_device_ref(int32_t dev);
int64_t device_refs(int32_t dev);

// ---- the calling thread's binding (context.cpp) ------------------------------------------------
// aclrtSetDevice: the thread works on `dev` in the device's default context (-1: on none).
void bind_thread_to_device(int32_t dev);
// The id of the thread's explicit context, 0 for a device's default context.
uint64_t current_context_id();

// ---- streams (stream.cpp) -----------------------------------------------------------------------
// Destroys the streams created on `dev` in context `ctx` (0: the default context), after their
// queued work has run. Their handles then fail with ACL_ERROR_RT_INVALID_HANDLE.
void release_streams_of(int32_t dev, uint64_t ctx);

}  // namespace aclmock
