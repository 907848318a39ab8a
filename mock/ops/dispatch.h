// The dispatch operator behind every generation's entry point (private to mock/ops): each
// aclnnMoeDistributeDispatch* GetWorkspaceSize maps its argument list onto DispatchArgs and
// DispatchAttrs and calls dispatch_phase1 (dispatch_v5.cpp: checks, executor, kernel).
#pragma once

#include <cstdint>

#include "aclnn/executor.h"
#include "ops/moe_checks.h"

#pragma GCC visibility push(hidden)

namespace aclmock {
namespace moe {

// The tensor arguments of one phase-1 call, named as in docs/operators.md; a generation without
// an argument passes NULL for it.
struct DispatchArgs {
    const aclTensor *context, *x, *expert_ids, *scales, *x_active_mask, *expert_scales, *elastic_info,
        *performance_info;
    aclTensor *expand_x, *dynamic_scales, *assist_info, *expert_token_nums, *ep_recv_counts, *tp_recv_counts,
        *expand_scales;
};

// The attributes as passed (the MoeParams attributes, generation, op and group strings included).
struct DispatchAttrs : MoeParams {
    int64_t quant = 0;
    int64_t ent_type = 1;          // expert_token_nums_type
};

aclnnStatus dispatch_phase1(const DispatchArgs &a, const DispatchAttrs &attrs, uint64_t *workspace_size,
                            aclOpExecutor **executor);

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
