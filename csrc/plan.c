/* Phase 2 of a plan (a repeatable executor), declared in csrc/aclnnpy.h: move the slots whose wanted
 * address differs from the bound one, then launch — one call from Python where a C programmer's loop
 * makes one per slot plus the launch, so a plan step costs one crossing of the Python/C boundary
 * whatever it rebinds. On failure the earlier moves stay done and recorded.
 *
 * A step writes the wanted addresses and then launches without the GIL, so two threads stepping one
 * plan would bind each other's tensors: a step runs between aclnnpy_plan_enter and _leave, and a
 * second one meanwhile is refused. */
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
    ret = ((aclnnpy_phase2_fn)p->launch)(p->workspace, p->workspace_size, p->executor, stream);
    if (ret != 0) p->failed = 3;
    return ret;
}
