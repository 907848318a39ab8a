// A CANN-style op sample for aclnnMoeDistributeDispatchV4 / aclnnMoeDistributeCombineV4 on Atlas A2,
// written the way CANN's A2 samples are: the ranks come from a rank table (RANK_TABLE_FILE, the
// first rank id of this server in FIRST_RANK_ID), each thread sets its device and joins with
// HcclCommInitClusterInfo. One server of four ranks, a "fullmesh" world the newest CANN documents
// allow (CANN 8.3.RC1 and earlier start at 16 ranks: under ACLNN_MOCK_CANN_VERSION=8.3.RC1 phase 1
// refuses it, and the sample prints CANN's message). Each rank holds 26 experts, more than the 24 per
// rank CANN 8.3.RC1 allowed with "fullmesh" and as many as the newest A2 tiling takes (CANN's own V4 A2
// sample runs 32 per rank). Dispatch takes the top-k weights (expertScales,
// out as expandScales) and both operators add their wait times to performanceInfo. Each rank checks
// dispatch's row count and rows against the host's prediction and that combine, with an identity
// expert and weights that sum to 1, gives x back; it prints one success line.
//
// Build and run (docs/c_programs.md), one line:
//   g++ -std=c++17 -I$ASCEND_HOME_PATH/include moe_dispatch_combine_v4_a2.cpp
//       -L$ASCEND_HOME_PATH/lib64 -L$ASCEND_HOME_PATH/opp/vendors/<vendor>/op_api/lib
//       -lcust_opapi -lnnopbase -lhccl -lascendcl -pthread -o moe_v4_a2
//   then RANK_TABLE_FILE=rank_table.json FIRST_RANK_ID=0 ./moe_v4_a2 prints "[INFO] all 4 ranks
//   passed" and exits 0 (on the mock with ACLNN_MOCK_SOC=Ascend910B2).
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_moe_distribute_combine_v4.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v4.h"
#include "hccl/hccl.h"
#include "sample_common.h"

using sample::DeviceTensor;

namespace {

constexpr uint32_t EP_WORLD_SIZE = 4;
constexpr int64_t BS = 4;
constexpr int64_t H = 1024;
constexpr int64_t K = 2;
constexpr int64_t LOCAL_EXPERT_NUM = 26;
constexpr int64_t MOE_EXPERT_NUM = EP_WORLD_SIZE * LOCAL_EXPERT_NUM;
constexpr int64_t GLOBAL_BS = BS * EP_WORLD_SIZE;
constexpr int64_t A = GLOBAL_BS * (LOCAL_EXPERT_NUM < K ? LOCAL_EXPERT_NUM : K);

struct Args {
    uint32_t rankId;
    const char *rankTable;
    int result = -1;
};

int64_t RowsFor(uint32_t me) {
    int64_t n = 0;
    for (uint32_t src = 0; src < EP_WORLD_SIZE; ++src)
        for (int t = 0; t < BS; ++t)
            for (int k = 0; k < K; ++k)
                n += sample::ExpertOf(src, t, k, MOE_EXPERT_NUM) / LOCAL_EXPERT_NUM == static_cast<int32_t>(me);
    return n;
}

int LaunchOneThreadDispatchV4AndCombineV4(Args &args) {
    const int32_t device = static_cast<int32_t>(args.rankId);
    aclrtContext context;
    aclrtStream stream;
    HcclComm hcclComm = nullptr;
    CHECK_CALL(aclrtSetDevice(device));
    CHECK_CALL(aclrtCreateContext(&context, device));
    CHECK_CALL(aclrtCreateStream(&stream));
    CHECK_CALL(HcclCommInitClusterInfo(args.rankTable, args.rankId, &hcclComm));
    char hcomEpName[COMM_NAME_MAX_LENGTH] = {0};
    CHECK_CALL(HcclGetCommName(hcclComm, hcomEpName));

    const sample::Tokens host = sample::RoutedTokens(args.rankId, args.rankId, BS, H, K, MOE_EXPERT_NUM);
    sample::TokenTensors tok;
    sample::DispatchOutputs out;
    DeviceTensor performanceInfo, xOut;
    CHECK_RET(tok.Create(host, BS, H, K) == 0, return -1);
    CHECK_RET(performanceInfo.Create(std::vector<int64_t>(EP_WORLD_SIZE, 0), {EP_WORLD_SIZE}, ACL_INT64) == 0,
              return -1);
    // "fullmesh" writes the W * L counts only
    CHECK_RET(out.Create(A, H, LOCAL_EXPERT_NUM, EP_WORLD_SIZE, 1, 1) == 0, return -1);
    CHECK_RET(xOut.Create(std::vector<uint16_t>(), {BS, H}, ACL_BF16) == 0, return -1);

    const int64_t tpWorldSize = 0, tpRankId = 0, expertShardType = 0, sharedExpertNum = 0, sharedExpertRankNum = 0;
    const int64_t quantMode = 0, expertTokenNumsType = 0, outDtype = 0, commQuantMode = 0, groupListType = 0;
    const int64_t zeroExpertNum = 0, copyExpertNum = 0, constExpertNum = 0;
    const char *commAlg = "fullmesh";

    uint64_t dispatchWorkspaceSize = 0;
    aclOpExecutor *dispatchExecutor = nullptr;
    void *dispatchWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeDispatchV4GetWorkspaceSize(
        tok.x.tensor, tok.expertIds.tensor, nullptr, nullptr, tok.expertScales.tensor, nullptr, performanceInfo.tensor,
        hcomEpName, EP_WORLD_SIZE, args.rankId, MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType,
        sharedExpertNum, sharedExpertRankNum, quantMode, GLOBAL_BS, expertTokenNumsType, commAlg, zeroExpertNum,
        copyExpertNum, constExpertNum, out.expandX.tensor, out.dynamicScales.tensor, out.assistInfo.tensor,
        out.expertTokenNums.tensor, out.epRecvCounts.tensor, out.tpRecvCounts.tensor, out.expandScales.tensor,
        &dispatchWorkspaceSize, &dispatchExecutor));
    if (dispatchWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&dispatchWorkspaceAddr, dispatchWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeDispatchV4(dispatchWorkspaceAddr, dispatchWorkspaceSize, dispatchExecutor, stream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(stream, 10000));

    std::vector<int64_t> tokenNums;
    CHECK_RET(out.expertTokenNums.Download(&tokenNums) == 0, return -1);
    const int64_t rows = tokenNums[LOCAL_EXPERT_NUM - 1];
    CHECK_RET(rows == RowsFor(args.rankId),
              LOG_PRINT("[ERROR] rank %u: %lld rows, the host expects %lld\n", args.rankId,
                        static_cast<long long>(rows), static_cast<long long>(RowsFor(args.rankId)));
              return -1);

    uint64_t combineWorkspaceSize = 0;
    aclOpExecutor *combineExecutor = nullptr;
    void *combineWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeCombineV4GetWorkspaceSize(
        out.expandX.tensor, tok.expertIds.tensor, out.assistInfo.tensor, out.epRecvCounts.tensor,
        tok.expertScales.tensor, nullptr,
        nullptr, nullptr, nullptr, nullptr, out.expandScales.tensor, nullptr, nullptr, nullptr, nullptr, nullptr,
        nullptr,
        performanceInfo.tensor, hcomEpName, EP_WORLD_SIZE, args.rankId, MOE_EXPERT_NUM, "", tpWorldSize, tpRankId,
        expertShardType, sharedExpertNum, sharedExpertRankNum, GLOBAL_BS, outDtype, commQuantMode, groupListType,
        commAlg, zeroExpertNum, copyExpertNum, constExpertNum, xOut.tensor, &combineWorkspaceSize, &combineExecutor));
    if (combineWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&combineWorkspaceAddr, combineWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeCombineV4(combineWorkspaceAddr, combineWorkspaceSize, combineExecutor, stream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(stream, 10000));

    std::vector<int64_t> perf;
    CHECK_RET(sample::CheckXBack(xOut, host.x, args.rankId) == 0 && performanceInfo.Download(&perf) == 0, return -1);
    for (int64_t us : perf)
        CHECK_RET(us >= 0, LOG_PRINT("[ERROR] rank %u: performanceInfo holds %lld\n", args.rankId,
                                     static_cast<long long>(us)); return -1);
    LOG_PRINT("[INFO] rank %u: dispatch V4 and combine V4 on Atlas A2 match the host (%lld rows)\n", args.rankId,
              static_cast<long long>(rows));

    if (dispatchWorkspaceAddr) aclrtFree(dispatchWorkspaceAddr);
    if (combineWorkspaceAddr) aclrtFree(combineWorkspaceAddr);
    tok.Release();
    out.Release();
    for (DeviceTensor *t : {&performanceInfo, &xOut}) t->Release();
    CHECK_CALL(HcclCommDestroy(hcclComm));
    CHECK_CALL(aclrtDestroyStream(stream));
    CHECK_CALL(aclrtDestroyContext(context));
    CHECK_CALL(aclrtResetDevice(device));
    return 0;
}

}  // namespace

int main() {
    const char *rankTable = std::getenv("RANK_TABLE_FILE");
    const char *firstRankId = std::getenv("FIRST_RANK_ID");
    CHECK_RET(rankTable && firstRankId,
              LOG_PRINT("[ERROR] set RANK_TABLE_FILE and FIRST_RANK_ID (the rank id of this server's device 0)\n");
              return 1);
    CHECK_CALL(aclInit(nullptr));
    const uint32_t first = static_cast<uint32_t>(std::stoul(firstRankId));
    Args args[EP_WORLD_SIZE];
    std::vector<std::unique_ptr<std::thread>> threads(EP_WORLD_SIZE);
    for (uint32_t i = 0; i < EP_WORLD_SIZE; ++i) {
        args[i].rankId = first + i;
        args[i].rankTable = rankTable;
        Args &a = args[i];
        threads[i].reset(new std::thread([&a] { a.result = LaunchOneThreadDispatchV4AndCombineV4(a); }));
    }
    int failed = 0;
    for (uint32_t i = 0; i < EP_WORLD_SIZE; ++i) {
        threads[i]->join();
        failed += args[i].result != 0;
    }
    CHECK_CALL(aclFinalize());
    if (failed) {
        LOG_PRINT("[ERROR] %d of %u ranks failed\n", failed, EP_WORLD_SIZE);
        return 1;
    }
    LOG_PRINT("[INFO] all %u ranks passed\n", EP_WORLD_SIZE);
    return 0;
}
