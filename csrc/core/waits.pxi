# The waits of a synchronisation, and the GIL they give back (csrc/core/gil_turnstile.h: the threads that
# come back from a wait take the GIL one after another, not all at once).

cdef extern from "core/gil_turnstile.h" nogil:
    int aclnnpy_turnstile_init() noexcept
    void aclnnpy_turnstile_enter() noexcept
    void aclnnpy_turnstile_leave() noexcept

ctypedef int (*sync_with_timeout_fn)(void *stream, int32_t timeout_ms) noexcept nogil

cdef sync_with_timeout_fn sync_with_timeout = NULL

if aclnnpy_turnstile_init() != 0:
    raise RuntimeError("the GIL turnstile's fork handler could not be registered")


def bind_waits(*, uintptr_t sync_with_timeout_address):
    """aclrtSynchronizeStreamWithTimeout of the loaded backend, by address."""
    global sync_with_timeout
    if not sync_with_timeout_address:
        raise ValueError("bind_waits: aclrtSynchronizeStreamWithTimeout needs its address")
    sync_with_timeout = <sync_with_timeout_fn>sync_with_timeout_address


def synchronize_slice(StreamBase stream, int32_t timeout_ms):
    """``aclrtSynchronizeStreamWithTimeout(stream, timeout_ms)``: its status. The GIL is released for the
    wait and taken back through the turnstile."""
    cdef int status
    if sync_with_timeout == NULL:
        raise RuntimeError("no backend is bound (import aclnn_py)")
    with nogil:
        status = sync_with_timeout(<void *>stream.handle, timeout_ms)
        aclnnpy_turnstile_enter()
    aclnnpy_turnstile_leave()
    return status


def _turnstile_enter():
    """Queue at the turnstile and come back holding it (and the GIL): the threads coming back from a
    synchronisation wait behind this one until :func:`_turnstile_leave`. For tests."""
    with nogil:
        aclnnpy_turnstile_enter()


def _turnstile_leave():
    """Let the thread queued behind this one through (after :func:`_turnstile_enter`). For tests."""
    aclnnpy_turnstile_leave()
