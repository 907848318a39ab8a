// Configuration of the mock, read from the environment at first use:
//   ACLNN_MOCK_DEVICE_COUNT  number of devices, 1..1024 (default 16)
//   ACLNN_MOCK_SOC           Ascend910_93 (default) or Ascend950 (case-insensitive)
//   ACLNN_MOCK_POISON        0/off/false/no disables the 0xA5 fill of new allocations
// A value that is not understood falls back to the default and leaves a note (config_notes()).
#include <atomic>
#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "runtime/rt_core.h"

namespace aclmock {
namespace {
constexpr int kMaxDevices = 1024;

std::mutex g_cfg_mu;
std::once_flag g_cfg_once;
Config g_cfg;
std::string g_notes;

void load_locked() {
    Config c;
    std::string notes;
    if (const char *v = std::getenv("ACLNN_MOCK_DEVICE_COUNT"); v && *v) {
        char *end = nullptr;
        errno = 0;
        long n = std::strtol(v, &end, 10);
        if (errno || end == v || *end || n < 1 || n > kMaxDevices)
            notes += format("ACLNN_MOCK_DEVICE_COUNT='%s' is not an integer in 1..%d; using %d. ", v,
                            kMaxDevices, c.device_count);
        else
            c.device_count = static_cast<int>(n);
    }
    if (const char *v = std::getenv("ACLNN_MOCK_SOC"); v && *v) {
        if (strcasecmp(v, "Ascend910_93") == 0)
            c.soc = Soc::Ascend910_93;
        else if (strcasecmp(v, "Ascend950") == 0)
            c.soc = Soc::Ascend950;
        else
            notes += format("ACLNN_MOCK_SOC='%s' is not Ascend910_93 or Ascend950; using %s. ", v,
                            soc_name(c.soc));
    }
    if (const char *v = std::getenv("ACLNN_MOCK_POISON"); v && *v) {
        if (!std::strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "false") ||
            !strcasecmp(v, "no"))
            c.poison = false;
        else if (!std::strcmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "true") ||
                 !strcasecmp(v, "yes"))
            c.poison = true;
        else
            notes += format("ACLNN_MOCK_POISON='%s' is not 0/1/on/off; poison stays on. ", v);
    }
    if (!notes.empty() && notes.back() == ' ') notes.pop_back();
    g_cfg = c;
    g_notes = notes;
}

void ensure_loaded() {
    std::call_once(g_cfg_once, [] {
        std::lock_guard<std::mutex> lk(g_cfg_mu);
        load_locked();
    });
}
}  // namespace

const Config &config() {
    ensure_loaded();
    return g_cfg;
}

void reload_config() {
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    load_locked();
}

void set_soc(Soc soc) {
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.soc = soc;
}

void set_poison(bool on) {
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.poison = on;
}

namespace {
std::atomic<bool> g_skip_kernels{false};
}

void set_skip_kernels(bool on) { g_skip_kernels.store(on, std::memory_order_relaxed); }
bool skip_kernels() { return g_skip_kernels.load(std::memory_order_relaxed); }

std::string config_notes() {
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    return g_notes;
}

const char *soc_name(Soc soc) {
    switch (soc) {
    case Soc::Ascend950: return "Ascend950";
    case Soc::Ascend910_93: break;
    }
    return "Ascend910_93";
}

double env_double(const char *name, double dflt) {
    const char *v = std::getenv(name);
    if (!v || !*v) return dflt;
    char *end = nullptr;
    errno = 0;
    double d = std::strtod(v, &end);
    if (errno || end == v) return dflt;
    while (*end == ' ' || *end == '\t') ++end;
    return *end ? dflt : d;
}

}  // namespace aclmock
