// Tests of the mock's internal C++ interfaces (mock/runtime/rt_core.h, mock/aclnn/executor.h):
// the two-phase executor rules through the MockCopy test op, failures reported by a stream,
// the memory registry and the exact statistics. Built only when MOCK_SOURCE_DIR is given.
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

extern "C" {
#include "check.h"
}
#include "acl/acl_rt.h"
#include "aclnn/executor.h"
#include "ops/kernel_scratch.h"
#include "ops/peer_copy.h"
#include "runtime/ptr_set.h"

using namespace aclmock;

namespace {

class FailingExecutor : public Executor {
public:
    FailingExecutor() : Executor("MockFail") {}
    int run(const std::vector<Slot> &, const std::vector<Slot> &, void *, Stream *,
            std::unique_ptr<KernelRest> *) override {
        return fail(ACLNN_ERR_INNER, "MockFail: boom on purpose");
    }
};

aclTensor *make_tensor(void *data, int64_t n, aclDataType dt = ACL_FLOAT) {
    int64_t dims[1] = {n};
    return aclCreateTensor(dims, 1, dt, nullptr, 0, ACL_FORMAT_ND, dims, 1, data);
}

void test_copy_executor() {
    void *a = nullptr, *b = nullptr, *c = nullptr, *ws = nullptr;
    CHECK_EQ(aclrtMalloc(&a, 256, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ(aclrtMalloc(&b, 256, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ(aclrtMalloc(&c, 256, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ(aclrtMalloc(&ws, 128, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    std::memset(a, 7, 256);
    aclTensor *src = make_tensor(a, 64), *dst = make_tensor(b, 64);
    aclrtStream s = nullptr;
    CHECK_EQ(aclrtCreateStream(&s), 0);

    // normal executor: one launch, then consumed
    aclOpExecutor *ex = make_copy_executor(src, dst, 0);
    CHECK(ex != nullptr);
    CHECK_EQ(tensor_stats().live_executors, 1);
    CHECK_EQ(launch_executor(ex, nullptr, 0, s, "aclnnMockCopy"), ACLNN_SUCCESS);
    CHECK_EQ(aclrtSynchronizeStream(s), 0);
    CHECK(static_cast<unsigned char *>(b)[255] == 7);
    CHECK_EQ(tensor_stats().live_executors, 0);
    CHECK_ERR(launch_executor(ex, nullptr, 0, s, "aclnnMockCopy"), ACLNN_ERR_PARAM_INVALID,
              "already launched", "aclSetAclOpExecutorRepeatable");
    CHECK_ERR(aclDestroyAclOpExecutor(ex), ACLNN_ERR_PARAM_INVALID, "aclDestroyAclOpExecutor", "already launched");
    CHECK_ERR(launch_executor(nullptr, nullptr, 0, s, "aclnnMockCopy"), ACLNN_ERR_INNER_NULLPTR, "aclnnMockCopy", "executor");

    // a normal executor that is never launched may be destroyed; the rebinding calls refuse it
    ex = make_copy_executor(src, dst, 0);
    CHECK_ERR(aclSetInputTensorAddr(ex, 0, src, a), ACLNN_ERR_PARAM_INVALID, "aclSetInputTensorAddr",
              "executor is not repeatable: call aclSetAclOpExecutorRepeatable after phase 1");
    CHECK_EQ(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_ERR(aclDestroyAclOpExecutor(ex), ACLNN_ERR_PARAM_INVALID, "aclDestroyAclOpExecutor", "destroyed");

    // workspace rules
    ex = make_copy_executor(src, dst, 128);
    CHECK_EQ(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    CHECK_ERR(launch_executor(ex, nullptr, 128, s, "aclnnMockCopy"), ACLNN_ERR_PARAM_INVALID, "workspace", "NULL");
    CHECK_ERR(launch_executor(ex, ws, 64, s, "aclnnMockCopy"), ACLNN_ERR_PARAM_INVALID, "workspaceSize", "128");
    unsigned char host_ws[256];
    CHECK_ERR(launch_executor(ex, host_ws, 256, s, "aclnnMockCopy"), ACLNN_ERR_PARAM_INVALID, "MockCopy", "not device memory");
    CHECK_ERR(launch_executor(ex, static_cast<char *>(ws) + 128, 128, s, "aclnnMockCopy"), ACLNN_ERR_PARAM_INVALID,
              "workspace", "past the end");
    // repeatable: several launches, rebinding between them
    std::memset(b, 0, 256);
    CHECK_EQ(launch_executor(ex, ws, 128, s, "aclnnMockCopy"), ACLNN_SUCCESS);
    CHECK_EQ(launch_executor(ex, ws, 128, s, "aclnnMockCopy"), ACLNN_SUCCESS);
    CHECK_EQ(aclrtSynchronizeStream(s), 0);
    CHECK(static_cast<unsigned char *>(b)[0] == 7);
    aclTensor *dst2 = make_tensor(nullptr, 64);
    CHECK_EQ(aclSetOutputTensorAddr(ex, 0, dst2, c), ACLNN_SUCCESS);
    void *raw = nullptr;
    CHECK_EQ(aclGetRawTensorAddr(dst2, &raw), ACLNN_SUCCESS);
    CHECK(raw == c);
    CHECK_EQ(launch_executor(ex, ws, 128, nullptr, "aclnnMockCopy"), ACLNN_SUCCESS);
    CHECK_EQ(aclrtSynchronizeStream(nullptr), 0);
    CHECK(static_cast<unsigned char *>(c)[100] == 7);
    CHECK_ERR(aclSetOutputTensorAddr(ex, 1, dst2, c), ACLNN_ERR_PARAM_INVALID, "index must be < 1", "got 1");
    CHECK_ERR(aclSetInputTensorAddr(ex, 1, dst2, c), ACLNN_ERR_PARAM_INVALID, "aclSetInputTensorAddr", "index");
    CHECK_EQ(aclSetTensorAddr(ex, 1, dst2, b), ACLNN_SUCCESS);  // inputs then outputs
    CHECK_ERR(aclSetTensorAddr(ex, 2, dst2, b), ACLNN_ERR_PARAM_INVALID, "index must be < 2", "got 2");
    CHECK_ERR(aclSetTensorAddr(ex, 0, dst2, static_cast<char *>(a) + 16), ACLNN_ERR_PARAM_INVALID,
              "32-byte aligned", "aclSetTensorAddr");
    CHECK_ERR(launch_executor(ex, ws, 128, reinterpret_cast<aclrtStream>(0x99), "aclnnMockCopy"),
              ACLNN_ERR_PARAM_INVALID, "aclnnMockCopy", "not a live stream");
    // a slot bound to host memory is refused at launch, naming op and slot
    unsigned char host_buf[512];
    void *host_aligned = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(host_buf) + 63) & ~uintptr_t(63));
    CHECK_EQ(aclSetInputTensorAddr(ex, 0, src, host_aligned), ACLNN_SUCCESS);
    CHECK_ERR(launch_executor(ex, ws, 128, s, "aclnnMockCopy"), ACLNN_ERR_PARAM_INVALID, "MockCopy input 0", "not device memory");
    // a slot whose view runs past its block
    CHECK_EQ(aclSetInputTensorAddr(ex, 0, src, static_cast<char *>(a) + 128), ACLNN_SUCCESS);
    CHECK_ERR(launch_executor(ex, ws, 128, s, "aclnnMockCopy"), ACLNN_ERR_PARAM_INVALID, "input 0", "past the end");
    CHECK_EQ(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ(tensor_stats().live_executors, 0);

    // make_copy_executor argument checks
    aclTensor *small = make_tensor(a, 8);
    CHECK(make_copy_executor(src, small, 0) == nullptr);
    CHECK(aclGetRecentErrMsg() != nullptr);

    // a failing task: reported (code + message) by the next synchronize, then cleared
    aclOpExecutor *fe = register_executor(std::make_shared<FailingExecutor>());
    CHECK_EQ(launch_executor(fe, nullptr, 0, s, "aclnnMockFail"), ACLNN_SUCCESS);
    CHECK_ERR(aclrtSynchronizeStream(s), ACLNN_ERR_INNER, "MockFail", "boom on purpose");
    CHECK_EQ(aclrtSynchronizeStream(s), 0);
    // the first failure wins
    fe = register_executor(std::make_shared<FailingExecutor>());
    CHECK_EQ(aclSetAclOpExecutorRepeatable(fe), 0);
    CHECK_EQ(launch_executor(fe, nullptr, 0, s, "aclnnMockFail1"), ACLNN_SUCCESS);
    CHECK_EQ(launch_executor(fe, nullptr, 0, s, "aclnnMockFail2"), ACLNN_SUCCESS);
    CHECK_EQ(aclDestroyAclOpExecutor(fe), 0);  // queued launches keep it alive
    CHECK_ERR(aclrtSynchronizeStreamWithTimeout(s, 5000), ACLNN_ERR_INNER, "boom", nullptr);
    CHECK_EQ(aclrtSynchronizeStream(s), 0);
    CHECK(stream_stats().tasks_failed >= 3);

    for (aclTensor *t : {src, dst, dst2, small}) CHECK_EQ(aclDestroyTensor(t), 0);
    CHECK_EQ(aclrtDestroyStream(s), 0);
    for (void *p : {a, b, c, ws}) CHECK_EQ(aclrtFree(p), 0);
}

void test_registry_and_stats() {
    MemStats m0 = mem_stats();
    StreamStats s0 = stream_stats();
    TensorStats t0 = tensor_stats();
    void *d = nullptr, *h = nullptr;
    CHECK_EQ(aclrtMalloc(&d, 100, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ(aclrtMallocHost(&h, 10), 0);
    MemStats m1 = mem_stats();
    CHECK_EQ(m1.live_allocations, m0.live_allocations + 2);
    CHECK_EQ(m1.live_bytes, m0.live_bytes + 160 + 64);
    MemBlock b;
    CHECK(find_block(static_cast<char *>(d) + 10, 150, &b));
    CHECK(b.base == reinterpret_cast<uintptr_t>(d) && b.size == 160 && b.kind == MemKind::Device && b.device == 0);
    CHECK(!find_block(static_cast<char *>(d) + 10, 151, &b));
    CHECK(find_block_at(static_cast<char *>(d) + 159, &b));
    CHECK(!find_block_at(static_cast<char *>(d) + 160, &b) || b.base != reinterpret_cast<uintptr_t>(d));
    CHECK(check_device_range(d, 160, "t"));
    CHECK(!check_device_range(h, 1, "probe"));
    CHECK(peek_error().find("probe") != std::string::npos);
    clear_error();
    CHECK(aclGetRecentErrMsg() == nullptr);

    // a window registered by HCCL is device-addressable, not counted as an allocation, and cannot
    // be freed with aclrtFree
    alignas(64) static unsigned char window[4096];
    register_block(window, sizeof window, 0, MemKind::Window);
    CHECK(check_device_range(window + 100, 100, "w"));
    CHECK_EQ(mem_stats().live_allocations, m1.live_allocations);
    CHECK_ERR(aclrtFree(window), ACL_ERROR_RT_MEMORY_FREE, "aclrtFree", "window");
    CHECK_EQ(aclrtMemset(window, 4096, 1, 4096), 0);
    CHECK(unregister_block(window));
    CHECK(!unregister_block(window));
    CHECK(!unregister_block(d));  // owned allocations are freed with aclrtFree

    aclrtStream s = nullptr;
    aclrtEvent e = nullptr;
    CHECK_EQ(aclrtCreateStream(&s), 0);
    CHECK_EQ(aclrtCreateEvent(&e), 0);
    int64_t dims[1] = {4};
    aclTensor *t = aclCreateTensor(dims, 1, ACL_INT32, nullptr, 0, ACL_FORMAT_ND, dims, 1, d);
    CHECK_EQ(stream_stats().live_streams, s0.live_streams + 1);
    CHECK_EQ(stream_stats().live_events, s0.live_events + 1);
    CHECK_EQ(tensor_stats().live_tensors, t0.live_tensors + 1);
    CHECK(tensor_alive(t));
    CHECK(view_extent_bytes(*t) == 16 && numel(*t) == 4 && is_contiguous(*t));
    Stream *rs = resolve_stream(s, nullptr);
    CHECK(rs != nullptr && stream_device(rs) == 0);
    CHECK_EQ(aclDestroyTensor(t), 0);
    CHECK(!tensor_alive(t));
    CHECK_EQ(aclrtDestroyEvent(e), 0);
    CHECK_EQ(aclrtDestroyStream(s), 0);
    CHECK_EQ(aclrtFree(d), 0);
    CHECK_EQ(aclrtFreeHost(h), 0);
    CHECK_EQ(mem_stats().live_allocations, m0.live_allocations);
    CHECK_EQ(mem_stats().live_bytes, m0.live_bytes);
    CHECK_EQ(stream_stats().live_streams, s0.live_streams);
    CHECK_EQ(stream_stats().live_events, s0.live_events);
    CHECK_EQ(tensor_stats().live_tensors, t0.live_tensors);

    // strided views and packed types
    int64_t vd[2] = {2, 3}, st[2] = {1, 2};
    aclTensor *v = aclCreateTensor(vd, 2, ACL_FLOAT16, st, 3, ACL_FORMAT_ND, vd, 2, nullptr);
    CHECK(!is_contiguous(*v));
    CHECK_EQ(view_extent_bytes(*v), (3 + 1 + 4 + 1) * 2);
    aclTensor *p4 = aclCreateTensor(vd, 2, ACL_INT4, nullptr, 0, ACL_FORMAT_ND, vd, 2, nullptr);
    CHECK_EQ(view_extent_bytes(*p4), 3);
    CHECK_EQ(dtype_bits(ACL_INT4), 4);
    CHECK(std::string(dtype_name(ACL_BF16)) == "ACL_BF16");
    CHECK_EQ(aclDestroyTensor(v), 0);
    CHECK_EQ(aclDestroyTensor(p4), 0);
}

}  // namespace

// Launches need aclInit (docs/reliability.md); phase 1 does not.
void test_launch_needs_init() {
    void *a = nullptr, *b = nullptr;
    CHECK_EQ(aclrtMalloc(&a, 256, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ(aclrtMalloc(&b, 256, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    aclTensor *src = make_tensor(a, 64), *dst = make_tensor(b, 64);
    aclOpExecutor *ex = make_copy_executor(src, dst, 0);
    CHECK(ex != nullptr);
    CHECK_ERR(launch_executor(ex, nullptr, 0, nullptr, "aclnnMockCopy"), ACLNN_ERR_RUNTIME_ERROR, "MockCopy", "aclInit");
    CHECK_EQ(tensor_stats().live_executors, 0);   // consumed all the same
    CHECK_EQ(aclDestroyTensor(src), 0);
    CHECK_EQ(aclDestroyTensor(dst), 0);
    CHECK_EQ(aclrtFree(a), 0);
    CHECK_EQ(aclrtFree(b), 0);
}

// PtrSet (the registries' flat table) against std::unordered_set: random insertions, erasures and
// lookups of addresses packed close together (long probe runs, erasures that shift entries back
// across the table's end), the whole content compared as the table grows and empties.
void test_ptr_set() {
    std::mt19937_64 rng(7);
    PtrSet set;
    std::unordered_set<uintptr_t> ref;
    long long wrong = 0;
    auto key = [&](uint64_t range) { return uintptr_t(0x10000) + 16 * uintptr_t(rng() % range); };
    auto same_content = [&] {
        long long missing = 0;
        for (uintptr_t k : ref) missing += !set.contains(reinterpret_cast<const void *>(k));
        return missing == 0 && set.size() == ref.size();
    };
    for (uint64_t range : {64, 5000, 200000}) {
        for (int op = 0; op < 100000; ++op) {
            const uintptr_t k = key(range);
            const void *p = reinterpret_cast<const void *>(k);
            switch (rng() % 3) {
            case 0: wrong += set.insert(p) != ref.insert(k).second; break;
            case 1: wrong += set.erase(p) != (ref.erase(k) == 1); break;
            default: wrong += set.contains(p) != (ref.count(k) == 1);
            }
            if (op % 5000 == 0) wrong += !same_content();
        }
        wrong += !same_content();
        for (auto it = ref.begin(); it != ref.end(); it = ref.erase(it))   // empty it, in no order
            wrong += !set.erase(reinterpret_cast<const void *>(*it));
        wrong += set.size() != 0 || set.contains(reinterpret_cast<const void *>(key(range)));
    }
    CHECK_EQ(wrong, 0);
    CHECK(!set.insert(nullptr) && !set.contains(nullptr) && !set.erase(nullptr));
}

// The kernels' scratch outside the workspace: counters that read 0 at every call's begin, and float
// rows lent last-returned first (so ranks taking turns reuse the row in the cache).
void test_kernel_scratch() {
    moe::CallCounters *c = &moe::CallCounters::begin(8);
    c->set(3, 5);
    CHECK(c->get(3) == 5 && c->get(2) == 0);
    c = &moe::CallCounters::begin(16);   // a new call: every counter 0 again, more of them
    CHECK(c->get(3) == 0 && c->get(15) == 0);
    c->set(15, 7);
    CHECK(c->get(15) == 7);

    float *first;
    {
        moe::ScratchFloats a(1000);
        first = a.data();
        CHECK(reinterpret_cast<uintptr_t>(first) % 64 == 0);
        for (int i = 0; i < 1000; ++i) first[i] = float(i);
    }
    {
        moe::ScratchFloats b(500);   // the row returned last, large enough
        CHECK(b.data() == first);
        moe::ScratchFloats c2(500);  // lent while b is out: another row
        CHECK(c2.data() != first);
        for (int i = 0; i < 500; ++i) c2.data()[i] = 1.0f;
    }
    {
        moe::ScratchFloats big(100000);   // more than any row returned: a row that holds it
        for (int i = 0; i < 100000; ++i) big.data()[i] = 2.0f;
        CHECK(big.data()[99999] == 2.0f);
    }
}

// A row copied into a peer's window is the same bytes whichever way it goes: streamed (16-byte
// blocks, then the tail) or copied, to an aligned destination or not (which is never streamed).
void test_copy_to_peer() {
    std::mt19937 rng(11);
    std::vector<uint8_t> src(4096 + 64);
    for (auto &b : src) b = uint8_t(rng());
    alignas(64) static uint8_t dst[4096 + 128];
    for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(511), size_t(512), size_t(513),
                     size_t(2048 + 7), size_t(4096)})
        for (size_t dst_off : {size_t(0), size_t(16), size_t(3)})
            for (size_t src_off : {size_t(0), size_t(5)})
                for (bool streaming : {true, false}) {
                    std::memset(dst, 0xA5, sizeof dst);
                    moe::copy_to_peer(dst + dst_off, src.data() + src_off, n, streaming);
                    CHECK(std::memcmp(dst + dst_off, src.data() + src_off, n) == 0);
                    bool untouched = true;   // nothing before or after the row
                    for (size_t i = 0; i < sizeof dst; ++i)
                        if ((i < dst_off || i >= dst_off + n) && dst[i] != 0xA5) untouched = false;
                    CHECK(untouched);
                }
}

int main() {
    test_ptr_set();
    test_kernel_scratch();
    test_copy_to_peer();
    CHECK_EQ(aclrtSetDevice(0), 0);
    test_launch_needs_init();
    CHECK_EQ(aclInit(nullptr), 0);
    test_copy_executor();
    test_registry_and_stats();
    CHECK_EQ(aclFinalize(), 0);
    CHECK_EQ(aclrtResetDevice(0), 0);
    return report();
}
