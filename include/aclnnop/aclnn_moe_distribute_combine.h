/*
 * aclnn-py: MoE expert-parallel combine, first generation: each (token, k) pair's expert row is
 * found through dispatch's expandIdx. The communicators are named by group strings
 * (HcclGetCommName): groupEp, and groupTp for an optional TP domain of two ranks (the TP reduce-
 * scatter, then the EP all-to-all). Semantics: docs/operators.md, "Group-string generations".
 * Phase 1 validates, sizes the workspace and creates the executor; phase 2 launches on a stream; a
 * normal executor is consumed by phase 2.
 */
#ifndef ACLNN_PY_ACLNN_MOE_DISTRIBUTE_COMBINE_H
#define ACLNN_PY_ACLNN_MOE_DISTRIBUTE_COMBINE_H

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

aclnnStatus aclnnMoeDistributeCombineGetWorkspaceSize(
    const aclTensor *expandX,
    const aclTensor *expertIds,
    const aclTensor *expandIdx,
    const aclTensor *epSendCounts,
    const aclTensor *expertScales,
    const aclTensor *tpSendCounts,
    const aclTensor *xActiveMask,
    const aclTensor *activationScale,
    const aclTensor *weightScale,
    const aclTensor *groupList,
    const aclTensor *expandScales,
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
    int64_t globalBs,
    int64_t outDtype,
    int64_t commQuantMode,
    int64_t groupListType,
    aclTensor *x,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);

aclnnStatus aclnnMoeDistributeCombine(void *workspace, uint64_t workspaceSize,
    aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
