// aclnnMoeDistributeDispatch (the first generation) and V2 / V3 / V4 on the mock: the argument
// lists of the group-string generations (docs/operators.md, "Group-string generations"), mapped
// onto the one dispatch operator (dispatch.h). The first generation returns expand_idx instead of
// assist_info_for_combine and has no comm_alg; V2 has no elastic_info and no zero / copy / const
// experts, V3 adds them, V4 adds performance_info.
#include "aclnnop/aclnn_moe_distribute_dispatch.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v2.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v3.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v4.h"
#include "ops/dispatch.h"
#include "ops/moe_generations.h"

using namespace aclmock;
using namespace aclmock::moe;

namespace {

// Phase 1 of generation `generation` (`op`) with the attributes of every group-string generation
// and dispatch's own two.
aclnnStatus group_dispatch(int generation, const char *op, const DispatchArgs &a, const GroupAttrs &g,
                           int64_t quant, int64_t ent_type, uint64_t *workspace_size, aclOpExecutor **executor) {
    DispatchAttrs p;
    if (int rc = group_attrs(generation, op, g, &p)) return rc;
    p.quant = quant; p.ent_type = ent_type;
    return dispatch_phase1(a, p, workspace_size, executor);
}

}  // namespace

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchGetWorkspaceSize(
    const aclTensor *x, const aclTensor *expertIds, const aclTensor *scales, const aclTensor *xActiveMask,
    const aclTensor *expertScales, const char *groupEp, int64_t epWorldSize, int64_t epRankId, int64_t moeExpertNum,
    const char *groupTp, int64_t tpWorldSize, int64_t tpRankId, int64_t expertShardType, int64_t sharedExpertNum,
    int64_t sharedExpertRankNum, int64_t quantMode, int64_t globalBs, int64_t expertTokenNumsType,
    aclTensor *expandX, aclTensor *dynamicScales, aclTensor *expandIdx, aclTensor *expertTokenNums,
    aclTensor *epRecvCounts, aclTensor *tpRecvCounts, aclTensor *expandScales, uint64_t *workspaceSize,
    aclOpExecutor **executor) {
    // aclnnMoeDistributeDispatch.md: xActiveMask is reserved; expertScales (BS, K) is an input, as in
    // the later generations (CANN's own sample passes it with expandScales of A entries)
    if (xActiveMask)
        return bad("x_active_mask", "must be NULL for aclnnMoeDistributeDispatch (got a %s tensor)",
                   dims_str(xActiveMask).c_str());
    const DispatchArgs a{nullptr, x, expertIds, scales, nullptr, expertScales, nullptr, nullptr, expandX, dynamicScales,
                         expandIdx, expertTokenNums, epRecvCounts, tpRecvCounts, expandScales};
    const GroupAttrs g{groupEp, epWorldSize, epRankId, moeExpertNum, groupTp, tpWorldSize, tpRankId,
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, nullptr, 0, 0, 0};
    return group_dispatch(1, "aclnnMoeDistributeDispatch", a, g, quantMode, expertTokenNumsType,
                          workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatch(void *workspace, uint64_t workspaceSize,
                                                              aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeDispatch");
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV2GetWorkspaceSize(
    const aclTensor *x, const aclTensor *expertIds, const aclTensor *scalesOptional,
    const aclTensor *xActiveMaskOptional, const aclTensor *expertScalesOptional, const char *groupEp,
    int64_t epWorldSize, int64_t epRankId, int64_t moeExpertNum, const char *groupTp, int64_t tpWorldSize,
    int64_t tpRankId, int64_t expertShardType, int64_t sharedExpertNum, int64_t sharedExpertRankNum,
    int64_t quantMode, int64_t globalBs, int64_t expertTokenNumsType, const char *commAlg, aclTensor *expandXOut,
    aclTensor *dynamicScalesOut, aclTensor *assistInfoForCombineOut, aclTensor *expertTokenNumsOut,
    aclTensor *epRecvCountsOut, aclTensor *tpRecvCountsOut, aclTensor *expandScalesOut, uint64_t *workspaceSize,
    aclOpExecutor **executor) {
    const DispatchArgs a{nullptr, x, expertIds, scalesOptional, xActiveMaskOptional, expertScalesOptional,
                         nullptr, nullptr, expandXOut, dynamicScalesOut, assistInfoForCombineOut,
                         expertTokenNumsOut, epRecvCountsOut, tpRecvCountsOut, expandScalesOut};
    const GroupAttrs g{groupEp, epWorldSize, epRankId, moeExpertNum, groupTp, tpWorldSize, tpRankId,
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, commAlg, 0, 0, 0};
    return group_dispatch(2, "aclnnMoeDistributeDispatchV2", a, g, quantMode, expertTokenNumsType,
                          workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV2(void *workspace, uint64_t workspaceSize,
                                                                aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeDispatchV2");
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV3GetWorkspaceSize(
    const aclTensor *x, const aclTensor *expertIds, const aclTensor *scalesOptional,
    const aclTensor *xActiveMaskOptional, const aclTensor *expertScalesOptional,
    const aclTensor *elasticInfoOptional, const char *groupEp, int64_t epWorldSize, int64_t epRankId,
    int64_t moeExpertNum, const char *groupTp, int64_t tpWorldSize, int64_t tpRankId, int64_t expertShardType,
    int64_t sharedExpertNum, int64_t sharedExpertRankNum, int64_t quantMode, int64_t globalBs,
    int64_t expertTokenNumsType, const char *commAlg, int64_t zeroExpertNum, int64_t copyExpertNum,
    int64_t constExpertNum, aclTensor *expandXOut, aclTensor *dynamicScalesOut, aclTensor *assistInfoForCombineOut,
    aclTensor *expertTokenNumsOut, aclTensor *epRecvCountsOut, aclTensor *tpRecvCountsOut,
    aclTensor *expandScalesOut, uint64_t *workspaceSize, aclOpExecutor **executor) {
    const DispatchArgs a{nullptr, x, expertIds, scalesOptional, xActiveMaskOptional, expertScalesOptional,
                         elasticInfoOptional, nullptr, expandXOut, dynamicScalesOut, assistInfoForCombineOut,
                         expertTokenNumsOut, epRecvCountsOut, tpRecvCountsOut, expandScalesOut};
    const GroupAttrs g{groupEp, epWorldSize, epRankId, moeExpertNum, groupTp, tpWorldSize, tpRankId,
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, commAlg, zeroExpertNum,
                       copyExpertNum, constExpertNum};
    return group_dispatch(3, "aclnnMoeDistributeDispatchV3", a, g, quantMode, expertTokenNumsType,
                          workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV3(void *workspace, uint64_t workspaceSize,
                                                                aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeDispatchV3");
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV4GetWorkspaceSize(
    const aclTensor *x, const aclTensor *expertIds, const aclTensor *scalesOptional,
    const aclTensor *xActiveMaskOptional, const aclTensor *expertScalesOptional,
    const aclTensor *elasticInfoOptional, const aclTensor *performanceInfoOptional, const char *groupEp,
    int64_t epWorldSize, int64_t epRankId, int64_t moeExpertNum, const char *groupTp, int64_t tpWorldSize,
    int64_t tpRankId, int64_t expertShardType, int64_t sharedExpertNum, int64_t sharedExpertRankNum,
    int64_t quantMode, int64_t globalBs, int64_t expertTokenNumsType, const char *commAlg, int64_t zeroExpertNum,
    int64_t copyExpertNum, int64_t constExpertNum, aclTensor *expandXOut, aclTensor *dynamicScalesOut,
    aclTensor *assistInfoForCombineOut, aclTensor *expertTokenNumsOut, aclTensor *epRecvCountsOut,
    aclTensor *tpRecvCountsOut, aclTensor *expandScalesOut, uint64_t *workspaceSize, aclOpExecutor **executor) {
    const DispatchArgs a{nullptr, x, expertIds, scalesOptional, xActiveMaskOptional, expertScalesOptional,
                         elasticInfoOptional, performanceInfoOptional, expandXOut, dynamicScalesOut,
                         assistInfoForCombineOut, expertTokenNumsOut, epRecvCountsOut, tpRecvCountsOut,
                         expandScalesOut};
    const GroupAttrs g{groupEp, epWorldSize, epRankId, moeExpertNum, groupTp, tpWorldSize, tpRankId,
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, commAlg, zeroExpertNum,
                       copyExpertNum, constExpertNum};
    return group_dispatch(4, "aclnnMoeDistributeDispatchV4", a, g, quantMode, expertTokenNumsType,
                          workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeDispatchV4(void *workspace, uint64_t workspaceSize,
                                                                aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeDispatchV4");
}
