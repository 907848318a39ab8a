// Contexts, and the calling thread's binding to a device and a context.
//
// Decisions (CANN's aclrtCreateContext / aclrtSetCurrentContext / aclrtDestroyContext documents
// leave room here):
// * Every device has a default context, the one aclrtSetDevice binds the thread to. It has a handle
//   of its own (aclrtGetCurrentContext returns it) that aclrtSetCurrentContext accepts while the
//   device holds a reference, and that aclrtDestroyContext refuses (ACL_ERROR_INVALID_PARAM): CANN
//   destroys only contexts made by aclrtCreateContext.
// * aclrtCreateContext(&ctx, dev) takes a reference on the device (like aclrtSetDevice; CANN opens
//   the device for a context when nothing else did) and binds the calling thread to the new
//   context. aclrtDestroyContext releases the streams created in it (queued work runs first) and
//   the device reference. A thread whose current context was destroyed, by itself or by another
//   thread, has no device any more: its next call that needs one fails with
//   ACL_ERROR_RT_CONTEXT_NULL (107002), as after aclrtResetDevice.
// * Context handles are opaque numbers looked up in a registry, never pointers, so a destroyed or
//   made-up handle is refused (ACL_ERROR_RT_INVALID_HANDLE, 107017) instead of being dereferenced.
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "runtime/context_internal.h"
#include "runtime/rt_core.h"

namespace aclmock {
namespace {
constexpr uintptr_t kContextHandleBase = 0x5a7c000000000000ULL;
constexpr uintptr_t kDefaultContextBase = 0x5a7b000000000000ULL;

struct Context {
    Context(uint64_t id_, int32_t dev) : id(id_), device(dev) {}
    const uint64_t id;
    const int32_t device;
    std::atomic<bool> live{true};
};

struct Registry {
    std::mutex mu;
    std::unordered_map<uint64_t, std::shared_ptr<Context>> contexts;
    uint64_t next_id = 1;
};

Registry &reg() {
    static auto *r = new Registry;   // never destroyed: threads may exit after static destructors
    return *r;
}

thread_local int32_t t_device = -1;
thread_local std::shared_ptr<Context> t_context;   // null: the device's default context

void *context_handle(uint64_t id) { return reinterpret_cast<void *>(kContextHandleBase + id * 16); }
void *default_context_handle(int32_t dev) {
    return reinterpret_cast<void *>(kDefaultContextBase + static_cast<uintptr_t>(dev) * 16);
}
bool handle_value(const void *h, uintptr_t base, uint64_t *value) {
    uintptr_t v = reinterpret_cast<uintptr_t>(h);
    if (v < base || (v - base) % 16 != 0 || v - base >= (uintptr_t(1) << 47)) return false;
    *value = (v - base) / 16;
    return true;
}

std::shared_ptr<Context> find_context(aclrtContext h) {
    uint64_t id;
    if (!handle_value(h, kContextHandleBase, &id)) return nullptr;
    Registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.contexts.find(id);
    return it == r.contexts.end() ? nullptr : it->second;
}

// The device whose default-context handle h is, or -1.
int32_t default_context_device(aclrtContext h) {
    uint64_t dev;
    if (!handle_value(h, kDefaultContextBase, &dev) || dev > INT32_MAX) return -1;
    return valid_device(static_cast<int32_t>(dev)) ? static_cast<int32_t>(dev) : -1;
}

aclError not_a_context(const char *api, aclrtContext h) {
    return fail(ACL_ERROR_RT_INVALID_HANDLE,
                "%s: context %p is not a live context (never returned by aclrtCreateContext or "
                "aclrtGetCurrentContext, or already destroyed)", api, h);
}
}  // namespace

int32_t current_device() {
    if (t_context && !t_context->live.load(std::memory_order_acquire)) {
        t_context.reset();   // destroyed by another thread
        t_device = -1;
    }
    return t_device;
}

void bind_thread_to_device(int32_t dev) {
    t_context.reset();
    t_device = dev;
}

uint64_t current_context_id() {
    return current_device() >= 0 && t_context ? t_context->id : 0;
}

}  // namespace aclmock

using namespace aclmock;

extern "C" {

ACLMOCK_API aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId) {
    if (!context) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateContext: context must not be NULL");
    if (!valid_device(deviceId))
        return fail(ACL_ERROR_RT_INVALID_DEVICEID, "aclrtCreateContext: deviceId must be in [0, %d) (got %d)",
                    config().device_count, deviceId);
    Registry &r = reg();
    std::shared_ptr<Context> c;
    {
        std::lock_guard<std::mutex> lk(r.mu);
        c = std::make_shared<Context>(r.next_id++, deviceId);
        r.contexts.emplace(c->id, c);
    }
    take_device_ref(deviceId);
    t_context = c;
    t_device = deviceId;
    *context = context_handle(c->id);
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtDestroyContext(aclrtContext context) {
    constexpr const char *api = "aclrtDestroyContext";
    if (!context) return fail(ACL_ERROR_INVALID_PARAM, "%s: context must not be NULL", api);
    if (int32_t dev = default_context_device(context); dev >= 0)
        return fail(ACL_ERROR_INVALID_PARAM,
                    "%s: context %p is the default context of device %d, which only aclrtResetDevice "
                    "releases (aclrtDestroyContext takes contexts made by aclrtCreateContext)", api, context, dev);
    std::shared_ptr<Context> c;
    uint64_t id;
    if (handle_value(context, kContextHandleBase, &id)) {
        Registry &r = reg();
        std::lock_guard<std::mutex> lk(r.mu);
        auto it = r.contexts.find(id);
        if (it != r.contexts.end()) {
            c = it->second;
            r.contexts.erase(it);
        }
    }
    if (!c) return not_a_context(api, context);
    c->live.store(false, std::memory_order_release);
    if (t_context == c) bind_thread_to_device(-1);
    release_streams_of(c->device, c->id);
    drop_device_ref(c->device);
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtSetCurrentContext(aclrtContext context) {
    constexpr const char *api = "aclrtSetCurrentContext";
    if (!context) return fail(ACL_ERROR_INVALID_PARAM, "%s: context must not be NULL", api);
    if (int32_t dev = default_context_device(context); dev >= 0) {
        if (device_refs(dev) == 0)
            return fail(ACL_ERROR_RT_CONTEXT_NULL,
                        "%s: context %p is the default context of device %d, which was reset "
                        "(call aclrtSetDevice(%d) again)", api, context, dev, dev);
        bind_thread_to_device(dev);
        return ACL_SUCCESS;
    }
    std::shared_ptr<Context> c = find_context(context);
    if (!c) return not_a_context(api, context);
    t_context = std::move(c);
    t_device = t_context->device;
    return ACL_SUCCESS;
}

ACLMOCK_API aclError aclrtGetCurrentContext(aclrtContext *context) {
    if (!context) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetCurrentContext: context must not be NULL");
    int32_t dev = current_device();
    if (dev < 0)
        return fail(ACL_ERROR_RT_CONTEXT_NULL,
                    "aclrtGetCurrentContext: this thread has no context (call aclrtSetDevice, "
                    "aclrtCreateContext or aclrtSetCurrentContext first)");
    *context = t_context ? context_handle(t_context->id) : default_context_handle(dev);
    return ACL_SUCCESS;
}

}  // extern "C"
