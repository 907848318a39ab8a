// A CANN-style op sample for aclnnMoeDistributeDispatchV3 / aclnnMoeDistributeCombineV3 on Atlas A2
// (Ascend910B), EP 16, written the way CANN's public A2 op samples are: one process per device
// (fork), each joining the EP communicator through a rank table with HcclCommInitClusterInfo, then
// both phases of dispatch, an identity expert, both phases of combine, a check of its result against
// the host's prediction, and a success line; on a failure the call and CANN's message.
//
// usage: moe_v3_a2 [rank_table_path]   (default: ./moe_v3_a2_rank_table.json, written by the program)
// Run with ACLNN_MOCK_SOC=Ascend910B3 (or any Atlas A2 name) on the mock; on hardware the SoC is the
// device's. Build with CANN's example link line (docs/c_programs.md).
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_moe_distribute_combine_v3.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v3.h"
#include "hccl/hccl.h"
#include "sample_common.h"

using sample::DeviceTensor;

namespace {

constexpr int EP_WORLD_SIZE = 16;   // Atlas A2 runs 16, 32, 64, 128 or 256 ranks
constexpr int64_t BS = 8;
constexpr int64_t H = 1024;
constexpr int64_t K = 4;
constexpr int64_t MOE_EXPERT_NUM = 16;
constexpr int64_t LOCAL_EXPERT_NUM = MOE_EXPERT_NUM / EP_WORLD_SIZE;
constexpr int64_t GLOBAL_BS = BS * EP_WORLD_SIZE;
constexpr int64_t A = GLOBAL_BS * (LOCAL_EXPERT_NUM < K ? LOCAL_EXPERT_NUM : K);

// The rank table HCCL reads: one server, one device per rank (device i is rank i).
int WriteRankTable(const std::string &path) {
    std::ofstream out(path);
    out << "{\"version\": \"1.0\", \"server_count\": \"1\", \"server_list\": [{\"server_id\": \"127.0.0.1\", "
           "\"device\": [";
    for (int r = 0; r < EP_WORLD_SIZE; ++r)
        out << (r ? ", " : "") << "{\"device_id\": \"" << r << "\", \"device_ip\": \"192.168.100." << r + 1
            << "\", \"rank_id\": \"" << r << "\"}";
    out << "]}], \"status\": \"completed\"}\n";
    out.close();
    CHECK_RET(out.good(), LOG_PRINT("[ERROR] cannot write the rank table %s\n", path.c_str()); return -1);
    return 0;
}

int RunOneRank(int rankId, const char *rankTable) {
    CHECK_CALL(aclInit(nullptr));
    CHECK_CALL(aclrtSetDevice(rankId));
    aclrtStream stream = nullptr;
    CHECK_CALL(aclrtCreateStream(&stream));
    HcclComm comm = nullptr;
    CHECK_CALL(HcclCommInitClusterInfo(rankTable, static_cast<uint32_t>(rankId), &comm));
    char hcomEpName[COMM_NAME_MAX_LENGTH] = {0};
    CHECK_CALL(HcclGetCommName(comm, hcomEpName));

    const sample::Tokens host = sample::RoutedTokens(rankId, rankId, BS, H, K, MOE_EXPERT_NUM);
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
    CHECK_CALL(aclnnMoeDistributeDispatchV3GetWorkspaceSize(
        tok.x.tensor, tok.expertIds.tensor, nullptr, nullptr, nullptr, nullptr, hcomEpName, EP_WORLD_SIZE, rankId,
        MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType, sharedExpertNum, sharedExpertRankNum, quantMode,
        GLOBAL_BS, expertTokenNumsType, commAlg, zeroExpertNum, copyExpertNum, constExpertNum, out.expandX.tensor,
        out.dynamicScales.tensor, out.assistInfo.tensor, out.expertTokenNums.tensor, out.epRecvCounts.tensor,
        out.tpRecvCounts.tensor,
        out.expandScales.tensor, &dispatchWorkspaceSize, &dispatchExecutor));
    if (dispatchWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&dispatchWorkspaceAddr, dispatchWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeDispatchV3(dispatchWorkspaceAddr, dispatchWorkspaceSize, dispatchExecutor, stream));

    uint64_t combineWorkspaceSize = 0;
    aclOpExecutor *combineExecutor = nullptr;
    void *combineWorkspaceAddr = nullptr;
    CHECK_CALL(aclnnMoeDistributeCombineV3GetWorkspaceSize(
        out.expandX.tensor, tok.expertIds.tensor, out.assistInfo.tensor, out.epRecvCounts.tensor,
        tok.expertScales.tensor, nullptr,
        nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, hcomEpName,
        EP_WORLD_SIZE, rankId, MOE_EXPERT_NUM, "", tpWorldSize, tpRankId, expertShardType, sharedExpertNum,
        sharedExpertRankNum, GLOBAL_BS, outDtype, commQuantMode, groupListType, commAlg, zeroExpertNum, copyExpertNum,
        constExpertNum, xOut.tensor, &combineWorkspaceSize, &combineExecutor));
    if (combineWorkspaceSize > 0)
        CHECK_CALL(aclrtMalloc(&combineWorkspaceAddr, combineWorkspaceSize, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_CALL(aclnnMoeDistributeCombineV3(combineWorkspaceAddr, combineWorkspaceSize, combineExecutor, stream));
    CHECK_CALL(aclrtSynchronizeStreamWithTimeout(stream, 10000));

    CHECK_RET(sample::CheckXBack(xOut, host.x, rankId) == 0, return -1);
    LOG_PRINT("[INFO] rank %d: aclnnMoeDistributeDispatchV3 and aclnnMoeDistributeCombineV3 execute successfully\n",
              rankId);

    if (dispatchWorkspaceAddr) aclrtFree(dispatchWorkspaceAddr);
    if (combineWorkspaceAddr) aclrtFree(combineWorkspaceAddr);
    tok.Release();
    out.Release();
    for (DeviceTensor *t : {&xOut}) t->Release();
    CHECK_CALL(HcclCommDestroy(comm));
    CHECK_CALL(aclrtDestroyStream(stream));
    CHECK_CALL(aclrtResetDevice(rankId));
    CHECK_CALL(aclFinalize());
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    const std::string rankTable = argc > 1 ? argv[1] : "moe_v3_a2_rank_table.json";
    if (argc <= 1) CHECK_RET(WriteRankTable(rankTable) == 0, return 1);
    std::vector<pid_t> pids;
    for (int rank = 0; rank < EP_WORLD_SIZE; ++rank) {
        pid_t pid = fork();
        CHECK_RET(pid >= 0, LOG_PRINT("[ERROR] fork failed for rank %d\n", rank); return 1);
        if (pid == 0) _exit(RunOneRank(rank, rankTable.c_str()) == 0 ? 0 : 1);
        pids.push_back(pid);
    }
    int failed = 0;
    for (pid_t pid : pids) {
        int status = 0;
        waitpid(pid, &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    if (failed) {
        LOG_PRINT("[ERROR] %d of %d ranks failed\n", failed, EP_WORLD_SIZE);
        return 1;
    }
    return 0;
}
