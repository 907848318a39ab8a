// The environment variables the mock reads, each with one grammar (the Python package checks the same
// ones with the same rules: aclnn_py/env_values.py). A value that cannot be read is refused with the
// variable's name and what it accepts; it is never replaced by a default in silence.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/rt_core.h"

namespace aclmock {

std::string env_trimmed(const char *v) {
    std::string s(v);
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string env_text(const char *name) {
    const char *v = std::getenv(name);
    return v ? env_trimmed(v) : std::string();
}

namespace {
const auto trimmed = env_trimmed;

bool all_digits(const std::string &s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// digits, optionally with a fraction: "2", "0.5", "2.", ".5"
bool decimal(const std::string &s) {
    const auto dot = s.find('.');
    if (dot == std::string::npos) return all_digits(s);
    const std::string whole = s.substr(0, dot), frac = s.substr(dot + 1);
    if (whole.empty() && frac.empty()) return false;
    return (whole.empty() || all_digits(whole)) && (frac.empty() || all_digits(frac));
}

}  // namespace

bool env_whole(const char *name, long long lo, long long hi, long long dflt, long long *out, std::string *why) {
    *out = dflt;
    const char *v = std::getenv(name);
    if (!v || !*v) return true;
    const std::string s = trimmed(v);
    // at most 18 digits: every such number fits in a long long
    if (all_digits(s) && s.size() <= 18) {
        const long long n = std::strtoll(s.c_str(), nullptr, 10);
        if (n >= lo && n <= hi) {
            *out = n;
            return true;
        }
    }
    *why = format("%s='%s' cannot be read: give a whole number in [%lld, %lld]", name, v, lo, hi);
    return false;
}

bool env_seconds(const char *name, bool zero_ok, double dflt, double *out, std::string *why) {
    *out = dflt;
    const char *v = std::getenv(name);
    if (!v || !*v) return true;
    const std::string s = trimmed(v);
    if (decimal(s)) {
        const double d = std::strtod(s.c_str(), nullptr);
        if (std::isfinite(d) && (d > 0 || (zero_ok && d == 0))) {
            *out = d;
            return true;
        }
    }
    *why = format("%s='%s' cannot be read: give a number of seconds %s", name, v,
                  zero_ok ? ">= 0 (0: no limit)" : "> 0");
    return false;
}

bool hccl_window_mib(long long *mib, std::string *why) {
    return env_whole("HCCL_BUFFSIZE", 1, kMaxBuffsizeMib, 200, mib, why);
}

bool hccl_exec_timeout(double *seconds, std::string *why) {
    return env_seconds("HCCL_EXEC_TIMEOUT", true, 120, seconds, why);
}

bool hccl_connect_timeout(double *seconds, std::string *why) {
    return env_seconds("HCCL_CONNECT_TIMEOUT", false, 120, seconds, why);
}

std::string hccl_env_error() {
    std::string why;
    long long mib;
    double t;
    if (!hccl_window_mib(&mib, &why) || !hccl_exec_timeout(&t, &why) || !hccl_connect_timeout(&t, &why)) return why;
    return "";
}

}  // namespace aclmock
