// The combine operator behind every generation's entry point (private to mock/ops): each
// aclnnMoeDistributeCombine* GetWorkspaceSize maps its argument list onto CombineArgs and
// CombineAttrs and calls combine_phase1 (combine_v5.cpp: checks, executor, kernel).
#pragma once

#include <cstdint>

#include "aclnn/executor.h"
#include "ops/moe_checks.h"

#pragma GCC visibility push(hidden)

namespace aclmock {
namespace moe {

// input slots (aclSetInputTensorAddr indices), in the operator's input order; a generation without
// an input passes NULL for it
enum CombineIn {
    kCtx, kExpandX, kIds, kAssist, kSendCounts, kEScales, kTpSend, kMask, kActScale, kWScale, kGroupList,
    kExpandScales, kSharedX, kElastic, kOriX, kAlpha1, kAlpha2, kConstV, kPerf, kNumIn
};

// The tensor arguments of one phase-1 call: the inputs in slot order, and x_out.
struct CombineArgs {
    const aclTensor *in[kNumIn];
    aclTensor *x_out;
    const aclTensor *operator[](int i) const { return in[i]; }
};

// The attributes as passed (the MoeParams attributes, generation, op and group strings included).
struct CombineAttrs : MoeParams {
    int64_t comm_quant = 0;
    int64_t out_dtype = 0, group_list_type = 0;   // reserved attributes
};

aclnnStatus combine_phase1(const CombineArgs &a, const CombineAttrs &attrs, uint64_t *workspace_size,
                           aclOpExecutor **executor);

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
