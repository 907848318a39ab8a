// Helpers shared between the source files of libnnopbase (not part of executor.h's contract).
#pragma once

#include <cstddef>

namespace aclmock {
size_t live_executor_count();
}  // namespace aclmock
