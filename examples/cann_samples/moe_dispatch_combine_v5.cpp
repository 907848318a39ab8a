// A CANN-style op sample for aclnnMoeDistributeDispatchV5 / aclnnMoeDistributeCombineV5 (the
// context + cclBufferSize generation), written the way CANN's public op samples are: the main thread
// sets up every device (aclrtSetDevice, aclrtCreateContext, aclrtCreateStream) and the EP
// communicators (HcclCommInitAll), then one thread per device makes its context current, builds the
// op's context tensor through HCCL, runs dispatch → an identity "expert" → combine, and checks the
// results against what the host predicts from the routing. It tears down as CANN documents:
// destroy tensors and memory, HcclCommDestroy, aclrtDestroyStream, aclrtDestroyContext,
// aclrtResetDevice, then aclFinalize.
//
// Build and run (docs/c_programs.md):
//   g++ -std=c++17 -I$ASCEND_HOME_PATH/include moe_dispatch_combine_v5.cpp
//       -L$ASCEND_HOME_PATH/lib64 -L$ASCEND_HOME_PATH/opp/vendors/<vendor>/op_api/lib
//       -lcust_opapi -lnnopbase -lhccl -lascendcl -pthread -o moe_v5      (one line)
//   LD_LIBRARY_PATH=... ./moe_v5        prints "[INFO] all 8 ranks passed" and exits 0
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_moe_distribute_combine_v5.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v5.h"
#include "hccl/hccl.h"
#include "hccl/hccl_kfc.h"
#include "sample_common.h"

using sample::DeviceTensor;

namespace {

constexpr uint32_t EP_WORLD_SIZE = 8;
constexpr int64_t BS = 8;
constexpr int64_t H = 1024;
constexpr int64_t K = 4;
constexpr int64_t MOE_EXPERT_NUM = 16;   // 2 experts per rank
constexpr int64_t LOCAL_EXPERT_NUM = MOE_EXPERT_NUM / EP_WORLD_SIZE;
constexpr int64_t A = BS * EP_WORLD_SIZE * (LOCAL_EXPERT_NUM < K ? LOCAL_EXPERT_NUM : K);
// The op's context: rank id, ranks per server, the HCCL op-resource context, then every rank's
// window address (docs/concepts.md, "Windows, the context tensor").
constexpr size_t MAX_EP_RANKS = 1024;
constexpr size_t CONTEXT_BYTES = 4 + 4 + 8 + 8 * MAX_EP_RANKS + 8 * MAX_EP_RANKS;

struct Args {
    uint32_t rankId;
    HcclComm hcclEpComm;
    aclrtStream dispatchStream;
    aclrtStream combineStream;
    aclrtContext context;
    int result = -1;
};

// The op's context tensor bytes for this rank, built through HCCL's KFC calls from the group name.
int BuildOpContext(const char *groupEp, std::vector<int32_t> *blob, int64_t *cclBufferSize) {
    HcclComm comm = nullptr;
    void *opArgs = nullptr;
    void *resCtx = nullptr;
    char algConfig[] = "AlltoAll=level0:fullmesh;level1:pairwise";
    uint32_t rank = 0, size = 0;
    CHECK_CALL(HcclCommGetHandleWithName(groupEp, &comm));
    CHECK_CALL(HcclKfcAllocOpArgs(&opArgs));
    CHECK_CALL(HcclKfcOpArgsSetCommEngine(opArgs, HCCL_COMM_ENGINE_AIV));
    CHECK_CALL(HcclKfcOpArgsSetAlgConfig(opArgs, algConfig));
    CHECK_CALL(HcclCreateOpResCtx(comm, HCCL_OP_TYPE_ALLTOALL, opArgs, &resCtx));
    CHECK_CALL(HcclKfcFreeOpArgs(opArgs));
    CHECK_CALL(HcclGetRankId(comm, &rank));
    CHECK_CALL(HcclGetRankSize(comm, &size));
    std::vector<unsigned char> bytes(CONTEXT_BYTES, 0);
    const uint32_t ranksPerServer = 2;
    const uint64_t kfc = reinterpret_cast<uintptr_t>(resCtx);
    std::memcpy(&bytes[0], &rank, 4);
    std::memcpy(&bytes[4], &ranksPerServer, 4);
    std::memcpy(&bytes[8], &kfc, 8);
    for (uint32_t r = 0; r < size; ++r) {
        void *addr = nullptr;
        uint64_t windowBytes = 0;
        if (r == rank) {
            CHECK_CALL(HcclGetHcclBuffer(comm, &addr, &windowBytes));
            *cclBufferSize = static_cast<int64_t>(windowBytes);
        } else {
            CHECK_CALL(HcclGetRemoteIpcHcclBuf(comm, r, &addr, &windowBytes));
        }
        const uint64_t a = reinterpret_cast<uintptr_t>(addr);
        std::memcpy(&bytes[16 + 8 * r], &a, 8);
    }
    blob->assign(CONTEXT_BYTES / 4, 0);
    std::memcpy(blob->data(), bytes.data(), CONTEXT_BYTES);
    return 0;
}

// What the host predicts for EP rank `me`: rows per local expert, and every value they may hold.
int CheckDispatch(uint32_t me, const std::vector<int64_t> &tokenNums, const std::vector<uint16_t> &expandX) {
    std::vector<int64_t> expected(LOCAL_EXPERT_NUM, 0);
    for (uint32_t src = 0; src < EP_WORLD_SIZE; ++src)
        for (int t = 0; t < BS; ++t)
            for (int k = 0; k < K; ++k) {
                int32_t e = sample::ExpertOf(src, t, k, MOE_EXPERT_NUM);
                if (e / LOCAL_EXPERT_NUM == static_cast<int32_t>(me)) ++expected[e % LOCAL_EXPERT_NUM];
            }
    int64_t row = 0;
    for (int64_t j = 0; j < LOCAL_EXPERT_NUM; ++j) {
        CHECK_RET(tokenNums[j] == expected[j],
                  LOG_PRINT("[ERROR] rank %u: expert %lld got %lld tokens, the host expects %lld\n", me,
                            static_cast<long long>(j), static_cast<long long>(tokenNums[j]),
                            static_cast<long long>(expected[j]));
                  return -1);
        for (int64_t i = 0; i < tokenNums[j]; ++i, ++row) {
            const float v = sample::FromBf16(expandX[row * H]);
            bool known = false;   // the row is some token routed to this expert
            for (uint32_t src = 0; src < EP_WORLD_SIZE && !known; ++src)
                for (int t = 0; t < BS && !known; ++t)
                    for (int k = 0; k < K && !known; ++k)
                        known = sample::ExpertOf(src, t, k, MOE_EXPERT_NUM) == me * LOCAL_EXPERT_NUM + j &&
                                sample::TokenValue(src, BS, t) == v;
            CHECK_RET(known && sample::FromBf16(expandX[row * H + H - 1]) == v,
                      LOG_PRINT("[ERROR] rank %u: row %lld of expandX (%g) is no token of expert %lld\n", me,
                                static_cast<long long>(row), v, static_cast<long long>(j));
                      return -1);
        }
    }
    return 0;
}

int LaunchOneThreadDispatchAndCombine(Args &args) {
    CHECK_CALL(aclrtSetCurrentContext(args.context));
    char groupEp[COMM_NAME_MAX_LENGTH] = {0};
    CHECK_CALL(HcclGetCommName(args.hcclEpComm, groupEp));
    const uint32_t rank = args.rankId;

    std::vector<int32_t> contextHost;
    int64_t cclBufferSize = 0;
    CHECK_RET(BuildOpContext(groupEp, &contextHost, &cclBufferSize) == 0, return -1);

    const sample::Tokens host = sample::RoutedTokens(rank, rank, BS, H, K, MOE_EXPERT_NUM);

    sample::TokenTensors tok;
    sample::DispatchOutputs out;
    DeviceTensor context, xOut;
    CHECK_RET(context.Create(contextHost, {static_cast<int64_t>(contextHost.size())}, ACL_INT32) == 0, return -1);
    CHECK_RET(tok.Create(host, BS, H, K) == 0, return -1);
    CHECK_RET(out.Create(A, H, LOCAL_EXPERT_NUM, EP_WORLD_SIZE, 1, 0) == 0, return -1);
    CHECK_RET(xOut.Create(std::vector<uint16_t>(), {BS, H}, ACL_BF16) == 0, return -1);

    const int64_t tpWorldSize = 0, tpRankId = 0, expertShardType = 0, sharedExpertNum = 1, sharedExpertRankNum = 0;
    const int64_t quantMode = 0, globalBs = 0, expertTokenNumsType = 1;

    // dispatch: phase 1 sizes the workspace, phase 2 launches on the stream
    uint64_t workspaceSize = 0;
    aclOpExecutor *executor = nullptr;
    void *workspace = nullptr;
    CHECK_CALL(aclnnMoeDistributeDispatchV5GetWorkspaceSize(
        context.tensor, tok.x.tensor, tok.expertIds.tensor, nullptr, nullptr, tok.expertScales.tensor, nullptr, nullptr,
        EP_WORLD_SIZE, rank, MOE_EXPERT_NUM, cclBufferSize, tpWorldSize, tpRankId, expertShardType, sharedExpertNum,
        sharedExpertRankNum, quantMode, globalBs, expertTokenNumsType, "", 0, 0, 0, out.expandX.tensor,
        out.dynamicScales.tensor, out.assistInfo.tensor, out.expertTokenNums.tensor, out.epRecvCounts.tensor,
        out.tpRecvCounts.tensor,
        out.expandScales.tensor, &workspaceSize, &executor));
    if (workspaceSize > 0) CHECK_CALL(aclrtMalloc(&workspace, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeDispatchV5(workspace, workspaceSize, executor, args.dispatchStream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.dispatchStream, 10000));
    if (workspace) aclrtFree(workspace);

    std::vector<int64_t> tokenNums;
    std::vector<uint16_t> expandXHost;
    CHECK_RET(out.expertTokenNums.Download(&tokenNums) == 0 && out.expandX.Download(&expandXHost) == 0, return -1);
    CHECK_RET(CheckDispatch(rank, tokenNums, expandXHost) == 0, return -1);

    // combine: the identity expert hands expandX back as it came; the weights sum to 1, so xOut == x
    workspaceSize = 0;
    executor = nullptr;
    workspace = nullptr;
    CHECK_CALL(aclnnMoeDistributeCombineV5GetWorkspaceSize(
        context.tensor, out.expandX.tensor, tok.expertIds.tensor, out.assistInfo.tensor, out.epRecvCounts.tensor,
        tok.expertScales.tensor,
        nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
        nullptr, EP_WORLD_SIZE, rank, MOE_EXPERT_NUM, cclBufferSize, tpWorldSize, tpRankId, expertShardType,
        sharedExpertNum, sharedExpertRankNum, globalBs, 0, 0, 0, "", 0, 0, 0, xOut.tensor, &workspaceSize, &executor));
    if (workspaceSize > 0) CHECK_CALL(aclrtMalloc(&workspace, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeCombineV5(workspace, workspaceSize, executor, args.combineStream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.combineStream, 10000));
    if (workspace) aclrtFree(workspace);

    CHECK_RET(sample::CheckXBack(xOut, host.x, rank) == 0, return -1);
    LOG_PRINT("[INFO] rank %u: dispatch and combine V5 match the host (group %s)\n", rank, groupEp);

    tok.Release();
    out.Release();
    for (DeviceTensor *t : {&context, &xOut}) t->Release();
    CHECK_CALL(HcclCommDestroy(args.hcclEpComm));
    CHECK_CALL(aclrtDestroyStream(args.dispatchStream));
    CHECK_CALL(aclrtDestroyStream(args.combineStream));
    CHECK_CALL(aclrtDestroyContext(args.context));
    CHECK_CALL(aclrtResetDevice(static_cast<int32_t>(rank)));
    return 0;
}

}  // namespace

int main() {
    CHECK_CALL(aclInit(nullptr));
    aclrtStream dispatchStream[EP_WORLD_SIZE];
    aclrtStream combineStream[EP_WORLD_SIZE];
    aclrtContext context[EP_WORLD_SIZE];
    int32_t devices[EP_WORLD_SIZE];
    for (uint32_t rankId = 0; rankId < EP_WORLD_SIZE; ++rankId) {
        devices[rankId] = static_cast<int32_t>(rankId);
        CHECK_CALL(aclrtSetDevice(devices[rankId]));
        CHECK_CALL(aclrtCreateContext(&context[rankId], devices[rankId]));
        CHECK_CALL(aclrtCreateStream(&dispatchStream[rankId]));
        CHECK_CALL(aclrtCreateStream(&combineStream[rankId]));
    }
    HcclComm comms[EP_WORLD_SIZE];
    CHECK_CALL(HcclCommInitAll(EP_WORLD_SIZE, devices, comms));

    Args args[EP_WORLD_SIZE];
    std::vector<std::unique_ptr<std::thread>> threads(EP_WORLD_SIZE);
    for (uint32_t rankId = 0; rankId < EP_WORLD_SIZE; ++rankId) {
        args[rankId].rankId = rankId;
        args[rankId].hcclEpComm = comms[rankId];
        args[rankId].dispatchStream = dispatchStream[rankId];
        args[rankId].combineStream = combineStream[rankId];
        args[rankId].context = context[rankId];
        threads[rankId].reset(new std::thread([&a = args[rankId]] { a.result = LaunchOneThreadDispatchAndCombine(a); }));
    }
    int failed = 0;
    for (uint32_t rankId = 0; rankId < EP_WORLD_SIZE; ++rankId) {
        threads[rankId]->join();
        failed += args[rankId].result != 0;
    }
    CHECK_CALL(aclFinalize());
    if (failed) {
        LOG_PRINT("[ERROR] %d of %u ranks failed\n", failed, EP_WORLD_SIZE);
        return 1;
    }
    LOG_PRINT("[INFO] all %u ranks passed\n", EP_WORLD_SIZE);
    return 0;
}
