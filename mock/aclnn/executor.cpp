// The generic two-phase executor (CANN's aclnn two-phase interface): registry of live executor handles, the
// aclSet*TensorAddr rebinding calls, aclSetAclOpExecutorRepeatable, aclDestroyAclOpExecutor and
// launch_executor (phase 2 of every mock op).
//
// Decisions:
// * Executor handles are opaque numbers looked up in a registry (never dereferenced), and never
//   reused, so a consumed, destroyed or garbage handle is reported with a message instead of
//   crashing. The most recent 4096 dead handles remember why they died, for a precise message.
// * NULL executor: 561103 (ACLNN_ERR_INNER_NULLPTR) from every executor call, including phase 2.
//   Unknown/consumed/destroyed executor: 161002.
// * A normal executor that was never launched may be destroyed with aclDestroyAclOpExecutor.
// * Phase 2 with a stream handle that is not live: 161002; with the NULL stream and no current
//   device: 361001 (ACLNN_ERR_RUNTIME_ERROR). The runtime's message is kept.
#include <pthread.h>

#include <array>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "aclnn/aclnn_internal.h"
#include "aclnn/executor.h"
#include "runtime/stream_internal.h"

namespace aclmock {
namespace {
constexpr uintptr_t kExecHandleBase = 0x5a7d000000000000ULL;
constexpr size_t kDeadMemory = 4096;

enum class Death : char { Consumed, Destroyed };

// The slots one launch runs with (rebinding after the launch does not change them).
struct Snapshot {
    std::vector<Slot> in, out;
};

struct Entry {
    std::shared_ptr<Executor> exec;
    std::mutex mu;  // guards exec's slots and flags against concurrent rebinding / launch
    // Handed to queued launches; rebuilt only after a rebind, so a repeated launch of an unchanged
    // executor copies nothing.
    std::shared_ptr<const Snapshot> snap;
    bool launched = false;  // phase 2 was called at least once (a repeatable executor stays live)
};

// What a queued launch holds until it has run, in one allocation.
struct Launch {
    std::shared_ptr<Executor> ex;
    std::shared_ptr<const Snapshot> slots;
    void *workspace;
    uint64_t workspace_bytes;
    Stream *stream;
    PinSet pins;
    std::unique_ptr<KernelRest> rest;   // a launch paused at a wait for its peers
};

// What the kernel running on this thread said it wrote of its outputs (note_output_written): bytes
// from each output view's element 0, kWhole for an output it said nothing about.
constexpr uint64_t kWhole = ~uint64_t(0);
constexpr size_t kNotedOutputs = 16;
thread_local std::array<uint64_t, kNotedOutputs> *t_noted = nullptr;

// Runs one launch's kernel and records what it wrote: the workspace, and each output - the part its
// kernel noted, or all of it (also when the kernel failed, which may stop anywhere).
int run_launch(Launch &run) {
    std::array<uint64_t, kNotedOutputs> noted;
    noted.fill(kWhole);
    t_noted = &noted;
    const int rc = run.rest ? run.rest->step()
                            : run.ex->run(run.slots->in, run.slots->out, run.workspace, run.stream, &run.rest);
    t_noted = nullptr;
    if (rc == kTaskPending) return rc;
    run.rest.reset();   // the call's hold on its communicator ends before the task counts as done
    run.pins.note_write(run.workspace, run.workspace_bytes);
    const std::vector<Slot> &out = run.slots->out;
    for (size_t i = 0; i < out.size(); ++i) {
        if (!out[i].present || !out[i].desc.data) continue;
        const uint64_t note = rc == 0 && i < kNotedOutputs ? noted[i] : kWhole;
        if (note == kWhole)
            run.pins.note_write(out[i].desc.data, out[i].desc.extent);
        else
            run.pins.note_write(view_ptr(out[i].desc), note);
    }
    run.pins.release();
    return rc;
}

struct DeadHandle {
    uint64_t id = 0;  // 0: no record (ids start at 1)
    Death why = Death::Consumed;
};

struct ExecRegistry {
    std::mutex mu;
    std::unordered_map<uint64_t, std::shared_ptr<Entry>> live;
    // A ring of the most recent dead handles: burying one allocates nothing, and only the message
    // of a call on a dead handle searches it.
    std::array<DeadHandle, kDeadMemory> dead;
    size_t dead_next = 0;
    uint64_t next_id = 1;
};

void anchor_fn() {}

ExecRegistry &ereg() {
    static ExecRegistry *r = [] {
        auto *p = new ExecRegistry;  // never destroyed (tasks may run during process exit)
        pin_library_of(reinterpret_cast<const void *>(&anchor_fn));
        pthread_atfork([] { ereg().mu.lock(); }, [] { ereg().mu.unlock(); },
                       [] { ereg().mu.unlock(); });
        return p;
    }();
    return *r;
}

aclOpExecutor *to_handle(uint64_t id) {
    return reinterpret_cast<aclOpExecutor *>(kExecHandleBase + id * 16);
}

bool to_id(const aclOpExecutor *h, uint64_t *id) {
    uintptr_t v = reinterpret_cast<uintptr_t>(h);
    if (v < kExecHandleBase || (v - kExecHandleBase) % 16 != 0 ||
        v - kExecHandleBase >= (uintptr_t(1) << 47))
        return false;
    *id = (v - kExecHandleBase) / 16;
    return true;
}

// Caller holds r.mu.
void bury_locked(ExecRegistry &r, uint64_t id, Death why) {
    r.dead[r.dead_next] = DeadHandle{id, why};
    r.dead_next = (r.dead_next + 1) % kDeadMemory;
}

// Caller holds r.mu. The record of a dead handle, or nullptr when it is not remembered.
const DeadHandle *find_dead_locked(const ExecRegistry &r, uint64_t id) {
    if (id == 0) return nullptr;
    for (const DeadHandle &d : r.dead)
        if (d.id == id) return &d;
    return nullptr;
}

std::shared_ptr<Entry> lookup(aclOpExecutor *h) {
    uint64_t id;
    if (!to_id(h, &id)) return nullptr;
    ExecRegistry &r = ereg();
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.live.find(id);
    return it == r.live.end() ? nullptr : it->second;
}

// Message for a handle that is not live.
int not_live(const char *api, aclOpExecutor *h) {
    uint64_t id;
    if (to_id(h, &id)) {
        ExecRegistry &r = ereg();
        std::lock_guard<std::mutex> lk(r.mu);
        const DeadHandle *dead = find_dead_locked(r, id);
        if (dead && dead->why == Death::Consumed)
            return fail(ACLNN_ERR_PARAM_INVALID,
                        "%s: executor %p was already launched: a normal executor is consumed by its "
                        "launch (phase 2) and cannot be used again; call "
                        "aclSetAclOpExecutorRepeatable after phase 1 to launch it more than once",
                        api, static_cast<void *>(h));
        if (dead)
            return fail(ACLNN_ERR_PARAM_INVALID,
                        "%s: executor %p was destroyed by aclDestroyAclOpExecutor", api,
                        static_cast<void *>(h));
    }
    return fail(ACLNN_ERR_PARAM_INVALID,
                "%s: executor %p is not a live aclOpExecutor (never created by a phase-1 call, "
                "already launched, or destroyed)", api, static_cast<void *>(h));
}

enum class Which { Input, Output, Any };

aclnnStatus set_addr(const char *api, aclOpExecutor *executor, size_t index, aclTensor *tensor,
                     void *addr, Which which) {
    if (!executor) return fail(ACLNN_ERR_INNER_NULLPTR, "%s: executor must not be NULL", api);
    if (!tensor) return fail(ACLNN_ERR_INNER_NULLPTR, "%s: tensor must not be NULL", api);
    std::shared_ptr<Entry> e = lookup(executor);
    if (!e) return not_live(api, executor);
    if (!tensor_alive(tensor))
        return fail(ACLNN_ERR_PARAM_INVALID,
                    "%s: tensor %p is not a live aclTensor (never created, or already destroyed)", api,
                    static_cast<void *>(tensor));
    std::lock_guard<std::mutex> lk(e->mu);
    Executor &ex = *e->exec;
    if (!ex.repeatable)
        return fail(ACLNN_ERR_PARAM_INVALID,
                    "%s: executor is not repeatable: call aclSetAclOpExecutorRepeatable after phase 1",
                    api);
    std::vector<Slot> *slots = nullptr;
    const size_t api_inputs = ex.inputs.size() - ex.hidden_inputs;
    size_t i = index + ex.hidden_inputs;
    const char *what = "input";
    size_t limit = 0;
    switch (which) {
    case Which::Input: slots = &ex.inputs; limit = api_inputs; break;
    case Which::Output: slots = &ex.outputs; limit = ex.outputs.size(); i = index; what = "output"; break;
    case Which::Any:
        limit = api_inputs + ex.outputs.size();
        if (index < api_inputs) {
            slots = &ex.inputs;
        } else {
            slots = &ex.outputs;
            i = index - api_inputs;
            what = "output";
        }
        break;
    }
    if (index >= limit)
        return fail(ACLNN_ERR_PARAM_INVALID, "%s: index must be < %zu for op %s (got %zu)", api, limit,
                    ex.op_name(), index);
    Slot &slot = (*slots)[i];
    if (!slot.present)
        return fail(ACLNN_ERR_PARAM_INVALID,
                    "%s: %s %zu of op %s was NULL at phase 1 and cannot be rebound (index %zu)", api,
                    what, slots == &ex.inputs ? i - ex.hidden_inputs : i, ex.op_name(), index);
    if (reinterpret_cast<uintptr_t>(addr) % 32 != 0)
        return fail(ACLNN_ERR_PARAM_INVALID, "%s: addr must be 32-byte aligned (got %p)", api, addr);
    slot.desc.data = addr;
    tensor->data = addr;
    e->snap.reset();  // the next launch takes a fresh copy of the slots
    return ACLNN_SUCCESS;
}

int slot_fail(const char *api, const Executor &ex, const char *what, size_t i, const Slot &s, const std::string &why) {
    return fail(ACLNN_ERR_PARAM_INVALID, "%s: %s %s %zu (shape %s, %s): %s", api, ex.op_name(), what, i,
                shape_str(s.desc.view).c_str(), dtype_name(s.desc.dtype), why.c_str());
}

// The alignment element 0 of a tensor of this type needs (its element size, up to 8 bytes).
uintptr_t element_align(aclDataType dtype) {
    const int bits = dtype_bits(dtype);
    return bits >= 8 ? static_cast<uintptr_t>(bits >= 64 ? 8 : bits / 8) : 1;
}

// The launch's workspace and every present, non-empty tensor must lie inside one registered device
// block, and a tensor's element 0 be naturally aligned (devices cannot load misaligned elements; the
// kernels read them as typed values). Their blocks are pinned until the launch has run (so aclrtFree
// of one waits instead of freeing memory under the kernel), all under one lock of the registry; the
// first problem in workspace, input, output order is reported.
int pin_launch(const char *api, const Executor &ex, const Snapshot &slots, void *workspace, uint64_t need,
               PinSet &pins) {
    struct Item {
        const Slot *slot;   // nullptr: the workspace
        const char *what;
        size_t i;
    };
    thread_local std::vector<PinSet::Range> ranges;
    thread_local std::vector<Item> items;
    ranges.clear();
    items.clear();
    if (need > 0) {
        ranges.push_back({workspace, need, "workspace"});
        items.push_back({nullptr, "workspace", 0});
    }
    bool stopped = false;   // the last item's data is NULL or misaligned: reported after those before it
    for (int side = 0; side < 2 && !stopped; ++side) {
        const std::vector<Slot> &v = side ? slots.out : slots.in;
        for (size_t i = 0; i < v.size() && !stopped; ++i) {
            const Slot &s = v[i];
            if (!s.present) continue;
            const uint64_t n = s.desc.extent;
            if (n == 0) continue;
            ranges.push_back({s.desc.data, n, "data"});   // a NULL range pins nothing
            items.push_back({&s, side ? "output" : "input", i});
            stopped = !s.desc.data || reinterpret_cast<uintptr_t>(view_ptr(s.desc)) % element_align(s.desc.dtype) != 0;
        }
    }
    const size_t bad = pins.pin_all(ranges.data(), ranges.size());
    if (bad < ranges.size()) {
        const std::string why = take_error();
        const Item &it = items[bad];
        return it.slot ? slot_fail(api, ex, it.what, it.i, *it.slot, why)
                       : fail(ACLNN_ERR_PARAM_INVALID, "%s: %s %s", api, ex.op_name(), why.c_str());
    }
    if (stopped) {
        const Item &it = items.back();
        const Slot &s = *it.slot;
        if (!s.desc.data) return slot_fail(api, ex, it.what, it.i, s, "data: address is NULL");
        return slot_fail(api, ex, it.what, it.i, s,
                         format("address %p is not aligned to its element size (%zu bytes)", view_ptr(s.desc),
                                static_cast<size_t>(element_align(s.desc.dtype))));
    }
    return ACLNN_SUCCESS;
}

// The slots of a launch. Those of an executor this launch consumed are moved: nothing reads them
// again (its handle is dead, and pending_executor_uses skips launched executors).
std::shared_ptr<const Snapshot> snapshot(Executor &ex, bool consumed) {
    if (consumed) return std::make_shared<const Snapshot>(Snapshot{std::move(ex.inputs), std::move(ex.outputs)});
    return std::make_shared<const Snapshot>(Snapshot{ex.inputs, ex.outputs});
}

// The trivial op behind make_copy_executor.
class CopyExecutor : public Executor {
public:
    CopyExecutor() : Executor("MockCopy") {}
    uint64_t nbytes = 0;
    int run(const std::vector<Slot> &in, const std::vector<Slot> &out, void *workspace, Stream *,
            std::unique_ptr<KernelRest> *) override {
        if (workspace_size > 0 && !find_block(workspace, workspace_size, nullptr))
            return fail(ACLNN_ERR_PARAM_INVALID, "MockCopy: workspace %p holds fewer than %llu bytes",
                        workspace, static_cast<unsigned long long>(workspace_size));
        if (nbytes) std::memmove(view_ptr(out[0].desc), view_ptr(in[0].desc), nbytes);
        return ACLNN_SUCCESS;
    }
};
}  // namespace

Slot slot_of(const aclTensor *t) {
    Slot s;
    if (t) {
        s.present = true;
        s.desc = *t;
        s.src = t;
    }
    return s;
}

bool pending_executor_uses(const aclTensor *t, std::string *what) {
    ExecRegistry &r = ereg();
    std::lock_guard<std::mutex> lk(r.mu);
    for (const auto &kv : r.live) {
        Entry &e = *kv.second;
        std::lock_guard<std::mutex> g(e.mu);
        if (e.launched) continue;
        const Executor &ex = *e.exec;
        for (int io = 0; io < 2; ++io) {
            const std::vector<Slot> &slots = io == 0 ? ex.inputs : ex.outputs;
            for (size_t i = 0; i < slots.size(); ++i) {
                const Slot &s = slots[i];
                if (!s.present || s.src != t || s.desc.serial != t->serial) continue;
                *what = format("executor %p of %s (%s %zu)", static_cast<void *>(to_handle(kv.first)),
                               ex.op_name(), io == 0 ? "input" : "output", i);
                return true;
            }
        }
    }
    return false;
}

size_t live_executor_count() {
    ExecRegistry &r = ereg();
    std::lock_guard<std::mutex> lk(r.mu);
    return r.live.size();
}

aclOpExecutor *register_executor(std::shared_ptr<Executor> exec) {
    if (!exec) {
        fail(ACLNN_ERR_INNER_CREATE_EXECUTOR, "register_executor: executor is NULL");
        return nullptr;
    }
    auto e = std::make_shared<Entry>();
    e->exec = std::move(exec);
    ExecRegistry &r = ereg();
    std::lock_guard<std::mutex> lk(r.mu);
    uint64_t id = r.next_id++;
    r.live.emplace(id, std::move(e));
    return to_handle(id);
}

std::shared_ptr<Executor> find_executor(aclOpExecutor *handle) {
    std::shared_ptr<Entry> e = lookup(handle);
    return e ? e->exec : nullptr;
}

aclnnStatus launch_executor(aclOpExecutor *handle, void *workspace, uint64_t workspace_size,
                            aclrtStream stream, const char *api_name) {
    const char *api = api_name ? api_name : "aclnn launch";
    if (!handle) return fail(ACLNN_ERR_INNER_NULLPTR, "%s: executor must not be NULL", api);
    uint64_t id = 0;
    std::shared_ptr<Entry> e;
    bool consumed = false;
    if (to_id(handle, &id)) {
        ExecRegistry &r = ereg();
        std::lock_guard<std::mutex> lk(r.mu);
        auto it = r.live.find(id);
        if (it != r.live.end()) {
            e = it->second;
            std::lock_guard<std::mutex> g(e->mu);
            e->launched = true;
            consumed = !e->exec->repeatable;  // consumed by this call, whatever its outcome
            if (consumed) {
                r.live.erase(it);
                bury_locked(r, id, Death::Consumed);
            }
        }
    }
    if (!e) return not_live(api, handle);

    std::shared_ptr<Executor> ex = e->exec;
    std::shared_ptr<const Snapshot> slots;
    uint64_t need;
    {
        std::lock_guard<std::mutex> g(e->mu);
        if (!e->snap) e->snap = snapshot(*ex, consumed);
        slots = e->snap;
        need = ex->workspace_size;
    }
    const char *op = ex->op_name();
    // Decision (docs/reliability.md): phase 1 is host-only and works without aclInit; a launch needs
    // the runtime initialised, as CANN loads the kernels at aclInit.
    if (!acl_initialized())
        return fail(ACLNN_ERR_RUNTIME_ERROR,
                    "%s: %s: the runtime is not initialised (aclInit was not called, or aclFinalize was "
                    "called); call aclInit before launching an op", api, op);
    PinSet pins;
    pins.reserve(1 + slots->in.size() + slots->out.size());
    if (need > 0) {
        if (!workspace)
            return fail(ACLNN_ERR_PARAM_INVALID, "%s: %s needs a workspace of %llu bytes but workspace is NULL",
                        api, op, static_cast<unsigned long long>(need));
        if (workspace_size < need)
            return fail(ACLNN_ERR_PARAM_INVALID,
                        "%s: %s: workspaceSize must be >= %llu (the size phase 1 returned) (got %llu)",
                        api, op, static_cast<unsigned long long>(need),
                        static_cast<unsigned long long>(workspace_size));
    }
    if (int rc = pin_launch(api, *ex, *slots, workspace, need, pins)) return rc;

    aclError err = ACL_SUCCESS;
    Stream *s = resolve_stream(stream, &err, api);
    if (!s) {
        std::string why = take_error();
        return fail(err == ACL_ERROR_RT_INVALID_HANDLE ? ACLNN_ERR_PARAM_INVALID : ACLNN_ERR_RUNTIME_ERROR,
                    "%s", why.c_str());
    }
    if (skip_kernels()) {
        // Nothing to hold for a kernel that does nothing: the pins go when this returns.
        err = enqueue(s, []() -> int { return 0; }, api);
    } else {
        auto run = std::make_shared<Launch>(Launch{ex, std::move(slots), workspace, need, s, std::move(pins), {}});
        err = enqueue(s, [run]() -> int { return run_launch(*run); }, api, ex->may_block());
    }
    if (err) {
        std::string why = take_error();
        return fail(ACLNN_ERR_RUNTIME_ERROR, "%s", why.c_str());
    }
    return ACLNN_SUCCESS;
}

void note_output_written(size_t index, uint64_t bytes) {
    if (t_noted && index < kNotedOutputs) (*t_noted)[index] = bytes;
}

aclOpExecutor *make_copy_executor(const aclTensor *src, aclTensor *dst, uint64_t workspace_size) {
    const char *api = "make_copy_executor";
    const aclTensor *ts[2] = {src, dst};
    const char *names[2] = {"src", "dst"};
    for (int i = 0; i < 2; ++i) {
        if (!ts[i]) {
            fail(ACLNN_ERR_PARAM_NULLPTR, "%s: %s must not be NULL", api, names[i]);
            return nullptr;
        }
        if (!tensor_alive(ts[i])) {
            fail(ACLNN_ERR_PARAM_INVALID, "%s: %s %p is not a live aclTensor", api, names[i],
                 static_cast<const void *>(ts[i]));
            return nullptr;
        }
        if (!is_contiguous(*ts[i])) {
            fail(ACLNN_ERR_PARAM_INVALID, "%s: %s must be contiguous", api, names[i]);
            return nullptr;
        }
    }
    auto nb = [](const aclTensor &t) {
        return (static_cast<uint64_t>(numel(t)) * static_cast<uint64_t>(dtype_bits(t.dtype)) + 7) / 8;
    };
    if (nb(*src) != nb(*dst)) {
        fail(ACLNN_ERR_PARAM_INVALID, "%s: src and dst must hold the same number of bytes (got %llu and %llu)",
             api, static_cast<unsigned long long>(nb(*src)), static_cast<unsigned long long>(nb(*dst)));
        return nullptr;
    }
    auto ex = std::make_shared<CopyExecutor>();
    ex->inputs.push_back(slot_of(src));
    ex->outputs.push_back(slot_of(dst));
    ex->nbytes = nb(*src);
    ex->workspace_size = workspace_size;
    return register_executor(std::move(ex));
}

}  // namespace aclmock

using namespace aclmock;

extern "C" {

ACLMOCK_API aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor) {
    const char *api = "aclSetAclOpExecutorRepeatable";
    if (!executor) return fail(ACLNN_ERR_INNER_NULLPTR, "%s: executor must not be NULL", api);
    std::shared_ptr<Entry> e = lookup(executor);
    if (!e) return not_live(api, executor);
    std::lock_guard<std::mutex> lk(e->mu);
    e->exec->repeatable = true;
    return ACLNN_SUCCESS;
}

ACLMOCK_API aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor) {
    const char *api = "aclDestroyAclOpExecutor";
    if (!executor) return fail(ACLNN_ERR_INNER_NULLPTR, "%s: executor must not be NULL", api);
    uint64_t id;
    std::shared_ptr<Entry> e;  // released outside the lock (launches queued keep their own ref)
    if (to_id(executor, &id)) {
        ExecRegistry &r = ereg();
        std::lock_guard<std::mutex> lk(r.mu);
        auto it = r.live.find(id);
        if (it != r.live.end()) {
            e = std::move(it->second);
            r.live.erase(it);
            bury_locked(r, id, Death::Destroyed);
        }
    }
    if (!e) return not_live(api, executor);
    return ACLNN_SUCCESS;
}

ACLMOCK_API aclnnStatus aclSetInputTensorAddr(aclOpExecutor *executor, const size_t index,
                                              aclTensor *tensor, void *addr) {
    return set_addr("aclSetInputTensorAddr", executor, index, tensor, addr, Which::Input);
}

ACLMOCK_API aclnnStatus aclSetOutputTensorAddr(aclOpExecutor *executor, const size_t index,
                                               aclTensor *tensor, void *addr) {
    return set_addr("aclSetOutputTensorAddr", executor, index, tensor, addr, Which::Output);
}

ACLMOCK_API aclnnStatus aclSetTensorAddr(aclOpExecutor *executor, const size_t index,
                                         aclTensor *tensor, void *addr) {
    return set_addr("aclSetTensorAddr", executor, index, tensor, addr, Which::Any);
}

}  // extern "C"
