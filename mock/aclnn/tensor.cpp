// aclTensor descriptors, their registry of live objects, aclnnInit/aclnnFinalize.
//
// Decisions:
// * aclCreateTensor returns NULL (with a message) for: a NULL dims pointer with count > 0, a
//   negative view or storage dim, a negative stride (views never reach below the storage base
//   here), a negative offset, an aclDataType value that does not exist, a format outside
//   [-1, 127] (what the aclFormat enum can hold), a tensorData (storage base) that is not 32-byte
//   aligned. Unknown format values inside that range are accepted (formats are only labels here;
//   the ops take ND only). tensorData may be NULL or any aligned address at creation time; the ops
//   check it against the memory registry at launch.
// * aclSetRawTensorAddr takes the same 32-byte aligned storage base, and is refused (161002) while
//   the tensor is an argument of a live executor that has not been launched yet: between phase 1
//   and phase 2 the executor holds the address phase 1 saw, so the change would be silently lost
//   (repeatable executors are rebound with aclSetInputTensorAddr / aclSetOutputTensorAddr).
// * Every live tensor is in a registry, so destroyed or garbage handles are recognised without
//   being dereferenced: getters return ACLNN_ERR_PARAM_INVALID (161002) for them (161001 for NULL
//   arguments), aclDestroyTensor(NULL) is 0, destroying a dead handle is 161002. The memory of the
//   last 4096 destroyed descriptors is held back (quarantine), so a dangling pointer is not
//   reused for a new descriptor and mistaken for it.
// * A view that addresses more than 2^62 bytes, or whose size overflows int64, is refused (161002).
// * aclnnInit/aclnnFinalize always succeed; repeated calls are harmless.
#include <pthread.h>

#include <atomic>
#include <deque>
#include <climits>
#include <cstdint>
#include <mutex>

#include "aclnn/aclnn_base.h"
#include "aclnn/aclnn_internal.h"
#include "aclnn/executor.h"
#include "runtime/ptr_set.h"
#include "runtime/stream_internal.h"

namespace aclmock {
namespace {
constexpr uint64_t kMaxViewBytes = uint64_t(1) << 62;
constexpr uintptr_t kStorageAlign = 32;   // tensorData / storage base alignment (CANN's rule)
std::atomic<uint64_t> g_next_serial{1};
bool valid_dtype(int dt);
// An address inside this library, for pin_library_of.
void valid_dtype_fn() {}

// Destroyed descriptors are not freed at once: the most recent kQuarantine stay allocated (their
// contents released), so a dangling aclTensor* cannot come back as the address of a new, live
// descriptor for a while, and is reported as destroyed instead of being taken for another tensor.
constexpr size_t kQuarantine = 4096;

struct TensorRegistry {
    std::mutex mu;
    PtrSet live;
    std::deque<aclTensor *> quarantine;
};

TensorRegistry &treg() {
    static TensorRegistry *r = [] {
        auto *p = new TensorRegistry;  // never destroyed (used during process exit)
        pin_library_of(reinterpret_cast<const void *>(&valid_dtype_fn));
        pthread_atfork([] { treg().mu.lock(); }, [] { treg().mu.unlock(); },
                       [] { treg().mu.unlock(); });
        return p;
    }();
    return *r;
}

bool valid_dtype(int dt) {
    return dt == ACL_DT_UNDEFINED || (dt >= ACL_FLOAT && dt <= ACL_UINT64 && dt != 5) ||
           (dt >= ACL_DOUBLE && dt <= ACL_STRING) || dt == ACL_COMPLEX64 || dt == ACL_COMPLEX128 ||
           dt == ACL_BF16 || dt == ACL_INT4 || dt == ACL_UINT1 || (dt >= ACL_COMPLEX32 && dt <= ACL_FLOAT4_E1M2);
}

aclnnStatus check_tensor(const char *api, const char *param, const aclTensor *t) {
    if (!t) return fail(ACLNN_ERR_PARAM_NULLPTR, "%s: %s must not be NULL", api, param);
    if (!tensor_alive(t))
        return fail(ACLNN_ERR_PARAM_INVALID,
                    "%s: %s %p is not a live aclTensor (never created by aclCreateTensor, or already "
                    "destroyed)", api, param, static_cast<const void *>(t));
    return ACLNN_SUCCESS;
}
}  // namespace

bool tensor_alive(const aclTensor *t) {
    if (!t) return false;
    TensorRegistry &r = treg();
    std::lock_guard<std::mutex> lk(r.mu);
    return r.live.contains(t);
}

TensorStats tensor_stats() {
    TensorStats st;
    {
        TensorRegistry &r = treg();
        std::lock_guard<std::mutex> lk(r.mu);
        st.live_tensors = r.live.size();
    }
    st.live_executors = live_executor_count();
    return st;
}

// Sizes saturate instead of wrapping (aclCreateTensor already refuses views beyond kMaxViewBytes,
// this keeps the arithmetic defined for any descriptor).
int64_t numel(const aclTensor &t) {
    int64_t n = 1;
    for (int64_t d : t.view)
        if (d < 0 || __builtin_mul_overflow(n, d, &n)) return INT64_MAX;
    return n;
}

uint64_t view_extent_bytes(const aclTensor &t) {
    int bits = dtype_bits(t.dtype);
    for (int64_t d : t.view)
        if (d == 0) return 0;
    // last element index reachable from the storage base
    uint64_t last = static_cast<uint64_t>(t.offset);
    for (size_t i = 0; i < t.view.size(); ++i) {
        int64_t st = i < t.strides.size() ? t.strides[i] : 0;
        uint64_t step;
        if (__builtin_mul_overflow(static_cast<uint64_t>(t.view[i] - 1), static_cast<uint64_t>(st), &step) ||
            __builtin_add_overflow(last, step, &last))
            return UINT64_MAX;
    }
    uint64_t bitsum;
    if (__builtin_mul_overflow(last + 1, static_cast<uint64_t>(bits), &bitsum) || bitsum > UINT64_MAX - 7)
        return UINT64_MAX;
    return (bitsum + 7) / 8;
}

bool is_contiguous(const aclTensor &t) {
    int64_t expect = 1;
    for (size_t i = t.view.size(); i-- > 0;) {
        int64_t d = t.view[i];
        if (d != 1 && (i >= t.strides.size() || t.strides[i] != expect)) return false;
        expect *= d;
    }
    return true;
}

void *view_ptr(const aclTensor &t) {
    if (!t.data) return nullptr;
    uint64_t byte_off = static_cast<uint64_t>(t.offset) * static_cast<uint64_t>(dtype_bits(t.dtype)) / 8;
    return static_cast<char *>(t.data) + byte_off;
}

std::string shape_str(const Dims &dims) {
    std::string s = "(";
    for (size_t i = 0; i < dims.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(dims[i]);
    }
    if (dims.size() == 1) s += ",";
    return s + ")";
}

}  // namespace aclmock

using namespace aclmock;

extern "C" {

ACLMOCK_API aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum,
                                       aclDataType dataType, const int64_t *stride, int64_t offset,
                                       aclFormat format, const int64_t *storageDims,
                                       uint64_t storageDimsNum, void *tensorData) {
    const char *api = "aclCreateTensor";
    if (viewDimsNum > 0 && !viewDims) {
        fail(ACLNN_ERR_PARAM_NULLPTR, "%s: viewDims is NULL but viewDimsNum is %llu", api,
             static_cast<unsigned long long>(viewDimsNum));
        return nullptr;
    }
    if (storageDimsNum > 0 && !storageDims) {
        fail(ACLNN_ERR_PARAM_NULLPTR, "%s: storageDims is NULL but storageDimsNum is %llu", api,
             static_cast<unsigned long long>(storageDimsNum));
        return nullptr;
    }
    if (viewDimsNum > 64 || storageDimsNum > 64) {
        fail(ACLNN_ERR_PARAM_INVALID, "%s: at most 64 dims are supported (got viewDimsNum %llu, storageDimsNum %llu)",
             api, static_cast<unsigned long long>(viewDimsNum), static_cast<unsigned long long>(storageDimsNum));
        return nullptr;
    }
    if (!valid_dtype(static_cast<int>(dataType))) {
        fail(ACLNN_ERR_PARAM_INVALID, "%s: dataType %d is not an aclDataType", api, static_cast<int>(dataType));
        return nullptr;
    }
    // Decision: format values beyond what the aclFormat enum can hold are refused (storing them in
    // the descriptor would be undefined behaviour in C++); unknown values inside it are labels.
    if (static_cast<int>(format) < ACL_FORMAT_UNDEFINED || static_cast<int>(format) > 127) {
        fail(ACLNN_ERR_PARAM_INVALID, "%s: format %d is not an aclFormat", api, static_cast<int>(format));
        return nullptr;
    }
    if (offset < 0) {
        fail(ACLNN_ERR_PARAM_INVALID, "%s: offset must be >= 0 (got %lld)", api, static_cast<long long>(offset));
        return nullptr;
    }
    if (reinterpret_cast<uintptr_t>(tensorData) % kStorageAlign != 0) {
        fail(ACLNN_ERR_PARAM_INVALID, "%s: tensorData (the storage base) must be 32-byte aligned, or NULL (got %p); "
             "address an element further in with offset", api, tensorData);
        return nullptr;
    }
    for (uint64_t i = 0; i < viewDimsNum; ++i)
        if (viewDims[i] < 0) {
            fail(ACLNN_ERR_PARAM_INVALID, "%s: viewDims[%llu] must be >= 0 (got %lld)", api,
                 static_cast<unsigned long long>(i), static_cast<long long>(viewDims[i]));
            return nullptr;
        }
    for (uint64_t i = 0; i < storageDimsNum; ++i)
        if (storageDims[i] < 0) {
            fail(ACLNN_ERR_PARAM_INVALID, "%s: storageDims[%llu] must be >= 0 (got %lld)", api,
                 static_cast<unsigned long long>(i), static_cast<long long>(storageDims[i]));
            return nullptr;
        }
    if (stride)
        for (uint64_t i = 0; i < viewDimsNum; ++i)
            if (stride[i] < 0) {
                fail(ACLNN_ERR_PARAM_INVALID, "%s: stride[%llu] must be >= 0 (got %lld)", api,
                     static_cast<unsigned long long>(i), static_cast<long long>(stride[i]));
                return nullptr;
            }
    auto *t = new aclTensor();
    t->magic = kTensorMagic;
    t->view.assign(viewDims, viewDims + viewDimsNum);
    t->strides.resize(viewDimsNum);
    bool too_big = false;
    if (stride) {
        t->strides.assign(stride, stride + viewDimsNum);
    } else {
        int64_t acc = 1;
        for (uint64_t i = viewDimsNum; i-- > 0;) {
            t->strides[i] = acc;
            if (__builtin_mul_overflow(acc, viewDims[i] > 0 ? viewDims[i] : 1, &acc)) {
                acc = INT64_MAX;
                too_big = true;
            }
        }
    }
    t->offset = offset;
    t->dtype = dataType;
    // Decision: a view that addresses more than 2^62 bytes (or whose size overflows) describes no
    // memory any device has; refusing it here keeps every size computation downstream defined.
    const uint64_t extent = view_extent_bytes(*t);
    if (too_big || static_cast<uint64_t>(numel(*t)) > kMaxViewBytes || extent > kMaxViewBytes) {
        fail(ACLNN_ERR_PARAM_INVALID, "%s: the view (shape %s, offset %lld) addresses more than 2^62 bytes "
             "(or its size overflows)", api, shape_str(t->view).c_str(), static_cast<long long>(offset));
        delete t;
        return nullptr;
    }
    t->extent = extent;
    t->format = format;
    t->storage.assign(storageDims, storageDims + storageDimsNum);
    t->data = tensorData;
    t->serial = g_next_serial.fetch_add(1, std::memory_order_relaxed);
    TensorRegistry &r = treg();
    std::lock_guard<std::mutex> lk(r.mu);
    r.live.insert(t);
    return t;
}

ACLMOCK_API aclnnStatus aclDestroyTensor(const aclTensor *tensor) {
    if (!tensor) return ACLNN_SUCCESS;
    TensorRegistry &r = treg();
    aclTensor *old = nullptr;
    {
        std::lock_guard<std::mutex> lk(r.mu);   // one lock: every rank thread of a world destroys its own
        if (!r.live.erase(tensor))
            return fail(ACLNN_ERR_PARAM_INVALID,
                        "aclDestroyTensor: tensor %p is not a live aclTensor (never created, or "
                        "already destroyed)", static_cast<const void *>(tensor));
        aclTensor *t = const_cast<aclTensor *>(tensor);
        t->magic = 0;
        t->view = Dims();
        t->strides = Dims();
        t->storage = Dims();
        r.quarantine.push_back(t);
        if (r.quarantine.size() > kQuarantine) {
            old = r.quarantine.front();
            r.quarantine.pop_front();
        }
    }
    delete old;
    return ACLNN_SUCCESS;
}

ACLMOCK_API aclnnStatus aclGetDataType(const aclTensor *tensor, aclDataType *dataType) {
    if (!dataType) return fail(ACLNN_ERR_PARAM_NULLPTR, "aclGetDataType: dataType must not be NULL");
    if (aclnnStatus s = check_tensor("aclGetDataType", "tensor", tensor)) return s;
    *dataType = tensor->dtype;
    return ACLNN_SUCCESS;
}

ACLMOCK_API aclnnStatus aclGetFormat(const aclTensor *tensor, aclFormat *format) {
    if (!format) return fail(ACLNN_ERR_PARAM_NULLPTR, "aclGetFormat: format must not be NULL");
    if (aclnnStatus s = check_tensor("aclGetFormat", "tensor", tensor)) return s;
    *format = tensor->format;
    return ACLNN_SUCCESS;
}

ACLMOCK_API aclnnStatus aclGetViewOffset(const aclTensor *tensor, int64_t *offset) {
    if (!offset) return fail(ACLNN_ERR_PARAM_NULLPTR, "aclGetViewOffset: offset must not be NULL");
    if (aclnnStatus s = check_tensor("aclGetViewOffset", "tensor", tensor)) return s;
    *offset = tensor->offset;
    return ACLNN_SUCCESS;
}

// Allowed before phase 1 or after phase 2 (an executor keeps its own copy of the descriptors taken
// at phase 1); refused in between (see the decisions at the top).
ACLMOCK_API aclnnStatus aclSetRawTensorAddr(aclTensor *tensor, void *addr) {
    const char *api = "aclSetRawTensorAddr";
    if (aclnnStatus s = check_tensor(api, "tensor", tensor)) return s;
    if (reinterpret_cast<uintptr_t>(addr) % kStorageAlign != 0)
        return fail(ACLNN_ERR_PARAM_INVALID, "%s: addr (the storage base) must be 32-byte aligned, or NULL (got %p)",
                    api, addr);
    std::string user;
    if (pending_executor_uses(tensor, &user))
        return fail(ACLNN_ERR_PARAM_INVALID,
                    "%s: tensor %p is an argument of %s, between its phase 1 and phase 2: the executor keeps the "
                    "address phase 1 saw, so it must not change now (launch or destroy the executor first, or make "
                    "it repeatable and rebind with aclSetInputTensorAddr / aclSetOutputTensorAddr)",
                    api, static_cast<void *>(tensor), user.c_str());
    tensor->data = addr;
    return ACLNN_SUCCESS;
}

ACLMOCK_API aclnnStatus aclGetRawTensorAddr(const aclTensor *tensor, void **addr) {
    if (!addr) return fail(ACLNN_ERR_PARAM_NULLPTR, "aclGetRawTensorAddr: addr must not be NULL");
    if (aclnnStatus s = check_tensor("aclGetRawTensorAddr", "tensor", tensor)) return s;
    *addr = tensor->data;
    return ACLNN_SUCCESS;
}

ACLMOCK_API aclnnStatus aclnnInit(const char *configPath) {
    (void)configPath;
    (void)config();
    return ACLNN_SUCCESS;
}

ACLMOCK_API aclnnStatus aclnnFinalize(void) { return ACLNN_SUCCESS; }

}  // extern "C"
