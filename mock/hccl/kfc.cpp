// The KFC calls that CANN's context builder uses: op arguments, and the op-resource context that the
// context tensor stores as kfcContextAddr (docs/concepts.md describes the context).
#include <atomic>
#include <cctype>
#include <cinttypes>
#include <cstring>
#include <set>

#include "hccl/hccl_internal.h"
#include "hccl/live_set.h"

namespace aclmock {
namespace hccl {

namespace {
std::mutex g_kfc_mu;
std::set<const OpArgs *> &live_args() {
    static auto *s = new std::set<const OpArgs *>();
    return *s;
}
LiveSet<OpResCtx> &live_ctx() {
    static auto *s = new LiveSet<OpResCtx>();
    return *s;
}

bool args_live(const OpArgs *a) {
    std::lock_guard<std::mutex> lk(g_kfc_mu);
    return live_args().count(a) != 0;
}

// "<Op>=level0:<alg>[;level1:<alg>...]" (several ops separated by '/'), checked loosely.
bool alg_config_ok(const std::string &s, std::string *why) {
    if (s.empty()) {
        *why = "it is empty";
        return false;
    }
    size_t pos = 0;
    while (pos <= s.size()) {
        size_t end = s.find('/', pos);
        if (end == std::string::npos) end = s.size();
        std::string item = s.substr(pos, end - pos);
        size_t eq = item.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
            *why = format("\"%s\" is not <op>=<levels>", item.c_str());
            return false;
        }
        for (size_t i = 0; i < eq; ++i)
            if (!isalnum(static_cast<unsigned char>(item[i])) && item[i] != '_') {
                *why = format("op name \"%s\" has a character other than letters, digits and '_'",
                              item.substr(0, eq).c_str());
                return false;
            }
        std::string levels = item.substr(eq + 1);
        size_t lp = 0;
        while (lp <= levels.size()) {
            size_t le = levels.find(';', lp);
            if (le == std::string::npos) le = levels.size();
            std::string lv = levels.substr(lp, le - lp);
            size_t colon = lv.find(':');
            if (lv.compare(0, 5, "level") != 0 || colon == std::string::npos || colon == 5 ||
                colon + 1 == lv.size()) {
                *why = format("\"%s\" is not level<N>:<algorithm>", lv.c_str());
                return false;
            }
            for (size_t i = 5; i < colon; ++i)
                if (!isdigit(static_cast<unsigned char>(lv[i]))) {
                    *why = format("\"%s\" is not level<N>:<algorithm>", lv.c_str());
                    return false;
                }
            lp = le + 1;
        }
        pos = end + 1;
    }
    return true;
}
}  // namespace

// Kernels verify their own context at every launch (live_set.h).
void register_op_ctx(OpResCtx *ctx) { live_ctx().add(ctx); }
void unregister_op_ctx(OpResCtx *ctx) { live_ctx().remove(ctx); }

OpResCtx *verify_op_res_ctx(uint64_t addr) {
    auto *p = reinterpret_cast<OpResCtx *>(static_cast<uintptr_t>(addr));
    if (!live_ctx().contains(p)) return nullptr;
    if (p->magic != kOpResCtxMagic || !p->comm || p->comm->destroyed()) return nullptr;
    return p;
}

void free_comm_op_ctxs(Comm *c) {
    Comm::Impl *m = c->impl();
    std::lock_guard<std::mutex> lk(m->mu);
    for (auto &kv : m->op_ctx) {
        unregister_op_ctx(kv.second);
        kv.second->magic = 0;
        delete kv.second;
    }
    m->op_ctx.clear();
}

}  // namespace hccl
}  // namespace aclmock

using namespace aclmock;
using namespace aclmock::hccl;

extern "C" HcclResult HcclKfcAllocOpArgs(void **opArgs) {
    if (!opArgs) return static_cast<HcclResult>(fail(HCCL_E_PTR, "HcclKfcAllocOpArgs: opArgs is NULL"));
    auto *a = new OpArgs();
    a->magic = kOpArgsMagic;
    a->comm_engine = 0;
    a->engine_set = false;
    a->alg_set = false;
    memset(a->alg_config, 0, sizeof a->alg_config);
    {
        std::lock_guard<std::mutex> lk(g_kfc_mu);
        live_args().insert(a);
    }
    *opArgs = a;
    return HCCL_SUCCESS;
}

static int check_args(void *opArgs, const char *fn) {
    if (!opArgs) return fail(HCCL_E_PTR, "%s: opArgs is NULL", fn);
    if (!args_live(static_cast<OpArgs *>(opArgs)))
        return fail(HCCL_E_PARA, "%s: opArgs %p was not returned by HcclKfcAllocOpArgs or was freed already",
                    fn, opArgs);
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclKfcFreeOpArgs(void *opArgs) {
    if (int rc = check_args(opArgs, "HcclKfcFreeOpArgs")) return static_cast<HcclResult>(rc);
    auto *a = static_cast<OpArgs *>(opArgs);
    {
        std::lock_guard<std::mutex> lk(g_kfc_mu);
        live_args().erase(a);
    }
    a->magic = 0;
    delete a;
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclKfcOpArgsSetCommEngine(void *opArgs, uint8_t commEngine) {
    if (int rc = check_args(opArgs, "HcclKfcOpArgsSetCommEngine")) return static_cast<HcclResult>(rc);
    auto *a = static_cast<OpArgs *>(opArgs);
    a->comm_engine = commEngine;
    a->engine_set = true;
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclKfcOpArgsSetAlgConfig(void *opArgs, char *algConfig) {
    const char *fn = "HcclKfcOpArgsSetAlgConfig";
    if (int rc = check_args(opArgs, fn)) return static_cast<HcclResult>(rc);
    if (!algConfig) return static_cast<HcclResult>(fail(HCCL_E_PTR, "%s: algConfig is NULL", fn));
    size_t n = strnlen(algConfig, 128);
    if (n >= 128)
        return static_cast<HcclResult>(fail(HCCL_E_PARA, "%s: algConfig must be shorter than 128 characters", fn));
    std::string s(algConfig, n), why;
    if (!alg_config_ok(s, &why))
        return static_cast<HcclResult>(fail(HCCL_E_PARA,
            "%s: algConfig \"%s\" is malformed: %s (expected e.g. \"AlltoAll=level0:fullmesh;level1:pairwise\")",
            fn, s.c_str(), why.c_str()));
    auto *a = static_cast<OpArgs *>(opArgs);
    memcpy(a->alg_config, s.c_str(), n + 1);
    a->alg_set = true;
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclCreateOpResCtx(HcclComm comm, uint8_t opType, void *opArgs, void **opResCtx) {
    const char *fn = "HcclCreateOpResCtx";
    if (!comm) return static_cast<HcclResult>(fail(HCCL_E_PTR, "%s: comm is NULL", fn));
    Comm *c = from_handle(comm);
    if (!c)
        return static_cast<HcclResult>(fail(HCCL_E_PARA, "%s: comm %p is not a live communicator", fn, comm));
    if (int rc = check_args(opArgs, fn)) return static_cast<HcclResult>(rc);
    if (!opResCtx) return static_cast<HcclResult>(fail(HCCL_E_PTR, "%s: opResCtx is NULL", fn));
    auto *a = static_cast<OpArgs *>(opArgs);
    Comm::Impl *m = c->impl();
    std::lock_guard<std::mutex> lk(m->mu);
    auto it = m->op_ctx.find(opType);
    if (it != m->op_ctx.end()) {
        *opResCtx = it->second;   // one context per communicator and op type, as HCCL does
        return HCCL_SUCCESS;
    }
    auto *ctx = new OpResCtx();
    ctx->magic = kOpResCtxMagic;
    ctx->comm = c;
    ctx->op_type = opType;
    ctx->comm_engine = a->engine_set ? a->comm_engine : HCCL_COMM_ENGINE_AIV;
    memcpy(ctx->alg_config, a->alg_config, sizeof ctx->alg_config);
    m->op_ctx[opType] = ctx;
    register_op_ctx(ctx);
    *opResCtx = ctx;
    return HCCL_SUCCESS;
}
