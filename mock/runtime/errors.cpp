// Error messages of the mock runtime: one "recent error" per thread, as CANN's default
// err_msg_mode. aclGetRecentErrMsg returns it and clears it; the pointer it returned stays valid
// until the next aclGetRecentErrMsg call on the same thread.
#include <cstdio>
#include <string>

#include "runtime/rt_core.h"

namespace aclmock {
namespace {
thread_local std::string t_recent;    // the message not yet read
thread_local std::string t_returned;  // the text handed out by the last aclGetRecentErrMsg
}  // namespace

std::string vformat(const char *fmt, va_list ap) {
    char buf[512];
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
    std::string out;
    if (n < 0) {
        out = fmt;
    } else if (static_cast<size_t>(n) < sizeof buf) {
        out.assign(buf, static_cast<size_t>(n));
    } else {
        out.resize(static_cast<size_t>(n) + 1);
        std::vsnprintf(&out[0], out.size(), fmt, ap2);
        out.resize(static_cast<size_t>(n));
    }
    va_end(ap2);
    return out;
}

std::string format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

void set_error(const std::string &msg) { t_recent = msg; }

std::string take_error() {
    std::string s;
    s.swap(t_recent);
    return s;
}

const std::string &peek_error() { return t_recent; }

void clear_error() { t_recent.clear(); }

int fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    t_recent = vformat(fmt, ap);
    va_end(ap);
    return code;
}

}  // namespace aclmock

extern "C" ACLMOCK_API const char *aclGetRecentErrMsg(void) {
    using namespace aclmock;
    if (t_recent.empty()) return nullptr;
    t_returned.swap(t_recent);
    t_recent.clear();
    return t_returned.c_str();
}
