/* Every peer's window address for a context in one crossing from Python. HCCL hands the addresses
 * out one peer at a time (HcclGetRemoteIpcHcclBuf); W calls from Python per rank would cost W**2
 * interpreter round trips, and GIL hand-overs between the ranks of a thread world, to form it.
 * Included by the extension's generated source after the trampolines (build_ffi.py). */

int aclnnpy_hccl_windows(void *comm, uint32_t rank, uint32_t nranks, uint64_t *addrs, uint32_t *failed_rank) {
    for (uint32_t r = 0; r < nranks; ++r) {
        if (r == rank) continue;
        void *addr = NULL;
        uint64_t size = 0;
        HcclResult rc = HcclGetRemoteIpcHcclBuf((HcclComm)comm, r, &addr, &size);
        if (rc != HCCL_SUCCESS) {
            *failed_rank = r;
            return (int)rc;
        }
        addrs[r] = (uint64_t)(uintptr_t)addr;
    }
    return 0;
}
