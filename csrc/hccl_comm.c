/* What a new communicator's Python object asks HCCL about it, in one crossing from Python: its name,
 * rank, size and window. From Python the four calls would each let go of the GIL, and the ranks of a
 * thread world joining at the same time would hand it over among themselves at each.
 * Included by the extension's generated source after the trampolines (build_ffi.py). */

int aclnnpy_hccl_comm_info(void *comm, char *name, uint32_t *rank, uint32_t *size, uint64_t *window_address,
                           uint64_t *window_size, const char **failed_call) {
    HcclComm c = (HcclComm)comm;
    void *addr = NULL;
    HcclResult rc;
    if ((rc = HcclGetCommName(c, name)) != HCCL_SUCCESS) *failed_call = "HcclGetCommName";
    else if ((rc = HcclGetRankId(c, rank)) != HCCL_SUCCESS) *failed_call = "HcclGetRankId";
    else if ((rc = HcclGetRankSize(c, size)) != HCCL_SUCCESS) *failed_call = "HcclGetRankSize";
    else if ((rc = HcclGetHcclBuffer(c, &addr, window_size)) != HCCL_SUCCESS) *failed_call = "HcclGetHcclBuffer";
    *window_address = (uint64_t)(uintptr_t)addr;
    return (int)rc;
}
