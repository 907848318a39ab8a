/* Phase 2 of a plan (a repeatable executor): move the slots whose wanted address differs from the
 * bound one, then launch — one call from Python where a C programmer's loop makes one per slot plus
 * the launch, so a plan step costs one crossing of the Python/C boundary whatever it rebinds.
 *
 * The plan's arguments are one struct, filled once when the plan is built: in_want/out_want hold the
 * addresses this step needs (0: the slot is absent); in_bound/out_bound the addresses the executor
 * holds now, updated as each move succeeds. On failure `failed` tells which call failed
 * (1: aclSetInputTensorAddr, 2: aclSetOutputTensorAddr, 3: the launch) and `failed_index` the slot;
 * earlier moves stay done and recorded. fastpath/plan.c calls the same function; build_ffi.py copies the
 * struct's declaration into cffi's.
 *
 * A step writes the wanted addresses and then launches without the GIL, so two threads stepping one
 * plan would bind each other's tensors: a step runs between aclnnpy_plan_enter and _leave, and a
 * second one meanwhile is refused. */
typedef aclnnStatus (*aclnnpy_launch_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);

struct aclnnpy_plan {
    void *launch;
    aclOpExecutor *executor;
    int n_in;
    aclTensor **in_desc;
    uintptr_t *in_want;
    uintptr_t *in_bound;
    int n_out;
    aclTensor **out_desc;
    uintptr_t *out_want;
    uintptr_t *out_bound;
    void *workspace;
    uint64_t workspace_size;
    int failed;
    int failed_index;
    int busy;  /* a step is running (aclnnpy_plan_enter) */
};

/* Start a step: 0, or 1 when another thread's step is running (the caller refuses the call). */
int aclnnpy_plan_enter(struct aclnnpy_plan *p) {
    return __atomic_exchange_n(&p->busy, 1, __ATOMIC_ACQUIRE);
}

void aclnnpy_plan_leave(struct aclnnpy_plan *p) {
    __atomic_store_n(&p->busy, 0, __ATOMIC_RELEASE);
}

aclnnStatus aclnnpy_plan_launch(struct aclnnpy_plan *p, aclrtStream stream) {
    aclnnStatus ret;
    p->failed = 0;
    p->failed_index = -1;
    for (int i = 0; i < p->n_in; ++i) {
        if (p->in_want[i] == p->in_bound[i]) continue;
        ret = aclSetInputTensorAddr(p->executor, (size_t)i, p->in_desc[i], (void *)p->in_want[i]);
        if (ret != 0) { p->failed = 1; p->failed_index = i; return ret; }
        p->in_bound[i] = p->in_want[i];
    }
    for (int i = 0; i < p->n_out; ++i) {
        if (p->out_want[i] == p->out_bound[i]) continue;
        ret = aclSetOutputTensorAddr(p->executor, (size_t)i, p->out_desc[i], (void *)p->out_want[i]);
        if (ret != 0) { p->failed = 2; p->failed_index = i; return ret; }
        p->out_bound[i] = p->out_want[i];
    }
    ret = ((aclnnpy_launch_fn)p->launch)(p->workspace, p->workspace_size, p->executor, stream);
    if (ret != 0) p->failed = 3;
    return ret;
}
