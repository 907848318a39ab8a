// The two other ways CANN programs form a world, both built on the rendezvous of rendezvous.cpp:
//
// * HcclCommInitAll(ndev, devices, comms): one call, from one thread, makes the communicators of
//   every device of the process (comms[i] is rank i, its window on devices[i]). CANN's op samples
//   call it once per domain from the main thread, then drive each rank from a thread of its own.
//   The ranks must meet, so each rank's rendezvous runs on a helper thread of this call; the call
//   returns once all have formed, or fails as a whole (the communicators that formed are
//   destroyed), with the first failing rank's message.
// * HcclCommInitClusterInfo(rankTable, rank, comm): each rank calls it, from any thread or
//   process, with the same rank table file (CANN's JSON: server_list[].device[] entries with
//   "device_id" and "rank_id"). The mock reads the entries, checks that the rank ids are 0..N-1,
//   and derives the world id from the file's path and contents, so every caller of one file meets
//   in one world.
#include <limits.h>
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "hccl/hccl.h"
#include "hccl/hccl_internal.h"

namespace aclmock {
namespace hccl {
namespace {

constexpr const char *kInitAll = "HcclCommInitAll";
constexpr const char *kClusterInfo = "HcclCommInitClusterInfo";

int check_init_all_args(uint32_t ndev, const int32_t *devices, const HcclComm *comms) {
    if (!devices) return fail(HCCL_E_PTR, "%s: devices is NULL", kInitAll);
    if (!comms) return fail(HCCL_E_PTR, "%s: comms (output) is NULL", kInitAll);
    if (std::string why = hccl_env_error(); !why.empty()) return fail(HCCL_E_PARA, "%s: %s", kInitAll, why.c_str());
    if (ndev < 1 || ndev > static_cast<uint32_t>(kMaxRanks))
        return fail(HCCL_E_PARA, "%s: ndev must be in [1, %d] (got %u)", kInitAll, kMaxRanks, ndev);
    std::map<int32_t, uint32_t> seen;
    for (uint32_t i = 0; i < ndev; ++i) {
        int32_t d = devices[i];
        if (d < 0 || d >= config().device_count)
            return fail(HCCL_E_PARA, "%s: devices[%u] must be a device id in [0, %d) (got %d)", kInitAll, i,
                        config().device_count, d);
        auto [it, fresh] = seen.emplace(d, i);
        if (!fresh)
            return fail(HCCL_E_PARA, "%s: devices[%u] and devices[%u] are both device %d (the list must not "
                        "repeat a device)", kInitAll, it->second, i, d);
    }
    return HCCL_SUCCESS;
}

struct RankOutcome {
    int rc = HCCL_SUCCESS;
    HcclComm comm = nullptr;
    std::string message;
};

// ---- rank tables ---------------------------------------------------------------------------------
struct RankEntry {
    int64_t rank = -1;
    int64_t device = -1;
};

// The device entries of a rank table: every innermost JSON object that names a rank_id.
std::vector<RankEntry> rank_entries(const std::string &text) {
    static const std::regex field("\"(rank_id|device_id)\"\\s*:\\s*\"?\\s*(-?[0-9]+)");
    std::vector<RankEntry> out;
    size_t open = std::string::npos;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '{') {
            open = i;
        } else if (text[i] == '}' && open != std::string::npos) {
            RankEntry e;
            const std::string obj = text.substr(open, i - open);
            for (std::sregex_iterator m(obj.begin(), obj.end(), field), end; m != end; ++m)
                ((*m)[1] == "rank_id" ? e.rank : e.device) = std::stoll((*m)[2]);
            if (e.rank != -1 || obj.find("\"rank_id\"") != std::string::npos) out.push_back(e);
            open = std::string::npos;
        }
    }
    return out;
}

uint64_t fnv1a(const std::string &s, uint64_t h = 0xcbf29ce484222325ULL) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    return h;
}

// Reads and checks the table; on success *nranks and *device (the table's device of `rank`) are set
// and *b holds the world of this file.
int read_rank_table(const char *path, uint32_t rank, uint32_t *nranks, int32_t *device, RootBlob *b) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return fail(HCCL_E_OPEN_FILE_FAILURE, "%s: cannot open the rank table file %s", kClusterInfo, path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::vector<RankEntry> entries;
    try {
        entries = rank_entries(text);
    } catch (const std::exception &) {
        return fail(HCCL_E_PARA, "%s: %s: a rank_id or device_id is not a number", kClusterInfo, path);
    }
    if (entries.empty())
        return fail(HCCL_E_PARA, "%s: %s names no device (server_list[].device[] entries with \"rank_id\")",
                    kClusterInfo, path);
    const int64_t n = static_cast<int64_t>(entries.size());
    if (n > kMaxRanks)
        return fail(HCCL_E_PARA, "%s: %s has %lld ranks; at most %d are supported", kClusterInfo, path,
                    static_cast<long long>(n), kMaxRanks);
    std::vector<int32_t> device_of(n, -1);
    for (const RankEntry &e : entries) {
        if (e.rank < 0 || e.rank >= n || device_of[e.rank] != -1)
            return fail(HCCL_E_PARA, "%s: %s: the rank_id values must be 0..%lld, each once (found %lld %s)",
                        kClusterInfo, path, static_cast<long long>(n - 1), static_cast<long long>(e.rank),
                        e.rank >= 0 && e.rank < n ? "twice" : "out of range");
        if (e.device < 0 || e.device >= config().device_count)
            return fail(HCCL_E_PARA, "%s: %s: rank %lld has device_id %lld, not a device id in [0, %d)",
                        kClusterInfo, path, static_cast<long long>(e.rank), static_cast<long long>(e.device),
                        config().device_count);
        device_of[e.rank] = static_cast<int32_t>(e.device);
    }
    if (rank >= static_cast<uint64_t>(n))
        return fail(HCCL_E_PARA, "%s: rank must be < %lld, the number of ranks in %s (got %u)", kClusterInfo,
                    static_cast<long long>(n), path, rank);
    char real[PATH_MAX];
    const std::string where = realpath(path, real) ? real : path;
    memset(b, 0, sizeof *b);
    b->magic = kRootMagic;
    b->version = kRootVersion;
    b->world_id = fnv1a(text, fnv1a(where + '\0'));
    if (b->world_id == 0) b->world_id = 1;
    *nranks = static_cast<uint32_t>(n);
    *device = device_of[rank];
    return HCCL_SUCCESS;
}

}  // namespace
}  // namespace hccl
}  // namespace aclmock

using namespace aclmock;
using namespace aclmock::hccl;

extern "C" HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms) {
    if (int rc = check_init_all_args(ndev, devices, comms)) return static_cast<HcclResult>(rc);
    const RootBlob b = new_root_blob();
    std::vector<RankOutcome> outcomes(ndev);
    std::vector<std::thread> ranks;
    ranks.reserve(ndev);
    for (uint32_t i = 0; i < ndev; ++i)
        ranks.emplace_back([&, i] {
            RankOutcome &o = outcomes[i];
            o.rc = join_world(b, ndev, i, devices[i], &o.comm);
            if (o.rc) o.message = take_error();
        });
    for (std::thread &t : ranks) t.join();
    const RankOutcome *failed = nullptr;
    uint32_t failed_rank = 0;
    for (uint32_t i = 0; i < ndev && !failed; ++i)
        if (outcomes[i].rc) {
            failed = &outcomes[i];
            failed_rank = i;
        }
    if (failed) {
        for (RankOutcome &o : outcomes)
            if (o.rc == HCCL_SUCCESS) HcclCommDestroy(o.comm);
        return static_cast<HcclResult>(fail(failed->rc, "%s: rank %u (device %d) failed, so no communicator was "
                                            "made: %s", kInitAll, failed_rank, devices[failed_rank],
                                            failed->message.c_str()));
    }
    for (uint32_t i = 0; i < ndev; ++i) comms[i] = outcomes[i].comm;
    return HCCL_SUCCESS;
}

extern "C" HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm) {
    if (!clusterInfo) return static_cast<HcclResult>(fail(HCCL_E_PTR, "%s: clusterInfo is NULL", kClusterInfo));
    if (!comm) return static_cast<HcclResult>(fail(HCCL_E_PTR, "%s: comm (output) is NULL", kClusterInfo));
    if (std::string why = hccl_env_error(); !why.empty())
        return static_cast<HcclResult>(fail(HCCL_E_PARA, "%s: %s", kClusterInfo, why.c_str()));
    RootBlob b;
    uint32_t nranks = 0;
    int32_t table_device = -1;
    if (int rc = read_rank_table(clusterInfo, rank, &nranks, &table_device, &b)) return static_cast<HcclResult>(rc);
    const int32_t current = current_device();
    if (current >= 0 && current != table_device)
        return static_cast<HcclResult>(fail(HCCL_E_PARA,
            "%s: rank %u is device_id %d in %s, but the calling thread's device is %d (call aclrtSetDevice(%d) "
            "first)", kClusterInfo, rank, table_device, clusterInfo, current, table_device));
    return static_cast<HcclResult>(join_world(b, nranks, rank, table_device, comm));
}
