/* What a new communicator's Python object asks HCCL about it, in one crossing from Python: its name,
 * rank, size and window. From Python the four calls would each let go of the GIL, and the ranks of a
 * thread world joining at the same time would hand it over among themselves at each.
 * Included by the extension's generated source after the trampolines (build_ffi.py). */

int aclnnpy_hccl_comm_info(void *comm, char *name, uint32_t *rank, uint32_t *size, uint64_t *window_address,
                           uint64_t *window_size, uint32_t *failed_step) {
    HcclComm c = (HcclComm)comm;
    void *addr = NULL;
    HcclResult rc;
    *failed_step = 0;
    if ((rc = HcclGetCommName(c, name)) != HCCL_SUCCESS) return (int)rc;
    *failed_step = 1;
    if ((rc = HcclGetRankId(c, rank)) != HCCL_SUCCESS) return (int)rc;
    *failed_step = 2;
    if ((rc = HcclGetRankSize(c, size)) != HCCL_SUCCESS) return (int)rc;
    *failed_step = 3;
    if ((rc = HcclGetHcclBuffer(c, &addr, window_size)) != HCCL_SUCCESS) return (int)rc;
    *window_address = (uint64_t)(uintptr_t)addr;
    return 0;
}
