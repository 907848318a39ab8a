// A CANN-style op sample for aclnnMoeDistributeDispatchV4 / aclnnMoeDistributeCombineV4 on Atlas A3,
// EP 8, written the way CANN's public A3 op samples are: aclInit; per device aclrtSetDevice, a context
// and a stream; one HcclCommInitAll for the EP domain; then one thread per device makes its context
// current, names its group with HcclGetCommName and runs both phases of dispatch, an identity expert
// and both phases of combine, checks the result against the host's prediction and prints its success
// line (or the failed call with CANN's message). Build with CANN's example link line
// (docs/c_programs.md).
#include <memory>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_moe_distribute_combine_v4.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v4.h"
#include "hccl/hccl.h"
#include "sample_common.h"

using sample::DeviceTensor;

namespace {

constexpr int EP_WORLD_SIZE = 8;
constexpr int64_t BS = 8;
constexpr int64_t H = 2048;
constexpr int64_t K = 4;
constexpr int64_t MOE_EXPERT_NUM = 16;
constexpr int64_t LOCAL_EXPERT_NUM = MOE_EXPERT_NUM / EP_WORLD_SIZE;
constexpr int64_t GLOBAL_BS = BS * EP_WORLD_SIZE;
constexpr int64_t A = GLOBAL_BS * (LOCAL_EXPERT_NUM < K ? LOCAL_EXPERT_NUM : K);

struct Args {
    int rankId;
    HcclComm comm;
    aclrtStream stream;
    aclrtContext context;
    int result = -1;
};

int LaunchOneThreadDispatchV4AndCombineV4(Args &args) {
    CHECK_CALL(aclrtSetCurrentContext(args.context));
    char hcomEpName[COMM_NAME_MAX_LENGTH] = {0};
    CHECK_CALL(HcclGetCommName(args.comm, hcomEpName));

    std::vector<uint16_t> xHost(BS * H);
    std::vector<int32_t> expertIdsHost(BS * K);
    std::vector<float> expertScalesHost(BS * K);
    const std::vector<float> w = sample::TopkWeights(K);
    for (int t = 0; t < BS; ++t) {
        for (int h = 0; h < H; ++h) xHost[t * H + h] = sample::ToBf16(sample::TokenValue(args.rankId, BS, t));
        for (int k = 0; k < K; ++k) {
            expertIdsHost[t * K + k] = sample::ExpertOf(args.rankId, t, k, MOE_EXPERT_NUM);
            expertScalesHost[t * K + k] = w[k];
        }
    }
    DeviceTensor x, expertIds, expertScales, expandX, dynamicScales, assistInfo, expertTokenNums, epRecvCounts,
        tpRecvCounts, expandScales, xOut;
    CHECK_RET(x.Create(xHost, {BS, H}, ACL_BF16) == 0, return -1);
    CHECK_RET(expertIds.Create(expertIdsHost, {BS, K}, ACL_INT32) == 0, return -1);
    CHECK_RET(expertScales.Create(expertScalesHost, {BS, K}, ACL_FLOAT) == 0, return -1);
    CHECK_RET(expandX.Create(std::vector<uint16_t>(), {A, H}, ACL_BF16) == 0, return -1);
    CHECK_RET(dynamicScales.Create(std::vector<float>(), {A}, ACL_FLOAT) == 0, return -1);
    CHECK_RET(assistInfo.Create(std::vector<int32_t>(), {A * 128}, ACL_INT32) == 0, return -1);
    CHECK_RET(expertTokenNums.Create(std::vector<int64_t>(), {LOCAL_EXPERT_NUM}, ACL_INT64) == 0, return -1);
    CHECK_RET(epRecvCounts.Create(std::vector<int32_t>(), {EP_WORLD_SIZE * LOCAL_EXPERT_NUM}, ACL_INT32) == 0,
              return -1);
    CHECK_RET(tpRecvCounts.Create(std::vector<int32_t>(), {1}, ACL_INT32) == 0, return -1);
    CHECK_RET(expandScales.Create(std::vector<float>(), {A}, ACL_FLOAT) == 0, return -1);
    CHECK_RET(xOut.Create(std::vector<uint16_t>(), {BS, H}, ACL_BF16) == 0, return -1);

    const int64_t tpWorldSize = 0, tpRankId = 0, expertShardType = 0, sharedExpertNum = 0, sharedExpertRankNum = 0;
    const int64_t quantMode = 0, expertTokenNumsType = 1, outDtype = 0, commQuantMode = 0, groupListType = 0;
    const int64_t zeroExpertNum = 0, copyExpertNum = 0, constExpertNum = 0;
    const char *commAlg = "";

    uint64_t dispatchWorkspaceSize = 0;
    aclOpExecutor *dispatchExecutor = nullptr;
    void *dispatchWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeDispatchV4GetWorkspaceSize(
        x.tensor, expertIds.tensor, nullptr, nullptr, nullptr, nullptr, nullptr /* performanceInfo */, hcomEpName, EP_WORLD_SIZE, args.rankId,
        MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType, sharedExpertNum, sharedExpertRankNum, quantMode,
        GLOBAL_BS, expertTokenNumsType, commAlg, zeroExpertNum, copyExpertNum, constExpertNum, expandX.tensor,
        dynamicScales.tensor, assistInfo.tensor, expertTokenNums.tensor, epRecvCounts.tensor, tpRecvCounts.tensor,
        expandScales.tensor, &dispatchWorkspaceSize, &dispatchExecutor));
    if (dispatchWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&dispatchWorkspaceAddr, dispatchWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(
        aclnnMoeDistributeDispatchV4(dispatchWorkspaceAddr, dispatchWorkspaceSize, dispatchExecutor, args.stream));

    uint64_t combineWorkspaceSize = 0;
    aclOpExecutor *combineExecutor = nullptr;
    void *combineWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeCombineV4GetWorkspaceSize(
        expandX.tensor, expertIds.tensor, assistInfo.tensor, epRecvCounts.tensor, expertScales.tensor, nullptr,
        nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
        nullptr /* performanceInfo */, hcomEpName,
        EP_WORLD_SIZE, args.rankId, MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType, sharedExpertNum,
        sharedExpertRankNum, GLOBAL_BS, outDtype, commQuantMode, groupListType, commAlg, zeroExpertNum, copyExpertNum,
        constExpertNum, xOut.tensor, &combineWorkspaceSize, &combineExecutor));
    if (combineWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&combineWorkspaceAddr, combineWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(
        aclnnMoeDistributeCombineV4(combineWorkspaceAddr, combineWorkspaceSize, combineExecutor, args.stream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.stream, 10000));

    std::vector<uint16_t> xOutHost;
    CHECK_RET(xOut.Download(&xOutHost) == 0, return -1);
    CHECK_RET(xOutHost == xHost,
              LOG_PRINT("[ERROR] rank %d: combine did not give x back (token 0: %g, x %g)\n", args.rankId,
                        sample::FromBf16(xOutHost[0]), sample::FromBf16(xHost[0]));
              return -1);
    LOG_PRINT("[INFO] rank %d: aclnnMoeDistributeDispatchV4 and aclnnMoeDistributeCombineV4 execute successfully\n",
              args.rankId);

    if (dispatchWorkspaceAddr) aclrtFree(dispatchWorkspaceAddr);
    if (combineWorkspaceAddr) aclrtFree(combineWorkspaceAddr);
    for (DeviceTensor *t : {&x, &expertIds, &expertScales, &expandX, &dynamicScales, &assistInfo, &expertTokenNums,
                            &epRecvCounts, &tpRecvCounts, &expandScales, &xOut})
        t->Release();
    CHECK_CALL(HcclCommDestroy(args.comm));
    CHECK_CALL(aclrtDestroyStream(args.stream));
    CHECK_CALL(aclrtDestroyContext(args.context));
    CHECK_CALL(aclrtResetDevice(args.rankId));
    return 0;
}

}  // namespace

int main() {
    CHECK_CALL(aclInit(nullptr));
    Args args[EP_WORLD_SIZE];
    int32_t devices[EP_WORLD_SIZE];
    for (int rankId = 0; rankId < EP_WORLD_SIZE; ++rankId) {
        devices[rankId] = rankId;
        args[rankId].rankId = rankId;
        CHECK_CALL(aclrtSetDevice(rankId));
        CHECK_CALL(aclrtCreateContext(&args[rankId].context, rankId));
        CHECK_CALL(aclrtCreateStream(&args[rankId].stream));
    }
    HcclComm comms[EP_WORLD_SIZE];
    CHECK_CALL(HcclCommInitAll(EP_WORLD_SIZE, devices, comms));
    std::vector<std::unique_ptr<std::thread>> threads(EP_WORLD_SIZE);
    for (int rankId = 0; rankId < EP_WORLD_SIZE; ++rankId) {
        Args &a = args[rankId];
        a.comm = comms[rankId];
        threads[rankId].reset(new std::thread([&a] { a.result = LaunchOneThreadDispatchV4AndCombineV4(a); }));
    }
    int failed = 0;
    for (int rankId = 0; rankId < EP_WORLD_SIZE; ++rankId) {
        threads[rankId]->join();
        failed += args[rankId].result != 0;
    }
    CHECK_CALL(aclFinalize());
    if (failed) {
        LOG_PRINT("[ERROR] %d of %d ranks failed\n", failed, EP_WORLD_SIZE);
        return 1;
    }
    return 0;
}
