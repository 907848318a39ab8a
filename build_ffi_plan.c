/* Phase 2 of a plan (a repeatable executor): move the slots whose wanted address differs from the
 * bound one, then launch — one call from Python where a C programmer's loop makes one per slot plus
 * the launch, so a plan step costs one crossing of the Python/C boundary whatever it rebinds.
 *
 * in_want/out_want hold the addresses this step needs (0: the slot is absent); in_bound/out_bound
 * the addresses the executor holds now, updated as each move succeeds. On failure *failed tells
 * which call failed (1: aclSetInputTensorAddr, 2: aclSetOutputTensorAddr, 3: the launch) and
 * *failed_index the slot; earlier moves stay done and recorded. */
typedef aclnnStatus (*aclnnpy_launch_fn)(void *, uint64_t, aclOpExecutor *, aclrtStream);

aclnnStatus aclnnpy_plan_launch(void *launch, aclOpExecutor *executor, int n_in, aclTensor **in_desc,
                                const uintptr_t *in_want, uintptr_t *in_bound, int n_out, aclTensor **out_desc,
                                const uintptr_t *out_want, uintptr_t *out_bound, void *workspace,
                                uint64_t workspace_size, aclrtStream stream, int *failed, int *failed_index) {
    aclnnStatus ret;
    *failed = 0;
    *failed_index = -1;
    for (int i = 0; i < n_in; ++i) {
        if (in_want[i] == in_bound[i]) continue;
        ret = aclSetInputTensorAddr(executor, (size_t)i, in_desc[i], (void *)in_want[i]);
        if (ret != 0) { *failed = 1; *failed_index = i; return ret; }
        in_bound[i] = in_want[i];
    }
    for (int i = 0; i < n_out; ++i) {
        if (out_want[i] == out_bound[i]) continue;
        ret = aclSetOutputTensorAddr(executor, (size_t)i, out_desc[i], (void *)out_want[i]);
        if (ret != 0) { *failed = 2; *failed_index = i; return ret; }
        out_bound[i] = out_want[i];
    }
    ret = ((aclnnpy_launch_fn)launch)(workspace, workspace_size, executor, stream);
    if (ret != 0) *failed = 3;
    return ret;
}
