// A CANN-style op sample for aclnnMoeDistributeDispatchV3 / aclnnMoeDistributeCombineV3 on Atlas A3
// with a dynamic shrink: four devices make one EP communicator (HcclCommInitAll); afterwards device 3
// is taken out of service, and the three others go on without rebuilding anything, passing
// elasticInfo (the ranks still taking part and their new ids). Device 3 never calls the operators.
// Combine gets dispatch's tpRecvCounts as tpSendCounts and groupListType 1 as CANN's newer samples
// pass them (no TP domain here: both are not read). Each live rank checks dispatch's row count and
// rows against the host's prediction and that combine, with an identity expert and top-k weights
// that sum to 1, gives x back; it prints one success line.
//
// Build and run (docs/c_programs.md), one line:
//   g++ -std=c++17 -I$ASCEND_HOME_PATH/include moe_dispatch_combine_v3_shrink.cpp
//       -L$ASCEND_HOME_PATH/lib64 -L$ASCEND_HOME_PATH/opp/vendors/<vendor>/op_api/lib
//       -lcust_opapi -lnnopbase -lhccl -lascendcl -pthread -o moe_v3_shrink
//   then ./moe_v3_shrink prints "[INFO] all 3 live ranks passed" and exits 0.
#include <memory>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_moe_distribute_combine_v3.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v3.h"
#include "hccl/hccl.h"
#include "sample_common.h"

using sample::DeviceTensor;

namespace {

constexpr uint32_t EP_WORLD_SIZE = 4;
constexpr uint32_t LEFT_OUT = 3;                       // the device taken out after the communicator was made
constexpr uint32_t LIVE = EP_WORLD_SIZE - 1;
constexpr int64_t BS = 4;
constexpr int64_t H = 1024;
constexpr int64_t K = 2;
constexpr int64_t MOE_EXPERT_NUM = EP_WORLD_SIZE;      // one expert per rank before the shrink
constexpr int64_t LIVE_EXPERT_NUM = LIVE;              // and after it: each MoE rank keeps its experts
constexpr int64_t LOCAL_EXPERT_NUM = 1;
constexpr int64_t GLOBAL_BS = BS * EP_WORLD_SIZE;
constexpr int64_t A = GLOBAL_BS * (LOCAL_EXPERT_NUM < K ? LOCAL_EXPERT_NUM : K);

struct Args {
    uint32_t rankId;
    HcclComm hcclEpComm;
    aclrtStream stream;
    aclrtContext context;
    int result = -1;
};

// [flag, ranks left, shared-expert ranks left, MoE experts left, new id of each rank (-1: out),
//  the rank of each new id]; the live ranks keep their order, so rank r < 3 is new id r
std::vector<int32_t> ElasticInfo() {
    std::vector<int32_t> info = {1, static_cast<int32_t>(LIVE), 0, static_cast<int32_t>(LIVE_EXPERT_NUM)};
    for (uint32_t r = 0; r < EP_WORLD_SIZE; ++r) info.push_back(r == LEFT_OUT ? -1 : static_cast<int32_t>(r));
    for (uint32_t r = 0; r < EP_WORLD_SIZE; ++r) info.push_back(r < LIVE ? static_cast<int32_t>(r) : 0);
    return info;
}

int64_t RowsFor(uint32_t me) {
    int64_t n = 0;
    for (uint32_t src = 0; src < LIVE; ++src)
        for (int t = 0; t < BS; ++t)
            for (int k = 0; k < K; ++k) n += sample::ExpertOf(src, t, k, LIVE_EXPERT_NUM) == static_cast<int32_t>(me);
    return n;
}

bool IsTokenOf(uint32_t me, float v) {
    for (uint32_t src = 0; src < LIVE; ++src)
        for (int t = 0; t < BS; ++t)
            for (int k = 0; k < K; ++k)
                if (sample::ExpertOf(src, t, k, LIVE_EXPERT_NUM) == static_cast<int32_t>(me) &&
                    sample::TokenValue(src, BS, t) == v)
                    return true;
    return false;
}

int LaunchOneThreadDispatchV3AndCombineV3(Args &args) {
    CHECK_CALL(aclrtSetCurrentContext(args.context));
    char hcomEpName[COMM_NAME_MAX_LENGTH] = {0};
    CHECK_CALL(HcclGetCommName(args.hcclEpComm, hcomEpName));

    const sample::Tokens host = sample::RoutedTokens(args.rankId, args.rankId, BS, H, K, LIVE_EXPERT_NUM);
    sample::TokenTensors tok;
    sample::DispatchOutputs out;
    DeviceTensor elasticInfo, xOut;
    CHECK_RET(tok.Create(host, BS, H, K) == 0, return -1);
    CHECK_RET(elasticInfo.Create(ElasticInfo(), {4 + 2 * EP_WORLD_SIZE}, ACL_INT32) == 0, return -1);
    CHECK_RET(out.Create(A, H, LOCAL_EXPERT_NUM, EP_WORLD_SIZE, 1, 1) == 0, return -1);
    CHECK_RET(xOut.Create(std::vector<uint16_t>(), {BS, H}, ACL_BF16) == 0, return -1);

    const int64_t tpWorldSize = 0, tpRankId = 0, expertShardType = 0, sharedExpertNum = 0, sharedExpertRankNum = 0;
    const int64_t quantMode = 0, expertTokenNumsType = 0, outDtype = 0, commQuantMode = 0, groupListType = 1;
    const int64_t zeroExpertNum = 0, copyExpertNum = 0, constExpertNum = 0;

    uint64_t dispatchWorkspaceSize = 0;
    aclOpExecutor *dispatchExecutor = nullptr;
    void *dispatchWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeDispatchV3GetWorkspaceSize(
        tok.x.tensor, tok.expertIds.tensor, nullptr, nullptr, nullptr, elasticInfo.tensor, hcomEpName, EP_WORLD_SIZE,
        args.rankId, MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType, sharedExpertNum,
        sharedExpertRankNum, quantMode, GLOBAL_BS, expertTokenNumsType, "", zeroExpertNum, copyExpertNum,
        constExpertNum, out.expandX.tensor, out.dynamicScales.tensor, out.assistInfo.tensor, out.expertTokenNums.tensor,
        out.epRecvCounts.tensor, out.tpRecvCounts.tensor, out.expandScales.tensor, &dispatchWorkspaceSize,
        &dispatchExecutor));
    if (dispatchWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&dispatchWorkspaceAddr, dispatchWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeDispatchV3(dispatchWorkspaceAddr, dispatchWorkspaceSize, dispatchExecutor,
                                            args.stream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.stream, 10000));

    std::vector<int64_t> tokenNums;
    std::vector<uint16_t> expandXHost;
    CHECK_RET(out.expertTokenNums.Download(&tokenNums) == 0 && out.expandX.Download(&expandXHost) == 0, return -1);
    const int64_t rows = tokenNums[LOCAL_EXPERT_NUM - 1];
    CHECK_RET(rows == RowsFor(args.rankId),
              LOG_PRINT("[ERROR] rank %u: %lld rows, the host expects %lld\n", args.rankId,
                        static_cast<long long>(rows), static_cast<long long>(RowsFor(args.rankId)));
              return -1);
    for (int64_t r = 0; r < rows; ++r)
        CHECK_RET(IsTokenOf(args.rankId, sample::FromBf16(expandXHost[r * H])),
                  LOG_PRINT("[ERROR] rank %u: row %lld of expandX is no token of its expert\n", args.rankId,
                            static_cast<long long>(r));
                  return -1);

    // the identity expert: expandX goes back as it came
    uint64_t combineWorkspaceSize = 0;
    aclOpExecutor *combineExecutor = nullptr;
    void *combineWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeCombineV3GetWorkspaceSize(
        out.expandX.tensor, tok.expertIds.tensor, out.assistInfo.tensor, out.epRecvCounts.tensor,
        tok.expertScales.tensor,
        out.tpRecvCounts.tensor, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, elasticInfo.tensor, nullptr,
        nullptr, nullptr, nullptr, hcomEpName, EP_WORLD_SIZE, args.rankId, MOE_EXPERT_NUM, "", tpWorldSize, tpRankId,
        expertShardType, sharedExpertNum, sharedExpertRankNum, GLOBAL_BS, outDtype, commQuantMode, groupListType, "",
        zeroExpertNum, copyExpertNum, constExpertNum, xOut.tensor, &combineWorkspaceSize, &combineExecutor));
    if (combineWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&combineWorkspaceAddr, combineWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeCombineV3(combineWorkspaceAddr, combineWorkspaceSize, combineExecutor, args.stream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.stream, 10000));

    CHECK_RET(sample::CheckXBack(xOut, host.x, args.rankId) == 0, return -1);
    LOG_PRINT("[INFO] rank %u: dispatch V3 and combine V3 after the shrink match the host (%lld rows)\n",
              args.rankId, static_cast<long long>(rows));

    if (dispatchWorkspaceAddr) aclrtFree(dispatchWorkspaceAddr);
    if (combineWorkspaceAddr) aclrtFree(combineWorkspaceAddr);
    tok.Release();
    out.Release();
    for (DeviceTensor *t : {&elasticInfo, &xOut}) t->Release();
    return 0;
}

}  // namespace

int main() {
    CHECK_CALL(aclInit(nullptr));
    aclrtStream stream[EP_WORLD_SIZE];
    aclrtContext context[EP_WORLD_SIZE];
    for (uint32_t rankId = 0; rankId < EP_WORLD_SIZE; ++rankId) {
        CHECK_CALL(aclrtSetDevice(static_cast<int32_t>(rankId)));
        CHECK_CALL(aclrtCreateContext(&context[rankId], static_cast<int32_t>(rankId)));
        CHECK_CALL(aclrtCreateStream(&stream[rankId]));
    }
    int32_t devices[EP_WORLD_SIZE] = {0, 1, 2, 3};
    HcclComm comms[EP_WORLD_SIZE];
    CHECK_CALL(HcclCommInitAll(EP_WORLD_SIZE, devices, comms));

    Args args[LIVE];
    std::vector<std::unique_ptr<std::thread>> threads(LIVE);
    for (uint32_t rankId = 0; rankId < LIVE; ++rankId) {   // device 3 is out: no thread, no call
        args[rankId].rankId = rankId;
        args[rankId].hcclEpComm = comms[rankId];
        args[rankId].stream = stream[rankId];
        args[rankId].context = context[rankId];
        Args &a = args[rankId];
        threads[rankId].reset(new std::thread([&a] { a.result = LaunchOneThreadDispatchV3AndCombineV3(a); }));
    }
    int failed = 0;
    for (uint32_t rankId = 0; rankId < LIVE; ++rankId) {
        threads[rankId]->join();
        failed += args[rankId].result != 0;
    }
    for (uint32_t rankId = 0; rankId < EP_WORLD_SIZE; ++rankId) {
        CHECK_CALL(HcclCommDestroy(comms[rankId]));
        CHECK_CALL(aclrtDestroyStream(stream[rankId]));
        CHECK_CALL(aclrtDestroyContext(context[rankId]));
        CHECK_CALL(aclrtResetDevice(static_cast<int32_t>(rankId)));
    }
    CHECK_CALL(aclFinalize());
    if (failed) {
        LOG_PRINT("[ERROR] %d of %u live ranks failed\n", failed, LIVE);
        return 1;
    }
    LOG_PRINT("[INFO] all %u live ranks passed\n", LIVE);
    return 0;
}
