// A CANN-style op sample for aclnnMoeDistributeDispatchV2 / aclnnMoeDistributeCombineV2 (the
// group-string generation with a TP domain), EP 8 x TP 2 = 16 devices, written the way CANN's public
// op sample for V2 is: the main thread sets up every device (aclrtSetDevice, aclrtCreateContext, two
// streams), makes the EP communicators (one HcclCommInitAll per TP index: devices {tp, tp+2, ...})
// and the TP communicators (one HcclCommInitAll per EP index: devices {2ep, 2ep+1}); then one thread
// per device makes its context current, names its groups with HcclGetCommName, runs dispatch → a
// TP-sharded "expert" → combine, and checks the results against the host's prediction. Teardown as
// CANN documents: tensors and memory, HcclCommDestroy, aclrtDestroyStream, aclrtDestroyContext,
// aclrtResetDevice, then aclFinalize.
//
// The expert of a TP pair is split in two halves: each TP rank returns half of every row it got,
// and combine's reduce-scatter adds the halves of the pair. With top-k weights that sum to 1 the
// round gives x back exactly.
//
// Build and run (docs/c_programs.md), one line:
//   g++ -std=c++17 -I$ASCEND_HOME_PATH/include moe_dispatch_combine_v2.cpp
//       -L$ASCEND_HOME_PATH/lib64 -L$ASCEND_HOME_PATH/opp/vendors/<vendor>/op_api/lib
//       -lcust_opapi -lnnopbase -lhccl -lascendcl -pthread -o moe_v2
//   then ./moe_v2 prints "[INFO] all 16 ranks passed" and exits 0.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_moe_distribute_combine_v2.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v2.h"
#include "hccl/hccl.h"
#include "sample_common.h"

using sample::DeviceTensor;

namespace {

constexpr uint32_t EP_WORLD_SIZE = 8;
constexpr uint32_t TP_WORLD_SIZE = 2;
constexpr uint32_t DEV_NUM = EP_WORLD_SIZE * TP_WORLD_SIZE;
constexpr int64_t BS = 8;
constexpr int64_t H = 1024;
constexpr int64_t K = 4;
constexpr int64_t MOE_EXPERT_NUM = EP_WORLD_SIZE;   // one expert per rank: the TP domain needs it
constexpr int64_t LOCAL_EXPERT_NUM = 1;
constexpr int64_t GLOBAL_BS = BS * EP_WORLD_SIZE;
constexpr int64_t A = GLOBAL_BS * (LOCAL_EXPERT_NUM < K ? LOCAL_EXPERT_NUM : K);

struct Args {
    uint32_t rankId;
    uint32_t epRankId;
    uint32_t tpRankId;
    HcclComm hcclEpComm;
    HcclComm hcclTpComm;
    aclrtStream dispatchV2Stream;
    aclrtStream combineV2Stream;
    aclrtContext context;
    int result = -1;
};

uint32_t DeviceOf(uint32_t ep, uint32_t tp) { return ep * TP_WORLD_SIZE + tp; }

// Rows the EP domain of one TP index sends to EP rank `me` (the same for both TP indices: the
// routing depends on the EP rank only).
int64_t RowsFromOneEpDomain(uint32_t me) {
    int64_t n = 0;
    for (uint32_t src = 0; src < EP_WORLD_SIZE; ++src)
        for (int t = 0; t < BS; ++t)
            for (int k = 0; k < K; ++k) n += sample::ExpertOf(src, t, k, MOE_EXPERT_NUM) == static_cast<int32_t>(me);
    return n;
}

// A row dispatch may hand EP rank `me`: a token routed to its expert, from either TP index.
bool IsTokenOf(uint32_t me, float v) {
    for (uint32_t tp = 0; tp < TP_WORLD_SIZE; ++tp)
        for (uint32_t src = 0; src < EP_WORLD_SIZE; ++src)
            for (int t = 0; t < BS; ++t)
                for (int k = 0; k < K; ++k)
                    if (sample::ExpertOf(src, t, k, MOE_EXPERT_NUM) == static_cast<int32_t>(me) &&
                        sample::TokenValue(DeviceOf(src, tp), BS, t) == v)
                        return true;
    return false;
}

int CheckDispatch(const Args &args, int64_t rows, const std::vector<int32_t> &tpRecvCounts,
                  const std::vector<uint16_t> &expandX) {
    const int64_t c = RowsFromOneEpDomain(args.epRankId);
    CHECK_RET(rows == c || rows == c * TP_WORLD_SIZE,
              LOG_PRINT("[ERROR] rank %u: %lld rows for the expert; the host expects %lld per TP rank\n", args.rankId,
                        static_cast<long long>(rows), static_cast<long long>(c));
              return -1);
    int64_t tpSum = 0;
    for (int32_t n : tpRecvCounts) tpSum += n;
    CHECK_RET(tpSum == rows,
              LOG_PRINT("[ERROR] rank %u: tpRecvCounts add up to %lld, not %lld\n", args.rankId,
                        static_cast<long long>(tpSum), static_cast<long long>(rows));
              return -1);
    // the rows from this rank's own EP domain come first, whatever the layout of the TP peer's rows
    for (int64_t r = 0; r < c; ++r) {
        const float v = sample::FromBf16(expandX[r * H]);
        CHECK_RET(IsTokenOf(args.epRankId, v) && sample::FromBf16(expandX[r * H + H - 1]) == v,
                  LOG_PRINT("[ERROR] rank %u: row %lld of expandX (%g) is no token of its expert\n", args.rankId,
                            static_cast<long long>(r), v);
                  return -1);
    }
    return 0;
}

int LaunchOneThreadDispatchV2AndCombineV2(Args &args) {
    CHECK_CALL(aclrtSetCurrentContext(args.context));
    char hcomEpName[COMM_NAME_MAX_LENGTH] = {0};
    char hcomTpName[COMM_NAME_MAX_LENGTH] = {0};
    CHECK_CALL(HcclGetCommName(args.hcclEpComm, hcomEpName));
    CHECK_CALL(HcclGetCommName(args.hcclTpComm, hcomTpName));

    const sample::Tokens host = sample::RoutedTokens(args.rankId, args.epRankId, BS, H, K, MOE_EXPERT_NUM);

    sample::TokenTensors tok;
    sample::DispatchOutputs out;
    DeviceTensor expertOut, xOut;
    CHECK_RET(tok.Create(host, BS, H, K) == 0, return -1);
    CHECK_RET(out.Create(A, H, LOCAL_EXPERT_NUM, EP_WORLD_SIZE, TP_WORLD_SIZE, TP_WORLD_SIZE) == 0, return -1);
    CHECK_RET(xOut.Create(std::vector<uint16_t>(), {BS, H}, ACL_BF16) == 0, return -1);

    const int64_t expertShardType = 0, sharedExpertNum = 0, sharedExpertRankNum = 0, quantMode = 0;
    const int64_t expertTokenNumsType = 0;   // prefix sums, as CANN's sample asks for
    const int64_t outDtype = 0, commQuantMode = 0, groupListType = 0;
    const std::string commAlg = "";

    uint64_t dispatchV2WorkspaceSize = 0;
    aclOpExecutor *dispatchV2Executor = nullptr;
    void *dispatchV2WorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeDispatchV2GetWorkspaceSize(
        tok.x.tensor, tok.expertIds.tensor, nullptr, nullptr, nullptr, hcomEpName, EP_WORLD_SIZE, args.epRankId,
        MOE_EXPERT_NUM, hcomTpName, TP_WORLD_SIZE, args.tpRankId, expertShardType, sharedExpertNum,
        sharedExpertRankNum, quantMode, GLOBAL_BS, expertTokenNumsType, commAlg.c_str(), out.expandX.tensor,
        out.dynamicScales.tensor, out.assistInfo.tensor, out.expertTokenNums.tensor, out.epRecvCounts.tensor,
        out.tpRecvCounts.tensor,
        out.expandScales.tensor, &dispatchV2WorkspaceSize, &dispatchV2Executor));
    if (dispatchV2WorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&dispatchV2WorkspaceAddr, dispatchV2WorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeDispatchV2(dispatchV2WorkspaceAddr, dispatchV2WorkspaceSize, dispatchV2Executor,
                                            args.dispatchV2Stream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.dispatchV2Stream, 10000));

    std::vector<int64_t> tokenNums;
    std::vector<int32_t> tpCounts;
    std::vector<uint16_t> expandXHost;
    CHECK_RET(out.expertTokenNums.Download(&tokenNums) == 0 && out.tpRecvCounts.Download(&tpCounts) == 0 &&
                  out.expandX.Download(&expandXHost) == 0,
              return -1);
    const int64_t rows = tokenNums[LOCAL_EXPERT_NUM - 1];   // the last prefix sum: every row
    CHECK_RET(CheckDispatch(args, rows, tpCounts, expandXHost) == 0, return -1);

    // this TP rank's half of the expert: every row of expandX, halved (exact for these values)
    std::vector<uint16_t> expertOutHost(expandXHost.size(), 0);
    for (size_t i = 0; i < expandXHost.size(); ++i)
        expertOutHost[i] = sample::ToBf16(sample::FromBf16(expandXHost[i]) * 0.5f);
    CHECK_RET(expertOut.Create(expertOutHost, {TP_WORLD_SIZE * A, H}, ACL_BF16) == 0, return -1);

    uint64_t combineV2WorkspaceSize = 0;
    aclOpExecutor *combineV2Executor = nullptr;
    void *combineV2WorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeCombineV2GetWorkspaceSize(
        expertOut.tensor, tok.expertIds.tensor, out.assistInfo.tensor, out.epRecvCounts.tensor, tok.expertScales.tensor,
        out.tpRecvCounts.tensor, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, hcomEpName, EP_WORLD_SIZE,
        args.epRankId, MOE_EXPERT_NUM, hcomTpName, TP_WORLD_SIZE, args.tpRankId, expertShardType, sharedExpertNum,
        sharedExpertRankNum, GLOBAL_BS, outDtype, commQuantMode, groupListType, commAlg.c_str(), xOut.tensor,
        &combineV2WorkspaceSize, &combineV2Executor));
    if (combineV2WorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&combineV2WorkspaceAddr, combineV2WorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeCombineV2(combineV2WorkspaceAddr, combineV2WorkspaceSize, combineV2Executor,
                                           args.combineV2Stream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.combineV2Stream, 10000));

    CHECK_RET(sample::CheckXBack(xOut, host.x, args.rankId) == 0, return -1);
    LOG_PRINT("[INFO] rank %u (ep %u, tp %u): dispatch V2 and combine V2 match the host (groups %s, %s)\n",
              args.rankId, args.epRankId, args.tpRankId, hcomEpName, hcomTpName);

    if (dispatchV2WorkspaceAddr) aclrtFree(dispatchV2WorkspaceAddr);
    if (combineV2WorkspaceAddr) aclrtFree(combineV2WorkspaceAddr);
    tok.Release();
    out.Release();
    for (DeviceTensor *t : {&expertOut, &xOut}) t->Release();
    CHECK_CALL(HcclCommDestroy(args.hcclEpComm));
    CHECK_CALL(HcclCommDestroy(args.hcclTpComm));
    CHECK_CALL(aclrtDestroyStream(args.dispatchV2Stream));
    CHECK_CALL(aclrtDestroyStream(args.combineV2Stream));
    CHECK_CALL(aclrtDestroyContext(args.context));
    CHECK_CALL(aclrtResetDevice(static_cast<int32_t>(args.rankId)));
    return 0;
}

}  // namespace

int main() {
    CHECK_CALL(aclInit(nullptr));
    aclrtStream dispatchV2Stream[DEV_NUM];
    aclrtStream combineV2Stream[DEV_NUM];
    aclrtContext context[DEV_NUM];
    for (uint32_t rankId = 0; rankId < DEV_NUM; ++rankId) {
        CHECK_CALL(aclrtSetDevice(static_cast<int32_t>(rankId)));
        CHECK_CALL(aclrtCreateContext(&context[rankId], static_cast<int32_t>(rankId)));
        CHECK_CALL(aclrtCreateStream(&dispatchV2Stream[rankId]));
        CHECK_CALL(aclrtCreateStream(&combineV2Stream[rankId]));
    }

    // EP domains: {0,2,...,14} and {1,3,...,15}; TP domains: {0,1}, {2,3}, ..., {14,15}
    int32_t devicesEp[TP_WORLD_SIZE][EP_WORLD_SIZE];
    HcclComm commsEp[TP_WORLD_SIZE][EP_WORLD_SIZE];
    for (uint32_t tp = 0; tp < TP_WORLD_SIZE; ++tp) {
        for (uint32_t ep = 0; ep < EP_WORLD_SIZE; ++ep) devicesEp[tp][ep] = static_cast<int32_t>(DeviceOf(ep, tp));
        CHECK_CALL(HcclCommInitAll(EP_WORLD_SIZE, devicesEp[tp], commsEp[tp]));
    }
    int32_t devicesTp[EP_WORLD_SIZE][TP_WORLD_SIZE];
    HcclComm commsTp[EP_WORLD_SIZE][TP_WORLD_SIZE];
    for (uint32_t ep = 0; ep < EP_WORLD_SIZE; ++ep) {
        for (uint32_t tp = 0; tp < TP_WORLD_SIZE; ++tp) devicesTp[ep][tp] = static_cast<int32_t>(DeviceOf(ep, tp));
        CHECK_CALL(HcclCommInitAll(TP_WORLD_SIZE, devicesTp[ep], commsTp[ep]));
    }

    Args args[DEV_NUM];
    std::vector<std::unique_ptr<std::thread>> threads(DEV_NUM);
    for (uint32_t rankId = 0; rankId < DEV_NUM; ++rankId) {
        Args &a = args[rankId];
        a.rankId = rankId;
        a.epRankId = rankId / TP_WORLD_SIZE;
        a.tpRankId = rankId % TP_WORLD_SIZE;
        a.hcclEpComm = commsEp[a.tpRankId][a.epRankId];
        a.hcclTpComm = commsTp[a.epRankId][a.tpRankId];
        a.dispatchV2Stream = dispatchV2Stream[rankId];
        a.combineV2Stream = combineV2Stream[rankId];
        a.context = context[rankId];
        threads[rankId].reset(new std::thread([&a] { a.result = LaunchOneThreadDispatchV2AndCombineV2(a); }));
    }
    int failed = 0;
    for (uint32_t rankId = 0; rankId < DEV_NUM; ++rankId) {
        threads[rankId]->join();
        failed += args[rankId].result != 0;
    }
    CHECK_CALL(aclFinalize());
    if (failed) {
        LOG_PRINT("[ERROR] %d of %u ranks failed\n", failed, DEV_NUM);
        return 1;
    }
    LOG_PRINT("[INFO] all %u ranks passed\n", DEV_NUM);
    return 0;
}
