// The dims (or strides) of a tensor descriptor: a vector of int64 that keeps up to kInline values
// in place. Descriptors are copied into every executor slot at phase 1 and every launch snapshot;
// CANN tensors rarely have more than 8 dims, so those copies allocate nothing. Longer lists (the
// mock accepts up to 64) live on the heap.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace aclmock {

class Dims {
public:
    static constexpr size_t kInline = 8;

    Dims() = default;
    Dims(const Dims &o) { assign(o.begin(), o.end()); }
    Dims(Dims &&o) noexcept { take(o); }
    Dims &operator=(const Dims &o) {
        if (this != &o) assign(o.begin(), o.end());
        return *this;
    }
    // Also the way to give back heap storage: `d = Dims();`.
    Dims &operator=(Dims &&o) noexcept {
        if (this != &o) {
            delete[] heap_;
            take(o);
        }
        return *this;
    }
    ~Dims() { delete[] heap_; }

    size_t size() const { return size_; }
    int64_t *data() { return heap_ ? heap_ : inline_; }
    const int64_t *data() const { return heap_ ? heap_ : inline_; }
    int64_t &operator[](size_t i) { return data()[i]; }
    int64_t operator[](size_t i) const { return data()[i]; }
    int64_t *begin() { return data(); }
    int64_t *end() { return data() + size_; }
    const int64_t *begin() const { return data(); }
    const int64_t *end() const { return data() + size_; }

    void assign(const int64_t *first, const int64_t *last) {
        const size_t n = static_cast<size_t>(last - first);
        if (n > capacity()) regrow(n, 0);
        std::copy(first, last, data());
        size_ = n;
    }
    // New values are 0, as std::vector::resize gives.
    void resize(size_t n) {
        if (n > capacity()) regrow(n, size_);
        if (n > size_) std::fill(data() + size_, data() + n, 0);
        size_ = n;
    }

private:
    size_t capacity() const { return heap_ ? cap_ : kInline; }
    // Moves to a heap buffer of n values, keeping the first `keep`.
    void regrow(size_t n, size_t keep) {
        int64_t *p = new int64_t[n];
        std::copy(data(), data() + keep, p);
        delete[] heap_;
        heap_ = p;
        cap_ = n;
    }
    void take(Dims &o) {
        heap_ = o.heap_;
        cap_ = o.cap_;
        size_ = o.size_;
        if (!heap_) std::copy(o.inline_, o.inline_ + size_, inline_);
        o.heap_ = nullptr;
        o.cap_ = 0;
        o.size_ = 0;
    }

    int64_t *heap_ = nullptr;  // owned; nullptr while the values fit in inline_
    size_t cap_ = 0;           // values heap_ holds
    size_t size_ = 0;
    int64_t inline_[kInline] = {};
};

}  // namespace aclmock
