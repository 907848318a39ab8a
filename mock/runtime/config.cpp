// Configuration of the mock, read from the environment at first use:
//   ACLNN_MOCK_DEVICE_COUNT  number of devices, 1..1024 (default 16)
//   ACLNN_MOCK_SOC           a SoC name of the Ascend910_93 family (default; the A3 line's names such
//                            as Ascend910_9391), of the Ascend950 family or of the Ascend910B family
//                            (Atlas A2: Ascend910B1 ... Ascend910B4); the profile is chosen by
//                            family prefix (case-insensitive) and aclrtGetSocName reports the name
//                            exactly as given. A name of no known family is refused: aclInit fails
//                            with config_error() until a valid profile is set.
//   ACLNN_MOCK_POISON        0/off/false/no disables the 0xA5 fill of new allocations
//   ACLNN_MOCK_CANN_VERSION  the CANN release whose rules the ops apply where releases differ
//                            (cann_rules_of); a value that is no release is refused like a bad SoC
// A value that cannot be read is refused (config_error(), which aclInit returns) with the variable's
// name and what it accepts (runtime/env.cpp); none falls back to a default.
#include <atomic>
#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "runtime/rt_core.h"

namespace aclmock {
namespace {
constexpr int kMaxDevices = 1024;

std::mutex g_cfg_mu;
std::once_flag g_cfg_once;
Config g_cfg;
std::string g_error;                      // the refused ACLNN_MOCK_SOC, if any
std::atomic<const char *> g_reported{nullptr};   // aclrtGetSocName; nullptr: the profile's own name

// Names handed out by aclrtGetSocName stay valid for the life of the process.
const char *intern(const std::string &name) {
    static auto *names = new std::set<std::string>();   // never destroyed (read during exit)
    return names->insert(name).first->c_str();
}

struct Family {
    const char *prefix;
    Soc soc;
};
constexpr Family kFamilies[] = {{"Ascend910_93", Soc::Ascend910_93}, {"Ascend950", Soc::Ascend950},
                                 {"Ascend910B", Soc::Ascend910B}};

void load_locked() {
    Config c;
    std::string error;
    auto refuse = [&error](const std::string &why) { error += (error.empty() ? "" : "; ") + why; };
    std::string why;
    long long count;
    if (env_whole("ACLNN_MOCK_DEVICE_COUNT", 1, kMaxDevices, c.device_count, &count, &why))
        c.device_count = static_cast<int>(count);
    else
        refuse(why);
    const char *reported = nullptr;
    if (const std::string v = env_text("ACLNN_MOCK_SOC"); !v.empty()) {
        std::string why;
        if (soc_profile_of(v.c_str(), &c.soc, &why))
            reported = intern(v.c_str());
        else
            refuse(format("ACLNN_MOCK_SOC='%s' is refused: %s", v.c_str(), why.c_str()));
    }
    if (const std::string v = env_text("ACLNN_MOCK_CANN_VERSION"); !v.empty()) {
        std::string why;
        if (cann_rules_of(v, &c.rules, &why))
            c.release = v;
        else
            refuse(why);
    }
    if (const char *v = std::getenv("ACLNN_MOCK_POISON"); v && *v) {
        if (!std::strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "false") ||
            !strcasecmp(v, "no"))
            c.poison = false;
        else if (!std::strcmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "true") ||
                 !strcasecmp(v, "yes"))
            c.poison = true;
        else if (!strcasecmp(v, "stripe"))
            c.poison = c.poison_stripe = true;
        else
            refuse(format("ACLNN_MOCK_POISON='%s' cannot be read: give 0, 1, on, off, true, false, yes, no or "
                          "stripe", v));
    }
    g_cfg = c;
    g_error = error;
    g_reported.store(reported);
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
    g_error.clear();
    g_reported.store(nullptr);
}

bool soc_profile_of(const std::string &name, Soc *soc, std::string *why) {
    for (const Family &f : kFamilies)
        if (strncasecmp(name.c_str(), f.prefix, std::strlen(f.prefix)) == 0) {
            *soc = f.soc;
            return true;
        }
    *why = format("'%s' names no SoC the mock simulates; the profile is chosen by family: a name beginning "
                  "Ascend910_93 (Atlas A3, e.g. Ascend910_9391, Ascend910_9392), Ascend910B (Atlas A2, e.g. "
                  "Ascend910B1 ... Ascend910B4) or Ascend950 (e.g. Ascend950PR_..., Ascend950DT_...)", name.c_str());
    return false;
}

bool cann_rules_of(const std::string &value, CannRules *rules, std::string *why) {
    if (value.empty() || !strcasecmp(value.c_str(), "newest")) {
        *rules = CannRules::Newest;
        return true;
    }
    // <major>.<minor>.<RCn | n>[.<suffix>]: digits, a dot, digits, a dot, then RC<digits> or digits
    const char *s = value.c_str();
    char *end = nullptr;
    errno = 0;
    const long major = std::strtol(s, &end, 10);
    // strtol skips blanks and takes signs: each number must start with a digit
    bool ok = *s >= '0' && *s <= '9' && !errno && *end == '.';
    long minor = 0;
    if (ok) {
        const char *m = end + 1;
        minor = std::strtol(m, &end, 10);
        ok = *m >= '0' && *m <= '9' && !errno && *end == '.';
    }
    if (ok) {
        const char *p = end + 1;
        if (!strncasecmp(p, "RC", 2)) p += 2;
        const char *digits = p;
        while (*p >= '0' && *p <= '9') ++p;
        ok = p != digits && (*p == '\0' || *p == '.');
        if (ok && *p == '.') ok = p[1] != '\0';
    }
    if (!ok || major < 1 || minor < 0) {
        *why = format("ACLNN_MOCK_CANN_VERSION='%s' is refused: must be a CANN release such as 8.3.RC1 or 8.5.0 "
                      "(<major>.<minor>.<RCn or n>; releases before 8.5 get the 8.3.RC1 rules) or \"newest\" "
                      "(the default)", value.c_str());
        return false;
    }
    *rules = (major < 8 || (major == 8 && minor < 5)) ? CannRules::R8_3 : CannRules::Newest;
    return true;
}

const char *cann_rules_name(CannRules rules) { return rules == CannRules::R8_3 ? "8.3.RC1" : "newest"; }

bool set_cann_version(const std::string &value, std::string *why) {
    CannRules rules;
    if (!cann_rules_of(value, &rules, why)) return false;
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.rules = rules;
    g_cfg.release = value;
    return true;
}

bool set_soc_name(const std::string &name, std::string *why) {
    Soc soc;
    if (!soc_profile_of(name, &soc, why)) return false;
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.soc = soc;
    g_error.clear();
    g_reported.store(intern(name));
    return true;
}

const char *reported_soc_name() {
    ensure_loaded();
    {
        std::lock_guard<std::mutex> lk(g_cfg_mu);
        if (!g_error.empty()) return nullptr;
    }
    const char *r = g_reported.load();
    return r ? r : soc_name(config().soc);
}

std::string config_error() {
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    return g_error;
}

void set_poison(bool on) {
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.poison = on;
}

void set_poison_stripe(bool stripe) {
    ensure_loaded();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.poison_stripe = stripe;
}

namespace {
std::atomic<bool> g_skip_kernels{false};
}

void set_skip_kernels(bool on) { g_skip_kernels.store(on, std::memory_order_relaxed); }
bool skip_kernels() { return g_skip_kernels.load(std::memory_order_relaxed); }

namespace {
std::atomic<int> g_row_streaming{-1};
}

void set_row_streaming(int mode) { g_row_streaming.store(mode < 0 ? -1 : mode > 0 ? 1 : 0, std::memory_order_relaxed); }
int row_streaming() { return g_row_streaming.load(std::memory_order_relaxed); }

const char *soc_name(Soc soc) {
    switch (soc) {
    case Soc::Ascend950: return "Ascend950";
    case Soc::Ascend910B: return "Ascend910B";
    case Soc::Ascend910_93: break;
    }
    return "Ascend910_93";
}

}  // namespace aclmock
