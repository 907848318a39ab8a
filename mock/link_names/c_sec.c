/* libc_sec.so of the mock root: the functions of securec.h. */
#include <stdint.h>
#include <string.h>

#include "securec.h"

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + nb && pb < pa + na;
}

/* The checks memcpy_s and memmove_s share: EOK when the copy may go ahead, else the error, with the
 * destination cleared where securec clears it. */
static errno_t check_copy(void *dest, size_t destMax, const void *src, size_t count) {
    if (destMax == 0 || destMax > SECUREC_MEM_MAX_LEN) return ERANGE;
    if (dest == NULL) return EINVAL;
    if (count > destMax) {
        memset(dest, 0, destMax);
        return ERANGE_AND_RESET;
    }
    if (src == NULL) {
        memset(dest, 0, destMax);
        return EINVAL_AND_RESET;
    }
    return EOK;
}

errno_t memcpy_s(void *dest, size_t destMax, const void *src, size_t count) {
    errno_t rc = check_copy(dest, destMax, src, count);
    if (rc != EOK || count == 0 || dest == src) return rc;
    if (overlaps(dest, count, src, count)) {
        memset(dest, 0, destMax);
        return EOVERLAP_AND_RESET;
    }
    memcpy(dest, src, count);
    return EOK;
}

errno_t memmove_s(void *dest, size_t destMax, const void *src, size_t count) {
    errno_t rc = check_copy(dest, destMax, src, count);
    if (rc == EOK && count != 0 && dest != src) memmove(dest, src, count);
    return rc;
}

errno_t memset_s(void *dest, size_t destMax, int c, size_t count) {
    if (destMax == 0 || destMax > SECUREC_MEM_MAX_LEN) return ERANGE;
    if (dest == NULL) return EINVAL;
    if (count > destMax) {
        memset(dest, c, destMax);
        return ERANGE_AND_RESET;
    }
    memset(dest, c, count);
    return EOK;
}

static errno_t copy_string(char *strDest, size_t destMax, const char *strSrc, size_t limit) {
    if (destMax == 0 || destMax > SECUREC_STRING_MAX_LEN) return ERANGE;
    if (strDest == NULL) return EINVAL;
    if (strSrc == NULL) {
        strDest[0] = '\0';
        return EINVAL_AND_RESET;
    }
    size_t n = 0;
    while (n < limit && strSrc[n] != '\0') ++n;
    if (n >= destMax) {  /* no room for the terminator */
        strDest[0] = '\0';
        return ERANGE_AND_RESET;
    }
    if (strDest == strSrc) return EOK;
    if (overlaps(strDest, n + 1, strSrc, n + 1)) {
        strDest[0] = '\0';
        return EOVERLAP_AND_RESET;
    }
    memcpy(strDest, strSrc, n);
    strDest[n] = '\0';
    return EOK;
}

errno_t strcpy_s(char *strDest, size_t destMax, const char *strSrc) {
    return copy_string(strDest, destMax, strSrc, (size_t)-1);
}

errno_t strncpy_s(char *strDest, size_t destMax, const char *strSrc, size_t count) {
    return copy_string(strDest, destMax, strSrc, count);
}
