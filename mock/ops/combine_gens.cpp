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

// The attributes every group-string generation has, in their common order.
struct GroupAttrs {
    const char *group_ep;
    int64_t W, r, E;
    const char *group_tp;
    int64_t tp_world, tp_rank, shard, S, R, global_bs, out_dtype, comm_quant, group_list_type;
    const char *comm_alg;
    int64_t Z, C, Q;
};

aclnnStatus group_combine(int generation, const char *op, const CombineArgs &a, const GroupAttrs &g,
                          uint64_t *workspace_size, aclOpExecutor **executor) {
    CombineAttrs p;
    p.generation = generation;
    p.op = op;
    if (int rc = group_arg(g.group_ep, "group_ep", &p.group_ep)) return rc;
    // group_tp is optional: NULL or "" mean no TP communicator
    if (g.group_tp && g.group_tp[0])
        if (int rc = group_arg(g.group_tp, "group_tp", &p.group_tp)) return rc;
    p.W = g.W; p.r = g.r; p.E = g.E;
    p.tp_world = g.tp_world; p.tp_rank = g.tp_rank; p.shard = g.shard;
    p.S_attr = g.S; p.R = g.R; p.global_bs = g.global_bs;
    p.Z = g.Z; p.C = g.C; p.Q = g.Q;
    p.comm_alg = g.comm_alg ? g.comm_alg : "";
    p.comm_quant = g.comm_quant; p.out_dtype = g.out_dtype; p.group_list_type = g.group_list_type;
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
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, outDtype, commQuantMode,
                       groupListType, nullptr, 0, 0, 0};
    return group_combine(1, "aclnnMoeDistributeCombine", a, g, workspaceSize, executor);
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
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, outDtype, commQuantMode,
                       groupListType, commAlg, 0, 0, 0};
    return group_combine(2, "aclnnMoeDistributeCombineV2", a, g, workspaceSize, executor);
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
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, outDtype, commQuantMode,
                       groupListType, commAlg, zeroExpertNum, copyExpertNum, constExpertNum};
    return group_combine(3, "aclnnMoeDistributeCombineV3", a, g, workspaceSize, executor);
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
                       expertShardType, sharedExpertNum, sharedExpertRankNum, globalBs, outDtype, commQuantMode,
                       groupListType, commAlg, zeroExpertNum, copyExpertNum, constExpertNum};
    return group_combine(4, "aclnnMoeDistributeCombineV4", a, g, workspaceSize, executor);
}

extern "C" ACLMOCK_API aclnnStatus aclnnMoeDistributeCombineV4(void *workspace, uint64_t workspaceSize,
                                                               aclOpExecutor *executor, aclrtStream stream) {
    return launch_executor(executor, workspace, workspaceSize, stream, "aclnnMoeDistributeCombineV4");
}
