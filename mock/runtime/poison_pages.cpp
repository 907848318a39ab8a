// Poison that costs no memory until something writes it. A large block is a private mapping of a
// small memory file full of the poison byte (mapped again for every kPoisonChunk bytes): its pages
// read as poison from the one shared copy, and a page gets memory of its own only when written
// (copy on write). An output sized for the worst case (expand_x holds room for every row a rank
// could receive) then costs the pages of the rows a kernel wrote, not its whole size.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "runtime/rt_core.h"

namespace aclmock {
namespace {
struct PoisonFile {
    int fd = -1;
    uint8_t byte = 0;
};

// One per process, made when a device is first opened (or at the first large allocation); never
// closed (blocks map it until the process ends).
const PoisonFile &poison_file(uint8_t byte) {
    static PoisonFile f;
    static std::once_flag once;
    std::call_once(once, [byte] {
        int fd = memfd_create("aclnn-mock-poison", MFD_CLOEXEC);
        if (fd < 0) return;
        // Filled by write(), not through a mapping: no page fault per page of the file, which
        // was most of what a process's first large allocation cost.
        unsigned char block[64 << 10];
        std::memset(block, byte, sizeof block);
        for (size_t off = 0; off < kPoisonChunk;) {
            const ssize_t n = pwrite(fd, block, std::min(sizeof block, kPoisonChunk - off), static_cast<off_t>(off));
            if (n <= 0) {
                close(fd);
                return;
            }
            off += static_cast<size_t>(n);
        }
        f.fd = fd;
        f.byte = byte;
    });
    return f;
}

size_t page_size() {
    static const size_t n = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return n;
}
}  // namespace

size_t poison_map_bytes(size_t bytes) { return (bytes + page_size() - 1) / page_size() * page_size(); }

void *map_poison(size_t bytes, uint8_t byte) {
    const PoisonFile &f = poison_file(byte);
    if (f.fd < 0 || f.byte != byte || bytes == 0) return nullptr;
    const size_t len = poison_map_bytes(bytes);
    // Reserve the range first so the chunks land next to each other.
    void *base = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    auto *at = static_cast<unsigned char *>(base);
    for (size_t off = 0; off < len; off += kPoisonChunk) {
        const size_t n = len - off < kPoisonChunk ? len - off : kPoisonChunk;
        if (mmap(at + off, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, f.fd, 0) == MAP_FAILED) {
            munmap(base, len);
            return nullptr;   // out of mappings (vm.max_map_count): the caller fills memory instead
        }
    }
    return base;
}

void prepare_poison_pages() {
    const Config &c = config();
    if (c.poison) poison_file(c.poison_byte);
}

void unmap_poison(void *p, size_t bytes) {
    if (p) munmap(p, poison_map_bytes(bytes));
}

}  // namespace aclmock
