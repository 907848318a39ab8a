/*
 * aclnn-py: HCCL types and result codes (subset of CANN's hccl_types.h).
 */
#ifndef ACLNN_PY_HCCL_TYPES_H
#define ACLNN_PY_HCCL_TYPES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *HcclComm;

typedef enum {
    HCCL_SUCCESS = 0,
    HCCL_E_PARA = 1,
    HCCL_E_PTR = 2,
    HCCL_E_MEMORY = 3,
    HCCL_E_INTERNAL = 4,
    HCCL_E_NOT_SUPPORT = 5,
    HCCL_E_NOT_FOUND = 6,
    HCCL_E_UNAVAIL = 7,
    HCCL_E_SYSCALL = 8,
    HCCL_E_TIMEOUT = 9,
    HCCL_E_OPEN_FILE_FAILURE = 10,
    HCCL_E_TCP_CONNECT = 11,
    HCCL_E_ROCE_CONNECT = 12,
    HCCL_E_TCP_TRANSFER = 13,
    HCCL_E_ROCE_TRANSFER = 14,
    HCCL_E_RUNTIME = 15,
    HCCL_E_DRV = 16,
    HCCL_E_PROFILING = 17,
    HCCL_E_CCE = 18,
    HCCL_E_NETWORK = 19,
    HCCL_E_AGAIN = 20,
    HCCL_E_REMOTE = 21,
    HCCL_E_SUSPENDING = 22,
    HCCL_E_OPRETRY_FAIL = 23,
    HCCL_E_OOM = 24,
    HCCL_E_IN_STATUS = 1041,
    HCCL_E_RESERVED = 1042
} HcclResult;

/* CANN declares this as `const uint32_t HCCL_ROOT_INFO_BYTES = 4108;` (C++ only). */
#define HCCL_ROOT_INFO_BYTES 4108
#define COMM_NAME_MAX_LENGTH 128

typedef struct HcclRootInfoDef {
    char internal[4108];
} HcclRootInfo;

#ifdef __cplusplus
}
#endif

#endif
