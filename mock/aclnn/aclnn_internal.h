// Helpers shared between the source files of libnnopbase (not part of executor.h's contract).
#pragma once

#include <cstddef>

#include <string>

struct aclTensor;

namespace aclmock {
size_t live_executor_count();
// When a live executor that has not been launched yet holds `t` (phase 1 done, phase 2 not), sets
// *what to a description of that executor ("executor 0x.. of <op>, input 1") and returns true.
bool pending_executor_uses(const aclTensor *t, std::string *what);
}  // namespace aclmock
