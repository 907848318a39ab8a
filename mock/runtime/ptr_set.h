// A set of pointers in one flat table (open addressing, linear probing, at most half full,
// backward-shift erasure, no tombstones). A lookup, insertion or erasure reads one or two cache
// lines where std::unordered_set walks a bucket's linked nodes and the node before the one erased:
// the registries of live handles hold tens of thousands of entries in a thread world of a thousand
// ranks, and its teardown erases them all with the table out of cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace aclmock {

class PtrSet {
public:
    bool contains(const void *p) const {
        const uintptr_t key = reinterpret_cast<uintptr_t>(p);
        if (!key) return false;
        for (size_t i = home(key);; i = next(i)) {
            if (slots_[i] == key) return true;
            if (!slots_[i]) return false;
        }
    }

    // False when p was already in the set (or is NULL, which it never holds).
    bool insert(const void *p) {
        const uintptr_t key = reinterpret_cast<uintptr_t>(p);
        if (!key) return false;
        if (2 * (count_ + 1) > slots_.size()) grow();
        size_t i = home(key);
        for (; slots_[i]; i = next(i))
            if (slots_[i] == key) return false;
        slots_[i] = key;
        ++count_;
        return true;
    }

    // False when p was not in the set.
    bool erase(const void *p) {
        const uintptr_t key = reinterpret_cast<uintptr_t>(p);
        if (!key) return false;
        size_t hole = home(key);
        for (; slots_[hole] != key; hole = next(hole))
            if (!slots_[hole]) return false;
        // Close the hole: a later entry of the same run moves back into it unless its home lies
        // cyclically in (hole, j], where a lookup for it would then stop at the hole.
        for (size_t j = next(hole); slots_[j]; j = next(j)) {
            const size_t h = home(slots_[j]);
            const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
            if (!stays) {
                slots_[hole] = slots_[j];
                hole = j;
            }
        }
        slots_[hole] = 0;
        --count_;
        return true;
    }

    size_t size() const { return count_; }

private:
    // Fibonacci hashing: the multiply spreads pointers (16-byte aligned, often close together) over
    // the top bits, which index the table.
    size_t home(uintptr_t key) const { return size_t((uint64_t(key) * 0x9E3779B97F4A7C15ULL) >> shift_); }
    size_t next(size_t i) const { return (i + 1) & (slots_.size() - 1); }

    void grow() {
        std::vector<uintptr_t> old(slots_.size() * 2, 0);
        old.swap(slots_);
        --shift_;
        for (uintptr_t key : old)
            if (key) {
                size_t i = home(key);
                while (slots_[i]) i = next(i);
                slots_[i] = key;
            }
    }

    std::vector<uintptr_t> slots_ = std::vector<uintptr_t>(kInitialSlots, 0);   // 0: empty
    size_t count_ = 0;
    static constexpr size_t kInitialSlots = 64;
    unsigned shift_ = 64 - 6;   // log2(kInitialSlots) top bits index the table
};

}  // namespace aclmock
