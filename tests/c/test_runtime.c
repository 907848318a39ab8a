/*
 * A plain C99 consumer of the fake CANN root: built against MOCK_ROOT/include, linked to
 * MOCK_ROOT/lib64/libascendcl.so and libnnopbase.so only. Exercises init, error messages, devices,
 * memory, streams, events and tensor descriptors; prints "N passed, M failed".
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl_rt.h"
#include "aclnn/aclnn_base.h"
#include "check.h"

#define BIG (64u << 20) /* bytes per big copy: takes the worker a while */

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return (v && *v) ? atoi(v) : dflt;
}

static size_t align32_plus32(size_t n) { return (n + 31) / 32 * 32 + 32; }

/* ---------------------------------------------------------------- init and error messages */

static void *thread_reads_msg(void *arg) {
    *(const char **)arg = aclGetRecentErrMsg();
    return NULL;
}

static void test_init_and_errors(void) {
    const char *m1;
    char copy[256];
    pthread_t th;
    const char *other = (const char *)1;

    CHECK(aclGetRecentErrMsg() == NULL);
    CHECK_EQ(aclInit(NULL), ACL_SUCCESS);
    CHECK_ERR(aclInit(NULL), ACL_ERROR_REPEAT_INITIALIZE, "aclInit", NULL);
    CHECK_ERR(aclInit(""), ACL_ERROR_REPEAT_INITIALIZE, "aclInit", "3");
    CHECK_EQ(aclFinalize(), ACL_SUCCESS);
    CHECK_ERR(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE, "aclFinalize", NULL);
    CHECK_EQ(aclInit(NULL), ACL_SUCCESS);

    CHECK_EQ(aclnnInit(NULL), ACLNN_SUCCESS);
    CHECK_EQ(aclnnInit(NULL), ACLNN_SUCCESS);

    /* the message is per thread, cleared on read, and the pointer stays valid until the next read */
    CHECK_EQ(aclrtMalloc(NULL, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
    pthread_create(&th, NULL, thread_reads_msg, &other);
    pthread_join(th, NULL);
    CHECK(other == NULL);
    m1 = aclGetRecentErrMsg();
    CHECK(m1 != NULL);
    if (m1) {
        strncpy(copy, m1, sizeof copy - 1);
        copy[sizeof copy - 1] = 0;
        CHECK(strstr(m1, "aclrtMalloc") != NULL);
        CHECK(strstr(m1, "devPtr") != NULL);
        CHECK(strcmp(m1, copy) == 0);
    }
    CHECK(aclGetRecentErrMsg() == NULL);
    /* a later message replaces an unread one */
    CHECK_EQ(aclrtGetDeviceCount(NULL), ACL_ERROR_INVALID_PARAM);
    CHECK_ERR(aclrtGetDevice(NULL), ACL_ERROR_INVALID_PARAM, "aclrtGetDevice:", "deviceId");
}

/* ---------------------------------------------------------------- devices */

static void *thread_get_device(void *arg) {
    int32_t d = -5;
    void *p = NULL;
    int *rc = (int *)arg;
    rc[0] = aclrtGetDevice(&d);
    rc[1] = aclrtSynchronizeStream(NULL);
    rc[2] = aclrtMalloc(&p, 8, ACL_MEM_MALLOC_HUGE_FIRST); /* no device: fails */
    (void)aclGetRecentErrMsg();
    return NULL;
}

static void test_devices(void) {
    int32_t dev = -1, major = 0, minor = 0, patch = 0;
    uint32_t count = 0;
    int expect_count = env_int("ACLNN_MOCK_DEVICE_COUNT", 16);
    const char *soc_env = getenv("ACLNN_MOCK_SOC");
    const char *soc;
    int rcs[3] = {0, 0, 0};
    pthread_t th;

    CHECK_ERR(aclrtGetDevice(&dev), ACL_ERROR_RT_CONTEXT_NULL, "aclrtGetDevice", "aclrtSetDevice");
    CHECK_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);
    CHECK_EQ(count, expect_count);
    CHECK_ERR(aclrtSetDevice(-1), ACL_ERROR_RT_INVALID_DEVICEID, "deviceId", "-1");
    CHECK_ERR(aclrtSetDevice((int32_t)count), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice", "deviceId");
    CHECK_ERR(aclrtResetDevice(-3), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtResetDevice", "-3");

    CHECK_EQ(aclrtSetDevice(1), ACL_SUCCESS);
    CHECK_EQ(aclrtGetDevice(&dev), ACL_SUCCESS);
    CHECK_EQ(dev, 1);
    CHECK_EQ(aclrtSetDevice(0), ACL_SUCCESS);
    CHECK_EQ(aclrtGetDevice(&dev), ACL_SUCCESS);
    CHECK_EQ(dev, 0);
    CHECK_EQ(aclrtResetDevice(1), ACL_SUCCESS);
    CHECK_ERR(aclrtResetDevice(1), ACL_ERROR_RT_CONTEXT_NULL, "aclrtResetDevice", "device 1");
    /* reference counted: set twice, reset once, still current */
    CHECK_EQ(aclrtSetDevice(0), ACL_SUCCESS);
    CHECK_EQ(aclrtResetDevice(0), ACL_SUCCESS);
    CHECK_EQ(aclrtGetDevice(&dev), ACL_SUCCESS);
    CHECK_EQ(dev, 0);

    /* the current device is per thread */
    pthread_create(&th, NULL, thread_get_device, rcs);
    pthread_join(th, NULL);
    CHECK_EQ(rcs[0], ACL_ERROR_RT_CONTEXT_NULL);
    CHECK_EQ(rcs[1], ACL_ERROR_RT_CONTEXT_NULL);
    CHECK_EQ(rcs[2], ACL_ERROR_RT_CONTEXT_NULL);

    soc = aclrtGetSocName();
    CHECK(soc != NULL);
    if (soc) {
        if (soc_env && (strcmp(soc_env, "Ascend950") == 0))
            CHECK(strcmp(soc, "Ascend950") == 0);
        else if (!soc_env || !*soc_env)
            CHECK(strcmp(soc, "Ascend910_93") == 0);
    }
    CHECK_EQ(aclrtGetVersion(&major, &minor, &patch), ACL_SUCCESS);
    CHECK(major > 0);
    CHECK_ERR(aclrtGetVersion(&major, NULL, &patch), ACL_ERROR_INVALID_PARAM, "aclrtGetVersion", "minorVersion");
}

/* ---------------------------------------------------------------- memory */

static void test_memory(void) {
    void *d = NULL, *d2 = NULL, *h = NULL;
    size_t sizes[4] = {1, 33, 1000, 4096};
    size_t i, j, fr0 = 0, tot0 = 0, fr1 = 0, tot1 = 0;
    int poison = env_int("ACLNN_MOCK_POISON", 1) != 0;
    unsigned char host[256], back[256];
    int x = 0;

    CHECK_ERR(aclrtMalloc(&d, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM, "size must be > 0", "got 0");
    CHECK_ERR(aclrtMalloc(&d, 16, (aclrtMemMallocPolicy)99), ACL_ERROR_INVALID_PARAM, "policy", "99");
    CHECK_ERR(aclrtMallocHost(&h, 0), ACL_ERROR_INVALID_PARAM, "aclrtMallocHost", "size");

    CHECK_EQ(aclrtGetMemInfo(ACL_HBM_MEM, &fr0, &tot0), ACL_SUCCESS);
    CHECK(tot0 == ((size_t)64 << 30));
    for (i = 0; i < 4; ++i) {
        void *p = NULL;
        size_t bad = 0;
        CHECK_EQ(aclrtMalloc(&p, sizes[i], ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
        CHECK(p != NULL && ((uintptr_t)p % 64) == 0);
        if (!p) continue;
        if (poison) {
            for (j = 0; j < align32_plus32(sizes[i]); ++j)
                if (((unsigned char *)p)[j] != 0xA5) ++bad;
            CHECK_EQ(bad, 0);
        }
        /* the whole padded block is addressable, one byte more is not */
        CHECK_EQ(aclrtMemset(p, align32_plus32(sizes[i]), 0, align32_plus32(sizes[i])), ACL_SUCCESS);
        CHECK_ERR(aclrtMemset(p, align32_plus32(sizes[i]) + 1, 0, align32_plus32(sizes[i]) + 1),
                  ACL_ERROR_INVALID_PARAM, "aclrtMemset", "past the end");
        if (i == 2) {
            CHECK_EQ(aclrtGetMemInfo(ACL_HBM_MEM, &fr1, &tot1), ACL_SUCCESS);
            CHECK(tot1 == tot0);
            CHECK(fr0 - fr1 == align32_plus32(1000)); /* the earlier ones were freed already */
        }
        CHECK_EQ(aclrtFree(p), ACL_SUCCESS);
        CHECK_ERR(aclrtFree(p), ACL_ERROR_RT_MEMORY_FREE, "aclrtFree", "not a live allocation");
    }
    CHECK_EQ(aclrtGetMemInfo(ACL_HBM_MEM, &fr1, &tot1), ACL_SUCCESS);
    CHECK(fr1 == fr0);
    CHECK_ERR(aclrtGetMemInfo(ACL_HBM_MEM, NULL, &tot1), ACL_ERROR_INVALID_PARAM, "aclrtGetMemInfo", "free");

    CHECK_ERR(aclrtFree(NULL), ACL_ERROR_INVALID_PARAM, "aclrtFree", "devPtr");
    CHECK_ERR(aclrtFree(&x), ACL_ERROR_RT_MEMORY_FREE, "aclrtFree", "not a live allocation");
    CHECK_EQ(aclrtMalloc(&d, 256, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ(aclrtMalloc(&d2, 256, ACL_MEM_MALLOC_NORMAL_ONLY), ACL_SUCCESS);
    CHECK_ERR(aclrtFree((char *)d + 64), ACL_ERROR_RT_MEMORY_FREE, "aclrtFree", "into the block");
    CHECK_EQ(aclrtMallocHost(&h, 256), ACL_SUCCESS);
    CHECK_ERR(aclrtFree(h), ACL_ERROR_RT_MEMORY_FREE, "pinned host memory", "aclrtFreeHost");
    CHECK_ERR(aclrtFreeHost(d), ACL_ERROR_RT_MEMORY_FREE, "aclrtFreeHost", "aclrtFree");

    for (i = 0; i < sizeof host; ++i) host[i] = (unsigned char)i;
    /* round trip */
    CHECK_EQ(aclrtMemcpy(d, 256, host, 256, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    CHECK_EQ(aclrtMemcpy(d2, 256, d, 256, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
    memset(back, 0, sizeof back);
    CHECK_EQ(aclrtMemcpy(back, 256, d2, 256, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    CHECK(memcmp(back, host, 256) == 0);
    memset(back, 0, sizeof back);
    CHECK_EQ(aclrtMemcpy(back, 256, d2, 256, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
    CHECK(memcmp(back, host, 256) == 0);
    CHECK_EQ(aclrtMemcpy(h, 256, host, 256, ACL_MEMCPY_HOST_TO_HOST), ACL_SUCCESS);
    CHECK_EQ(aclrtMemcpy(back, 256, host, 0, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS); /* count 0 */

    /* destMax, kinds, ranges */
    CHECK_ERR(aclrtMemcpy(d, 100, host, 200, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM, "destMax", "200");
    CHECK_ERR(aclrtMemcpy(back, 256, host, 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM, "dst", "not device memory");
    CHECK_ERR(aclrtMemcpy(back, 256, host, 16, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM, "src", "not device memory");
    CHECK_ERR(aclrtMemcpy(d, 256, h, 16, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_INVALID_PARAM, "src", "pinned host memory");
    CHECK_ERR(aclrtMemcpy(d, 4096, host, 256 + 64 + 1, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM, "dst", "past the end");
    CHECK_ERR(aclrtMemcpy((char *)d + 200, 4096, d2, 200, ACL_MEMCPY_DEFAULT), ACL_ERROR_INVALID_PARAM, "dst", "past the end");
    CHECK_ERR(aclrtMemcpy(back, 4096, (char *)d2 + 100, 300, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM, "src", "past the end");
    /* even HOST_TO_HOST refuses a range running out of a registered block */
    CHECK_ERR(aclrtMemcpy(back, 4096, (char *)h + 200, 200, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_INVALID_PARAM, "src", "past the end");
    CHECK_ERR(aclrtMemcpy(d, 256, host, 16, (aclrtMemcpyKind)9), ACL_ERROR_INVALID_PARAM, "kind", "9");
    CHECK_ERR(aclrtMemcpy(NULL, 256, host, 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "dst");
    CHECK_ERR(aclrtMemcpy(d, 256, NULL, 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "src");

    /* memset */
    CHECK_EQ(aclrtMemset(d, 256, 0x3c, 128), ACL_SUCCESS);
    CHECK(((unsigned char *)d)[0] == 0x3c && ((unsigned char *)d)[127] == 0x3c);
    CHECK_ERR(aclrtMemset(d, 64, 0, 128), ACL_ERROR_INVALID_PARAM, "maxCount", "128");
    CHECK_ERR(aclrtMemset(host, 256, 0, 16), ACL_ERROR_INVALID_PARAM, "aclrtMemset", "not device memory");
    CHECK_ERR(aclrtMemset(h, 256, 0, 16), ACL_ERROR_INVALID_PARAM, "aclrtMemset", "pinned host memory");
    CHECK_ERR(aclrtMemset(NULL, 256, 0, 16), ACL_ERROR_INVALID_PARAM, "aclrtMemset", "devPtr");

    CHECK_EQ(aclrtFree(d), ACL_SUCCESS);
    CHECK_EQ(aclrtFree(d2), ACL_SUCCESS);
    CHECK_EQ(aclrtFreeHost(h), ACL_SUCCESS);
    CHECK_ERR(aclrtFreeHost(h), ACL_ERROR_RT_MEMORY_FREE, "aclrtFreeHost", "not a live allocation");
}

/* ---------------------------------------------------------------- streams */

static void test_streams(void) {
    aclrtStream s = NULL, s2 = NULL;
    void *a = NULL, *b = NULL, *small = NULL;
    unsigned char probe[64], host[64];
    int k, ok;

    CHECK_ERR(aclrtCreateStream(NULL), ACL_ERROR_INVALID_PARAM, "aclrtCreateStream", "stream");
    CHECK_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
    CHECK_EQ(aclrtCreateStream(&s2), ACL_SUCCESS);
    CHECK(s != NULL && s2 != NULL && s != s2);
    CHECK_EQ(aclrtMalloc(&a, BIG, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ(aclrtMalloc(&b, BIG, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ(aclrtMalloc(&small, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    if (!a || !b || !small) return;

    /* ordering: memset a=1, copy a->b, memset a=2 ; then b holds 1 and a holds 2 */
    CHECK_EQ(aclrtMemsetAsync(a, BIG, 1, BIG, s), ACL_SUCCESS);
    CHECK_EQ(aclrtMemcpyAsync(b, BIG, a, BIG, ACL_MEMCPY_DEVICE_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_EQ(aclrtMemsetAsync(a, BIG, 2, BIG, s), ACL_SUCCESS);
    /* asynchronous: a zero-timeout sync finds work still pending (4 more big copies queued) */
    for (k = 0; k < 4; ++k)
        CHECK_EQ(aclrtMemcpyAsync(b, BIG, a, BIG / 2, ACL_MEMCPY_DEVICE_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_ERR(aclrtSynchronizeStreamWithTimeout(s, 0), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
              "aclrtSynchronizeStreamWithTimeout", "pending");
    CHECK_ERR(aclrtSynchronizeStreamWithTimeout(s, -2), ACL_ERROR_INVALID_PARAM, "timeout", "-2");
    CHECK_EQ(aclrtSynchronizeStreamWithTimeout(s, -1), ACL_SUCCESS);
    CHECK(((unsigned char *)b)[BIG - 1] == 1 && ((unsigned char *)b)[0] == 2);
    CHECK(((unsigned char *)a)[0] == 2 && ((unsigned char *)a)[BIG - 1] == 2);
    CHECK_EQ(aclrtSynchronizeStreamWithTimeout(s, 1000), ACL_SUCCESS);

    /* pageable host end: returns after the copy ran; pinned: ordered on the stream */
    memset(host, 0x77, sizeof host);
    CHECK_EQ(aclrtMemcpyAsync(small, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    CHECK(((unsigned char *)small)[63] == 0x77);
    CHECK_ERR(aclrtMemcpyAsync(small, 64, host, 65, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_ERROR_INVALID_PARAM, "aclrtMemcpyAsync", "destMax");
    CHECK_ERR(aclrtMemcpyAsync(host, 64, small, 64, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_ERROR_INVALID_PARAM, "aclrtMemcpyAsync", "dst");
    CHECK_ERR(aclrtMemsetAsync(small, 64, 0, 65, s), ACL_ERROR_INVALID_PARAM, "aclrtMemsetAsync", "maxCount");

    /* default stream (NULL) of the current device */
    CHECK_EQ(aclrtMemsetAsync(small, 64, 0x11, 64, NULL), ACL_SUCCESS);
    CHECK_EQ(aclrtSynchronizeStream(NULL), ACL_SUCCESS);
    CHECK(((unsigned char *)small)[0] == 0x11);

    /* destroy drains queued work first */
    CHECK_EQ(aclrtMemcpyAsync(b, BIG, a, BIG, ACL_MEMCPY_DEVICE_TO_DEVICE, s2), ACL_SUCCESS);
    CHECK_EQ(aclrtMemsetAsync(small, 64, 0x22, 64, s2), ACL_SUCCESS);
    CHECK_EQ(aclrtDestroyStream(s2), ACL_SUCCESS);
    CHECK(((unsigned char *)small)[0] == 0x22);
    CHECK_ERR(aclrtDestroyStream(s2), ACL_ERROR_RT_INVALID_HANDLE, "aclrtDestroyStream", "not a live stream");
    CHECK_ERR(aclrtSynchronizeStream(s2), ACL_ERROR_RT_INVALID_HANDLE, "aclrtSynchronizeStream", "not a live stream");
    CHECK_ERR(aclrtMemsetAsync(small, 64, 0, 1, s2), ACL_ERROR_RT_INVALID_HANDLE, "aclrtMemsetAsync", "stream");
    CHECK_ERR(aclrtDestroyStream(NULL), ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream", "stream");
    CHECK_ERR(aclrtDestroyStream((aclrtStream)probe), ACL_ERROR_RT_INVALID_HANDLE, "aclrtDestroyStream", "not a live stream");
    CHECK_ERR(aclrtSynchronizeStream((aclrtStream)(uintptr_t)0x1234), ACL_ERROR_RT_INVALID_HANDLE, "aclrtSynchronizeStream", "0x1234");

    /* many small tasks keep their order */
    ok = 1;
    for (k = 0; k < 200; ++k) CHECK_EQ(aclrtMemsetAsync(small, 64, k & 0xff, 64, s), ACL_SUCCESS);
    CHECK_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
    for (k = 0; k < 64; ++k) ok &= ((unsigned char *)small)[k] == 199;
    CHECK(ok);

    CHECK_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
    CHECK_EQ(aclrtFree(a), ACL_SUCCESS);
    CHECK_EQ(aclrtFree(b), ACL_SUCCESS);
    CHECK_EQ(aclrtFree(small), ACL_SUCCESS);
}

/* ---------------------------------------------------------------- events */

static void test_events(void) {
    aclrtStream s1 = NULL, s2 = NULL;
    aclrtEvent e = NULL, start = NULL, end = NULL, never = NULL;
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_COMPLETE;
    void *a = NULL, *b = NULL, *c = NULL;
    float ms = -1.0f;
    int k;

    CHECK_EQ(aclrtCreateStream(&s1), ACL_SUCCESS);
    CHECK_EQ(aclrtCreateStream(&s2), ACL_SUCCESS);
    CHECK_EQ(aclrtMalloc(&a, BIG, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ(aclrtMalloc(&b, BIG, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ(aclrtMalloc(&c, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    if (!a || !b || !c) return;
    CHECK_ERR(aclrtCreateEvent(NULL), ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent", "event");
    CHECK_EQ(aclrtCreateEvent(&e), ACL_SUCCESS);
    CHECK_EQ(aclrtCreateEvent(&start), ACL_SUCCESS);
    CHECK_EQ(aclrtCreateEvent(&end), ACL_SUCCESS);
    CHECK_EQ(aclrtCreateEvent(&never), ACL_SUCCESS);

    /* never recorded: not ready; synchronize returns at once */
    CHECK_EQ(aclrtQueryEventStatus(e, &st), ACL_SUCCESS);
    CHECK_EQ(st, ACL_EVENT_RECORDED_STATUS_NOT_READY);
    CHECK_EQ(aclrtSynchronizeEvent(never), ACL_SUCCESS);
    CHECK_ERR(aclrtQueryEventStatus(e, NULL), ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus", "status");

    /* record after slow work: not ready at first, complete after synchronize */
    CHECK_EQ(aclrtRecordEvent(start, s1), ACL_SUCCESS);
    CHECK_EQ(aclrtMemsetAsync(a, BIG, 0x5c, BIG, s1), ACL_SUCCESS);
    for (k = 0; k < 3; ++k)
        CHECK_EQ(aclrtMemcpyAsync(b, BIG, a, BIG, ACL_MEMCPY_DEVICE_TO_DEVICE, s1), ACL_SUCCESS);
    CHECK_EQ(aclrtRecordEvent(e, s1), ACL_SUCCESS);
    CHECK_EQ(aclrtRecordEvent(end, s1), ACL_SUCCESS);
    CHECK_EQ(aclrtQueryEventStatus(e, &st), ACL_SUCCESS);
    CHECK_EQ(st, ACL_EVENT_RECORDED_STATUS_NOT_READY);
    CHECK_ERR(aclrtEventElapsedTime(&ms, start, end), ACL_ERROR_RT_EVENT_NOT_COMPLETE, "aclrtEventElapsedTime", "has not completed");

    /* s2 waits for e (recorded on s1 after the copies), then reads b */
    CHECK_EQ(aclrtStreamWaitEvent(s2, e), ACL_SUCCESS);
    CHECK_EQ(aclrtMemcpyAsync(c, 64, b, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, s2), ACL_SUCCESS);
    CHECK_EQ(aclrtSynchronizeStream(s2), ACL_SUCCESS);
    CHECK(((unsigned char *)c)[0] == 0x5c && ((unsigned char *)c)[63] == 0x5c);

    CHECK_EQ(aclrtSynchronizeEvent(end), ACL_SUCCESS);
    CHECK_EQ(aclrtQueryEventStatus(e, &st), ACL_SUCCESS);
    CHECK_EQ(st, ACL_EVENT_RECORDED_STATUS_COMPLETE);
    CHECK_EQ(aclrtEventElapsedTime(&ms, start, end), ACL_SUCCESS);
    CHECK(ms > 0.0f && ms < 60000.0f);
    CHECK_ERR(aclrtEventElapsedTime(NULL, start, end), ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime", "ms");
    CHECK_ERR(aclrtEventElapsedTime(&ms, never, end), ACL_ERROR_RT_EVENT_NOT_COMPLETE, "startEvent", "never recorded");

    /* default stream records too */
    CHECK_EQ(aclrtRecordEvent(never, NULL), ACL_SUCCESS);
    CHECK_EQ(aclrtSynchronizeEvent(never), ACL_SUCCESS);
    CHECK_EQ(aclrtQueryEventStatus(never, &st), ACL_SUCCESS);
    CHECK_EQ(st, ACL_EVENT_RECORDED_STATUS_COMPLETE);

    CHECK_EQ(aclrtDestroyEvent(e), ACL_SUCCESS);
    CHECK_ERR(aclrtDestroyEvent(e), ACL_ERROR_RT_INVALID_HANDLE, "aclrtDestroyEvent", "not a live event");
    CHECK_ERR(aclrtRecordEvent(e, s1), ACL_ERROR_RT_INVALID_HANDLE, "aclrtRecordEvent", "event");
    CHECK_ERR(aclrtSynchronizeEvent(e), ACL_ERROR_RT_INVALID_HANDLE, "aclrtSynchronizeEvent", "event");
    CHECK_ERR(aclrtStreamWaitEvent(s2, e), ACL_ERROR_RT_INVALID_HANDLE, "aclrtStreamWaitEvent", "event");
    CHECK_ERR(aclrtDestroyEvent(NULL), ACL_ERROR_INVALID_PARAM, "aclrtDestroyEvent", "event");
    CHECK_ERR(aclrtRecordEvent(start, (aclrtStream)(uintptr_t)0x40), ACL_ERROR_RT_INVALID_HANDLE, "aclrtRecordEvent", "stream");
    CHECK_EQ(aclrtDestroyEvent(start), ACL_SUCCESS);
    CHECK_EQ(aclrtDestroyEvent(end), ACL_SUCCESS);
    CHECK_EQ(aclrtDestroyEvent(never), ACL_SUCCESS);
    CHECK_EQ(aclrtDestroyStream(s1), ACL_SUCCESS);
    CHECK_EQ(aclrtDestroyStream(s2), ACL_SUCCESS);
    CHECK_EQ(aclrtFree(a), ACL_SUCCESS);
    CHECK_EQ(aclrtFree(b), ACL_SUCCESS);
    CHECK_EQ(aclrtFree(c), ACL_SUCCESS);
}

/* ---------------------------------------------------------------- tensors and executors */

static void test_tensors(void) {
    int64_t dims[2] = {2, 3}, strides[2] = {1, 2}, storage[1] = {6}, neg[2] = {2, -1};
    aclTensor *t, *t2, *scalar;
    aclDataType dt = ACL_DT_UNDEFINED;
    aclFormat fmt = ACL_FORMAT_UNDEFINED;
    int64_t off = -1;
    void *dev = NULL, *addr = NULL;

    CHECK_EQ(aclrtMalloc(&dev, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    t = aclCreateTensor(dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, storage, 1, dev);
    CHECK(t != NULL);
    CHECK_EQ(aclGetDataType(t, &dt), ACLNN_SUCCESS);
    CHECK_EQ(dt, ACL_FLOAT);
    CHECK_EQ(aclGetFormat(t, &fmt), ACLNN_SUCCESS);
    CHECK_EQ(fmt, ACL_FORMAT_ND);
    CHECK_EQ(aclGetViewOffset(t, &off), ACLNN_SUCCESS);
    CHECK_EQ(off, 0);
    CHECK_EQ(aclGetRawTensorAddr(t, &addr), ACLNN_SUCCESS);
    CHECK(addr == dev);
    CHECK_EQ(aclSetRawTensorAddr(t, NULL), ACLNN_SUCCESS);
    CHECK_EQ(aclGetRawTensorAddr(t, &addr), ACLNN_SUCCESS);
    CHECK(addr == NULL);

    t2 = aclCreateTensor(dims, 2, ACL_BF16, strides, 5, ACL_FORMAT_NCL, storage, 1, NULL);
    CHECK(t2 != NULL);
    CHECK_EQ(aclGetViewOffset(t2, &off), ACLNN_SUCCESS);
    CHECK_EQ(off, 5);
    CHECK_EQ(aclGetFormat(t2, &fmt), ACLNN_SUCCESS);
    CHECK_EQ(fmt, ACL_FORMAT_NCL);
    scalar = aclCreateTensor(NULL, 0, ACL_INT64, NULL, 0, ACL_FORMAT_ND, NULL, 0, dev);
    CHECK(scalar != NULL);

    /* NULL arguments */
    CHECK_ERR(aclGetDataType(NULL, &dt), ACLNN_ERR_PARAM_NULLPTR, "aclGetDataType", "tensor");
    CHECK_ERR(aclGetDataType(t, NULL), ACLNN_ERR_PARAM_NULLPTR, "aclGetDataType", "dataType");
    CHECK_ERR(aclGetFormat(t, NULL), ACLNN_ERR_PARAM_NULLPTR, "aclGetFormat", "format");
    CHECK_ERR(aclGetViewOffset(NULL, &off), ACLNN_ERR_PARAM_NULLPTR, "aclGetViewOffset", "tensor");
    CHECK_ERR(aclGetRawTensorAddr(t, NULL), ACLNN_ERR_PARAM_NULLPTR, "aclGetRawTensorAddr", "addr");
    CHECK_ERR(aclSetRawTensorAddr(NULL, dev), ACLNN_ERR_PARAM_NULLPTR, "aclSetRawTensorAddr", "tensor");

    /* bad creation arguments give NULL and a message */
    CHECK(aclCreateTensor(NULL, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, storage, 1, dev) == NULL);
    CHECK_ERR(ACLNN_ERR_PARAM_NULLPTR, ACLNN_ERR_PARAM_NULLPTR, "aclCreateTensor", "viewDims");
    CHECK(aclCreateTensor(neg, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, storage, 1, dev) == NULL);
    CHECK_ERR(ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_PARAM_INVALID, "viewDims[1]", "-1");
    CHECK(aclCreateTensor(dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 1, dev) == NULL);
    CHECK_ERR(ACLNN_ERR_PARAM_NULLPTR, ACLNN_ERR_PARAM_NULLPTR, "aclCreateTensor", "storageDims");
    CHECK(aclCreateTensor(dims, 2, (aclDataType)5, NULL, 0, ACL_FORMAT_ND, storage, 1, dev) == NULL);
    CHECK_ERR(ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_PARAM_INVALID, "dataType", "5");
    CHECK(aclCreateTensor(dims, 2, ACL_FLOAT, NULL, -1, ACL_FORMAT_ND, storage, 1, dev) == NULL);
    CHECK_ERR(ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_PARAM_INVALID, "offset", "-1");

    /* destroy */
    CHECK_EQ(aclDestroyTensor(NULL), ACLNN_SUCCESS);
    CHECK_EQ(aclDestroyTensor(t), ACLNN_SUCCESS);
    CHECK_ERR(aclGetDataType(t, &dt), ACLNN_ERR_PARAM_INVALID, "aclGetDataType", "not a live aclTensor");
    CHECK_ERR(aclDestroyTensor(t), ACLNN_ERR_PARAM_INVALID, "aclDestroyTensor", "not a live aclTensor");
    CHECK_ERR(aclGetFormat((const aclTensor *)&off, &fmt), ACLNN_ERR_PARAM_INVALID, "aclGetFormat", "not a live aclTensor");
    CHECK_EQ(aclDestroyTensor(t2), ACLNN_SUCCESS);
    CHECK_EQ(aclDestroyTensor(scalar), ACLNN_SUCCESS);

    /* executor calls: NULL and garbage handles */
    t = aclCreateTensor(dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, storage, 1, dev);
    CHECK_ERR(aclSetAclOpExecutorRepeatable(NULL), ACLNN_ERR_INNER_NULLPTR, "aclSetAclOpExecutorRepeatable", "executor");
    CHECK_ERR(aclDestroyAclOpExecutor(NULL), ACLNN_ERR_INNER_NULLPTR, "aclDestroyAclOpExecutor", "executor");
    CHECK_ERR(aclSetInputTensorAddr(NULL, 0, t, dev), ACLNN_ERR_INNER_NULLPTR, "aclSetInputTensorAddr", "executor");
    CHECK_ERR(aclSetOutputTensorAddr((aclOpExecutor *)&off, 0, NULL, dev), ACLNN_ERR_INNER_NULLPTR, "aclSetOutputTensorAddr", "tensor");
    CHECK_ERR(aclSetTensorAddr((aclOpExecutor *)&off, 0, t, dev), ACLNN_ERR_PARAM_INVALID, "aclSetTensorAddr", "not a live aclOpExecutor");
    CHECK_ERR(aclDestroyAclOpExecutor((aclOpExecutor *)&off), ACLNN_ERR_PARAM_INVALID, "aclDestroyAclOpExecutor", "not a live aclOpExecutor");
    CHECK_ERR(aclSetAclOpExecutorRepeatable((aclOpExecutor *)(uintptr_t)0x10), ACLNN_ERR_PARAM_INVALID, "aclSetAclOpExecutorRepeatable", "not a live");
    CHECK_EQ(aclDestroyTensor(t), ACLNN_SUCCESS);
    CHECK_EQ(aclrtFree(dev), ACL_SUCCESS);

    /* element sizes */
    CHECK_EQ(aclDataTypeSize(ACL_FLOAT), 4);
    CHECK_EQ(aclDataTypeSize(ACL_FLOAT16), 2);
    CHECK_EQ(aclDataTypeSize(ACL_BF16), 2);
    CHECK_EQ(aclDataTypeSize(ACL_INT8), 1);
    CHECK_EQ(aclDataTypeSize(ACL_BOOL), 1);
    CHECK_EQ(aclDataTypeSize(ACL_INT64), 8);
    CHECK_EQ(aclDataTypeSize(ACL_DOUBLE), 8);
    CHECK_EQ(aclDataTypeSize(ACL_COMPLEX64), 8);
    CHECK_EQ(aclDataTypeSize(ACL_COMPLEX128), 16);
    CHECK_EQ(aclDataTypeSize(ACL_FLOAT8_E4M3FN), 1);
    CHECK_EQ(aclDataTypeSize(ACL_HIFLOAT8), 1);
    CHECK_EQ(aclDataTypeSize(ACL_INT4), 0);
    CHECK_EQ(aclDataTypeSize(ACL_FLOAT4_E2M1), 0);
    CHECK_EQ(aclDataTypeSize(ACL_DT_UNDEFINED), 0);
    CHECK_EQ(aclDataTypeSize(ACL_STRING), 0);
}

int main(void) {
    test_init_and_errors();
    test_devices();
    test_memory();
    test_streams();
    test_events();
    test_tensors();
    CHECK_EQ(aclrtResetDevice(0), ACL_SUCCESS);
    CHECK_EQ(aclnnFinalize(), ACLNN_SUCCESS);
    CHECK_EQ(aclFinalize(), ACL_SUCCESS);
    return report();
}
