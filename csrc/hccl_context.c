/* The MoE context of a communicator in one crossing from Python: CANN's KFC sequence, then every
 * peer's window address. HCCL hands the addresses out one peer at a time (HcclGetRemoteIpcHcclBuf):
 * W calls from Python per rank would cost W**2 interpreter round trips to form a thread world of W
 * ranks, and each of the sequence's ten calls from Python a hand-over of the GIL between its ranks.
 * Included by the extension's generated source after the trampolines (build_ffi.py). */

#include <string.h>

/* The context struct (16 + 8 * nranks bytes of it) into `ctx` and the window size into
 * *ccl_buffer_size; 0, or the status of the call that failed with *failed_call its name. info[1],
 * info[2]: the rank id and size the communicator found by `name` reports; one of another rank or size
 * is refused (HCCL_E_INTERNAL, info[0] = 1, named after HcclCommGetHandleWithName). */
int aclnnpy_hccl_context(const char *name, uint32_t comm_engine, uint32_t op_type, const char *alg_config,
                         uint32_t rank, uint32_t nranks, uint32_t rank_size_per_server, uint8_t *ctx,
                         uint64_t *ccl_buffer_size, uint32_t *info, const char **failed_call) {
    void *op_args = NULL;
    HcclComm comm = NULL;
    void *res_ctx = NULL;
    HcclResult rc;
    info[0] = 0;
    *failed_call = "HcclKfcAllocOpArgs";
    if ((rc = HcclKfcAllocOpArgs(&op_args)) != HCCL_SUCCESS) return (int)rc;
    *failed_call = "HcclKfcOpArgsSetCommEngine";
    if ((rc = HcclKfcOpArgsSetCommEngine(op_args, (uint8_t)comm_engine)) != HCCL_SUCCESS) goto free_args;
    *failed_call = "HcclKfcOpArgsSetAlgConfig";
    if ((rc = HcclKfcOpArgsSetAlgConfig(op_args, (char *)alg_config)) != HCCL_SUCCESS) goto free_args;
    *failed_call = "HcclCommGetHandleWithName";
    if ((rc = HcclCommGetHandleWithName(name, &comm)) != HCCL_SUCCESS) goto free_args;
    *failed_call = "HcclCreateOpResCtx";
    if ((rc = HcclCreateOpResCtx(comm, (uint8_t)op_type, op_args, &res_ctx)) != HCCL_SUCCESS) goto free_args;
    *failed_call = "HcclGetRankId";
    if ((rc = HcclGetRankId(comm, &info[1])) != HCCL_SUCCESS) goto free_args;
    *failed_call = "HcclGetRankSize";
    if ((rc = HcclGetRankSize(comm, &info[2])) != HCCL_SUCCESS) goto free_args;
    if (info[1] != rank || info[2] != nranks) {
        *failed_call = "HcclCommGetHandleWithName";
        info[0] = 1;
        rc = HCCL_E_INTERNAL;
        goto free_args;
    }
    *failed_call = "HcclKfcFreeOpArgs";
    if ((rc = HcclKfcFreeOpArgs(op_args)) != HCCL_SUCCESS) return (int)rc;

    const uint64_t kfc_context_addr = (uint64_t)(uintptr_t)res_ctx;   /* the head: epRankId, rankSizePerServer, it */
    memcpy(ctx, &rank, 4);
    memcpy(ctx + 4, &rank_size_per_server, 4);
    memcpy(ctx + 8, &kfc_context_addr, 8);
    for (uint32_t r = 0; r < nranks; ++r) {
        void *addr = NULL;
        uint64_t size = 0;
        *failed_call = r == rank ? "HcclGetHcclBuffer" : "HcclGetRemoteIpcHcclBuf";
        rc = r == rank ? HcclGetHcclBuffer(comm, &addr, ccl_buffer_size) : HcclGetRemoteIpcHcclBuf(comm, r, &addr, &size);
        if (rc != HCCL_SUCCESS) return (int)rc;
        uint64_t word = (uint64_t)(uintptr_t)addr;
        memcpy(ctx + 16 + 8 * (size_t)r, &word, sizeof word);
    }
    return 0;

free_args:
    HcclKfcFreeOpArgs(op_args);
    return (int)rc;
}
