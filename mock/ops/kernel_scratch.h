// Scratch of the MoE kernels that lives outside their workspace (private to mock/ops), as an AI core
// keeps such values in its own on-chip buffer. A thread world runs hundreds of ranks in turn on one
// CPU: by the time a rank runs again its workspace has left the cache, and zeroing a W-entry counter
// array there (or an H-float accumulator) cost a cache miss per line, W of them per rank and round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#pragma GCC visibility push(hidden)

namespace aclmock {
namespace moe {

// Counters [0, n) that read 0 at the start of every call, for the part of a kernel that runs on one
// thread without pausing (its send): each call advances the thread's epoch, and a counter holds a
// value only if it was set in this epoch, so a call touches the counters it uses, not all n.
class CallCounters {
public:
    // This thread's counters, all 0 from here until the next begin() on this thread.
    static CallCounters &begin(size_t n) {
        thread_local CallCounters c;
        if (++c.epoch_ == 0) {   // after 2^32 calls the oldest stamps would read as current
            for (Slot &s : c.slots_) s.epoch = 0;
            c.epoch_ = 1;
        }
        if (c.slots_.size() < n) c.slots_.resize(n);
        return c;
    }
    int32_t get(size_t i) const { return slots_[i].epoch == epoch_ ? slots_[i].value : 0; }
    void set(size_t i, int32_t v) { slots_[i] = Slot{epoch_, v}; }

private:
    struct Slot {
        uint32_t epoch = 0;
        int32_t value = 0;
    };
    std::vector<Slot> slots_;
    uint32_t epoch_ = 0;
};

// Float rows lent last-returned first, process-wide: the ranks taking turns on a CPU reuse the row
// the rank before them left in its cache. A loan is returned when it goes out of scope.
class ScratchFloats {
public:
    explicit ScratchFloats(size_t n) {
        Pool &p = pool();
        std::lock_guard<std::mutex> lk(p.mu);
        while (!p.free.empty() && !row_) {
            Row r = p.free.back();
            p.free.pop_back();
            if (r.capacity >= n) row_ = r;
            else std::free(r.data);
        }
        if (!row_) row_ = Row{allocate(n), n};
    }
    ~ScratchFloats() {
        Pool &p = pool();
        std::lock_guard<std::mutex> lk(p.mu);
        p.free.push_back(row_);
    }
    ScratchFloats(const ScratchFloats &) = delete;
    ScratchFloats &operator=(const ScratchFloats &) = delete;
    float *data() const { return row_.data; }

private:
    struct Row {
        float *data = nullptr;
        size_t capacity = 0;
        explicit operator bool() const { return data != nullptr; }
    };
    struct Pool {
        std::mutex mu;
        std::vector<Row> free;   // the last one returned at the back
    };
    static Pool &pool() {
        static Pool *p = new Pool;   // never destroyed: kernels may run while the process exits
        return *p;
    }
    static float *allocate(size_t n) {
        const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
        void *d = std::aligned_alloc(64, bytes ? bytes : 64);
        if (!d) throw std::bad_alloc();
        return static_cast<float *>(d);
    }
    Row row_;
};

}  // namespace moe
}  // namespace aclmock

#pragma GCC visibility pop
