// Fault injection registry (aclnn_py._mock.inject_fault / clear_faults), for the reliability tests
// of docs/reliability.md. The registry lives here, in the runtime every other mock library links,
// so one process-wide table serves the HCCL mailbox (which consults it once per collective call)
// and any other hook. Faults are per process: a forked or spawned rank starts with an empty table
// and arms its own.
//
// A fault matches an op name ("dispatch", "combine", "barrier", ...) and a rank (-1 = any rank)
// and fires `count` times (-1 = every time). take_fault() consumes one firing atomically, so with
// thread ranks exactly `count` calls see it.
#include <mutex>
#include <string>
#include <vector>

#include "runtime/rt_core.h"

namespace aclmock {
namespace {
struct Fault {
    std::string op;
    int rank = -1;
    FaultKind kind = FaultKind::None;
    double seconds = 0;
    int remaining = 1;  // -1: unlimited
};

struct FaultTable {
    std::mutex mu;
    std::vector<Fault> faults;
    uint64_t fired = 0;
};

FaultTable &table() {
    static FaultTable *t = new FaultTable;  // never destroyed: consulted by worker threads at exit
    return *t;
}
}  // namespace

void inject_fault(const std::string &op, int rank, FaultKind kind, double seconds, int count) {
    if (kind == FaultKind::None || count == 0) return;
    FaultTable &t = table();
    std::lock_guard<std::mutex> lk(t.mu);
    Fault f;
    f.op = op;
    f.rank = rank;
    f.kind = kind;
    f.seconds = seconds < 0 ? 0 : seconds;
    f.remaining = count < 0 ? -1 : count;
    t.faults.push_back(std::move(f));
}

void clear_faults() {
    FaultTable &t = table();
    std::lock_guard<std::mutex> lk(t.mu);
    t.faults.clear();
}

FaultHit take_fault(const char *op, int rank) {
    FaultHit hit;
    if (!op) return hit;
    FaultTable &t = table();
    std::lock_guard<std::mutex> lk(t.mu);
    for (size_t i = 0; i < t.faults.size(); ++i) {
        Fault &f = t.faults[i];
        if (f.op != op || (f.rank >= 0 && f.rank != rank)) continue;
        hit.kind = f.kind;
        hit.seconds = f.seconds;
        ++t.fired;
        if (f.remaining > 0 && --f.remaining == 0) t.faults.erase(t.faults.begin() + static_cast<long>(i));
        return hit;
    }
    return hit;
}

FaultStats fault_stats() {
    FaultTable &t = table();
    std::lock_guard<std::mutex> lk(t.mu);
    FaultStats s;
    s.armed = t.faults.size();
    s.fired = t.fired;
    return s;
}

const char *fault_kind_name(FaultKind k) {
    switch (k) {
    case FaultKind::Skip: return "skip";
    case FaultKind::Delay: return "delay";
    case FaultKind::Crash: return "crash";
    case FaultKind::None: break;
    }
    return "none";
}

}  // namespace aclmock
