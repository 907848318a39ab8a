// aclnnMoeDistributeCombine (the first generation) and V2 / V3 / V4 on the mock: the argument
// lists of the group-string generations (docs/operators.md, "Group-string generations"), mapped
// onto the one combine operator (combine.h). The first generation takes dispatch's expand_idx and
// has no shared_expert_x and no comm_alg; V2 has no elastic_info and no zero / copy / const experts
// (nor their ori_x / const-expert tensors), V3 adds them, V4 adds performance_info.
#include "aclnnop/aclnn_moe_distribute_combine.h"
#include "aclnnop/aclnn_moe_distribute_combine_v2.h"
#include "aclnnop/aclnn_moe_distribute_combine_v3.h"
#include "aclnnop/aclnn_moe_distribute_combine_v4.h"
#include "ops/combine.h"
#include "ops/moe_generations.h"

using namespace aclmock;
using namespace aclmock::moe;

namespace {

// Phase 1 of generation `generation` (`op`) with the attributes of every group-string generation
// and combine's own three.
aclnnStatus group_combine(int generation, const char *op, const CombineArgs &a, const GroupAttrs &g,
                          int64_t out_dtype, int64_t comm_quant, int64_t group_list_type, uint64_t *workspace_size,
                          aclOpExecutor **executor) {
    CombineAttrs p;
    if (int rc = group_attrs(generation, op, g, &p)) return rc;
    p.comm_quant = comm_quant; p.out_dtype = out_dtype; p.group_list_type = group_list_type;
    return combine_phase1(a, p, workspace_size, executor);
}

}  // namespace

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineGetWorkspaceSize(
    const aclTensor *expandX, const aclTensor *expertIds, const aclTensor *expandIdx, const aclTensor *epSendCounts,
    const aclTensor *expertScales, const aclTensor *tpSendCounts, const aclTensor *xActiveMask,
    const aclTensor *activationScale, const aclTensor *weightScale, const aclTensor *groupList,
    const aclTensor *expandScales, const char *groupEp, int64_t epWorldSize, int64_t epRankId, int64_t moeExpertNum,
    const char *groupTp, int64_t tpWorldSize, int64_t tpRankId, int64_t expertShardType, int64_t sharedExpertNum,
    int64_t sharedExpertRankNum, int64_t globalBs, int64_t outDtype, int64_t commQuantMode, int64_t groupListType,
    aclTensor *x, uint64_t *workspaceSize, aclOpExecutor **executor) {
    // aclnnMoeDistributeCombine.md: xActiveMask is reserved
    if (xActiveMask)
        return bad("x_active_mask", "must be NULL for aclnnMoeDistributeCombine (got a %s tensor)",
                   dims_str(xActiveMask).c_str());
    const CombineArgs a{{nullptr, expandX, expertIds, expandIdx, epSendCounts, expertScales, tpSendCounts, nullptr,
                         activationScale, weightScale, groupList, expandScales, nullptr, nullptr, nullptr, nullptr,
                         nullptr, nullptr, nullptr},
                        x};
    const GroupAttrs g{groupEp, epWorldSize, epRankId, moeExpertNum, groupTp, tpWorldSize, tpRankId,
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, nullptr, 0, 0, 0};
    return group_combine(1, "aclnnMoeDistributeCombine", a, g, outDtype, commQuantMode, groupListType,
                         workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombine(void *workspace, uint64_t workspaceSize,
                                                             aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeCombine");
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV2GetWorkspaceSize(
    const aclTensor *expandX, const aclTensor *expertIds, const aclTensor *assistInfoForCombine,
    const aclTensor *epSendCounts, const aclTensor *expertScales, const aclTensor *tpSendCountsOptional,
    const aclTensor *xActiveMaskOptional, const aclTensor *activationScaleOptional,
    const aclTensor *weightScaleOptional, const aclTensor *groupListOptional, const aclTensor *expandScalesOptional,
    const aclTensor *sharedExpertXOptional, const char *groupEp, int64_t epWorldSize, int64_t epRankId,
    int64_t moeExpertNum, const char *groupTp, int64_t tpWorldSize, int64_t tpRankId, int64_t expertShardType,
    int64_t sharedExpertNum, int64_t sharedExpertRankNum, int64_t globalBs, int64_t outDtype,
    int64_t commQuantMode, int64_t groupListType, const char *commAlg, aclTensor *xOut, uint64_t *workspaceSize,
    aclOpExecutor **executor) {
    const CombineArgs a{{nullptr, expandX, expertIds, assistInfoForCombine, epSendCounts, expertScales,
                         tpSendCountsOptional, xActiveMaskOptional, activationScaleOptional, weightScaleOptional,
                         groupListOptional, expandScalesOptional, sharedExpertXOptional, nullptr, nullptr, nullptr,
                         nullptr, nullptr, nullptr},
                        xOut};
    const GroupAttrs g{groupEp, epWorldSize, epRankId, moeExpertNum, groupTp, tpWorldSize, tpRankId,
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, commAlg, 0, 0, 0};
    return group_combine(2, "aclnnMoeDistributeCombineV2", a, g, outDtype, commQuantMode, groupListType,
                         workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV2(void *workspace, uint64_t workspaceSize,
                                                               aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeCombineV2");
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV3GetWorkspaceSize(
    const aclTensor *expandX, const aclTensor *expertIds, const aclTensor *assistInfoForCombine,
    const aclTensor *epSendCounts, const aclTensor *expertScales, const aclTensor *tpSendCountsOptional,
    const aclTensor *xActiveMaskOptional, const aclTensor *activationScaleOptional,
    const aclTensor *weightScaleOptional, const aclTensor *groupListOptional, const aclTensor *expandScalesOptional,
    const aclTensor *sharedExpertXOptional, const aclTensor *elasticInfoOptional, const aclTensor *oriXOptional,
    const aclTensor *constExpertAlpha1Optional, const aclTensor *constExpertAlpha2Optional,
    const aclTensor *constExpertVOptional, const char *groupEp, int64_t epWorldSize, int64_t epRankId,
    int64_t moeExpertNum, const char *groupTp, int64_t tpWorldSize, int64_t tpRankId, int64_t expertShardType,
    int64_t sharedExpertNum, int64_t sharedExpertRankNum, int64_t globalBs, int64_t outDtype,
    int64_t commQuantMode, int64_t groupListType, const char *commAlg, int64_t zeroExpertNum, int64_t copyExpertNum,
    int64_t constExpertNum, aclTensor *xOut, uint64_t *workspaceSize, aclOpExecutor **executor) {
    const CombineArgs a{{nullptr, expandX, expertIds, assistInfoForCombine, epSendCounts, expertScales,
                         tpSendCountsOptional, xActiveMaskOptional, activationScaleOptional, weightScaleOptional,
                         groupListOptional, expandScalesOptional, sharedExpertXOptional, elasticInfoOptional,
                         oriXOptional, constExpertAlpha1Optional, constExpertAlpha2Optional, constExpertVOptional,
                         nullptr},
                        xOut};
    const GroupAttrs g{groupEp, epWorldSize, epRankId, moeExpertNum, groupTp, tpWorldSize, tpRankId,
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, commAlg, zeroExpertNum,
                       copyExpertNum, constExpertNum};
    return group_combine(3, "aclnnMoeDistributeCombineV3", a, g, outDtype, commQuantMode, groupListType,
                         workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV3(void *workspace, uint64_t workspaceSize,
                                                               aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeCombineV3");
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV4GetWorkspaceSize(
    const aclTensor *expandX, const aclTensor *expertIds, const aclTensor *assistInfoForCombine,
    const aclTensor *epSendCounts, const aclTensor *expertScales, const aclTensor *tpSendCountsOptional,
    const aclTensor *xActiveMaskOptional, const aclTensor *activationScaleOptional,
    const aclTensor *weightScaleOptional, const aclTensor *groupListOptional, const aclTensor *expandScalesOptional,
    const aclTensor *sharedExpertXOptional, const aclTensor *elasticInfoOptional, const aclTensor *oriXOptional,
    const aclTensor *constExpertAlpha1Optional, const aclTensor *constExpertAlpha2Optional,
    const aclTensor *constExpertVOptional, const aclTensor *performanceInfoOptional, const char *groupEp,
    int64_t epWorldSize, int64_t epRankId, int64_t moeExpertNum, const char *groupTp, int64_t tpWorldSize,
    int64_t tpRankId, int64_t expertShardType, int64_t sharedExpertNum, int64_t sharedExpertRankNum,
    int64_t globalBs, int64_t outDtype, int64_t commQuantMode, int64_t groupListType, const char *commAlg,
    int64_t zeroExpertNum, int64_t copyExpertNum, int64_t constExpertNum, aclTensor *xOut, uint64_t *workspaceSize,
    aclOpExecutor **executor) {
    const CombineArgs a{{nullptr, expandX, expertIds, assistInfoForCombine, epSendCounts, expertScales,
                         tpSendCountsOptional, xActiveMaskOptional, activationScaleOptional, weightScaleOptional,
                         groupListOptional, expandScalesOptional, sharedExpertXOptional, elasticInfoOptional,
                         oriXOptional, constExpertAlpha1Optional, constExpertAlpha2Optional, constExpertVOptional,
                         performanceInfoOptional},
                        xOut};
    const GroupAttrs g{groupEp, epWorldSize, epRankId, moeExpertNum, groupTp, tpWorldSize, tpRankId,
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, commAlg, zeroExpertNum,
                       copyExpertNum, constExpertNum};
    return group_combine(4, "aclnnMoeDistributeCombineV4", a, g, outDtype, commQuantMode, groupListType,
                         workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV4(void *workspace, uint64_t workspaceSize,
                                                               aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeCombineV4");
}
