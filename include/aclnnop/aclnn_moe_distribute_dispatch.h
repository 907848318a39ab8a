/*
 * aclnn-py: MoE expert-parallel dispatch, first generation: expandIdx (BS * K,) gives each (token,
 * k) pair's position in its expert's receive block. The communicators are named by group strings
 * (HcclGetCommName): groupEp, and groupTp for an optional TP domain of two ranks (the EP all-to-
 * all, then the TP all-gather). Semantics: docs/operators.md, "Group-string generations". Phase 1
 * validates, sizes the workspace and creates the executor; phase 2 launches on a stream; a normal
 * executor is consumed by phase 2.
 */
#ifndef ACLNN_PY_ACLNN_MOE_DISTRIBUTE_DISPATCH_H
#define ACLNN_PY_ACLNN_MOE_DISTRIBUTE_DISPATCH_H

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

aclnnStatus aclnnMoeDistributeDispatchGetWorkspaceSize(
    const aclTensor *x,
    const aclTensor *expertIds,
    const aclTensor *scales,
    const aclTensor *xActiveMask,
    const aclTensor *expertScales,
    const char *groupEp,
    int64_t epWorldSize,
    int64_t epRankId,
    int64_t moeExpertNum,
    const char *groupTp,
    int64_t tpWorldSize,
    int64_t tpRankId,
    int64_t expertShardType,
    int64_t sharedExpertNum,
    int64_t sharedExpertRankNum,
    int64_t quantMode,
    int64_t globalBs,
    int64_t expertTokenNumsType,
    aclTensor *expandX,
    aclTensor *dynamicScales,
    aclTensor *expandIdx,
    aclTensor *expertTokenNums,
    aclTensor *epRecvCounts,
    aclTensor *tpRecvCounts,
    aclTensor *expandScales,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);

aclnnStatus aclnnMoeDistributeDispatch(void *workspace, uint64_t workspaceSize,
    aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
