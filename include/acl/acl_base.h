/*
 * aclnn-py: base types, enums and status codes of the ACL runtime (subset of CANN's acl_base.h /
 * acl_base_rt.h). Names and values follow CANN (see ../shared/ABI.md §1, §2); written for this project.
 * Plain C99, usable from C++.
 */
#ifndef ACLNN_PY_ACL_BASE_H
#define ACLNN_PY_ACL_BASE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int aclError;
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void *aclrtContext;

/* aclError, ACL level */
#define ACL_SUCCESS 0
#define ACL_ERROR_NONE 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_REPEAT_FINALIZE 100037
#define ACL_ERROR_BAD_ALLOC 200000
#define ACL_ERROR_API_NOT_SUPPORT 200001
#define ACL_ERROR_INVALID_DEVICE 200002
#define ACL_ERROR_MEMORY_ADDRESS_UNALIGNED 200003
#define ACL_ERROR_RESOURCE_NOT_MATCH 200004
#define ACL_ERROR_INVALID_RESOURCE_HANDLE 200005
#define ACL_ERROR_FEATURE_UNSUPPORTED 200006
#define ACL_ERROR_STORAGE_OVER_LIMIT 300000
#define ACL_ERROR_INTERNAL_ERROR 500000
#define ACL_ERROR_FAILURE 500001
#define ACL_ERROR_RT_FAILURE 500003

/* runtime codes (CANN: error_codes/rt_error_codes.h) */
#define ACL_RT_SUCCESS 0
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_STREAM_CONTEXT 107003
#define ACL_ERROR_RT_ADDR_UNALIGNED 107008
#define ACL_ERROR_RT_INVALID_MEMORY_TYPE 107016
#define ACL_ERROR_RT_INVALID_HANDLE 107017
#define ACL_ERROR_RT_WAIT_TIMEOUT 107019
#define ACL_ERROR_RT_TASK_TIMEOUT 107020
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_ERROR_RT_MEMORY_FREE 207002
#define ACL_ERROR_RT_NO_DEVICE 207004
#define ACL_ERROR_RT_TIMEOUT 207020
#define ACL_ERROR_RT_INTERNAL_ERROR 507000
#define ACL_ERROR_RT_STREAM_NOT_COMPLETE 507004
#define ACL_ERROR_RT_EVENT_NOT_COMPLETE 507006
#define ACL_ERROR_RT_AICORE_TIMEOUT 507014
#define ACL_ERROR_RT_AICORE_EXCEPTION 507015
#define ACL_ERROR_RT_STREAM_SYNC_TIMEOUT 507046
#define ACL_ERROR_RT_EVENT_SYNC_TIMEOUT 507047

typedef enum {
    ACL_DT_UNDEFINED = -1,
    ACL_FLOAT = 0,
    ACL_FLOAT16 = 1,
    ACL_INT8 = 2,
    ACL_INT32 = 3,
    ACL_UINT8 = 4,
    ACL_INT16 = 6,
    ACL_UINT16 = 7,
    ACL_UINT32 = 8,
    ACL_INT64 = 9,
    ACL_UINT64 = 10,
    ACL_DOUBLE = 11,
    ACL_BOOL = 12,
    ACL_STRING = 13,
    ACL_COMPLEX64 = 16,
    ACL_COMPLEX128 = 17,
    ACL_BF16 = 27,
    ACL_INT4 = 29,
    ACL_UINT1 = 30,
    ACL_COMPLEX32 = 33,
    ACL_HIFLOAT8 = 34,
    ACL_FLOAT8_E5M2 = 35,
    ACL_FLOAT8_E4M3FN = 36,
    ACL_FLOAT8_E8M0 = 37,
    ACL_FLOAT6_E3M2 = 38,
    ACL_FLOAT6_E2M3 = 39,
    ACL_FLOAT4_E2M1 = 40,
    ACL_FLOAT4_E1M2 = 41
} aclDataType;

typedef enum {
    ACL_FORMAT_UNDEFINED = -1,
    ACL_FORMAT_NCHW = 0,
    ACL_FORMAT_NHWC = 1,
    ACL_FORMAT_ND = 2,
    ACL_FORMAT_NC1HWC0 = 3,
    ACL_FORMAT_FRACTAL_Z = 4,
    ACL_FORMAT_NC1HWC0_C04 = 12,
    ACL_FORMAT_HWCN = 16,
    ACL_FORMAT_NDHWC = 27,
    ACL_FORMAT_FRACTAL_NZ = 29,
    ACL_FORMAT_NCDHW = 30,
    ACL_FORMAT_NDC1HWC0 = 32,
    ACL_FRACTAL_Z_3D = 33,
    ACL_FORMAT_NC = 35,
    ACL_FORMAT_NCL = 47,
    ACL_FORMAT_FRACTAL_NZ_C0_16 = 50,
    ACL_FORMAT_FRACTAL_NZ_C0_32 = 51,
    ACL_FORMAT_FRACTAL_NZ_C0_2 = 52,
    ACL_FORMAT_FRACTAL_NZ_C0_4 = 53,
    ACL_FORMAT_FRACTAL_NZ_C0_8 = 54
} aclFormat;

/* Number of bytes of one element; 0 for undefined and packed sub-byte types is CANN's answer for
 * types smaller than a byte (callers size those by hand). */
size_t aclDataTypeSize(aclDataType dataType);

#ifdef __cplusplus
}
#endif

#endif
