// Internal C++ interface of the mock aclnn meta library (libnnopbase.so): tensor descriptors and
// the generic two-phase executor that every mock op builds on (CANN's aclnn two-phase interface).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aclnn/acl_meta.h"
#include "aclnn/dims.h"
#include "runtime/rt_core.h"

// aclTensor / aclOpExecutor are opaque in the public headers; the mock defines them here.
// What every launch reads of each of its tensors comes first, in one cache line: the slots of an
// executor hold copies, and in a thread world of hundreds of ranks a launch finds them out of cache.
struct aclTensor {
    uint64_t magic;                   // kTensorMagic while alive
    void *data = nullptr;             // storage base
    int64_t offset = 0;               // in elements
    uint64_t extent = 0;              // bytes the view spans from data: view_extent_bytes, fixed at creation
    aclDataType dtype = ACL_DT_UNDEFINED;
    aclFormat format = ACL_FORMAT_ND;
    uint64_t serial = 0;              // unique per aclCreateTensor call (a reused address is a new tensor)
    aclmock::Dims view;               // view dims
    aclmock::Dims strides;            // in elements
    aclmock::Dims storage;            // storage dims
};

namespace aclmock {

constexpr uint64_t kTensorMagic = 0x41434c54454e534fULL;

// Bits of one element; packed types give 4 (INT4, FP4_*) or 1 (UINT1); 0 for UNDEFINED/STRING.
// (dtype_bits and dtype_name are defined in libascendcl, next to aclDataTypeSize, so both
// libraries share one table.)
ACLMOCK_API int dtype_bits(aclDataType dt);
ACLMOCK_API const char *dtype_name(aclDataType dt);
// True when `t` is a tensor created by aclCreateTensor and not destroyed.
ACLMOCK_API bool tensor_alive(const aclTensor *t);
ACLMOCK_API int64_t numel(const aclTensor &t);
// Bytes from the storage base to one past the last element the view can reach.
ACLMOCK_API uint64_t view_extent_bytes(const aclTensor &t);
ACLMOCK_API bool is_contiguous(const aclTensor &t);
// Address of view element 0: data + offset * element size.
ACLMOCK_API void *view_ptr(const aclTensor &t);
ACLMOCK_API std::string shape_str(const Dims &dims);
struct TensorStats {
    size_t live_tensors = 0;
    size_t live_executors = 0;
};
ACLMOCK_API TensorStats tensor_stats();

// One slot of an executor: a copy of the descriptor taken at phase 1 (so the caller may destroy its
// aclTensor after phase 2 returns), or empty when the optional argument was NULL.
struct Slot {
    bool present = false;
    aclTensor desc{};
    const aclTensor *src = nullptr;   // the caller's descriptor (compared with desc.serial, never read)
};
// The slot of one phase-1 argument: a copy of *t, or an empty slot when t is NULL.
ACLMOCK_API Slot slot_of(const aclTensor *t);

// Base class of every op's executor. Phase 1 (the op's GetWorkspaceSize) validates, fills the
// slots, sets workspace_size and calls register_executor(). Phase 2 calls launch_executor().
// What is left of a launch that paused at a wait for its peers (Executor::run returned
// kTaskPending): step() goes on from there, on whichever thread runs the stream next, and is called
// again until it returns something else.
class KernelRest {
public:
    virtual ~KernelRest() = default;
    virtual int step() = 0;

    // Every rest takes the same kRestBytes: a rank's dispatch and combine alternate on its thread,
    // and with one size the allocator gives a launch the memory of the rest that just finished there,
    // still in the cache, where a size of its own would be the one that rank last freed a round ago
    // (out of the cache in a thread world of hundreds of ranks).
    static constexpr size_t kRestBytes = 1024;
    static void *operator new(size_t n) { return ::operator new(n < kRestBytes ? kRestBytes : n); }
    static void operator delete(void *p) { ::operator delete(p); }
};

class Executor {
public:
    // `op_name` is a string literal (kept, not copied).
    explicit Executor(const char *op_name) : op_name_(op_name) {}
    virtual ~Executor() = default;

    const char *op_name() const { return op_name_; }
    std::vector<Slot> inputs;
    std::vector<Slot> outputs;
    // Leading input slots the op's aclnn API has no parameter for (the group-string generations keep
    // the context slot of the op they map onto, always NULL): aclSetInputTensorAddr's index i, which
    // counts the API's input parameters, is slot i + hidden_inputs.
    size_t hidden_inputs = 0;
    uint64_t workspace_size = 0;
    bool repeatable = false;

    // Runs on the thread that runs the stream (its worker, or one synchronising it). `workspace` was
    // checked to be device memory of at least workspace_size bytes; the slots hold the addresses
    // bound at launch time (rebinding after a launch does not affect a launch already queued).
    // Returns an aclError / aclnnStatus; on failure it has set the message with aclmock::set_error /
    // fail. A kernel that waits for its peers may instead return kTaskPending with *rest set to what
    // is left of the launch (its pending wait set, see enqueue).
    virtual int run(const std::vector<Slot> &inputs, const std::vector<Slot> &outputs,
                    void *workspace, Stream *stream, std::unique_ptr<KernelRest> *rest) = 0;
    // Whether a launch may block its thread other than where it pauses: it then runs on the
    // stream's worker only, never on a thread that synchronises the stream.
    virtual bool may_block() const { return false; }

private:
    const char *op_name_;
};

// Makes a live executor handle out of a fully built executor.
ACLMOCK_API aclOpExecutor *register_executor(std::shared_ptr<Executor> exec);
// Looks up a live handle (nullptr when unknown, destroyed or consumed).
ACLMOCK_API std::shared_ptr<Executor> find_executor(aclOpExecutor *handle);
// Phase 2 shared by all ops: checks the handle (consumed / destroyed → ACLNN_ERR_PARAM_INVALID
// with a message), the workspace (NULL or smaller than workspace_size when > 0, not device memory →
// ACLNN_ERR_PARAM_INVALID), every bound tensor's data range against the memory registry, resolves
// the stream, snapshots the slots and enqueues exec->run. A normal executor is consumed (its handle
// becomes invalid) when this returns, successful or not; a repeatable one stays. `api_name` is a
// string literal (it names the queued task).
ACLMOCK_API aclnnStatus launch_executor(aclOpExecutor *handle, void *workspace, uint64_t workspace_size,
                                        aclrtStream stream, const char *api_name);

// Called by a kernel while it runs: of output `index` it wrote only the first `bytes` bytes from the
// view's element 0. Without a note the whole output counts as written; either way the launch records
// it in the memory registry (mark_written), so a refill of a reused output restores only that part.
ACLMOCK_API void note_output_written(size_t index, uint64_t bytes);

// A trivial test op (added so the two-phase rules can be tested without the real ops): phase 1 of
// "MockCopy". Input 0 = src, output 0 = dst, both contiguous with the same number of bytes; the
// launch copies src's bytes to dst and requires a workspace of at least workspace_size bytes.
// Returns NULL (with a message) when the arguments are wrong.
ACLMOCK_API aclOpExecutor *make_copy_executor(const aclTensor *src, aclTensor *dst,
                                              uint64_t workspace_size);

}  // namespace aclmock
