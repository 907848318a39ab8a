/*
 * The benchmarks' host-overhead floor: what a C programmer gets from the same backend libraries.
 *
 * `python -m benchmarks` compiles this file into a shared library on first use (benchmarks/c_floor.py),
 * loads it with ctypes and times two loops against the functions of the backend the Python binding
 * already loaded (resolved with dlopen(RTLD_NOLOAD) + dlsym, so the loop calls exactly the code the
 * binding calls, never a second copy of a library):
 *
 *   per call: phase 1 (aclnnMoeDistribute*V5GetWorkspaceSize) with descriptors made once by the
 *             Python side, then phase 2 (aclnnMoeDistribute*V5) on the caller's workspace/stream;
 *   plan:     aclSetInputTensorAddr of the inputs a plan call rebinds, then phase 2, on one
 *             repeatable executor made by the Python side;
 *   world:    rounds of one rank of a world: dispatch, combine and aclrtSynchronizeStream on repeatable
 *             executors, the whole loop in C (the worlds sections' floor: no interpreter, no GIL).
 *
 * Each timing function runs `calls` iterations and returns the elapsed nanoseconds, or a negative
 * number on failure (aclnnpy_floor_error() then names the call and its status).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "acl/acl_rt.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_moe_distribute_combine_v5.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v5.h"

#if defined(__GNUC__)
#define FLOOR_API __attribute__((visibility("default")))
#else
#define FLOOR_API
#endif

/* Function pointer types taken from the declarations in include/, so the signatures have one source. */
typedef __typeof__(aclnnMoeDistributeDispatchV5GetWorkspaceSize) *dispatch_phase1_fn;
typedef __typeof__(aclnnMoeDistributeCombineV5GetWorkspaceSize) *combine_phase1_fn;
typedef __typeof__(aclnnMoeDistributeDispatchV5) *launch_fn;
typedef __typeof__(aclSetInputTensorAddr) *set_input_fn;
typedef __typeof__(aclrtSynchronizeStream) *sync_fn;

enum { FLOOR_DISPATCH = 0, FLOOR_COMBINE = 1 };

static struct {
    dispatch_phase1_fn dispatch_phase1;
    launch_fn dispatch_launch;
    combine_phase1_fn combine_phase1;
    launch_fn combine_launch;
    set_input_fn set_input;
    sync_fn synchronize;
} fns;

/* per thread: the ranks of a thread world run their loops at once */
static __thread char last_error[512];

FLOOR_API const char *aclnnpy_floor_error(void) { return last_error; }

static int64_t fail(const char *call, int status) {
    snprintf(last_error, sizeof last_error, "%s returned %d", call, status);
    return -1;
}

/* Bind `symbol` to its definition in `library`, which must already be loaded in this process (the
 * binding loaded it): RTLD_NOLOAD refuses to load a second copy. Returns 0, or -1 with the reason in
 * aclnnpy_floor_error(). */
FLOOR_API int aclnnpy_floor_bind(const char *symbol, const char *library) {
    void *handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    if (!handle) {
        snprintf(last_error, sizeof last_error, "%s is not loaded in this process: %s", library,
                 dlerror());
        return -1;
    }
    void *address = dlsym(handle, symbol);
    dlclose(handle); /* drops only the reference RTLD_NOLOAD took; the binding keeps the library */
    if (!address) {
        snprintf(last_error, sizeof last_error, "%s not found in %s", symbol, library);
        return -1;
    }
    if (strcmp(symbol, "aclnnMoeDistributeDispatchV5GetWorkspaceSize") == 0)
        fns.dispatch_phase1 = (dispatch_phase1_fn)address;
    else if (strcmp(symbol, "aclnnMoeDistributeDispatchV5") == 0)
        fns.dispatch_launch = (launch_fn)address;
    else if (strcmp(symbol, "aclnnMoeDistributeCombineV5GetWorkspaceSize") == 0)
        fns.combine_phase1 = (combine_phase1_fn)address;
    else if (strcmp(symbol, "aclnnMoeDistributeCombineV5") == 0)
        fns.combine_launch = (launch_fn)address;
    else if (strcmp(symbol, "aclSetInputTensorAddr") == 0)
        fns.set_input = (set_input_fn)address;
    else if (strcmp(symbol, "aclrtSynchronizeStream") == 0)
        fns.synchronize = (sync_fn)address;
    else {
        snprintf(last_error, sizeof last_error, "%s is not a function the floor loops call", symbol);
        return -1;
    }
    return 0;
}

/* The address bound to `symbol` (0 when unbound), so a test can check it is the binding's own. */
FLOOR_API uintptr_t aclnnpy_floor_address(const char *symbol) {
    if (strcmp(symbol, "aclnnMoeDistributeDispatchV5GetWorkspaceSize") == 0)
        return (uintptr_t)fns.dispatch_phase1;
    if (strcmp(symbol, "aclnnMoeDistributeDispatchV5") == 0) return (uintptr_t)fns.dispatch_launch;
    if (strcmp(symbol, "aclnnMoeDistributeCombineV5GetWorkspaceSize") == 0)
        return (uintptr_t)fns.combine_phase1;
    if (strcmp(symbol, "aclnnMoeDistributeCombineV5") == 0) return (uintptr_t)fns.combine_launch;
    if (strcmp(symbol, "aclSetInputTensorAddr") == 0) return (uintptr_t)fns.set_input;
    if (strcmp(symbol, "aclrtSynchronizeStream") == 0) return (uintptr_t)fns.synchronize;
    return 0;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t workspace_too_small(uint64_t need, uint64_t have) {
    snprintf(last_error, sizeof last_error, "phase 1 asks for a %llu-byte workspace; the loop was given %llu",
             (unsigned long long)need, (unsigned long long)have);
    return -1;
}

static int64_t unbound(const char *what) {
    snprintf(last_error, sizeof last_error, "%s is not bound: call aclnnpy_floor_bind first", what);
    return -1;
}

/* Dispatch per call: `tensors` holds the 8 inputs then the 7 outputs in the C parameter order (NULL
 * for absent optional inputs); `attrs` the 12 integer attributes before commAlg then the 3 after it. */
FLOOR_API int64_t aclnnpy_floor_dispatch_per_call(aclTensor *const tensors[15], const int64_t attrs[15],
                                                  const char *comm_alg, void *workspace,
                                                  uint64_t workspace_capacity, aclrtStream stream,
                                                  int64_t calls) {
    if (!fns.dispatch_phase1 || !fns.dispatch_launch) return unbound("dispatch");
    aclTensor *const *in = tensors, *const *out = tensors + 8;
    const int64_t *a = attrs;
    int64_t t0 = now_ns();
    for (int64_t i = 0; i < calls; ++i) {
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        aclnnStatus st = fns.dispatch_phase1(
            in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], a[0], a[1], a[2], a[3], a[4], a[5], a[6],
            a[7], a[8], a[9], a[10], a[11], comm_alg, a[12], a[13], a[14], out[0], out[1], out[2], out[3],
            out[4], out[5], out[6], &ws, &ex);
        if (st) return fail("aclnnMoeDistributeDispatchV5GetWorkspaceSize", st);
        if (ws > workspace_capacity) return workspace_too_small(ws, workspace_capacity);
        st = fns.dispatch_launch(workspace, ws, ex, stream);
        if (st) return fail("aclnnMoeDistributeDispatchV5", st);
    }
    return now_ns() - t0;
}

/* Combine per call: `tensors` holds the 19 inputs then x_out; `attrs` the 13 integer attributes
 * before commAlg then the 3 after it. */
FLOOR_API int64_t aclnnpy_floor_combine_per_call(aclTensor *const tensors[20], const int64_t attrs[16],
                                                 const char *comm_alg, void *workspace,
                                                 uint64_t workspace_capacity, aclrtStream stream,
                                                 int64_t calls) {
    if (!fns.combine_phase1 || !fns.combine_launch) return unbound("combine");
    aclTensor *const *t = tensors;
    const int64_t *a = attrs;
    int64_t t0 = now_ns();
    for (int64_t i = 0; i < calls; ++i) {
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        aclnnStatus st = fns.combine_phase1(
            t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12], t[13], t[14], t[15],
            t[16], t[17], t[18], a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
            comm_alg, a[13], a[14], a[15], t[19], &ws, &ex);
        if (st) return fail("aclnnMoeDistributeCombineV5GetWorkspaceSize", st);
        if (ws > workspace_capacity) return workspace_too_small(ws, workspace_capacity);
        st = fns.combine_launch(workspace, ws, ex, stream);
        if (st) return fail("aclnnMoeDistributeCombineV5", st);
    }
    return now_ns() - t0;
}

/* Plan: iteration i rebinds input slots[j] of the repeatable `executor` to addrs[(i % sets) * nslots
 * + j] through descs[j] (aclSetInputTensorAddr), then launches phase 2 of `op` (FLOOR_DISPATCH or
 * FLOOR_COMBINE). `sets` address sets alternate, as a plan called with new activations each step. */
FLOOR_API int64_t aclnnpy_floor_plan(int op, aclOpExecutor *executor, int64_t nslots, const int64_t *slots,
                                     aclTensor *const *descs, void *const *addrs, int64_t sets,
                                     void *workspace, uint64_t workspace_size, aclrtStream stream,
                                     int64_t calls) {
    launch_fn launch = op == FLOOR_DISPATCH  ? fns.dispatch_launch
                       : op == FLOOR_COMBINE ? fns.combine_launch
                                             : NULL;
    if (!launch || (nslots && !fns.set_input)) return unbound("plan launch / aclSetInputTensorAddr");
    if (sets < 1) sets = 1;
    int64_t t0 = now_ns();
    for (int64_t i = 0; i < calls; ++i) {
        void *const *set = addrs + (i % sets) * nslots;
        for (int64_t j = 0; j < nslots; ++j) {
            aclnnStatus st = fns.set_input(executor, (size_t)slots[j], descs[j], set[j]);
            if (st) return fail("aclSetInputTensorAddr", st);
        }
        aclnnStatus st = launch(workspace, workspace_size, executor, stream);
        if (st) return fail(op == FLOOR_DISPATCH ? "aclnnMoeDistributeDispatchV5" : "aclnnMoeDistributeCombineV5",
                            st);
    }
    return now_ns() - t0;
}

/* World: `rounds` rounds of one rank, each phase 2 of the repeatable dispatch executor, then of the
 * repeatable combine executor (which reads the dispatch's outputs), then aclrtSynchronizeStream; the
 * CLOCK_MONOTONIC time (ns) each round ended goes to ends[i] (the ranks of a world start their loops
 * one after another; their rounds then run in step, which the ends show). */
FLOOR_API int64_t aclnnpy_floor_world_rounds(aclOpExecutor *dispatch, void *dispatch_workspace,
                                             uint64_t dispatch_workspace_size, aclOpExecutor *combine,
                                             void *combine_workspace, uint64_t combine_workspace_size,
                                             aclrtStream stream, int64_t rounds, int64_t *ends) {
    if (!fns.dispatch_launch || !fns.combine_launch || !fns.synchronize)
        return unbound("dispatch / combine launch / aclrtSynchronizeStream");
    int64_t t0 = now_ns();
    for (int64_t i = 0; i < rounds; ++i) {
        aclnnStatus st = fns.dispatch_launch(dispatch_workspace, dispatch_workspace_size, dispatch, stream);
        if (st) return fail("aclnnMoeDistributeDispatchV5", st);
        st = fns.combine_launch(combine_workspace, combine_workspace_size, combine, stream);
        if (st) return fail("aclnnMoeDistributeCombineV5", st);
        aclError e = fns.synchronize(stream);
        if (e) return fail("aclrtSynchronizeStream", e);
        ends[i] = now_ns();
    }
    return now_ns() - t0;
}
