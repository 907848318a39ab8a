/*
 * A plain C99 CANN program: one MoE layer round on W ranks (one pthread per rank, one device each):
 *
 *   HcclGetRootInfo → per rank: HcclCommInitRootInfo → context tensor built through HCCL's KFC calls
 *   (docs/concepts.md, "Windows, the context tensor") → aclnnMoeDistributeDispatchV5 (two phases)
 *   → a deterministic "expert" on the host → aclnnMoeDistributeCombineV5 (two phases) → results
 *   written as .npy files.
 *
 * Nothing here knows about the mock: it includes CANN's header names and links libascendcl.so,
 * libnnopbase.so, libhccl.so and the op library libcust_opapi.so found under $ASCEND_HOME_PATH
 * (see CMakeLists.txt). Pointing ASCEND_HOME_PATH at aclnn_py.mock_root() runs it on the CPU.
 *
 * usage: moe_round out_dir [world_size] [tokens] [hidden] [topk] [experts] [seed]
 * defaults:                 4            8        1024     4      8         0
 * out_dir is required: the program writes 9 files per rank there. Each number must be a whole
 * decimal number (a word such as "abc" is refused by name, exit code 2, not read as 0).
 * out_dir is created (with its parents) if it does not exist; when that fails the program stops
 * before any CANN call, naming the folder.
 *
 * Files written to out_dir (bf16 arrays are stored as '<u2' bit patterns):
 *   rank<r>_x.npy (BS,H) bf16   rank<r>_expert_ids.npy (BS,K) int32   rank<r>_weights.npy (BS,K) f32
 *   rank<r>_expand_x.npy (N,H) bf16   rank<r>_assist_info.npy (3N,) int32
 *   rank<r>_ep_recv_counts.npy (W*L,) int32   rank<r>_expert_token_nums.npy (L,) int64
 *   rank<r>_expert_out.npy (N,H) bf16  rank<r>_x_out.npy (BS,H) bf16
 * and prints "OK <W> ranks" on success (exit 0), an error naming the failed call otherwise.
 *
 * The expert applied to the rows of local expert j on rank r (mirrored by tests/test_examples.py):
 *   y = bf16_rne( f32(x) * (1 + 0.25*j) + 0.125*r )   -- a float32 multiply, then a float32 add
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "acl/acl_rt.h"
#include "aclnn/aclnn_base.h"
#include "aclnnop/aclnn_moe_distribute_combine_v5.h"
#include "aclnnop/aclnn_moe_distribute_dispatch_v5.h"
#include "hccl/hccl_comm.h"
#include "hccl/hccl_kfc.h"

/* ------------------------------------------------------------------------------ configuration */

typedef struct {
    const char *out_dir;
    int world_size, tokens, hidden, topk, experts;
    uint64_t seed;
    HcclRootInfo root;
} Config;

typedef struct {
    const Config *cfg;
    int rank;
    int failed;
    char error[512];
} RankJob;

#define MAX_EP_RANKS 1024
#define CONTEXT_BYTES (4 + 4 + 8 + 8 * MAX_EP_RANKS + 8 * MAX_EP_RANKS) /* 16400 bytes */
#define CONTEXT_INT32 (CONTEXT_BYTES / 4)                                 /* 4100 */

/* Report the first failure of a rank (with CANN's own message) and leave the rank's function. */
#define FAIL(job, ...)                                                                             \
    do {                                                                                           \
        snprintf((job)->error, sizeof (job)->error, __VA_ARGS__);                                  \
        (job)->failed = 1;                                                                         \
        goto done;                                                                                 \
    } while (0)
#define ACL_CALL(job, call)                                                                        \
    do {                                                                                           \
        int ret_ = (int)(call);                                                                    \
        if (ret_ != 0) {                                                                           \
            const char *msg_ = aclGetRecentErrMsg();                                               \
            FAIL(job, "%s returned %d: %s", #call, ret_, msg_ ? msg_ : "(no message)");            \
        }                                                                                          \
    } while (0)
#define HCCL_CALL(job, call)                                                                       \
    do {                                                                                           \
        HcclResult ret_ = (call);                                                                  \
        if (ret_ != HCCL_SUCCESS) {                                                                \
            const char *msg_ = aclGetRecentErrMsg();                                               \
            FAIL(job, "%s returned %d (%s): %s", #call, (int)ret_, HcclGetErrorString(ret_),       \
                 msg_ ? msg_ : "(no message)");                                                    \
        }                                                                                          \
    } while (0)

static const char *recent_msg(void) {
    const char *m = aclGetRecentErrMsg();
    return m ? m : "(no message)";
}

/* ------------------------------------------------------------------------------ bf16 and RNG */

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest, ties to even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform01(uint64_t *s) { return (float)(splitmix64(s) >> 40) / (float)(1u << 24); }

/* ------------------------------------------------------------------------------ output folder */

/* Create `dir` and its missing parents (mkdir -p). Returns 0 when `dir` is a directory afterwards;
 * otherwise -1 with errno set and `failed` naming the path that could not be created. */
static int make_dirs(const char *dir, char *failed, size_t failed_size) {
    char path[1024];
    struct stat st;
    size_t i, n = strlen(dir);
    if (n == 0 || n >= sizeof path) {
        errno = n == 0 ? ENOENT : ENAMETOOLONG;
        snprintf(failed, failed_size, "%s", dir);
        return -1;
    }
    memcpy(path, dir, n + 1);
    for (i = 1; i <= n; ++i) {
        if (path[i] != '/' && path[i] != '\0') continue;
        path[i] = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            snprintf(failed, failed_size, "%s", path);
            return -1;
        }
        if (i < n) path[i] = '/';
    }
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    if (errno == 0 || errno == EEXIST) errno = ENOTDIR; /* it exists, as something else than a folder */
    snprintf(failed, failed_size, "%s", dir);
    return -1;
}

/* ------------------------------------------------------------------------------ .npy writer */

static int write_npy(const Config *cfg, int rank, const char *name, const char *descr, const void *data,
                     size_t elem_size, int ndim, const int64_t *shape) {
    char path[1024], header[256], dims[128] = "";
    size_t count = 1, hlen, total;
    FILE *f;
    int i;
    for (i = 0; i < ndim; ++i) {
        char d[32];
        snprintf(d, sizeof d, ndim == 1 ? "%lld," : (i ? " %lld" : "%lld"), (long long)shape[i]);
        strcat(dims, d);
        if (ndim > 1 && i + 1 < ndim) strcat(dims, ",");
        count *= (size_t)shape[i];
    }
    hlen = (size_t)snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                            descr, dims);
    total = 10 + hlen + 1;
    while (total % 64) header[hlen++] = ' ', ++total;
    header[hlen++] = '\n';
    snprintf(path, sizeof path, "%s/rank%d_%s.npy", cfg->out_dir, rank, name);
    f = fopen(path, "wb");
    if (!f) return -1;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc((int)(hlen & 0xff), f);
    fputc((int)(hlen >> 8), f);
    fwrite(header, 1, hlen, f);
    if (count) fwrite(data, elem_size, count, f);
    return fclose(f);
}

/* ------------------------------------------------------------------------------ device tensors */

typedef struct {
    void *dev;
    size_t bytes;
    aclTensor *desc;
} DevTensor;

/* aclrtMalloc'd memory (never 0 bytes) and an ND aclTensor over it; optionally uploaded from `host`. */
static int dev_tensor(DevTensor *t, aclDataType dtype, size_t elem_size, int ndim, const int64_t *shape,
                      const void *host) {
    int64_t storage = 1;
    int i;
    for (i = 0; i < ndim; ++i) storage *= shape[i];
    t->bytes = (size_t)storage * elem_size;
    t->dev = NULL;
    t->desc = NULL;
    if (aclrtMalloc(&t->dev, t->bytes ? t->bytes : 32, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) return -1;
    if (host && t->bytes &&
        aclrtMemcpy(t->dev, t->bytes, host, t->bytes, ACL_MEMCPY_HOST_TO_DEVICE) != ACL_SUCCESS)
        return -1;
    t->desc = aclCreateTensor(shape, (uint64_t)ndim, dtype, NULL, 0, ACL_FORMAT_ND, &storage, 1, t->dev);
    return t->desc ? 0 : -1;
}

static void dev_tensor_free(DevTensor *t) {
    if (t->desc) aclDestroyTensor(t->desc);
    if (t->dev) aclrtFree(t->dev);
    t->desc = NULL;
    t->dev = NULL;
}

static int download(void *host, const DevTensor *t, size_t bytes) {
    if (!bytes) return 0;
    return aclrtMemcpy(host, bytes, t->dev, bytes, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS ? 0 : -1;
}

/* ------------------------------------------------------------------------------ the context tensor */

/* CANN's KFC sequence (docs/concepts.md): op args → comm engine AIV → alg config → the communicator by its
 * name → op resource context (all-to-all) as kfcContextAddr → check rank → free op args → every
 * rank's window address. Fills `blob` (the Mc2MoeContext layout, little-endian) and the window size. */
static int build_context(RankJob *job, HcclComm comm, unsigned char *blob, uint64_t *ccl_buffer_size) {
    char name[COMM_NAME_MAX_LENGTH] = {0};
    char alg[] = "AlltoAll=level0:fullmesh;level1:pairwise";
    void *op_args = NULL, *res_ctx = NULL, *addr = NULL;
    HcclComm by_name = NULL;
    uint32_t rank = 0, size = 0, r;
    uint64_t kfc, win, bytes = 0;
    uint32_t rank_size_per_server = 2;

    memset(blob, 0, CONTEXT_BYTES);
    HCCL_CALL(job, HcclGetCommName(comm, name));
    HCCL_CALL(job, HcclKfcAllocOpArgs(&op_args));
    HCCL_CALL(job, HcclKfcOpArgsSetCommEngine(op_args, HCCL_COMM_ENGINE_AIV));
    HCCL_CALL(job, HcclKfcOpArgsSetAlgConfig(op_args, alg));
    HCCL_CALL(job, HcclCommGetHandleWithName(name, &by_name));
    HCCL_CALL(job, HcclCreateOpResCtx(by_name, HCCL_OP_TYPE_ALLTOALL, op_args, &res_ctx));
    HCCL_CALL(job, HcclGetRankId(by_name, &rank));
    HCCL_CALL(job, HcclGetRankSize(by_name, &size));
    if ((int)rank != job->rank || (int)size != job->cfg->world_size)
        FAIL(job, "communicator %s is rank %u of %u, expected %d of %d", name, rank, size, job->rank,
             job->cfg->world_size);
    HCCL_CALL(job, HcclKfcFreeOpArgs(op_args));
    op_args = NULL;

    kfc = (uint64_t)(uintptr_t)res_ctx;
    memcpy(blob + 0, &rank, 4);
    memcpy(blob + 4, &rank_size_per_server, 4);
    memcpy(blob + 8, &kfc, 8);
    for (r = 0; r < size; ++r) {
        uint64_t sz = 0;
        if (r == rank) {
            HCCL_CALL(job, HcclGetHcclBuffer(by_name, &addr, &sz));
            bytes = sz;
        } else {
            HCCL_CALL(job, HcclGetRemoteIpcHcclBuf(by_name, r, &addr, &sz));
        }
        win = (uint64_t)(uintptr_t)addr;
        memcpy(blob + 16 + 8 * (size_t)r, &win, 8);
    }
    *ccl_buffer_size = bytes;
    return 0;
done:
    if (op_args) HcclKfcFreeOpArgs(op_args);
    return -1;
}

/* ------------------------------------------------------------------------------ one rank */

static void *rank_main(void *arg) {
    RankJob *job = (RankJob *)arg;
    const Config *cfg = job->cfg;
    const int W = cfg->world_size, BS = cfg->tokens, H = cfg->hidden, K = cfg->topk, E = cfg->experts;
    const int rank = job->rank;
    const int L = E / W;                      /* no shared-expert ranks: L = E / W */
    const int64_t G = (int64_t)BS * W;        /* global_bs 0 → BS * W */
    const int64_t A = G * (L < K ? L : K);    /* rows this rank can receive (docs/operators.md) */
    const int64_t assist_len = (int64_t)BS * K > A * 128 ? (int64_t)BS * K : A * 128;
    HcclComm comm = NULL;
    aclrtStream stream = NULL;
    unsigned char *ctx_blob = NULL;
    uint64_t ccl_buffer_size = 0, ws_size = 0, seed;
    aclOpExecutor *executor = NULL;
    void *workspace = NULL;
    uint16_t *x = NULL, *expand_x = NULL, *expert_out = NULL, *x_out = NULL;
    int32_t *ids = NULL, *assist = NULL, *recv_counts = NULL;
    int64_t *tok_nums = NULL;
    float *weights = NULL;
    DevTensor d_ctx = {0}, d_x = {0}, d_ids = {0}, d_w = {0}, d_expand_x = {0}, d_dyn = {0}, d_assist = {0},
              d_tok = {0}, d_recv = {0}, d_tp = {0}, d_escales = {0}, d_expert_out = {0}, d_x_out = {0};
    int64_t n = 0, i, h;
    int k, j;

    ACL_CALL(job, aclrtSetDevice(rank));
    ACL_CALL(job, aclrtCreateStream(&stream));
    HCCL_CALL(job, HcclCommInitRootInfo((uint32_t)W, &cfg->root, (uint32_t)rank, &comm));

    /* the context tensor: int32 (4100,) over the 16,400-byte context struct */
    ctx_blob = (unsigned char *)calloc(1, CONTEXT_BYTES);
    if (!ctx_blob || build_context(job, comm, ctx_blob, &ccl_buffer_size) != 0) {
        if (!job->failed) FAIL(job, "out of host memory");
        goto done;
    }
    {
        int64_t shape[1] = {CONTEXT_INT32};
        if (dev_tensor(&d_ctx, ACL_INT32, 4, 1, shape, ctx_blob)) FAIL(job, "context tensor: %s", recent_msg());
    }

    /* this rank's inputs: a pure function of (seed, rank) */
    x = (uint16_t *)malloc(sizeof *x * (size_t)BS * H);
    ids = (int32_t *)malloc(sizeof *ids * (size_t)BS * K);
    weights = (float *)malloc(sizeof *weights * (size_t)BS * K);
    if (!x || !ids || !weights) FAIL(job, "out of host memory");
    seed = cfg->seed * 1000003ull + (uint64_t)rank;
    for (i = 0; i < (int64_t)BS * H; ++i) x[i] = f32_to_bf16(uniform01(&seed) * 4.0f - 2.0f);
    for (i = 0; i < BS; ++i) {
        int32_t perm[1024];
        for (j = 0; j < E; ++j) perm[j] = j;
        for (k = 0; k < K; ++k) { /* K distinct experts: partial Fisher-Yates */
            int pick = k + (int)(splitmix64(&seed) % (uint64_t)(E - k));
            int32_t tmp = perm[k];
            perm[k] = perm[pick];
            perm[pick] = tmp;
            ids[i * K + k] = perm[k];
            weights[i * K + k] = uniform01(&seed);
        }
    }
    {
        int64_t xs[2] = {BS, H}, ks[2] = {BS, K};
        if (dev_tensor(&d_x, ACL_BF16, 2, 2, xs, x) || dev_tensor(&d_ids, ACL_INT32, 4, 2, ks, ids) ||
            dev_tensor(&d_w, ACL_FLOAT, 4, 2, ks, weights))
            FAIL(job, "input tensors: %s", recent_msg());
    }

    /* dispatch outputs, sized as docs/operators.md lists them */
    {
        int64_t ex[2] = {A, H}, a1[1] = {A}, as[1] = {assist_len}, l1[1] = {L}, wl[1] = {(int64_t)W * L},
                tp[1] = {0};
        if (dev_tensor(&d_expand_x, ACL_BF16, 2, 2, ex, NULL) || dev_tensor(&d_dyn, ACL_FLOAT, 4, 1, a1, NULL) ||
            dev_tensor(&d_assist, ACL_INT32, 4, 1, as, NULL) || dev_tensor(&d_tok, ACL_INT64, 8, 1, l1, NULL) ||
            dev_tensor(&d_recv, ACL_INT32, 4, 1, wl, NULL) || dev_tensor(&d_tp, ACL_INT32, 4, 1, tp, NULL) ||
            dev_tensor(&d_escales, ACL_FLOAT, 4, 1, a1, NULL))
            FAIL(job, "dispatch outputs: %s", recent_msg());
    }

    /* dispatch: phase 1, workspace, phase 2, wait */
    ACL_CALL(job, aclnnMoeDistributeDispatchV5GetWorkspaceSize(
                      d_ctx.desc, d_x.desc, d_ids.desc, NULL, NULL, d_w.desc, NULL, NULL, W, rank, E,
                      (int64_t)ccl_buffer_size, 0, 0, 0, 1, 0, 0, 0, 1, "", 0, 0, 0, d_expand_x.desc, d_dyn.desc,
                      d_assist.desc, d_tok.desc, d_recv.desc, d_tp.desc, d_escales.desc, &ws_size, &executor));
    if (ws_size) ACL_CALL(job, aclrtMalloc(&workspace, ws_size, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CALL(job, aclnnMoeDistributeDispatchV5(workspace, ws_size, executor, stream));
    ACL_CALL(job, aclrtSynchronizeStream(stream));
    if (workspace) aclrtFree(workspace);
    workspace = NULL;

    recv_counts = (int32_t *)malloc(sizeof *recv_counts * (size_t)W * L);
    tok_nums = (int64_t *)malloc(sizeof *tok_nums * (size_t)L);
    if (!recv_counts || !tok_nums) FAIL(job, "out of host memory");
    if (download(recv_counts, &d_recv, sizeof *recv_counts * (size_t)W * L) ||
        download(tok_nums, &d_tok, sizeof *tok_nums * (size_t)L))
        FAIL(job, "download: %s", recent_msg());
    n = recv_counts[W * L - 1];
    expand_x = (uint16_t *)malloc(sizeof *expand_x * (size_t)(n * H + 1));
    assist = (int32_t *)malloc(sizeof *assist * (size_t)(3 * n + 1));
    expert_out = (uint16_t *)calloc((size_t)(A * H), sizeof *expert_out); /* rows >= n stay zero */
    if (!expand_x || !assist || !expert_out) FAIL(job, "out of host memory");
    if (download(expand_x, &d_expand_x, sizeof *expand_x * (size_t)(n * H)) ||
        download(assist, &d_assist, sizeof *assist * (size_t)(3 * n)))
        FAIL(job, "download: %s", recent_msg());

    /* the "expert": rows are grouped by local expert (expert_token_nums, type 1 = per-expert counts) */
    {
        int64_t row = 0;
        for (j = 0; j < L; ++j) {
            const float a = 1.0f + 0.25f * (float)j, b = 0.125f * (float)rank;
            for (i = 0; i < tok_nums[j]; ++i, ++row)
                for (h = 0; h < H; ++h) {
                    volatile float prod = bf16_to_f32(expand_x[row * H + h]) * a; /* no FMA */
                    expert_out[row * H + h] = f32_to_bf16(prod + b);
                }
        }
        if (row != n) FAIL(job, "expert_token_nums sum to %lld, ep_recv_counts says %lld", (long long)row, (long long)n);
    }

    /* combine: expand_x = the expert outputs in dispatch's (A, H) layout */
    {
        int64_t ex[2] = {A, H}, xs[2] = {BS, H};
        if (dev_tensor(&d_expert_out, ACL_BF16, 2, 2, ex, expert_out) ||
            dev_tensor(&d_x_out, ACL_BF16, 2, 2, xs, NULL))
            FAIL(job, "combine tensors: %s", recent_msg());
    }
    executor = NULL;
    ws_size = 0;
    ACL_CALL(job, aclnnMoeDistributeCombineV5GetWorkspaceSize(
                      d_ctx.desc, d_expert_out.desc, d_ids.desc, d_assist.desc, d_recv.desc, d_w.desc, NULL, NULL,
                      NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, W, rank, E,
                      (int64_t)ccl_buffer_size, 0, 0, 0, 1, 0, 0, 0, 0, 0, "", 0, 0, 0, d_x_out.desc, &ws_size,
                      &executor));
    if (ws_size) ACL_CALL(job, aclrtMalloc(&workspace, ws_size, ACL_MEM_MALLOC_HUGE_FIRST));
    ACL_CALL(job, aclnnMoeDistributeCombineV5(workspace, ws_size, executor, stream));
    ACL_CALL(job, aclrtSynchronizeStream(stream));

    x_out = (uint16_t *)malloc(sizeof *x_out * (size_t)BS * H);
    if (!x_out) FAIL(job, "out of host memory");
    if (download(x_out, &d_x_out, sizeof *x_out * (size_t)BS * H)) FAIL(job, "download: %s", recent_msg());

    {
        int64_t xs[2] = {BS, H}, ks[2] = {BS, K}, nx[2] = {n, H}, n3[1] = {3 * n}, wl[1] = {(int64_t)W * L},
                l1[1] = {L};
        if (write_npy(cfg, rank, "x", "<u2", x, 2, 2, xs) || write_npy(cfg, rank, "expert_ids", "<i4", ids, 4, 2, ks) ||
            write_npy(cfg, rank, "weights", "<f4", weights, 4, 2, ks) ||
            write_npy(cfg, rank, "expand_x", "<u2", expand_x, 2, 2, nx) ||
            write_npy(cfg, rank, "assist_info", "<i4", assist, 4, 1, n3) ||
            write_npy(cfg, rank, "ep_recv_counts", "<i4", recv_counts, 4, 1, wl) ||
            write_npy(cfg, rank, "expert_token_nums", "<i8", tok_nums, 8, 1, l1) ||
            write_npy(cfg, rank, "expert_out", "<u2", expert_out, 2, 2, nx) ||
            write_npy(cfg, rank, "x_out", "<u2", x_out, 2, 2, xs))
            FAIL(job, "cannot write the .npy files to %s", cfg->out_dir);
    }

done:
    if (workspace) aclrtFree(workspace);
    dev_tensor_free(&d_ctx);
    dev_tensor_free(&d_x);
    dev_tensor_free(&d_ids);
    dev_tensor_free(&d_w);
    dev_tensor_free(&d_expand_x);
    dev_tensor_free(&d_dyn);
    dev_tensor_free(&d_assist);
    dev_tensor_free(&d_tok);
    dev_tensor_free(&d_recv);
    dev_tensor_free(&d_tp);
    dev_tensor_free(&d_escales);
    dev_tensor_free(&d_expert_out);
    dev_tensor_free(&d_x_out);
    if (comm) HcclCommDestroy(comm);
    if (stream) aclrtDestroyStream(stream);
    aclrtResetDevice(rank);
    free(ctx_blob);
    free(x);
    free(ids);
    free(weights);
    free(expand_x);
    free(assist);
    free(recv_counts);
    free(tok_nums);
    free(expert_out);
    free(x_out);
    return NULL;
}

static const char USAGE[] = "usage: moe_round out_dir [world_size] [tokens] [hidden] [topk] [experts] [seed]";

/* argv[i] as a whole decimal number in [lo, hi], or `dflt` when absent; 0 on success, else a message
 * naming the argument and -1 */
static int number_arg(int argc, char **argv, int i, const char *name, long long lo, long long hi, long long dflt,
                      long long *out) {
    const char *v;
    char *end = NULL;
    long long n;
    *out = dflt;
    if (argc <= i) return 0;
    v = argv[i];
    errno = 0;
    n = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0 || n < lo || n > hi) {
        fprintf(stderr, "moe_round: %s must be a whole number in [%lld, %lld] (got '%s')\n%s\n", name, lo, hi, v,
                USAGE);
        return -1;
    }
    *out = n;
    return 0;
}

int main(int argc, char **argv) {
    Config cfg;
    RankJob *jobs;
    pthread_t *threads;
    int r, failed = 0;
    long long w, bs, h, k, e, seed;

    if (argc < 2 || argc > 8) {
        fprintf(stderr, "moe_round: %s\n%s\n", argc < 2 ? "name the output folder (out_dir)" : "too many arguments",
                USAGE);
        return 2;
    }
    cfg.out_dir = argv[1];
    if (number_arg(argc, argv, 2, "world_size", 2, MAX_EP_RANKS, 4, &w) ||
        number_arg(argc, argv, 3, "tokens", 1, 1 << 20, 8, &bs) ||
        number_arg(argc, argv, 4, "hidden", 1, 1 << 20, 1024, &h) ||
        number_arg(argc, argv, 5, "topk", 1, 1024, 4, &k) ||
        number_arg(argc, argv, 6, "experts", 1, 1024, 8, &e) ||
        number_arg(argc, argv, 7, "seed", 0, 0x7fffffffffffffffLL, 0, &seed))
        return 2;
    cfg.world_size = (int)w;
    cfg.tokens = (int)bs;
    cfg.hidden = (int)h;
    cfg.topk = (int)k;
    cfg.experts = (int)e;
    cfg.seed = (uint64_t)seed;
    if (cfg.world_size < 2 || cfg.world_size > MAX_EP_RANKS || cfg.experts < 1 || cfg.experts > 1024 ||
        cfg.experts % cfg.world_size || cfg.topk < 1 || cfg.topk > cfg.experts || cfg.tokens < 1 || cfg.hidden < 1) {
        fprintf(stderr, "bad configuration (experts must be a multiple of world_size, topk <= experts)\n");
        return 2;
    }
    {
        char failed[1024];
        if (make_dirs(cfg.out_dir, failed, sizeof failed) != 0) {
            fprintf(stderr, "cannot create the output folder %s (at %s: %s)\n", cfg.out_dir, failed, strerror(errno));
            return 2;
        }
    }

    if (aclInit(NULL) != ACL_SUCCESS || aclnnInit(NULL) != 0) {
        fprintf(stderr, "aclInit/aclnnInit failed: %s\n", recent_msg());
        return 1;
    }
    if (HcclGetRootInfo(&cfg.root) != HCCL_SUCCESS) { /* once; the "broadcast" is sharing memory */
        fprintf(stderr, "HcclGetRootInfo failed: %s\n", recent_msg());
        return 1;
    }
    jobs = (RankJob *)calloc((size_t)cfg.world_size, sizeof *jobs);
    threads = (pthread_t *)calloc((size_t)cfg.world_size, sizeof *threads);
    if (!jobs || !threads) return 1;
    for (r = 0; r < cfg.world_size; ++r) {
        jobs[r].cfg = &cfg;
        jobs[r].rank = r;
        if (pthread_create(&threads[r], NULL, rank_main, &jobs[r]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    for (r = 0; r < cfg.world_size; ++r) pthread_join(threads[r], NULL);
    for (r = 0; r < cfg.world_size; ++r)
        if (jobs[r].failed) {
            fprintf(stderr, "rank %d: %s\n", r, jobs[r].error);
            failed = 1;
        }
    free(jobs);
    free(threads);
    aclnnFinalize();
    aclFinalize();
    if (failed) return 1;
    printf("OK %d ranks\n", cfg.world_size);
    return 0;
}
