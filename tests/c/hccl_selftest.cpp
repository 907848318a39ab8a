// C-level tests of the mock libhccl.so, built and run by tests/mock/test_hccl_c.py:
//   hccl_selftest <scenario> [args]
// Scenarios run worlds of threads (or forked processes) and exit 0 on success; a failed check prints
// "FAIL <file>:<line>: <what>" and exits 1. Uses the public C ABI plus the kernel contract of
// mock/hccl/hccl_core.h (arrive / wait_all / verify_op_res_ctx).
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl_rt.h"
#include "hccl/hccl_comm.h"
#include "hccl/hccl_core.h"
#include "hccl/hccl_internal.h"
#include "hccl/hccl_kfc.h"

using namespace aclmock;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);              \
            fflush(stderr);                                                              \
            _exit(1);                                                                    \
        }                                                                                \
    } while (0)
#define CHECK_RANGE(v, lo, hi)                                                           \
    do {                                                                                 \
        double v_ = (v);                                                                 \
        if (!(v_ >= (lo) && v_ < (hi))) {                                                \
            fprintf(stderr, "FAIL %s:%d: %s = %g outside [%g, %g)\n", __FILE__, __LINE__, #v, \
                    v_, (double)(lo), (double)(hi));                                     \
            fflush(stderr);                                                              \
            _exit(1);                                                                    \
        }                                                                                \
    } while (0)
#define CHECK_EQ(a, b)                                                                   \
    do {                                                                                 \
        long long va_ = (long long)(a), vb_ = (long long)(b);                            \
        if (va_ != vb_) {                                                                \
            const char *m_ = aclGetRecentErrMsg();                                       \
            fprintf(stderr, "FAIL %s:%d: %s == %s (%lld vs %lld) msg=%s\n", __FILE__,     \
                    __LINE__, #a, #b, va_, vb_, m_ ? m_ : "(none)");                     \
            fflush(stderr);                                                              \
            _exit(1);                                                                    \
        }                                                                                \
    } while (0)

static std::string msg() {
    const char *m = aclGetRecentErrMsg();
    return m ? m : "";
}
static bool contains(const std::string &s, const char *sub) { return s.find(sub) != std::string::npos; }
#define CHECK_MSG(s, sub)                                                                \
    do {                                                                                 \
        std::string s_ = (s);                                                            \
        if (!contains(s_, sub)) {                                                        \
            fprintf(stderr, "FAIL %s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, \
                    s_.c_str(), sub);                                                    \
            _exit(1);                                                                    \
        }                                                                                \
    } while (0)

static std::string hex_world(const HcclRootInfo &root) {
    hccl::RootBlob rb;
    memcpy(&rb, root.internal, sizeof rb);
    uint64_t wid = rb.world_id;
    char b[32];
    snprintf(b, sizeof b, "%016" PRIx64, wid);
    return b;
}

static int shm_segments_of(const std::string &world) {
    int n = 0;
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    while (struct dirent *e = readdir(d))
        if (strstr(e->d_name, "aclmock_hccl_") && strstr(e->d_name, world.c_str())) ++n;
    closedir(d);
    return n;
}

static double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Timing bounds of the liveness scenarios: "promptly" means well under this, on a loaded machine,
// while the timeouts the driver sets (HCCL_EXEC_TIMEOUT / HCCL_CONNECT_TIMEOUT = 120 s) are far above.
static const double kPrompt = 10.0;

static void run_ranks(int n, const std::function<void(int)> &fn) {
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) ts.emplace_back([&, r] {
        CHECK_EQ(aclrtSetDevice(r % 16), 0);
        fn(r);
    });
    for (auto &t : ts) t.join();
}

// ---- scenario: a world of threads, everything that should work --------------------------------
static void world_threads(int W) {
    HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    std::vector<HcclComm> comms(W);
    std::vector<void *> own(W);
    run_ranks(W, [&](int r) {
        HcclComm c = nullptr;
        CHECK_EQ(HcclCommInitRootInfo(W, &root, r, &c), HCCL_SUCCESS);
        comms[r] = c;
        uint32_t id = 99, size = 0;
        CHECK_EQ(HcclGetRankId(c, &id), HCCL_SUCCESS);
        CHECK_EQ(HcclGetRankSize(c, &size), HCCL_SUCCESS);
        CHECK_EQ(id, r);
        CHECK_EQ(size, W);
        char name[COMM_NAME_MAX_LENGTH] = {0};
        CHECK_EQ(HcclGetCommName(c, name), HCCL_SUCCESS);
        CHECK(strlen(name) > 0 && strlen(name) < COMM_NAME_MAX_LENGTH);
        HcclComm back = nullptr;
        CHECK_EQ(HcclCommGetHandleWithName(name, &back), HCCL_SUCCESS);
        CHECK(back == c);
        void *addr = nullptr;
        uint64_t bytes = 0;
        CHECK_EQ(HcclGetHcclBuffer(c, &addr, &bytes), HCCL_SUCCESS);
        CHECK_EQ(bytes, 2ull * 2 * (1 << 20));   // HCCL_BUFFSIZE=2 (set by the test driver)
        CHECK(reinterpret_cast<uintptr_t>(addr) % 512 == 0);
        own[r] = addr;
        // KFC sequence as CANN's context builder runs it
        void *args = nullptr;
        CHECK_EQ(HcclKfcAllocOpArgs(&args), HCCL_SUCCESS);
        CHECK_EQ(HcclKfcOpArgsSetCommEngine(args, HCCL_COMM_ENGINE_AIV), HCCL_SUCCESS);
        char alg[] = "AlltoAll=level0:fullmesh;level1:pairwise";
        CHECK_EQ(HcclKfcOpArgsSetAlgConfig(args, alg), HCCL_SUCCESS);
        void *ctx = nullptr, *ctx2 = nullptr;
        CHECK_EQ(HcclCreateOpResCtx(back, HCCL_OP_TYPE_ALLTOALL, args, &ctx), HCCL_SUCCESS);
        CHECK_EQ(HcclCreateOpResCtx(back, HCCL_OP_TYPE_ALLTOALL, args, &ctx2), HCCL_SUCCESS);
        CHECK(ctx && ctx == ctx2);
        CHECK_EQ(HcclKfcFreeOpArgs(args), HCCL_SUCCESS);
        CHECK_EQ(HcclKfcFreeOpArgs(args), HCCL_E_PARA);   // freed already
        hccl::OpResCtx *v = hccl::verify_op_res_ctx(reinterpret_cast<uintptr_t>(ctx));
        CHECK(v != nullptr);
        CHECK(v->comm == hccl::from_handle(c));
        CHECK_EQ(v->op_type, HCCL_OP_TYPE_ALLTOALL);
        CHECK_EQ(v->comm_engine, HCCL_COMM_ENGINE_AIV);
        CHECK(strcmp(v->alg_config, alg) == 0);
        CHECK(hccl::verify_op_res_ctx(reinterpret_cast<uintptr_t>(ctx) + 8) == nullptr);
    });
    // every rank maps every window; thread ranks share one mapping per window
    run_ranks(W, [&](int r) {
        for (int p = 0; p < W; ++p) {
            void *a = nullptr;
            uint64_t sz = 0;
            CHECK_EQ(HcclGetRemoteIpcHcclBuf(comms[r], p, &a, &sz), HCCL_SUCCESS);
            CHECK(a == own[p]);
        }
        void *a;
        uint64_t sz;
        CHECK_EQ(HcclGetRemoteIpcHcclBuf(comms[r], W, &a, &sz), HCCL_E_PARA);
        CHECK_MSG(msg(), "remoteRank");
    });
    // data through aclrtMemcpy into the next rank's data area, barrier, read back by that rank
    run_ranks(W, [&](int r) {
        hccl::Comm *c = hccl::from_handle(comms[r]);
        CHECK(c != nullptr);
        int dst = (r + 1) % W;
        int64_t val = 1000 + r;
        CHECK_EQ(aclrtMemcpy(c->data_half(dst, 0), 8, &val, 8, ACL_MEMCPY_HOST_TO_DEVICE), 0);
        aclrtStream s = nullptr;
        CHECK_EQ(aclrtCreateStream(&s), 0);
        CHECK_EQ(HcclBarrier(comms[r], s), HCCL_SUCCESS);
        CHECK_EQ(aclrtSynchronizeStream(s), 0);
        int64_t got = 0;
        CHECK_EQ(aclrtMemcpy(&got, 8, c->data_half(r, 0), 8, ACL_MEMCPY_DEVICE_TO_HOST), 0);
        CHECK_EQ(got, 1000 + (r + W - 1) % W);
        // second barrier on the default stream
        CHECK_EQ(HcclBarrier(comms[r], nullptr), HCCL_SUCCESS);
        CHECK_EQ(aclrtSynchronizeStream(nullptr), 0);
        CHECK_EQ(aclrtDestroyStream(s), 0);
        HcclResult ae = HCCL_E_INTERNAL;
        CHECK_EQ(HcclGetCommAsyncError(comms[r], &ae), HCCL_SUCCESS);
        CHECK_EQ(ae, HCCL_SUCCESS);
    });
    // the kernel contract: arrive / wait_all with parameters, then a parameter mismatch
    if (W >= 2) run_ranks(W, [&](int r) {
        hccl::Comm *c = hccl::from_handle(comms[r]);
        const char *names[2] = {"moe_expert_num", "bs"};
        for (int round = 0; round < 3; ++round) {
            uint64_t seq = c->next_seq();
            int64_t f[2] = {32, 8 + round};
            c->arrive(seq, hccl::kTagDispatch, f, 2);
            CHECK_EQ(c->wait_all(seq, hccl::kTagDispatch, f, names, 2, "MoeDistributeDispatchV5"), 0);
        }
        uint64_t seq = c->next_seq();
        int64_t f[2] = {r == 1 ? 64 : 32, 8};
        c->arrive(seq, hccl::kTagDispatch, f, 2);
        int rc = c->wait_all(seq, hccl::kTagDispatch, f, names, 2, "MoeDistributeDispatchV5");
        CHECK_EQ(rc, ACL_ERROR_RT_AICORE_EXCEPTION);
        std::string m = msg();
        CHECK_MSG(m, "moe_expert_num");
        CHECK_MSG(m, r == 1 ? "has 32" : "rank 1 has 64");
    });
    // tag mismatch: rank 0 runs combine, the others dispatch
    if (W >= 2) run_ranks(W, [&](int r) {
        hccl::Comm *c = hccl::from_handle(comms[r]);
        uint64_t seq = c->next_seq();
        uint32_t tag = r == 0 ? hccl::kTagCombine : hccl::kTagDispatch;
        c->arrive(seq, tag, nullptr, 0);
        CHECK_EQ(c->wait_all(seq, tag, nullptr, nullptr, 0, nullptr), ACL_ERROR_RT_AICORE_EXCEPTION);
        CHECK_MSG(msg(), "call-order mismatch");
    });
    hccl::HcclStats st = hccl::hccl_stats();
    CHECK_EQ(st.live_comms, W);
    CHECK_EQ(st.mapped_windows, W);   // one mapping per window in this process
    std::string world = hex_world(root);
    CHECK_EQ(shm_segments_of(world), 0);   // unlinked once every rank mapped every window
    run_ranks(W, [&](int r) { CHECK_EQ(HcclCommDestroy(comms[r]), HCCL_SUCCESS); });
    st = hccl::hccl_stats();
    CHECK_EQ(st.live_comms, 0);
    CHECK_EQ(st.mapped_windows, 0);
    uint32_t x;
    CHECK_EQ(HcclGetRankId(comms[0], &x), HCCL_E_PARA);
    CHECK_MSG(msg(), "not a live communicator");
    CHECK_EQ(HcclCommDestroy(comms[0]), HCCL_E_PARA);
    CHECK_EQ(HcclGetRankId(nullptr, &x), HCCL_E_PTR);
    printf("ok world_threads %d\n", W);
}

// ---- scenario: argument errors ------------------------------------------------------------------
static void arg_errors() {
    HcclRootInfo root;
    HcclComm c = nullptr;
    CHECK_EQ(HcclGetRootInfo(nullptr), HCCL_E_PTR);
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    CHECK_EQ(HcclCommInitRootInfo(0, &root, 0, &c), HCCL_E_PARA);
    CHECK_MSG(msg(), "nRanks");
    CHECK_EQ(HcclCommInitRootInfo(2, &root, 2, &c), HCCL_E_PARA);
    CHECK_MSG(msg(), "rank must be < nRanks");
    CHECK_EQ(HcclCommInitRootInfo(2, nullptr, 0, &c), HCCL_E_PTR);
    CHECK_EQ(HcclCommInitRootInfo(2, &root, 0, nullptr), HCCL_E_PTR);
    HcclRootInfo bad;
    memset(&bad, 7, sizeof bad);
    CHECK_EQ(HcclCommInitRootInfo(2, &bad, 0, &c), HCCL_E_PARA);
    CHECK_MSG(msg(), "HcclGetRootInfo");
    // duplicate rank and nRanks mismatch, while rank 0 waits for its peer
    std::atomic<int> phase{0};
    std::thread t0([&] {
        HcclComm c0 = nullptr;
        CHECK_EQ(HcclCommInitRootInfo(2, &root, 0, &c0), HCCL_SUCCESS);
        phase = 2;
        CHECK_EQ(HcclCommDestroy(c0), HCCL_SUCCESS);
    });
    usleep(100000);
    HcclComm d = nullptr;
    CHECK_EQ(HcclCommInitRootInfo(2, &root, 0, &d), HCCL_E_PARA);
    CHECK_MSG(msg(), "duplicate rank 0");
    CHECK_EQ(HcclCommInitRootInfo(3, &root, 1, &d), HCCL_E_PARA);
    CHECK_MSG(msg(), "nRanks mismatch");
    HcclComm c1 = nullptr;
    CHECK_EQ(HcclCommInitRootInfo(2, &root, 1, &c1), HCCL_SUCCESS);
    t0.join();
    CHECK_EQ(HcclCommDestroy(c1), HCCL_SUCCESS);
    // KFC argument checks
    void *args = nullptr;
    CHECK_EQ(HcclKfcAllocOpArgs(nullptr), HCCL_E_PTR);
    CHECK_EQ(HcclKfcAllocOpArgs(&args), HCCL_SUCCESS);
    char badcfg[] = "AlltoAll";
    CHECK_EQ(HcclKfcOpArgsSetAlgConfig(args, badcfg), HCCL_E_PARA);
    CHECK_MSG(msg(), "malformed");
    CHECK_EQ(HcclKfcOpArgsSetAlgConfig(args, nullptr), HCCL_E_PTR);
    CHECK_EQ(HcclKfcOpArgsSetCommEngine(nullptr, 4), HCCL_E_PTR);
    void *ctx;
    CHECK_EQ(HcclCreateOpResCtx(nullptr, 8, args, &ctx), HCCL_E_PTR);
    CHECK_EQ(HcclCreateOpResCtx(c1, 8, args, &ctx), HCCL_E_PARA);   // destroyed comm
    CHECK_EQ(HcclKfcFreeOpArgs(args), HCCL_SUCCESS);
    CHECK_EQ(HcclKfcFreeOpArgs(nullptr), HCCL_E_PTR);
    HcclComm h;
    CHECK_EQ(HcclCommGetHandleWithName("no such comm", &h), HCCL_E_NOT_FOUND);
    for (int code = 0; code <= 24; ++code) CHECK(strlen(HcclGetErrorString(static_cast<HcclResult>(code))) > 5);
    CHECK(contains(HcclGetErrorString(HCCL_E_TIMEOUT), "TIMEOUT"));
    CHECK(strlen(HcclGetErrorString(static_cast<HcclResult>(777))) > 0);
    printf("ok arg_errors\n");
}

// ---- scenario: a rank never joins (HCCL_CONNECT_TIMEOUT set by the driver) ----------------------
static void never_joins(int W) {
    HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    run_ranks(W - 1, [&](int r) {
        HcclComm c = nullptr;
        CHECK_EQ(HcclCommInitRootInfo(W, &root, r, &c), HCCL_E_TIMEOUT);
        char want[32];
        snprintf(want, sizeof want, "[%d]", W - 1);
        CHECK_MSG(msg(), want);
    });
    CHECK_EQ(shm_segments_of(hex_world(root)), 0);
    CHECK_EQ(hccl::hccl_stats().mapped_windows, 0);
    printf("ok never_joins %d\n", W);
}

// ---- scenario: a barrier that a peer never enters (HCCL_EXEC_TIMEOUT set by the driver) ---------
static void exec_timeout() {
    HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    std::atomic<bool> reported{false};
    run_ranks(2, [&](int r) {
        HcclComm c = nullptr;
        CHECK_EQ(HcclCommInitRootInfo(2, &root, r, &c), HCCL_SUCCESS);
        if (r == 0) {
            CHECK_EQ(HcclBarrier(c, nullptr), HCCL_SUCCESS);
            CHECK_EQ(aclrtSynchronizeStream(nullptr), ACL_ERROR_RT_AICORE_TIMEOUT);
            std::string m = msg();
            CHECK_MSG(m, "HcclBarrier on rank 0: timed out");
            CHECK_MSG(m, "[1]");
            reported = true;
        } else {
            // alive and holding its communicator, just not entering the barrier: only the timeout
            // can end rank 0's wait
            while (!reported) usleep(10000);
        }
        CHECK_EQ(HcclCommDestroy(c), HCCL_SUCCESS);
    });
    printf("ok exec_timeout\n");
}

// ---- scenario: a peer destroys its communicator while rank 0 waits for it ---------------------
static void peer_destroyed() {
    HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    run_ranks(2, [&](int r) {
        HcclComm c = nullptr;
        CHECK_EQ(HcclCommInitRootInfo(2, &root, r, &c), HCCL_SUCCESS);
        if (r == 0) {
            double t0 = now_s();
            CHECK_EQ(HcclBarrier(c, nullptr), HCCL_SUCCESS);
            CHECK_EQ(aclrtSynchronizeStream(nullptr), ACL_ERROR_RT_AICORE_TIMEOUT);
            double took = now_s() - t0;
            std::string m = msg();
            CHECK_MSG(m, "waiting for ranks [1]");
            CHECK_MSG(m, "(rank 1 destroyed its communicator)");
            CHECK_RANGE(took, 0, kPrompt);
        } else {
            usleep(300000);   // rank 0 is waiting by now
        }
        CHECK_EQ(HcclCommDestroy(c), HCCL_SUCCESS);
    });
    printf("ok peer_destroyed\n");
}

// ---- scenario: host waits in short slices, then abandoned (the C side of Ctrl-C) ----------------
// Rank 0 queues barriers that wait for rank 1. aclrtSynchronizeStreamWithTimeout returns 507046 in
// about its slice and leaves the queued work alone: once rank 1 arrives a plain synchronise reports
// the barrier's own result. Then rank 0 queues two more barriers, abandons them and destroys its
// communicator: the barrier waiting inside fails at once, the one queued behind it too, and both
// aclrtSynchronizeStream and aclrtDestroyStream return promptly (HCCL_EXEC_TIMEOUT is 120 s).
static void sliced_waits() {
    HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    std::atomic<int> phase{0};
    run_ranks(2, [&](int r) {
        HcclComm c = nullptr;
        CHECK_EQ(HcclCommInitRootInfo(2, &root, r, &c), HCCL_SUCCESS);
        if (r == 1) {
            while (phase < 1) usleep(1000);
            CHECK_EQ(HcclBarrier(c, nullptr), HCCL_SUCCESS);
            CHECK_EQ(aclrtSynchronizeStream(nullptr), 0);
            phase = 2;
            while (phase < 3) usleep(1000);   // keeps its communicator while rank 0 abandons
            CHECK_EQ(HcclCommDestroy(c), HCCL_SUCCESS);
            return;
        }
        aclrtStream s = nullptr;
        CHECK_EQ(aclrtCreateStream(&s), 0);
        CHECK_EQ(HcclBarrier(c, s), HCCL_SUCCESS);
        for (int i = 0; i < 3; ++i) {
            double t0 = now_s();
            CHECK_EQ(aclrtSynchronizeStreamWithTimeout(s, 100), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
            CHECK_RANGE(now_s() - t0, 0.099, kPrompt);
            CHECK_MSG(msg(), "timed out after 100 ms");
        }
        phase = 1;   // rank 1 enters the barrier now
        CHECK_EQ(aclrtSynchronizeStream(s), 0);   // the barrier's own result, nothing lost
        while (phase < 2) usleep(1000);
        // abandoned waits
        CHECK_EQ(HcclBarrier(c, s), HCCL_SUCCESS);
        CHECK_EQ(HcclBarrier(c, s), HCCL_SUCCESS);
        CHECK_EQ(aclrtSynchronizeStreamWithTimeout(s, 100), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
        double t0 = now_s();
        CHECK_EQ(HcclCommDestroy(c), HCCL_SUCCESS);
        CHECK_RANGE(now_s() - t0, 0, kPrompt);
        t0 = now_s();
        CHECK_EQ(aclrtSynchronizeStream(s), ACL_ERROR_RT_AICORE_EXCEPTION);
        CHECK_MSG(msg(), "destroyed");
        CHECK_EQ(aclrtDestroyStream(s), 0);
        CHECK_RANGE(now_s() - t0, 0, kPrompt);
        phase = 3;
    });
    // the same, with the stream destroyed right after the communicator, without a synchronise
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    run_ranks(2, [&](int r) {
        HcclComm c = nullptr;
        CHECK_EQ(HcclCommInitRootInfo(2, &root, r, &c), HCCL_SUCCESS);
        if (r == 1) {
            while (phase < 4) usleep(1000);
            CHECK_EQ(HcclCommDestroy(c), HCCL_SUCCESS);
            return;
        }
        aclrtStream s = nullptr;
        CHECK_EQ(aclrtCreateStream(&s), 0);
        CHECK_EQ(HcclBarrier(c, s), HCCL_SUCCESS);
        CHECK_EQ(aclrtSynchronizeStreamWithTimeout(s, 50), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
        double t0 = now_s();
        CHECK_EQ(HcclCommDestroy(c), HCCL_SUCCESS);
        CHECK_EQ(aclrtDestroyStream(s), 0);
        CHECK_RANGE(now_s() - t0, 0, kPrompt);
        phase = 4;
    });
    printf("ok sliced_waits\n");
}

// ---- scenario: a kernel that times out, watched in slices (HCCL_EXEC_TIMEOUT=1 by the driver) ---
static void sliced_timeout() {
    HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    std::atomic<bool> reported{false};
    run_ranks(2, [&](int r) {
        HcclComm c = nullptr;
        CHECK_EQ(HcclCommInitRootInfo(2, &root, r, &c), HCCL_SUCCESS);
        if (r == 0) {
            aclrtStream s = nullptr;
            CHECK_EQ(aclrtCreateStream(&s), 0);
            CHECK_EQ(HcclBarrier(c, s), HCCL_SUCCESS);
            int slices = 0, rc;
            while ((rc = aclrtSynchronizeStreamWithTimeout(s, 100)) == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) ++slices;
            CHECK_EQ(rc, ACL_ERROR_RT_AICORE_TIMEOUT);   // the kernel's own result
            CHECK_MSG(msg(), "HcclBarrier on rank 0: timed out");
            CHECK_RANGE(slices, 1, 1e9);
            CHECK_EQ(aclrtSynchronizeStream(s), 0);      // reported once
            CHECK_EQ(aclrtDestroyStream(s), 0);
            reported = true;
        } else {
            while (!reported) usleep(10000);
        }
        CHECK_EQ(HcclCommDestroy(c), HCCL_SUCCESS);
    });
    printf("ok sliced_timeout\n");
}

// ---- scenario: main() returns while another thread is blocked (exit with a join or a wait) -------
// Prints the world id; the driver checks that the process ended promptly and that /dev/shm holds
// nothing of that world.
static int exit_while_blocked(const std::string &where) {
    static HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    if (where == "join") {
        std::thread([] {
            CHECK_EQ(aclrtSetDevice(0), 0);
            HcclComm c = nullptr;
            HcclCommInitRootInfo(2, &root, 0, &c);   // rank 1 never comes
        }).detach();
        double until = now_s() + 30;
        while (shm_segments_of(hex_world(root)) < 2 && now_s() < until) usleep(10000);
        CHECK_EQ(shm_segments_of(hex_world(root)), 2);   // its rendezvous area and its window
    } else {
        static HcclComm comms[2];
        run_ranks(2, [&](int r) { CHECK_EQ(HcclCommInitRootInfo(2, &root, r, &comms[r]), HCCL_SUCCESS); });
        CHECK_EQ(aclrtSetDevice(0), 0);
        aclrtStream s = nullptr;
        CHECK_EQ(aclrtCreateStream(&s), 0);
        CHECK_EQ(HcclBarrier(comms[0], s), HCCL_SUCCESS);   // rank 1 never enters it
        CHECK_EQ(aclrtSynchronizeStreamWithTimeout(s, 100), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
    }
    printf("world %s\nok exit_while_blocked %s\n", hex_world(root).c_str(), where.c_str());
    fflush(stdout);
    return 0;   // exit() with the other thread still blocked
}

// ---- scenario: processes; rank W-1 is SIGKILLed after joining --------------------------------
static void procs(int W, bool kill_last) {
    HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    std::vector<pid_t> kids;
    for (int r = 0; r < W; ++r) {
        pid_t p = fork();
        CHECK(p >= 0);
        if (p == 0) {
            CHECK_EQ(aclrtSetDevice(r), 0);
            HcclComm c = nullptr;
            CHECK_EQ(HcclCommInitRootInfo(W, &root, r, &c), HCCL_SUCCESS);
            hccl::Comm *cc = hccl::from_handle(c);
            int64_t v = 7000 + r;
            CHECK_EQ(aclrtMemcpy(cc->data_half((r + 1) % W, 1), 8, &v, 8, ACL_MEMCPY_HOST_TO_DEVICE), 0);
            CHECK_EQ(HcclBarrier(c, nullptr), HCCL_SUCCESS);
            CHECK_EQ(aclrtSynchronizeStream(nullptr), 0);
            int64_t got = 0;
            CHECK_EQ(aclrtMemcpy(&got, 8, cc->data_half(r, 1), 8, ACL_MEMCPY_DEVICE_TO_HOST), 0);
            CHECK_EQ(got, 7000 + (r + W - 1) % W);
            if (kill_last) {
                if (r == W - 1) raise(SIGKILL);
                double t0 = now_s();
                CHECK_EQ(HcclBarrier(c, nullptr), HCCL_SUCCESS);
                CHECK_EQ(aclrtSynchronizeStream(nullptr), ACL_ERROR_RT_AICORE_TIMEOUT);
                CHECK_RANGE(now_s() - t0, 0, kPrompt);   // the driver sets HCCL_EXEC_TIMEOUT=120
                std::string m = msg();
                char want[64];
                snprintf(want, sizeof want, "rank %d: process", W - 1);
                CHECK_MSG(m, want);
                CHECK_MSG(m, "is dead");
                HcclResult ae = HCCL_SUCCESS;
                CHECK_EQ(HcclGetCommAsyncError(c, &ae), HCCL_SUCCESS);
                CHECK_EQ(ae, HCCL_E_REMOTE);
            }
            CHECK_EQ(HcclCommDestroy(c), HCCL_SUCCESS);
            _exit(0);
        }
        kids.push_back(p);
    }
    int bad = 0;
    for (int r = 0; r < W; ++r) {
        int st = 0;
        waitpid(kids[r], &st, 0);
        bool ok = kill_last && r == W - 1 ? (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
                                          : (WIFEXITED(st) && WEXITSTATUS(st) == 0);
        if (!ok) {
            fprintf(stderr, "rank %d ended with status 0x%x\n", r, st);
            ++bad;
        }
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(shm_segments_of(hex_world(root)), 0);
    printf("ok procs %d%s\n", W, kill_last ? " kill" : "");
}

// ---- scenario: a rank's process dies while the world forms -------------------------------------
// W = 3: rank 2 never comes; rank 1 joins in a child process that the parent SIGKILLs (and leaves
// unreaped, a zombie) while it waits; rank 0, a thread of the parent, gives up within seconds
// although HCCL_CONNECT_TIMEOUT is 120 s, naming rank 1's dead process. Nothing is left in /dev/shm.
static void join_dies() {
    HcclRootInfo root;
    CHECK_EQ(HcclGetRootInfo(&root), HCCL_SUCCESS);
    pid_t kid = fork();
    CHECK(kid >= 0);
    if (kid == 0) {
        CHECK_EQ(aclrtSetDevice(1), 0);
        HcclComm c = nullptr;
        HcclCommInitRootInfo(3, &root, 1, &c);
        _exit(3);
    }
    std::string err;
    double took = 0;
    std::thread rank0([&] {
        CHECK_EQ(aclrtSetDevice(0), 0);
        HcclComm c = nullptr;
        double t0 = now_s();
        CHECK_EQ(HcclCommInitRootInfo(3, &root, 0, &c), HCCL_E_TIMEOUT);
        took = now_s() - t0;
        err = msg();
    });
    usleep(500000);   // both wait in the rendezvous by now
    kill(kid, SIGKILL);
    rank0.join();
    char want[64];
    snprintf(want, sizeof want, "(rank 1: process %d is dead)", static_cast<int>(kid));
    CHECK_MSG(err, want);
    CHECK_MSG(err, "waiting for ranks [2] to join");
    CHECK_RANGE(took, 0, 0.5 + kPrompt);
    CHECK_EQ(shm_segments_of(hex_world(root)), 0);
    int st = 0;
    waitpid(kid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    printf("ok join_dies\n");
}

int main(int argc, char **argv) {
    std::string sc = argc > 1 ? argv[1] : "";
    int n = argc > 2 ? atoi(argv[2]) : 4;
    if (sc == "threads") world_threads(n);
    else if (sc == "args") arg_errors();
    else if (sc == "never_joins") never_joins(n);
    else if (sc == "exec_timeout") exec_timeout();
    else if (sc == "procs") procs(n, false);
    else if (sc == "procs_kill") procs(n, true);
    else if (sc == "peer_destroyed") peer_destroyed();
    else if (sc == "sliced_waits") sliced_waits();
    else if (sc == "sliced_timeout") sliced_timeout();
    else if (sc == "join_dies") join_dies();
    else if (sc == "exit_join") return exit_while_blocked("join");
    else if (sc == "exit_wait") return exit_while_blocked("wait");
    else {
        fprintf(stderr, "usage: hccl_selftest threads|args|never_joins|exec_timeout|procs|procs_kill|"
                        "peer_destroyed|sliced_waits|sliced_timeout|join_dies|exit_join|exit_wait [n]\n");
        return 2;
    }
    return 0;
}
