// Helpers shared by the CANN-style op samples of this folder: status checks, bf16 conversion, device
// tensors made from host vectors, the routing every sample uses so the host can predict the results,
// the inputs and outputs of a bf16 dispatch, and the check that combine gave x back. Only CANN's
// public headers are used.
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

// A rank's host inputs: every column of token t holds TokenValue(device, bs, t) in bf16; its K experts
// are ExpertOf(epRank, t, k, experts), weighted by TopkWeights(K).
struct Tokens {
    std::vector<uint16_t> x;
    std::vector<int32_t> expertIds;
    std::vector<float> expertScales;
};

inline Tokens RoutedTokens(int device, int epRank, int64_t bs, int64_t h, int64_t k, int64_t experts) {
    Tokens in{std::vector<uint16_t>(bs * h), std::vector<int32_t>(bs * k), std::vector<float>(bs * k)};
    const std::vector<float> w = TopkWeights(static_cast<int>(k));
    for (int t = 0; t < bs; ++t) {
        for (int c = 0; c < h; ++c) in.x[t * h + c] = ToBf16(TokenValue(device, static_cast<int>(bs), t));
        for (int j = 0; j < k; ++j) {
            in.expertIds[t * k + j] = ExpertOf(epRank, t, j, static_cast<int>(experts));
            in.expertScales[t * k + j] = w[j];
        }
    }
    return in;
}

// Device copies of a rank's Tokens: x (bs, h) bf16, expert_ids and expert_scales (bs, k).
struct TokenTensors {
    DeviceTensor x, expertIds, expertScales;

    int Create(const Tokens &in, int64_t bs, int64_t h, int64_t k) {
        CHECK_RET(x.Create(in.x, {bs, h}, ACL_BF16) == 0, return -1);
        CHECK_RET(expertIds.Create(in.expertIds, {bs, k}, ACL_INT32) == 0, return -1);
        CHECK_RET(expertScales.Create(in.expertScales, {bs, k}, ACL_FLOAT) == 0, return -1);
        return 0;
    }

    void Release() {
        for (DeviceTensor *t : {&x, &expertIds, &expertScales}) t->Release();
    }
};

// The outputs of a bf16 dispatch without quantisation (generations 2 to 5), shaped as CANN's op docs give
// them: A rows per TP rank, assist_info A * 128, ep_recv_counts tpWorld * W * local experts, and
// tp_recv_counts of `tpRecvLen` entries.
struct DispatchOutputs {
    DeviceTensor expandX, dynamicScales, assistInfo, expertTokenNums, epRecvCounts, tpRecvCounts, expandScales;

    int Create(int64_t a, int64_t h, int64_t localExperts, int64_t epWorld, int64_t tpWorld, int64_t tpRecvLen) {
        CHECK_RET(expandX.Create(std::vector<uint16_t>(), {tpWorld * a, h}, ACL_BF16) == 0, return -1);
        CHECK_RET(dynamicScales.Create(std::vector<float>(), {tpWorld * a}, ACL_FLOAT) == 0, return -1);
        CHECK_RET(assistInfo.Create(std::vector<int32_t>(), {a * 128}, ACL_INT32) == 0, return -1);
        CHECK_RET(expertTokenNums.Create(std::vector<int64_t>(), {localExperts}, ACL_INT64) == 0, return -1);
        CHECK_RET(epRecvCounts.Create(std::vector<int32_t>(), {tpWorld * epWorld * localExperts}, ACL_INT32) == 0,
                  return -1);
        CHECK_RET(tpRecvCounts.Create(std::vector<int32_t>(), {tpRecvLen}, ACL_INT32) == 0, return -1);
        CHECK_RET(expandScales.Create(std::vector<float>(), {a}, ACL_FLOAT) == 0, return -1);
        return 0;
    }

    void Release() {
        for (DeviceTensor *t :
             {&expandX, &dynamicScales, &assistInfo, &expertTokenNums, &epRecvCounts, &tpRecvCounts, &expandScales})
            t->Release();
    }
};

// Combine gave x back (every expert returned its input and the weights sum to 1): 0, else the first
// differing token is printed and -1 returned.
inline int CheckXBack(const DeviceTensor &xOut, const std::vector<uint16_t> &x, long long rank) {
    std::vector<uint16_t> got;
    CHECK_RET(xOut.Download(&got) == 0, return -1);
    for (size_t i = 0; i < x.size(); ++i)
        CHECK_RET(got[i] == x[i],
                  LOG_PRINT("[ERROR] rank %lld: combine did not give x back (element %zu: %g, x %g)\n", rank, i,
                            FromBf16(got[i]), FromBf16(x[i]));
                  return -1);
    return 0;
}

}  // namespace sample
