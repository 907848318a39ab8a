/*
 * aclnn-py: HCCL communicator management (subset of CANN's hccl_comm.h / hccl.h).
 * On CANN >= 8.5 these live in libhcomm.so, before that in libhccl.so.
 */
#ifndef ACLNN_PY_HCCL_COMM_H
#define ACLNN_PY_HCCL_COMM_H

#include "acl/acl_base.h"
#include "hccl/hccl_types.h"

#ifdef __cplusplus
extern "C" {
#endif

HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm);
HcclResult HcclCommDestroy(HcclComm comm);
HcclResult HcclGetCommName(HcclComm comm, char *commName);
HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);
HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError);
const char *HcclGetErrorString(HcclResult code);
HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
