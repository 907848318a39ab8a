# Copies between host arrays and device memory, from and into the arrays' own buffers. Every
# stream-ordered upload (Tensor.copy_from and from_numpy, an operator's host inputs, a buffer result
# set's kept copies) is one aclrtMemcpyAsync, then one hold keeping the array and the Tensor's memory
# until the stream passes the copy; every download (Tensor.numpy and the rest) one aclrtMemcpy.

from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_IsContiguous, PyBuffer_Release,
                             PyObject_GetBuffer)

from .errors import check_acl

ctypedef int (*memcpy_async_fn)(void *dst, size_t dst_max, const void *src, size_t count, int kind,
                                void *stream) noexcept nogil

ctypedef int (*memcpy_fn)(void *dst, size_t dst_max, const void *src, size_t count, int kind) noexcept nogil

cdef memcpy_async_fn memcpy_async = NULL
cdef memcpy_fn memcpy_sync = NULL
cdef int memcpy_host_to_device = 1   # ACL_MEMCPY_HOST_TO_DEVICE, as the backend states it
cdef int memcpy_device_to_host = 2   # ACL_MEMCPY_DEVICE_TO_HOST


def bind_copies(*, uintptr_t memcpy_async_address, uintptr_t memcpy_address, int host_to_device,
                int device_to_host):
    """aclrtMemcpyAsync and aclrtMemcpy (by address), ACL_MEMCPY_HOST_TO_DEVICE and
    ACL_MEMCPY_DEVICE_TO_HOST of the loaded backend."""
    global memcpy_async, memcpy_sync, memcpy_host_to_device, memcpy_device_to_host
    if not memcpy_async_address or not memcpy_address:
        raise ValueError("bind_copies: aclrtMemcpyAsync and aclrtMemcpy need their addresses")
    memcpy_async = <memcpy_async_fn>memcpy_async_address
    memcpy_sync = <memcpy_fn>memcpy_address
    memcpy_host_to_device, memcpy_device_to_host = host_to_device, device_to_host


cdef int host_buffer(object arr, Py_buffer *view, int flags, str what) except -1:
    """`arr`'s buffer into `view` (the caller releases it), refused unless C-contiguous."""
    PyObject_GetBuffer(arr, view, flags | PyBUF_ANY_CONTIGUOUS)  # a strided array raises BufferError
    if not PyBuffer_IsContiguous(view, b'C'):
        PyBuffer_Release(view)
        raise BufferError(f"{what}: the host array must be C-contiguous")
    return 0


cdef int copy_from_host(uintptr_t dst, size_t room, object arr, object stream) except -1:
    """The C-contiguous host array `arr`'s bytes to device address `dst` (`room` bytes there): queued on
    `stream` by aclrtMemcpyAsync with the GIL released (from pageable memory it returns once the copy has
    run, CANN's rule, which may wait for work queued before it); with `stream` None by aclrtMemcpy, the
    GIL kept where a call cannot block (the mock: a memmove)."""
    cdef Py_buffer view
    cdef int status = 0
    cdef void *handle = NULL
    cdef bint queued = stream is not None
    if memcpy_async == NULL:
        raise RuntimeError("no backend is bound (import aclnn_py)")
    if queued:
        if not isinstance(stream, StreamBase):
            raise TypeError(f"copy to device: expected a Stream, got {type(stream).__name__}")
        handle = <void *>(<StreamBase>stream).handle
    host_buffer(arr, &view, 0, "copy to device")
    try:
        if <size_t>view.len > room:
            raise ValueError(f"copy to device: {view.len} bytes into {room} bytes")
        if view.len and queued:
            with nogil:
                status = memcpy_async(<void *>dst, room, view.buf, <size_t>view.len, memcpy_host_to_device, handle)
        elif view.len and launch_releases_gil:
            with nogil:
                status = memcpy_sync(<void *>dst, room, view.buf, <size_t>view.len, memcpy_host_to_device)
        elif view.len:
            status = memcpy_sync(<void *>dst, room, view.buf, <size_t>view.len, memcpy_host_to_device)
        if status:
            check_acl(status, "aclrtMemcpyAsync" if queued else "aclrtMemcpy")
    finally:
        PyBuffer_Release(&view)
    return 0


def copy_host_to_device(uintptr_t dst, size_t room, object arr, object stream=None):
    """runtime.copy_to_device: see copy_from_host (the caller keeps `arr` alive until the stream passes
    a queued copy)."""
    copy_from_host(dst, room, arr, stream)


def upload(TensorBase dst, object arr, StreamBase stream):
    """Queue on `stream` a copy of the C-contiguous host array `arr`'s bytes into `dst`'s memory from
    element 0 (at most its span) and hold both until the stream passes it (see copy_from_host)."""
    copy_from_host(dst.data, <size_t>dst.span, arr, stream)
    hold(stream, (arr, anchor_of(dst)))  # the copy reads `arr` and writes the memory later
    written_on(dst, stream)


def download(object out, uintptr_t src, Py_ssize_t count):
    """Copy `count` bytes from device address `src` into the writable C-contiguous host buffer `out`
    (aclrtMemcpy; the caller has waited for the writers of the source). Where a call cannot block
    (the mock: this copy is a memmove) the GIL is kept."""
    cdef Py_buffer view
    cdef int status
    if memcpy_sync == NULL:
        raise RuntimeError("no backend is bound (import aclnn_py)")
    host_buffer(out, &view, PyBUF_WRITABLE, "download")
    try:
        if count < 0 or count > view.len:
            raise ValueError(f"download: {count} bytes into a {view.len}-byte host array")
        if count:
            if launch_releases_gil:
                with nogil:
                    status = memcpy_sync(view.buf, <size_t>view.len, <void *>src, <size_t>count,
                                         memcpy_device_to_host)
            else:
                status = memcpy_sync(view.buf, <size_t>view.len, <void *>src, <size_t>count, memcpy_device_to_host)
            if status:
                check_acl(status, "aclrtMemcpy")
    finally:
        PyBuffer_Release(&view)
