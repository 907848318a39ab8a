/*
 * aclnn-py: the bounds-checked memory and string functions CANN programs call through securec.h
 * (implemented by the mock root's libc_sec.so). Names, argument order and return codes follow CANN's
 * libc_sec; written for this project. Plain C99, usable from C++.
 *
 * Each function writes at most destMax bytes. On an error it returns a non-zero code and, where the
 * code has the _AND_RESET form, first clears the destination (the whole buffer for the mem*_s
 * functions, the first character for the str*_s functions) so that no half-copied data is left.
 */
#ifndef ACLNN_PY_SECUREC_H
#define ACLNN_PY_SECUREC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int errno_t;

#define EOK 0
#ifndef EINVAL
#define EINVAL 22
#endif
#ifndef ERANGE
#define ERANGE 34
#endif
#define EINVAL_AND_RESET (22 | 128)
#define ERANGE_AND_RESET (34 | 128)
#define EOVERLAP_AND_RESET (54 | 128)

/* the largest destMax accepted: larger values are taken for a negative size passed by mistake */
#define SECUREC_MEM_MAX_LEN 0x7fffffffUL
#define SECUREC_STRING_MAX_LEN 0x7fffffffUL

errno_t memcpy_s(void *dest, size_t destMax, const void *src, size_t count);
errno_t memmove_s(void *dest, size_t destMax, const void *src, size_t count);
errno_t memset_s(void *dest, size_t destMax, int c, size_t count);
errno_t strcpy_s(char *strDest, size_t destMax, const char *strSrc);
errno_t strncpy_s(char *strDest, size_t destMax, const char *strSrc, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* ACLNN_PY_SECUREC_H */
