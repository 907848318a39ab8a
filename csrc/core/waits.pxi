# The host waits that a thread world's ranks end together — a stream synchronisation, the join of a
# communicator's world — and the GIL they take back (csrc/core/gil_turnstile.h: the threads that come back
# from such a wait take the GIL one after another, not all at once).

from cpython.exc cimport PyErr_CheckSignals
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

cdef extern from "core/gil_turnstile.h" nogil:
    int aclnnpy_turnstile_init() noexcept
    void aclnnpy_turnstile_enter() noexcept
    void aclnnpy_turnstile_leave() noexcept

ctypedef int (*sync_with_timeout_fn)(void *stream, int32_t timeout_ms) noexcept nogil
ctypedef int (*comm_init_root_info_fn)(uint32_t nranks, const void *root, uint32_t rank, void **comm) noexcept nogil

cdef sync_with_timeout_fn sync_with_timeout = NULL
cdef comm_init_root_info_fn comm_init_root_info_ = NULL
cdef extern from "hccl/hccl_types.h":
    enum: HCCL_ROOT_INFO_BYTES

#: The bytes of an HcclRootInfo (HCCL_ROOT_INFO_BYTES of include/hccl/hccl_types.h).
ROOT_INFO_BYTES = HCCL_ROOT_INFO_BYTES

if aclnnpy_turnstile_init() != 0:
    raise RuntimeError("the GIL turnstile's fork handler could not be registered")


def bind_waits(*, uintptr_t sync_with_timeout_address, uintptr_t comm_init_root_info_address):
    """aclrtSynchronizeStreamWithTimeout and HcclCommInitRootInfo of the loaded backend, by address (the
    trampolines': a symbol the backend lacks fails with its status)."""
    global sync_with_timeout, comm_init_root_info_
    if not sync_with_timeout_address or not comm_init_root_info_address:
        raise ValueError("bind_waits: every function needs its address")
    sync_with_timeout = <sync_with_timeout_fn>sync_with_timeout_address
    comm_init_root_info_ = <comm_init_root_info_fn>comm_init_root_info_address


cdef enum:
    SLICE_MS = 100   # host waits are cut into slices this long: Python runs signal handlers (Ctrl-C) between


cdef int sync_slice(StreamBase stream, int32_t timeout_ms) except? -1:
    """``aclrtSynchronizeStreamWithTimeout(stream, timeout_ms)``: its status. The GIL is released for the
    wait and taken back through the turnstile."""
    cdef int status
    cdef void *handle = <void *>stream.handle
    if sync_with_timeout == NULL:
        raise RuntimeError("no backend is bound (import aclnn_py)")
    with nogil:
        status = sync_with_timeout(handle, timeout_ms)
        aclnnpy_turnstile_enter()
    aclnnpy_turnstile_leave()
    return status


cdef inline double monotonic_seconds() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


def synchronize(StreamBase stream, timeout_ms, failed):
    """The body of ``Stream.synchronize``: wait for the work queued on `stream` in slices of
    100 ms (Ctrl-C raises KeyboardInterrupt in between, the work left queued), at most
    `timeout_ms` (None: no limit), then release what the stream held before the wait began (the holds
    of the segment this closes first). ``failed(status, timed_out, timeout_ms)`` turns a slice's
    non-zero status into the exception to raise, or None to wait another slice; `timed_out`: the
    deadline has passed. Nothing is released when the wait raises."""
    cdef Py_ssize_t launches = 0, closed
    cdef int status
    cdef int32_t slice_ms = SLICE_MS
    cdef double deadline = -1, left_ms
    if timeout_ms is not None:
        deadline = monotonic_seconds() + timeout_ms / 1000.0
    closed = mark_sync(stream, &launches)
    while True:
        if deadline >= 0:
            left_ms = (deadline - monotonic_seconds()) * 1000
            slice_ms = 0 if left_ms <= 0 else <int32_t>min(left_ms, <double>SLICE_MS)
        status = sync_slice(stream, slice_ms)
        if status == 0:
            break
        exc = failed(status, deadline >= 0 and monotonic_seconds() >= deadline, timeout_ms)
        if exc is not None:
            raise exc
        PyErr_CheckSignals()
    sync_passed(stream, closed, launches)


def comm_init_root_info(uint32_t world_size, bytes root, uint32_t rank):
    """``HcclCommInitRootInfo(world_size, root, rank, &comm)``: (status, the communicator's address). The
    GIL is released for the join and taken back through the turnstile."""
    cdef const char *info = root
    cdef void *comm = NULL
    cdef int status
    if comm_init_root_info_ == NULL:
        raise RuntimeError("no backend is bound (import aclnn_py)")
    if len(root) != HCCL_ROOT_INFO_BYTES:
        raise ValueError(f"root: {HCCL_ROOT_INFO_BYTES} bytes of HcclRootInfo expected (got {len(root)})")
    with nogil:
        status = comm_init_root_info_(world_size, <const void *>info, rank, &comm)
        aclnnpy_turnstile_enter()
    aclnnpy_turnstile_leave()
    return status, <uintptr_t>comm


def _turnstile_enter():
    """Queue at the turnstile and come back holding it (and the GIL): the threads coming back from a
    synchronisation wait behind this one until :func:`_turnstile_leave`. For tests."""
    with nogil:
        aclnnpy_turnstile_enter()


def _turnstile_leave():
    """Let the thread queued behind this one through (after :func:`_turnstile_enter`). For tests."""
    aclnnpy_turnstile_leave()
