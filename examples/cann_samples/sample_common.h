// Helpers shared by the CANN-style op samples of this folder: status checks, bf16 conversion, device
// tensors made from host vectors, and the routing every sample uses so the host can predict the
// results. Only CANN's public headers are used.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"

#define CHECK_RET(cond, return_expr) \
    do {                             \
        if (!(cond)) {               \
            return_expr;             \
        }                            \
    } while (0)

#define LOG_PRINT(message, ...)                  \
    do {                                         \
        std::printf(message, ##__VA_ARGS__);     \
        std::fflush(stdout);                     \
    } while (0)

// The call failed: print it with CANN's message, and leave the function with -1.
#define CHECK_CALL(call)                                                                          \
    do {                                                                                          \
        long long ret_ = static_cast<long long>(call);                                            \
        if (ret_ != 0) {                                                                          \
            const char *msg_ = aclGetRecentErrMsg();                                              \
            LOG_PRINT("[ERROR] %s failed. ret = %lld: %s\n", #call, ret_, msg_ ? msg_ : "");      \
            return -1;                                                                            \
        }                                                                                         \
    } while (0)

namespace sample {

inline uint16_t ToBf16(float f) {   // round to nearest even; the samples only use exact values
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

inline float FromBf16(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline int64_t ShapeSize(const std::vector<int64_t> &shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

// A contiguous ND device tensor holding `host` (or, when host is empty, uninitialised memory).
struct DeviceTensor {
    void *addr = nullptr;
    aclTensor *tensor = nullptr;
    size_t bytes = 0;

    template <typename T>
    int Create(const std::vector<T> &host, const std::vector<int64_t> &shape, aclDataType dataType) {
        bytes = static_cast<size_t>(ShapeSize(shape)) * sizeof(T);
        CHECK_CALL(aclrtMalloc(&addr, bytes ? bytes : 1, ACL_MEM_MALLOC_HUGE_FIRST));
        if (!host.empty()) CHECK_CALL(aclrtMemcpy(addr, bytes, host.data(), bytes, ACL_MEMCPY_HOST_TO_DEVICE));
        std::vector<int64_t> strides(shape.size(), 1);
        for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) strides[i] = shape[i + 1] * strides[i + 1];
        tensor = aclCreateTensor(shape.data(), shape.size(), dataType, strides.data(), 0, ACL_FORMAT_ND,
                                 shape.data(), shape.size(), addr);
        CHECK_RET(tensor != nullptr, LOG_PRINT("[ERROR] aclCreateTensor failed: %s\n", aclGetRecentErrMsg()); return -1);
        return 0;
    }

    template <typename T>
    int Download(std::vector<T> *host) const {
        host->resize(bytes / sizeof(T));
        if (bytes) CHECK_CALL(aclrtMemcpy(host->data(), bytes, addr, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
        return 0;
    }

    void Release() {
        if (tensor) aclDestroyTensor(tensor);
        if (addr) aclrtFree(addr);
        tensor = nullptr;
        addr = nullptr;
    }
};

// Token t of the device with global id `dev` holds the value dev * bs + t + 1 in every column
// (small integers: exact in bf16, and after halving).
inline float TokenValue(int dev, int bs, int t) { return static_cast<float>(dev * bs + t + 1); }

// The k-th expert of token t on EP rank `ep`: K consecutive experts (distinct, as K <= E).
inline int32_t ExpertOf(int ep, int t, int k, int experts) { return static_cast<int32_t>((ep * 3 + t + k) % experts); }

// Top-k weights that sum to 1 in exact binary fractions, so combine gives back x when every expert
// returns its input.
inline std::vector<float> TopkWeights(int k) {
    std::vector<float> w(k, 0.0f);
    float left = 1.0f;
    for (int i = 0; i < k - 1; ++i) {
        w[i] = left / 2;
        left -= w[i];
    }
    w[k - 1] = left;
    return w;
}

}  // namespace sample
