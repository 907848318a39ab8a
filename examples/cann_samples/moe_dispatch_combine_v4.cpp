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

    const sample::Tokens host = sample::RoutedTokens(args.rankId, args.rankId, BS, H, K, MOE_EXPERT_NUM);
    sample::TokenTensors tok;
    sample::DispatchOutputs out;
    DeviceTensor xOut;
    CHECK_RET(tok.Create(host, BS, H, K) == 0, return -1);
    CHECK_RET(out.Create(A, H, LOCAL_EXPERT_NUM, EP_WORLD_SIZE, 1, 1) == 0, return -1);
    CHECK_RET(xOut.Create(std::vector<uint16_t>(), {BS, H}, ACL_BF16) == 0, return -1);

    const int64_t tpWorldSize = 0, tpRankId = 0, expertShardType = 0, sharedExpertNum = 0, sharedExpertRankNum = 0;
    const int64_t quantMode = 0, expertTokenNumsType = 1, outDtype = 0, commQuantMode = 0, groupListType = 0;
    const int64_t zeroExpertNum = 0, copyExpertNum = 0, constExpertNum = 0;
    const char *commAlg = "";

    uint64_t dispatchWorkspaceSize = 0;
    aclOpExecutor *dispatchExecutor = nullptr;
    void *dispatchWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeDispatchV4GetWorkspaceSize(
        tok.x.tensor, tok.expertIds.tensor, nullptr, nullptr, nullptr, nullptr, nullptr /* performanceInfo */,
        hcomEpName, EP_WORLD_SIZE, args.rankId,
        MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType, sharedExpertNum, sharedExpertRankNum, quantMode,
        GLOBAL_BS, expertTokenNumsType, commAlg, zeroExpertNum, copyExpertNum, constExpertNum, out.expandX.tensor,
        out.dynamicScales.tensor, out.assistInfo.tensor, out.expertTokenNums.tensor, out.epRecvCounts.tensor,
        out.tpRecvCounts.tensor,
        out.expandScales.tensor, &dispatchWorkspaceSize, &dispatchExecutor));
    if (dispatchWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&dispatchWorkspaceAddr, dispatchWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(
        aclnnMoeDistributeDispatchV4(dispatchWorkspaceAddr, dispatchWorkspaceSize, dispatchExecutor, args.stream));

    uint64_t combineWorkspaceSize = 0;
    aclOpExecutor *combineExecutor = nullptr;
    void *combineWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeCombineV4GetWorkspaceSize(
        out.expandX.tensor, tok.expertIds.tensor, out.assistInfo.tensor, out.epRecvCounts.tensor,
        tok.expertScales.tensor, nullptr,
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

    CHECK_RET(sample::CheckXBack(xOut, host.x, args.rankId) == 0, return -1);
    LOG_PRINT("[INFO] rank %d: aclnnMoeDistributeDispatchV4 and aclnnMoeDistributeCombineV4 execute successfully\n",
              args.rankId);

    if (dispatchWorkspaceAddr) aclrtFree(dispatchWorkspaceAddr);
    if (combineWorkspaceAddr) aclrtFree(combineWorkspaceAddr);
    tok.Release();
    out.Release();
    for (DeviceTensor *t : {&xOut}) t->Release();
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
