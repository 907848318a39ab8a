/* Contexts, aclrtResetDevice's releases, HcclCommInitAll and HcclCommInitClusterInfo on the fake
 * CANN root, from plain C99 built with only -I/-L flags against acl/acl.h and hccl/hccl.h.
 * Usage: test_contexts_comms <scratch folder>
 *        test_contexts_comms --table-rank <rank table> <rank> <device>   (one rank, as a process) */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "hccl/hccl.h"

#include "check.h"

static const char *g_scratch = ".";

/* ---- contexts --------------------------------------------------------------------------------- */
struct ctx_probe {
    aclrtContext ctx;
    int set_rc, dev_rc, dev, later_rc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage; /* 1: bound, 2: the context was destroyed by the main thread */
};

static void *use_foreign_context(void *arg) {
    struct ctx_probe *p = (struct ctx_probe *)arg;
    int32_t dev = -1;
    p->set_rc = aclrtSetCurrentContext(p->ctx);
    p->dev_rc = aclrtGetDevice(&dev);
    p->dev = dev;
    pthread_mutex_lock(&p->mu);
    p->stage = 1;
    pthread_cond_broadcast(&p->cv);
    while (p->stage != 2) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    p->later_rc = aclrtGetDevice(&dev); /* its current context is gone */
    aclGetRecentErrMsg();
    return NULL;
}

static void test_contexts(void) {
    aclrtContext c0 = NULL, cur = NULL, dflt3 = NULL;
    aclrtStream s = NULL;
    int32_t dev = -1;
    void *buf = NULL;
    struct ctx_probe probe;
    pthread_t th;

    CHECK_ERR(aclrtGetCurrentContext(&cur), ACL_ERROR_RT_CONTEXT_NULL, "aclrtGetCurrentContext", "no context");
    CHECK_ERR(aclrtCreateContext(NULL, 0), ACL_ERROR_INVALID_PARAM, "aclrtCreateContext", "context");
    CHECK_ERR(aclrtCreateContext(&c0, -1), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtCreateContext", "-1");
    CHECK_ERR(aclrtGetCurrentContext(NULL), ACL_ERROR_INVALID_PARAM, "aclrtGetCurrentContext", "NULL");

    /* creating a context binds the thread to it and to its device */
    CHECK_EQ(aclrtCreateContext(&c0, 2), ACL_SUCCESS);
    CHECK_EQ(aclrtGetDevice(&dev), ACL_SUCCESS);
    CHECK_EQ(dev, 2);
    CHECK_EQ(aclrtGetCurrentContext(&cur), ACL_SUCCESS);
    CHECK(cur == c0);
    CHECK_EQ(aclrtCreateStream(&s), ACL_SUCCESS); /* a stream of c0 */

    /* aclrtSetDevice moves the thread to the device's default context, which has its own handle */
    CHECK_EQ(aclrtSetDevice(3), ACL_SUCCESS);
    CHECK_EQ(aclrtGetCurrentContext(&dflt3), ACL_SUCCESS);
    CHECK(dflt3 != NULL && dflt3 != c0);
    CHECK_EQ(aclrtSetCurrentContext(c0), ACL_SUCCESS);
    CHECK_EQ(aclrtGetDevice(&dev), ACL_SUCCESS);
    CHECK_EQ(dev, 2);
    CHECK_EQ(aclrtSetCurrentContext(dflt3), ACL_SUCCESS);
    CHECK_EQ(aclrtGetDevice(&dev), ACL_SUCCESS);
    CHECK_EQ(dev, 3);
    CHECK_ERR(aclrtDestroyContext(dflt3), ACL_ERROR_INVALID_PARAM, "default context of device 3", "aclrtResetDevice");
    CHECK_ERR(aclrtSetCurrentContext(NULL), ACL_ERROR_INVALID_PARAM, "aclrtSetCurrentContext", "NULL");
    CHECK_ERR(aclrtSetCurrentContext((aclrtContext)(uintptr_t)0x1234), ACL_ERROR_RT_INVALID_HANDLE,
              "aclrtSetCurrentContext", "not a live context");
    CHECK_ERR(aclrtDestroyContext(NULL), ACL_ERROR_INVALID_PARAM, "aclrtDestroyContext", "NULL");

    /* another thread shares c0: its device follows the context */
    memset(&probe, 0, sizeof probe);
    probe.ctx = c0;
    pthread_mutex_init(&probe.mu, NULL);
    pthread_cond_init(&probe.cv, NULL);
    pthread_create(&th, NULL, use_foreign_context, &probe);
    pthread_mutex_lock(&probe.mu);
    while (probe.stage != 1) pthread_cond_wait(&probe.cv, &probe.mu);
    pthread_mutex_unlock(&probe.mu);
    CHECK_EQ(probe.set_rc, ACL_SUCCESS);
    CHECK_EQ(probe.dev_rc, ACL_SUCCESS);
    CHECK_EQ(probe.dev, 2);

    /* destroying the current context: this thread has no device any more, c0's stream is gone, and
     * the other thread (c0 current there too) has no device either */
    CHECK_EQ(aclrtSetCurrentContext(c0), ACL_SUCCESS);
    CHECK_EQ(aclrtMalloc(&buf, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ(aclrtMemsetAsync(buf, 64, 0x5c, 64, s), ACL_SUCCESS);
    CHECK_EQ(aclrtDestroyContext(c0), ACL_SUCCESS);
    pthread_mutex_lock(&probe.mu);
    probe.stage = 2;
    pthread_cond_broadcast(&probe.cv);
    pthread_mutex_unlock(&probe.mu);
    pthread_join(th, NULL);
    CHECK_EQ(probe.later_rc, ACL_ERROR_RT_CONTEXT_NULL);
    CHECK_ERR(aclrtGetDevice(&dev), ACL_ERROR_RT_CONTEXT_NULL, "aclrtGetDevice", "no device");
    CHECK_ERR(aclrtSynchronizeStream(s), ACL_ERROR_RT_INVALID_HANDLE, "aclrtSynchronizeStream", "not a live stream");
    CHECK_ERR(aclrtDestroyStream(s), ACL_ERROR_RT_INVALID_HANDLE, "aclrtDestroyStream", "not a live stream");
    CHECK_ERR(aclrtDestroyContext(c0), ACL_ERROR_RT_INVALID_HANDLE, "aclrtDestroyContext", "not a live context");
    CHECK_ERR(aclrtSetCurrentContext(c0), ACL_ERROR_RT_INVALID_HANDLE, "aclrtSetCurrentContext", "already destroyed");
    {
        /* the work queued on c0's stream ran before the stream went; memory outlives the context */
        unsigned char host[64];
        CHECK_EQ(aclrtSetDevice(2), ACL_SUCCESS);
        CHECK_EQ(aclrtMemcpy(host, 64, buf, 64, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
        CHECK_EQ(host[0], 0x5c);
        CHECK_EQ(host[63], 0x5c);
        CHECK_EQ(aclrtFree(buf), ACL_SUCCESS);
        CHECK_EQ(aclrtResetDevice(2), ACL_SUCCESS);
    }
    CHECK_EQ(aclrtResetDevice(3), ACL_SUCCESS);
    CHECK_ERR(aclrtResetDevice(2), ACL_ERROR_RT_CONTEXT_NULL, "aclrtResetDevice", "device 2"); /* c0's reference went with it */
    pthread_mutex_destroy(&probe.mu);
    pthread_cond_destroy(&probe.cv);
}

/* ---- aclrtResetDevice ---------------------------------------------------------------------------- */
static void test_reset_releases_streams(void) {
    aclrtStream s = NULL, kept = NULL;
    aclrtContext ctx = NULL, dflt = NULL;
    void *buf = NULL;
    unsigned char host[32];
    int32_t dev = -1;

    CHECK_EQ(aclrtSetDevice(5), ACL_SUCCESS);
    CHECK_EQ(aclrtGetCurrentContext(&dflt), ACL_SUCCESS);
    CHECK_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
    CHECK_EQ(aclrtMalloc(&buf, 32, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ(aclrtMemsetAsync(buf, 32, 0x3b, 32, s), ACL_SUCCESS);
    /* a second reference: the first reset releases nothing */
    CHECK_EQ(aclrtSetDevice(5), ACL_SUCCESS);
    CHECK_EQ(aclrtResetDevice(5), ACL_SUCCESS);
    CHECK_EQ(aclrtSynchronizeStream(s), ACL_SUCCESS);
    /* a stream of an explicit context on the same device is not the default context's */
    CHECK_EQ(aclrtCreateContext(&ctx, 6), ACL_SUCCESS);
    CHECK_EQ(aclrtCreateStream(&kept), ACL_SUCCESS);
    CHECK_EQ(aclrtSetDevice(5), ACL_SUCCESS);
    CHECK_EQ(aclrtResetDevice(5), ACL_SUCCESS);
    CHECK_EQ(aclrtResetDevice(5), ACL_SUCCESS); /* the last reference: streams of device 5 go */
    CHECK_ERR(aclrtGetDevice(&dev), ACL_ERROR_RT_CONTEXT_NULL, "aclrtGetDevice", "no device");
    CHECK_ERR(aclrtSynchronizeStream(s), ACL_ERROR_RT_INVALID_HANDLE, "aclrtSynchronizeStream", "not a live stream");
    CHECK_ERR(aclrtDestroyStream(s), ACL_ERROR_RT_INVALID_HANDLE, "aclrtDestroyStream", "not a live stream");
    CHECK_ERR(aclrtSetCurrentContext(dflt), ACL_ERROR_RT_CONTEXT_NULL, "default context of device 5", "was reset");
    CHECK_EQ(aclrtSynchronizeStream(kept), ACL_SUCCESS);
    /* device memory is not released by the reset */
    CHECK_EQ(aclrtSetDevice(5), ACL_SUCCESS);
    CHECK_EQ(aclrtMemcpy(host, sizeof host, buf, 32, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    CHECK_EQ(host[31], 0x3b);
    CHECK_EQ(aclrtFree(buf), ACL_SUCCESS);
    CHECK_EQ(aclrtResetDevice(5), ACL_SUCCESS);
    CHECK_EQ(aclrtSetCurrentContext(ctx), ACL_SUCCESS);
    CHECK_EQ(aclrtDestroyStream(kept), ACL_SUCCESS);
    CHECK_EQ(aclrtDestroyContext(ctx), ACL_SUCCESS);
}

/* ---- HcclCommInitAll --------------------------------------------------------------------------------- */
struct rank_job {
    HcclComm comm;
    int32_t device;
    int rc_barrier, rc_sync;
};

static void *barrier_on_own_device(void *arg) {
    struct rank_job *j = (struct rank_job *)arg;
    aclrtStream s = NULL;
    aclrtSetDevice(j->device);
    aclrtCreateStream(&s);
    j->rc_barrier = HcclBarrier(j->comm, s);
    j->rc_sync = aclrtSynchronizeStreamWithTimeout(s, 20000);
    aclrtDestroyStream(s);
    aclrtResetDevice(j->device);
    return NULL;
}

static void test_init_all(void) {
    int32_t devices[4] = {7, 4, 5, 6};
    int32_t dup[3] = {1, 2, 1};
    int32_t bad[2] = {0, 99};
    HcclComm comms[4] = {NULL, NULL, NULL, NULL};
    char names[4][COMM_NAME_MAX_LENGTH];
    struct rank_job jobs[4];
    pthread_t th[4];
    uint32_t v = 0;
    int i;

    CHECK_ERR(HcclCommInitAll(4, NULL, comms), HCCL_E_PTR, "HcclCommInitAll", "devices");
    CHECK_ERR(HcclCommInitAll(4, devices, NULL), HCCL_E_PTR, "HcclCommInitAll", "comms");
    CHECK_ERR(HcclCommInitAll(0, devices, comms), HCCL_E_PARA, "HcclCommInitAll", "ndev");
    CHECK_ERR(HcclCommInitAll(3, dup, comms), HCCL_E_PARA, "devices[0] and devices[2]", "device 1");
    CHECK_ERR(HcclCommInitAll(2, bad, comms), HCCL_E_PARA, "devices[1]", "99");
    CHECK(comms[0] == NULL);

    CHECK_EQ(HcclCommInitAll(4, devices, comms), HCCL_SUCCESS);
    for (i = 0; i < 4; ++i) {
        CHECK_EQ(HcclGetRankId(comms[i], &v), HCCL_SUCCESS);
        CHECK_EQ(v, i);
        CHECK_EQ(HcclGetRankSize(comms[i], &v), HCCL_SUCCESS);
        CHECK_EQ(v, 4);
        CHECK_EQ(HcclGetCommName(comms[i], names[i]), HCCL_SUCCESS);
    }
    CHECK(strcmp(names[0], names[1]) != 0);
    /* one thread per device drives its rank afterwards */
    for (i = 0; i < 4; ++i) {
        jobs[i].comm = comms[i];
        jobs[i].device = devices[i];
        pthread_create(&th[i], NULL, barrier_on_own_device, &jobs[i]);
    }
    for (i = 0; i < 4; ++i) pthread_join(th[i], NULL);
    for (i = 0; i < 4; ++i) {
        CHECK_EQ(jobs[i].rc_barrier, HCCL_SUCCESS);
        CHECK_EQ(jobs[i].rc_sync, ACL_SUCCESS);
    }
    for (i = 0; i < 4; ++i) CHECK_EQ(HcclCommDestroy(comms[i]), HCCL_SUCCESS);
    CHECK_ERR(HcclCommDestroy(comms[0]), HCCL_E_PARA, "HcclCommDestroy", "not a live communicator");
    CHECK_ERR(HcclGetCommName(comms[1], names[1]), HCCL_E_PARA, "HcclGetCommName", "not a live communicator");
}

/* ---- HcclCommInitClusterInfo -------------------------------------------------------------------- */
struct table_rank {
    const char *path;
    uint32_t rank;
    int32_t device;
    int rc;
    HcclComm comm;
};

static void *join_from_table(void *arg) {
    struct table_rank *t = (struct table_rank *)arg;
    aclrtSetDevice(t->device);
    t->rc = HcclCommInitClusterInfo(t->path, t->rank, &t->comm);
    aclrtResetDevice(t->device);
    return NULL;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
}

static void test_cluster_info(void) {
    char table[1024], bad_table[1024], missing[1024];
    struct table_rank ranks[2];
    pthread_t th[2];
    HcclComm comm = NULL;
    uint32_t v = 0;
    int i;

    snprintf(table, sizeof table, "%s/rank_table.json", g_scratch);
    snprintf(bad_table, sizeof bad_table, "%s/rank_table_dup.json", g_scratch);
    snprintf(missing, sizeof missing, "%s/no_such_table.json", g_scratch);
    write_file(table,
               "{\"version\": \"1.0\", \"server_count\": \"1\", \"server_list\": [{\"server_id\": \"10.0.0.1\",\n"
               " \"device\": [{\"device_id\": \"8\", \"device_ip\": \"192.168.1.8\", \"rank_id\": \"1\"},\n"
               "            {\"device_id\": \"9\", \"device_ip\": \"192.168.1.9\", \"rank_id\": \"0\"}]}],\n"
               " \"status\": \"completed\"}\n");
    write_file(bad_table, "{\"server_list\": [{\"device\": [{\"device_id\": \"0\", \"rank_id\": \"0\"},"
                          " {\"device_id\": \"1\", \"rank_id\": \"0\"}]}]}\n");

    CHECK_ERR(HcclCommInitClusterInfo(NULL, 0, &comm), HCCL_E_PTR, "HcclCommInitClusterInfo", "clusterInfo");
    CHECK_ERR(HcclCommInitClusterInfo(table, 0, NULL), HCCL_E_PTR, "HcclCommInitClusterInfo", "comm");
    CHECK_ERR(HcclCommInitClusterInfo(missing, 0, &comm), HCCL_E_OPEN_FILE_FAILURE, "cannot open", missing);
    CHECK_ERR(HcclCommInitClusterInfo(bad_table, 0, &comm), HCCL_E_PARA, "rank_id values", "twice");
    CHECK_ERR(HcclCommInitClusterInfo(table, 2, &comm), HCCL_E_PARA, "rank must be < 2", table);
    CHECK_EQ(aclrtSetDevice(3), ACL_SUCCESS);
    CHECK_ERR(HcclCommInitClusterInfo(table, 0, &comm), HCCL_E_PARA, "device_id 9", "device is 3");
    CHECK_EQ(aclrtResetDevice(3), ACL_SUCCESS);

    /* twice in a row from the same table: the second world forms once the first was destroyed */
    for (int round = 0; round < 2; ++round) {
        for (i = 0; i < 2; ++i) {
            ranks[i].path = table;
            ranks[i].rank = (uint32_t)i;
            ranks[i].device = i == 0 ? 9 : 8;
            ranks[i].rc = -1;
            ranks[i].comm = NULL;
            pthread_create(&th[i], NULL, join_from_table, &ranks[i]);
        }
        for (i = 0; i < 2; ++i) pthread_join(th[i], NULL);
        for (i = 0; i < 2; ++i) {
            CHECK_EQ(ranks[i].rc, HCCL_SUCCESS);
            CHECK_EQ(HcclGetRankId(ranks[i].comm, &v), HCCL_SUCCESS);
            CHECK_EQ(v, i);
            CHECK_EQ(HcclGetRankSize(ranks[i].comm, &v), HCCL_SUCCESS);
            CHECK_EQ(v, 2);
        }
        for (i = 0; i < 2; ++i) CHECK_EQ(HcclCommDestroy(ranks[i].comm), HCCL_SUCCESS);
    }
}

/* One rank of a world formed from a rank table by separate processes: prints "rank R of N". */
static int join_table_as_process(const char *path, uint32_t rank, int32_t device) {
    HcclComm comm = NULL;
    uint32_t r = 0, n = 0;
    int rc;
    if (aclrtSetDevice(device) != ACL_SUCCESS) return 3;
    rc = HcclCommInitClusterInfo(path, rank, &comm);
    if (rc != HCCL_SUCCESS) {
        fprintf(stderr, "HcclCommInitClusterInfo: %d: %s\n", rc, aclGetRecentErrMsg());
        return 1;
    }
    HcclGetRankId(comm, &r);
    HcclGetRankSize(comm, &n);
    printf("rank %u of %u\n", r, n);
    return HcclCommDestroy(comm) == HCCL_SUCCESS && aclrtResetDevice(device) == ACL_SUCCESS ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--table-rank") == 0)
        return join_table_as_process(argv[2], (uint32_t)atoi(argv[3]), (int32_t)atoi(argv[4]));
    if (argc > 1) g_scratch = argv[1];
    test_contexts();
    test_reset_releases_streams();
    test_init_all();
    test_cluster_info();
    return report();
}
