// A registry of live handles of one kind (communicators, op-resource contexts) that calls check their
// handle against. Handles are checked far more often than made or let go of (a thread world of W ranks
// checks each communicator W times per rank while it builds its contexts; a kernel checks its context at
// every launch), so readers share the lock, and a thread remembers the handle it found live last until
// any handle of the set is removed: a walk of a set holding every rank's handles costs a cache miss per
// level, under a lock all ranks take.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>

#include "runtime/ptr_set.h"

namespace aclmock {
namespace hccl {

template <class T>
class LiveSet {
public:
    // `also()` runs under the same exclusive lock (what must change with the set, e.g. a by-name index).
    template <class F>
    void add(const T *p, F &&also) {
        std::unique_lock<std::shared_mutex> lk(mu_);
        set_.insert(p);
        also();
    }
    void add(const T *p) { add(p, [] {}); }

    // `also(was_live)` runs under the same exclusive lock.
    template <class F>
    void remove(const T *p, F &&also) {
        std::unique_lock<std::shared_mutex> lk(mu_);
        const bool was_live = set_.erase(p);
        // under the lock, so that a reader's count and its lookup agree
        removals_.fetch_add(1, std::memory_order_release);
        also(was_live);
    }
    void remove(const T *p) { remove(p, [](bool) {}); }

    bool contains(const T *p) const {
        thread_local Memo memo;
        const uint64_t removals = removals_.load(std::memory_order_acquire);
        if (memo.set == this && memo.handle == p && memo.removals == removals) return true;
        std::shared_lock<std::shared_mutex> lk(mu_);
        if (!set_.contains(p)) return false;
        memo = Memo{this, p, removals_.load(std::memory_order_relaxed)};
        return true;
    }

    size_t size() const {
        std::shared_lock<std::shared_mutex> lk(mu_);
        return set_.size();
    }

    // `f()` under the shared lock: a read of what add's and remove's `also` keep with the set.
    template <class F>
    auto read(F &&f) const {
        std::shared_lock<std::shared_mutex> lk(mu_);
        return f();
    }

private:
    struct Memo {
        const LiveSet *set = nullptr;
        const T *handle = nullptr;
        uint64_t removals = 0;
    };
    mutable std::shared_mutex mu_;
    std::atomic<uint64_t> removals_{0};
    PtrSet set_;
};

}  // namespace hccl
}  // namespace aclmock
