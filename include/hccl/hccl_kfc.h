/*
 * aclnn-py: HCCL window and op-resource-context calls used to build the MoE context tensor
 * (docs/concepts.md, windows and the context tensor).
 */
#ifndef ACLNN_PY_HCCL_KFC_H
#define ACLNN_PY_HCCL_KFC_H

#include "hccl/hccl_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HCCL_COMM_ENGINE_AIV 4
#define HCCL_OP_TYPE_ALLTOALL 8

HcclResult HcclCommGetHandleWithName(const char *commName, HcclComm *comm);
HcclResult HcclGetHcclBuffer(HcclComm comm, void **addr, uint64_t *size);
HcclResult HcclGetRemoteIpcHcclBuf(HcclComm comm, uint64_t remoteRank, void **addr, uint64_t *size);
HcclResult HcclKfcAllocOpArgs(void **opArgs);
HcclResult HcclKfcFreeOpArgs(void *opArgs);
HcclResult HcclKfcOpArgsSetCommEngine(void *opArgs, uint8_t commEngine);
HcclResult HcclKfcOpArgsSetAlgConfig(void *opArgs, char *algConfig);
HcclResult HcclCreateOpResCtx(HcclComm comm, uint8_t opType, void *opArgs, void **opResCtx);

#ifdef __cplusplus
}
#endif

#endif
