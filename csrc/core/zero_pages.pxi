# Host memory that reads as zero where nothing was copied, for the downloads that copy a part of a
# Tensor (a dispatch result's received rows): fresh anonymous pages, which take memory only once
# written. A fresh mapping costs an mmap, and when its array dies a munmap: 19 us for 1.5 MiB with
# one page written, as much as the rest of a download (a thread world's rank downloads its
# expand_x every host round). A mapping whose array died is kept and handed out again after
# madvise(MADV_DONTNEED) gave its pages back (3.4 us): on Linux its pages then read as zero again,
# and it holds no memory, only address space.

from posix.mman cimport MADV_DONTNEED, MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_READ, PROT_WRITE, madvise, mmap, munmap
from posix.unistd cimport _SC_PAGESIZE, sysconf

from cpython.buffer cimport PyBuffer_FillInfo

cdef enum:
    ZERO_PAGES_KEPT = 4096   # mappings kept for reuse, at most (each rank of a thread world cycles its own)
cdef size_t ZERO_PAGES_KEPT_BYTES = <size_t>4 << 30   # their address space, at most (no memory, but committed)
cdef size_t zero_page_size = <size_t>sysconf(_SC_PAGESIZE)
cdef dict zero_pages_kept = {}   # mapped bytes -> [address, ...] of the mappings kept for reuse
cdef Py_ssize_t zero_pages_count = 0
cdef size_t zero_pages_bytes = 0


@cython.final
cdef class ZeroPages:
    """`nbytes` of host memory reading zero (fresh anonymous pages), exported through the buffer protocol
    (``np.frombuffer``); a mapping kept from an earlier one when one of its size is, given back to be
    kept when the last reference goes."""

    cdef void *addr
    cdef size_t mapped      # nbytes rounded up to whole pages
    cdef Py_ssize_t nbytes

    def __cinit__(self, Py_ssize_t nbytes):
        global zero_pages_count, zero_pages_bytes
        if nbytes <= 0:
            raise ValueError(f"ZeroPages: nbytes must be > 0 (got {nbytes})")
        self.nbytes = nbytes
        self.mapped = (<size_t>nbytes + zero_page_size - 1) // zero_page_size * zero_page_size
        kept = zero_pages_kept.get(self.mapped)
        if kept:
            self.addr = <void *><uintptr_t>kept.pop()
            zero_pages_count -= 1
            zero_pages_bytes -= self.mapped
            return
        cdef void *p = mmap(NULL, self.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if p == MAP_FAILED:
            raise MemoryError(f"ZeroPages: mmap of {self.mapped} bytes failed")
        self.addr = p

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self.addr, self.nbytes, 0, flags)

    def __dealloc__(self):
        global zero_pages_count, zero_pages_bytes
        if self.addr == NULL:  # __cinit__ failed
            return
        # (at interpreter exit the module's dict may be gone: the mapping is unmapped then)
        if zero_pages_kept is not None and zero_pages_count < ZERO_PAGES_KEPT \
                and zero_pages_bytes + self.mapped <= ZERO_PAGES_KEPT_BYTES \
                and madvise(self.addr, self.mapped, MADV_DONTNEED) == 0:
            zero_pages_kept.setdefault(self.mapped, []).append(<uintptr_t>self.addr)
            zero_pages_count += 1
            zero_pages_bytes += self.mapped
        else:
            munmap(self.addr, self.mapped)


def zero_pages_held():
    """(mappings, bytes of address space) kept for reuse by ZeroPages."""
    return zero_pages_count, zero_pages_bytes
