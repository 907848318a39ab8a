// aclInit/aclFinalize, devices, version, SoC name and data-type sizes.
//
// Decisions (CANN leaves room here):
// * aclInit is reference counted: the first call returns 0, every further call returns
//   ACL_ERROR_REPEAT_INITIALIZE (100002, "ignore it") and still counts. aclFinalize zeroes the count;
//   a second aclFinalize returns ACL_ERROR_REPEAT_FINALIZE (100037). The config file argument is
//   accepted and ignored.
// * Device, memory, stream and event calls work without aclInit (real CANN sets up a context on
//   aclrtSetDevice alone). acl_initialized() reports the state for the ops, which may insist on it.
// * Every device-id error is ACL_ERROR_RT_INVALID_DEVICEID (107001). aclrtGetDevice with no device
//   set on the thread, and calls that need a current device (aclrtMalloc, aclrtCreateStream,
//   aclrtGetMemInfo, the NULL stream) without one, return ACL_ERROR_RT_CONTEXT_NULL (107002).
// * aclrtSetDevice is counted per device (an explicit context holds one reference too, see
//   context.cpp); aclrtResetDevice decrements (an unbalanced reset is 107002) and, when the calling
//   thread's current device reaches 0 references, unsets it on this thread. At 0 references the
//   streams created in the device's default context are released, as CANN's aclrtResetDevice
//   documents: their queued work runs first, then their handles are refused (107017). The default
//   stream (the NULL handle) is kept for the life of the process and is reused after a new
//   aclrtSetDevice, so no thread ever holds a dangling default stream. Device memory is not
//   released by a reset (CANN's documentation of aclrtResetDevice names contexts and streams only):
//   aclrtFree of an earlier allocation still works afterwards.
#include <atomic>
#include <mutex>

#include "aclnn/executor.h"
#include "runtime/context_internal.h"
#include "runtime/rt_core.h"

namespace aclmock {
namespace {
constexpr int kMaxDevices = 1024;
std::atomic<int64_t> g_init_count{0};
std::mutex g_dev_mu;
int64_t g_dev_refs[kMaxDevices];
}  // namespace

bool valid_device(int32_t id) { return id >= 0 && id < config().device_count && id < kMaxDevices; }

void take_device_ref(int32_t dev) {
    std::lock_guard<std::mutex> lk(g_dev_mu);
    ++g_dev_refs[dev];
}

int64_t drop_device_ref(int32_t dev) {
    int64_t left;
    {
        std::lock_guard<std::mutex> lk(g_dev_mu);
        if (g_dev_refs[dev] == 0) return -1;
        left = --g_dev_refs[dev];
    }
    if (left == 0) release_streams_of(dev, 0);
    return left;
}

int64_t device_refs(int32_t dev) {
    std::lock_guard<std::mutex> lk(g_dev_mu);
    return g_dev_refs[dev];
}

bool acl_initialized() { return g_init_count.load() > 0; }

}  // namespace aclmock

using namespace aclmock;

extern "C" {

ACLMOCK_API aclError aclInit(const char *configPath) {
    (void)configPath;
    if (std::string why = config_error(); !why.empty())
        return fail(ACL_ERROR_INVALID_PARAM, "aclInit: %s", why.c_str());
    int64_t prev = g_init_count.fetch_add(1);
    if (prev == 0) return ACL_SUCCESS;
    return fail(ACL_ERROR_REPEAT_INITIALIZE,
                "aclInit: already initialized (reference count is now %lld); a repeated aclInit is "
                "counted and returns ACL_ERROR_REPEAT_INITIALIZE, which callers may ignore",
                static_cast<long long>(prev + 1));
}

ACLMOCK_API aclError aclFinalize(void) {
    if (g_init_count.exchange(0) == 0)
        return fail(ACL_ERROR_REPEAT_FINALIZE,
                    "aclFinalize: not initialized (aclInit was never called, or aclFinalize was "
                    "already called)");
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion,
                                     int32_t *patchVersion) {
    if (!majorVersion || !minorVersion || !patchVersion)
        return fail(ACL_ERROR_INVALID_PARAM,
                    "aclrtGetVersion: %s must not be NULL",
                    !majorVersion ? "majorVersion" : !minorVersion ? "minorVersion" : "patchVersion");
    // The mock root's <arch>-linux/ascend_toolkit_install.info says 8.5.0.
    *majorVersion = 8;
    *minorVersion = 5;
    *patchVersion = 0;
    return ACL_SUCCESS;
}

ACLMOCK_API const char *aclrtGetSocName(void) { return reported_soc_name(); }

ACLMOCK_API aclError aclrtSetDevice(int32_t deviceId) {
    if (!valid_device(deviceId))
        return fail(ACL_ERROR_RT_INVALID_DEVICEID,
                    "aclrtSetDevice: deviceId must be in [0, %d) (got %d)", config().device_count,
                    deviceId);
    take_device_ref(deviceId);
    bind_thread_to_device(deviceId);
    // A device's memory is ready once it is open: the first operator call of a process (often the
    // first round of a world) should not be the one filling the poison file.
    prepare_poison_pages();
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtResetDevice(int32_t deviceId) {
    if (!valid_device(deviceId))
        return fail(ACL_ERROR_RT_INVALID_DEVICEID,
                    "aclrtResetDevice: deviceId must be in [0, %d) (got %d)", config().device_count,
                    deviceId);
    int64_t left = drop_device_ref(deviceId);
    if (left < 0)
        return fail(ACL_ERROR_RT_CONTEXT_NULL,
                    "aclrtResetDevice: device %d holds no reference (aclrtSetDevice was not "
                    "called for it, or every reference was already reset)",
                    deviceId);
    if (left == 0 && current_device() == deviceId) bind_thread_to_device(-1);
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtGetDevice(int32_t *deviceId) {
    if (!deviceId) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId must not be NULL");
    int32_t dev = current_device();
    if (dev < 0)
        return fail(ACL_ERROR_RT_CONTEXT_NULL,
                    "aclrtGetDevice: no device is set on this thread (call aclrtSetDevice or "
                    "aclrtSetCurrentContext first)");
    *deviceId = dev;
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtGetDeviceCount(uint32_t *count) {
    if (!count) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count must not be NULL");
    *count = static_cast<uint32_t>(config().device_count);
    return ACL_SUCCESS;
}

// Bytes of one element. Packed sub-byte types (ACL_INT4, ACL_UINT1, ACL_FLOAT4_E2M1,
// ACL_FLOAT4_E1M2) return 0, like ACL_DT_UNDEFINED and ACL_STRING: callers size them from the bit
// width (aclmock::dtype_bits gives 4 or 1). The FP6 types are stored one per byte and return 1.
ACLMOCK_API size_t aclDataTypeSize(aclDataType dataType) {
    int bits = dtype_bits(dataType);
    return bits >= 8 ? static_cast<size_t>(bits / 8) : 0;
}

}  // extern "C"

namespace aclmock {
// Declared in aclnn/executor.h; defined here so the runtime and the aclnn library share one table.
int dtype_bits(aclDataType dt) {
    switch (dt) {
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: return 32;
    case ACL_FLOAT16: case ACL_INT16: case ACL_UINT16: case ACL_BF16: return 16;
    case ACL_INT8: case ACL_UINT8: case ACL_BOOL: case ACL_HIFLOAT8: case ACL_FLOAT8_E5M2:
    case ACL_FLOAT8_E4M3FN: case ACL_FLOAT8_E8M0: case ACL_FLOAT6_E3M2: case ACL_FLOAT6_E2M3:
        return 8;
    case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: case ACL_COMPLEX64: return 64;
    case ACL_COMPLEX32: return 32;
    case ACL_COMPLEX128: return 128;
    case ACL_INT4: case ACL_FLOAT4_E2M1: case ACL_FLOAT4_E1M2: return 4;
    case ACL_UINT1: return 1;
    case ACL_DT_UNDEFINED: case ACL_STRING: return 0;
    }
    return 0;
}

const char *dtype_name(aclDataType dt) {
    switch (dt) {
    case ACL_DT_UNDEFINED: return "ACL_DT_UNDEFINED";
    case ACL_FLOAT: return "ACL_FLOAT";
    case ACL_FLOAT16: return "ACL_FLOAT16";
    case ACL_INT8: return "ACL_INT8";
    case ACL_INT32: return "ACL_INT32";
    case ACL_UINT8: return "ACL_UINT8";
    case ACL_INT16: return "ACL_INT16";
    case ACL_UINT16: return "ACL_UINT16";
    case ACL_UINT32: return "ACL_UINT32";
    case ACL_INT64: return "ACL_INT64";
    case ACL_UINT64: return "ACL_UINT64";
    case ACL_DOUBLE: return "ACL_DOUBLE";
    case ACL_BOOL: return "ACL_BOOL";
    case ACL_STRING: return "ACL_STRING";
    case ACL_COMPLEX64: return "ACL_COMPLEX64";
    case ACL_COMPLEX128: return "ACL_COMPLEX128";
    case ACL_BF16: return "ACL_BF16";
    case ACL_INT4: return "ACL_INT4";
    case ACL_UINT1: return "ACL_UINT1";
    case ACL_COMPLEX32: return "ACL_COMPLEX32";
    case ACL_HIFLOAT8: return "ACL_HIFLOAT8";
    case ACL_FLOAT8_E5M2: return "ACL_FLOAT8_E5M2";
    case ACL_FLOAT8_E4M3FN: return "ACL_FLOAT8_E4M3FN";
    case ACL_FLOAT8_E8M0: return "ACL_FLOAT8_E8M0";
    case ACL_FLOAT6_E3M2: return "ACL_FLOAT6_E3M2";
    case ACL_FLOAT6_E2M3: return "ACL_FLOAT6_E2M3";
    case ACL_FLOAT4_E2M1: return "ACL_FLOAT4_E2M1";
    case ACL_FLOAT4_E1M2: return "ACL_FLOAT4_E1M2";
    }
    return "unknown aclDataType";
}
}  // namespace aclmock
