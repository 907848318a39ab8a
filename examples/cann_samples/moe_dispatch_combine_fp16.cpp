// A CANN-style op sample for aclnnMoeDistributeDispatch / aclnnMoeDistributeCombine (the first,
// unsuffixed generation) on float16 tokens held on the host as op::fp16_t, EP 8 on Atlas A3, written
// the way CANN's public op samples are: aclInit; per device aclrtSetDevice, a context and two streams;
// one HcclCommInitAll for the EP domain; then one thread per device runs both phases of dispatch
// (GetWorkspaceSize, then the launch on its stream), an identity expert, both phases of combine, and
// checks every rank's result against the host's prediction, printing CANN's message on a failure.
//
// The link line is the one CANN's example build (build.sh --run_example) uses for a built-in
// operator, so this program also shows that line works against the mock root (docs/c_programs.md):
//   g++ moe_dispatch_combine_fp16.cpp -I $ASCEND_HOME_PATH/include -I $ASCEND_HOME_PATH/include/aclnn
//       -I $ASCEND_HOME_PATH/<arch>-linux/include/aclnnop -L $ASCEND_OPP_PATH/lib64 -L $ASCEND_HOME_PATH/lib64
//       -lopapi_math -lopapi_transformer -lascendcl -lnnopbase -lpthread -lhccl -lhccl_fwk -lc_sec
//       -o moe_fp16
//   then ./moe_fp16 prints "[INFO] rank <r>: ... execute successfully" for every rank and exits 0.
#include <memory>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclnn/opdev/fp16_t.h"
#include "aclnnop/aclnn_moe_distribute_combine.h"
#include "aclnnop/aclnn_moe_distribute_dispatch.h"
#include "hccl/hccl.h"
#include "sample_common.h"

using sample::DeviceTensor;

namespace {

constexpr uint32_t EP_WORLD_SIZE = 8;
constexpr int64_t BS = 8;
constexpr int64_t H = 7168;   // the first generation runs H = 7168 only
constexpr int64_t K = 4;
constexpr int64_t MOE_EXPERT_NUM = 16;
constexpr int64_t LOCAL_EXPERT_NUM = MOE_EXPERT_NUM / EP_WORLD_SIZE;
constexpr int64_t GLOBAL_BS = BS * EP_WORLD_SIZE;
constexpr int64_t A = GLOBAL_BS * (LOCAL_EXPERT_NUM < K ? LOCAL_EXPERT_NUM : K);

struct Args {
    uint32_t rankId;
    HcclComm hcclEpComm;
    aclrtStream dispatchStream;
    aclrtStream combineStream;
    aclrtContext context;
    int result = -1;
};

// the rows every rank routes to the experts of rank `me`
int64_t RowsFor(uint32_t me) {
    int64_t n = 0;
    for (uint32_t src = 0; src < EP_WORLD_SIZE; ++src)
        for (int t = 0; t < BS; ++t)
            for (int k = 0; k < K; ++k) n += sample::ExpertOf(src, t, k, MOE_EXPERT_NUM) / LOCAL_EXPERT_NUM == me;
    return n;
}

int LaunchOneThreadDispatchAndCombine(Args &args) {
    CHECK_CALL(aclrtSetCurrentContext(args.context));
    char hcomEpName[COMM_NAME_MAX_LENGTH] = {0};
    CHECK_CALL(HcclGetCommName(args.hcclEpComm, hcomEpName));

    std::vector<op::fp16_t> xHostData(BS * H, 0);
    std::vector<int32_t> expertIdsHostData(BS * K, 0);
    std::vector<float> expertScalesHostData(BS * K, 0);
    const std::vector<float> w = sample::TopkWeights(K);
    for (int t = 0; t < BS; ++t) {
        for (int h = 0; h < H; ++h) xHostData[t * H + h] = sample::TokenValue(args.rankId, BS, t) + 0.5f * (h % 4);
        for (int k = 0; k < K; ++k) {
            expertIdsHostData[t * K + k] = sample::ExpertOf(args.rankId, t, k, MOE_EXPERT_NUM);
            expertScalesHostData[t * K + k] = w[k];
        }
    }

    DeviceTensor x, expertIds, expertScales, expandX, dynamicScales, expandIdx, expertTokenNums, epRecvCounts,
        tpRecvCounts, expandScales, xOut;
    CHECK_RET(x.Create(xHostData, {BS, H}, ACL_FLOAT16) == 0, return -1);
    CHECK_RET(expertIds.Create(expertIdsHostData, {BS, K}, ACL_INT32) == 0, return -1);
    CHECK_RET(expertScales.Create(expertScalesHostData, {BS, K}, ACL_FLOAT) == 0, return -1);
    CHECK_RET(expandX.Create(std::vector<op::fp16_t>(), {A, H}, ACL_FLOAT16) == 0, return -1);
    CHECK_RET(dynamicScales.Create(std::vector<float>(), {A}, ACL_FLOAT) == 0, return -1);
    CHECK_RET(expandIdx.Create(std::vector<int32_t>(), {BS * K}, ACL_INT32) == 0, return -1);
    CHECK_RET(expertTokenNums.Create(std::vector<int64_t>(), {LOCAL_EXPERT_NUM}, ACL_INT64) == 0, return -1);
    CHECK_RET(epRecvCounts.Create(std::vector<int32_t>(), {EP_WORLD_SIZE * LOCAL_EXPERT_NUM}, ACL_INT32) == 0,
              return -1);
    CHECK_RET(tpRecvCounts.Create(std::vector<int32_t>(), {1}, ACL_INT32) == 0, return -1);
    CHECK_RET(expandScales.Create(std::vector<float>(), {A}, ACL_FLOAT) == 0, return -1);
    CHECK_RET(xOut.Create(std::vector<op::fp16_t>(), {BS, H}, ACL_FLOAT16) == 0, return -1);

    const int64_t tpWorldSize = 0, tpRankId = 0, expertShardType = 0, sharedExpertNum = 0, sharedExpertRankNum = 0;
    const int64_t quantMode = 0, expertTokenNumsType = 1;   // counts per expert
    const int64_t outDtype = 0, commQuantMode = 0, groupListType = 0;

    uint64_t dispatchWorkspaceSize = 0;
    aclOpExecutor *dispatchExecutor = nullptr;
    void *dispatchWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeDispatchGetWorkspaceSize(
        x.tensor, expertIds.tensor, nullptr, nullptr, nullptr, hcomEpName, EP_WORLD_SIZE, args.rankId,
        MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType, sharedExpertNum, sharedExpertRankNum, quantMode,
        GLOBAL_BS, expertTokenNumsType, expandX.tensor, dynamicScales.tensor, expandIdx.tensor, expertTokenNums.tensor,
        epRecvCounts.tensor, tpRecvCounts.tensor, expandScales.tensor, &dispatchWorkspaceSize, &dispatchExecutor));
    if (dispatchWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&dispatchWorkspaceAddr, dispatchWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeDispatch(dispatchWorkspaceAddr, dispatchWorkspaceSize, dispatchExecutor,
                                          args.dispatchStream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.dispatchStream, 10000));

    std::vector<int64_t> tokenNums;
    CHECK_RET(expertTokenNums.Download(&tokenNums) == 0, return -1);
    int64_t rows = 0;
    for (int64_t n : tokenNums) rows += n;
    CHECK_RET(rows == RowsFor(args.rankId),
              LOG_PRINT("[ERROR] rank %u: %lld rows reached its experts; the host expects %lld\n", args.rankId,
                        static_cast<long long>(rows), static_cast<long long>(RowsFor(args.rankId)));
              return -1);

    // the identity expert: combine reads expandX as the experts' output
    uint64_t combineWorkspaceSize = 0;
    aclOpExecutor *combineExecutor = nullptr;
    void *combineWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeCombineGetWorkspaceSize(
        expandX.tensor, expertIds.tensor, expandIdx.tensor, epRecvCounts.tensor, expertScales.tensor,
        nullptr /* tpSendCounts: no TP domain */, nullptr, nullptr, nullptr, nullptr, nullptr, hcomEpName, EP_WORLD_SIZE, args.rankId,
        MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType, sharedExpertNum, sharedExpertRankNum, GLOBAL_BS,
        outDtype, commQuantMode, groupListType, xOut.tensor, &combineWorkspaceSize, &combineExecutor));
    if (combineWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&combineWorkspaceAddr, combineWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeCombine(combineWorkspaceAddr, combineWorkspaceSize, combineExecutor,
                                         args.combineStream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(args.combineStream, 10000));

    // top-k weights summing to 1 in binary fractions: the weighted sum of K copies of a row is the row
    std::vector<op::fp16_t> xOutHostData;
    CHECK_RET(xOut.Download(&xOutHostData) == 0, return -1);
    for (int64_t i = 0; i < BS * H; ++i) {
        CHECK_RET(xOutHostData[i] == xHostData[i],
                  LOG_PRINT("[ERROR] rank %u: element %lld of x is %f after the round, %f before\n", args.rankId,
                            static_cast<long long>(i), static_cast<float>(xOutHostData[i]),
                            static_cast<float>(xHostData[i]));
                  return -1);
    }
    LOG_PRINT("[INFO] rank %u: aclnnMoeDistributeDispatch and aclnnMoeDistributeCombine execute successfully\n",
              args.rankId);

    if (dispatchWorkspaceAddr) aclrtFree(dispatchWorkspaceAddr);
    if (combineWorkspaceAddr) aclrtFree(combineWorkspaceAddr);
    for (DeviceTensor *t : {&x, &expertIds, &expertScales, &expandX, &dynamicScales, &expandIdx, &expertTokenNums,
                            &epRecvCounts, &tpRecvCounts, &expandScales, &xOut})
        t->Release();
    CHECK_CALL(HcclCommDestroy(args.hcclEpComm));
    CHECK_CALL(aclrtDestroyStream(args.dispatchStream));
    CHECK_CALL(aclrtDestroyStream(args.combineStream));
    CHECK_CALL(aclrtDestroyContext(args.context));
    CHECK_CALL(aclrtResetDevice(static_cast<int32_t>(args.rankId)));
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
        Args &a = args[rankId];
        a.rankId = rankId;
        a.hcclEpComm = comms[rankId];
        a.dispatchStream = dispatchStream[rankId];
        a.combineStream = combineStream[rankId];
        a.context = context[rankId];
        threads[rankId].reset(new std::thread([&a] { a.result = LaunchOneThreadDispatchAndCombine(a); }));
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
    return 0;
}
