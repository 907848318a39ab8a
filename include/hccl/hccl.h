/*
 * aclnn-py: the HCCL API header CANN programs include (CANN's hccl/hccl.h): result codes and types,
 * communicator creation (root info, all devices of one process, rank table) and queries such as
 * HcclGetCommName, whose prototypes live in hccl_comm.h.
 */
#ifndef ACLNN_PY_HCCL_H
#define ACLNN_PY_HCCL_H

#include "acl/acl.h"
#include "hccl/hccl_types.h"
#include "hccl/hccl_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One communicator per device of this process, called from one thread: comms[i] is rank i, on
 * devices[i]. The ranks are then driven by one thread per device. */
HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms);

/* The communicator of `rank` in the world a rank table file (JSON) describes. */
HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm);

#ifdef __cplusplus
}
#endif

#endif
