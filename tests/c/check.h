/* Minimal check helpers shared by the C tests of the fake CANN root (plain C99). */
#ifndef ACLNN_PY_TESTS_CHECK_H
#define ACLNN_PY_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int g_passed = 0;
static int g_failed = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            ++g_passed;                                                               \
        } else {                                                                      \
            ++g_failed;                                                               \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
        }                                                                             \
    } while (0)

#define CHECK_EQ(a, b)                                                                \
    do {                                                                              \
        long long va_ = (long long)(a), vb_ = (long long)(b);                         \
        if (va_ == vb_) {                                                             \
            ++g_passed;                                                               \
        } else {                                                                      \
            ++g_failed;                                                               \
            fprintf(stderr, "FAIL %s:%d: %s == %s (%lld != %lld)\n", __FILE__,        \
                    __LINE__, #a, #b, va_, vb_);                                      \
        }                                                                             \
    } while (0)

/* The call must return `code`, leave a message containing every non-NULL fragment, and reading
 * the message must clear it. */
static void check_error_impl(const char *file, int line, const char *expr, long long rc,
                             long long code, const char *frag1, const char *frag2,
                             const char *(*get_msg)(void)) {
    const char *msg;
    int ok = 1;
    if (rc != code) {
        fprintf(stderr, "FAIL %s:%d: %s returned %lld, expected %lld\n", file, line, expr, rc, code);
        ok = 0;
    }
    msg = get_msg();
    if (!msg) {
        fprintf(stderr, "FAIL %s:%d: %s left no error message\n", file, line, expr);
        ok = 0;
    } else {
        if (frag1 && !strstr(msg, frag1)) {
            fprintf(stderr, "FAIL %s:%d: message of %s lacks '%s': %s\n", file, line, expr, frag1, msg);
            ok = 0;
        }
        if (frag2 && !strstr(msg, frag2)) {
            fprintf(stderr, "FAIL %s:%d: message of %s lacks '%s': %s\n", file, line, expr, frag2, msg);
            ok = 0;
        }
        if (get_msg() != NULL) {
            fprintf(stderr, "FAIL %s:%d: message of %s was not cleared by reading it\n", file, line, expr);
            ok = 0;
        }
    }
    if (ok)
        ++g_passed;
    else
        ++g_failed;
}

#define CHECK_ERR(call, code, frag1, frag2) \
    check_error_impl(__FILE__, __LINE__, #call, (long long)(call), (long long)(code), frag1, frag2, aclGetRecentErrMsg)

static int report(void) {
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}

#endif
