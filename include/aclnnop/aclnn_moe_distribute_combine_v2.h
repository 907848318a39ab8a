/*
 * aclnn-py: MoE expert-parallel combine, generation 2: assistInfoForCombine (A * 128,),
 * sharedExpertXOptional and commAlg. The communicators are named by group strings
 * (HcclGetCommName): groupEp, and groupTp for an optional TP domain of two ranks (the TP reduce-
 * scatter, then the EP all-to-all). Semantics: docs/operators.md, "Group-string generations".
 * Phase 1 validates, sizes the workspace and creates the executor; phase 2 launches on a stream; a
 * normal executor is consumed by phase 2.
 */
#ifndef ACLNN_PY_ACLNN_MOE_DISTRIBUTE_COMBINE_V2_H
#define ACLNN_PY_ACLNN_MOE_DISTRIBUTE_COMBINE_V2_H

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

aclnnStatus aclnnMoeDistributeCombineV2GetWorkspaceSize(
    const aclTensor *expandX,
    const aclTensor *expertIds,
    const aclTensor *assistInfoForCombine,
    const aclTensor *epSendCounts,
    const aclTensor *expertScales,
    const aclTensor *tpSendCountsOptional,
    const aclTensor *xActiveMaskOptional,
    const aclTensor *activationScaleOptional,
    const aclTensor *weightScaleOptional,
    const aclTensor *groupListOptional,
    const aclTensor *expandScalesOptional,
    const aclTensor *sharedExpertXOptional,
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
    const char *commAlg,
    aclTensor *xOut,
    uint64_t *workspaceSize,
    aclOpExecutor **executor);

aclnnStatus aclnnMoeDistributeCombineV2(void *workspace, uint64_t workspaceSize,
    aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
