/* Both phases of an operator in one call from Python (the per-call path): phase 1, then — when the
 * stream's current workspace block (its address `workspace`, workspace_cap bytes) is large enough — phase 2 on
 * `stream`. The tensors come as one array in the C prototype's order (inputs, then outputs) and the
 * integer attributes as one array (those before commAlg, then those after), so a call crosses the
 * Python/C boundary once with a handful of arguments instead of twice with thirty-odd.
 *
 * With `launch` 0 only phase 1 runs (the two-phase prepare path): one home for the prototype's
 * argument order. *launched is 1 when phase 2 ran (its status is returned), 0 when phase 1 failed
 * (its status is returned), when `launch` is 0, or when the workspace must grow first: then *executor
 * is phase 1's executor, still to be launched by the caller with *workspace_size bytes. */

aclnnStatus aclnnpy_dispatch_v5_run(aclTensor **t, const int64_t *a, const char *commAlg, uintptr_t workspace,
                                    uint64_t workspace_cap, aclrtStream stream, uint64_t *workspace_size,
                                    aclOpExecutor **executor, int launch, int *launched) {
    *launched = 0;
    aclnnStatus ret = aclnnMoeDistributeDispatchV5GetWorkspaceSize(
        t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
        a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], commAlg, a[12], a[13], a[14],
        t[8], t[9], t[10], t[11], t[12], t[13], t[14], workspace_size, executor);
    if (ret != 0 || !launch || *workspace_size > workspace_cap) return ret;
    *launched = 1;
    return aclnnMoeDistributeDispatchV5(*workspace_size ? (void *)workspace : NULL, *workspace_size, *executor, stream);
}

aclnnStatus aclnnpy_combine_v5_run(aclTensor **t, const int64_t *a, const char *commAlg, uintptr_t workspace,
                                   uint64_t workspace_cap, aclrtStream stream, uint64_t *workspace_size,
                                   aclOpExecutor **executor, int launch, int *launched) {
    *launched = 0;
    aclnnStatus ret = aclnnMoeDistributeCombineV5GetWorkspaceSize(
        t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12], t[13], t[14], t[15],
        t[16], t[17], t[18],
        a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], commAlg, a[13], a[14],
        a[15], t[19], workspace_size, executor);
    if (ret != 0 || !launch || *workspace_size > workspace_cap) return ret;
    *launched = 1;
    return aclnnMoeDistributeCombineV5(*workspace_size ? (void *)workspace : NULL, *workspace_size, *executor, stream);
}
