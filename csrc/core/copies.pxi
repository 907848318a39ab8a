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


def upload(TensorBase dst, object arr, StreamBase stream):
    """Queue on `stream` a copy of the C-contiguous host array `arr`'s bytes into `dst`'s memory from
    element 0 (at most its span) and hold both until the stream passes it. The GIL is released around
    aclrtMemcpyAsync: from pageable memory it returns once the copy has run (CANN's rule), which may
    wait for work queued before it."""
    cdef Py_buffer view
    cdef int status
    cdef void *handle = <void *>stream.handle
    cdef void *target = <void *>dst.data
    cdef size_t room = <size_t>dst.span
    if memcpy_async == NULL:
        raise RuntimeError("no backend is bound (import aclnn_py)")
    PyObject_GetBuffer(arr, &view, PyBUF_ANY_CONTIGUOUS)  # a strided array raises BufferError
    try:
        if not PyBuffer_IsContiguous(&view, b'C'):
            raise BufferError("upload: the host array must be C-contiguous")
        if <size_t>view.len > room:
            raise ValueError(f"upload: {view.len} bytes into a {room}-byte Tensor")
        if view.len:
            with nogil:
                status = memcpy_async(target, room, view.buf, <size_t>view.len, memcpy_host_to_device, handle)
            if status:
                check_acl(status, "aclrtMemcpyAsync")
    finally:
        PyBuffer_Release(&view)
    hold(stream, (arr, anchor_of(dst)))  # the copy reads `arr` and writes the memory later
    written_on(dst, stream)



def download(object out, uintptr_t src, Py_ssize_t count):
    """Copy `count` bytes from device address `src` into the writable C-contiguous host buffer `out`
    (aclrtMemcpy; the caller has waited for the writers of the source). Where a launch cannot block
    (the mock: this copy is a memmove) the GIL is kept."""
    cdef Py_buffer view
    cdef int status
    if memcpy_sync == NULL:
        raise RuntimeError("no backend is bound (import aclnn_py)")
    PyObject_GetBuffer(out, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        if not PyBuffer_IsContiguous(&view, b'C'):
            raise BufferError("download: the host array must be C-contiguous")
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
