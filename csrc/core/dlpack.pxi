# DLPack, written once: the producer side of Tensor.__dlpack__ (a kDLCPU tensor over mock device memory,
# which is host memory) and the consumer side of Tensor.from_dlpack, plus zero-copy host views of raw
# memory that keep their owner alive. aclnn_py.dlpack holds the Python side (type codes, choices).

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo
from cpython.exc cimport PyErr_Fetch, PyErr_Restore
from cpython.pycapsule cimport PyCapsule_GetName, PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New
from cpython.pycapsule cimport PyCapsule_SetName
from cpython.ref cimport Py_DECREF
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t
from libc.stdlib cimport free, malloc

cdef extern from "Python.h":
    int Py_IsInitialized() nogil


cdef extern from *:
    """
    /* The DLPack 1.1 structures (dlpack.h), declared here so the core needs no header of DLPack's. */
    typedef struct { int32_t device_type; int32_t device_id; } aclnnpy_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } aclnnpy_DLDataType;
    typedef struct {
        void *data; aclnnpy_DLDevice device; int32_t ndim; aclnnpy_DLDataType dtype;
        int64_t *shape; int64_t *strides; uint64_t byte_offset;
    } aclnnpy_DLTensor;
    typedef struct aclnnpy_DLManagedTensor {
        aclnnpy_DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct aclnnpy_DLManagedTensor *self);
    } aclnnpy_DLManagedTensor;
    typedef struct { uint32_t major; uint32_t minor; } aclnnpy_DLPackVersion;
    typedef struct aclnnpy_DLManagedTensorVersioned {
        aclnnpy_DLPackVersion version; void *manager_ctx;
        void (*deleter)(struct aclnnpy_DLManagedTensorVersioned *self); uint64_t flags;
        aclnnpy_DLTensor dl_tensor;
    } aclnnpy_DLManagedTensorVersioned;
    """
    ctypedef struct DLDevice "aclnnpy_DLDevice":
        int32_t device_type
        int32_t device_id
    ctypedef struct DLDataType "aclnnpy_DLDataType":
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct DLTensor "aclnnpy_DLTensor":
        void *data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef struct DLManagedTensor "aclnnpy_DLManagedTensor":
        DLTensor dl_tensor
        void *manager_ctx
        void (*deleter)(DLManagedTensor *) noexcept nogil
    ctypedef struct DLPackVersion "aclnnpy_DLPackVersion":
        uint32_t major
        uint32_t minor
    ctypedef struct DLManagedTensorVersioned "aclnnpy_DLManagedTensorVersioned":
        DLPackVersion version
        void *manager_ctx
        void (*deleter)(DLManagedTensorVersioned *) noexcept nogil
        uint64_t flags
        DLTensor dl_tensor

cdef enum:
    DLPACK_MAJOR = 1
    DLPACK_MINOR = 1
    KDL_CPU = 1
    FLAG_IS_COPIED = 2

cdef const char *NAME = b"dltensor"
cdef const char *NAME_VERSIONED = b"dltensor_versioned"
cdef const char *USED = b"used_dltensor"
cdef const char *USED_VERSIONED = b"used_dltensor_versioned"


cdef struct Export:
    # one allocation per export: the managed tensor the consumer gets, its shape and strides, and the
    # object that keeps the memory allocated until the consumer is done
    DLManagedTensor legacy
    DLManagedTensorVersioned versioned
    PyObject *keep
    int64_t dims[2 * MAX_DIMS]


cdef Py_ssize_t exports_alive = 0   # exports made and not yet given back (read and written with the GIL)


def live_exports():
    """DLPack exports whose consumer (or unconsumed capsule) still holds them."""
    return exports_alive


cdef void release_export(Export *e) noexcept nogil:
    """Let the export go: drop what keeps the memory (with the GIL, from whichever thread the consumer
    calls its deleter on, keeping any exception being handled there), then the allocation."""
    cdef PyObject *kind
    cdef PyObject *value
    cdef PyObject *tb
    if e == NULL:
        return
    if e.keep != NULL and Py_IsInitialized():
        with gil:
            PyErr_Fetch(&kind, &value, &tb)
            global exports_alive
            exports_alive -= 1
            Py_DECREF(<object>e.keep)
            PyErr_Restore(kind, value, tb)
    free(e)


cdef void legacy_deleter(DLManagedTensor *m) noexcept nogil:
    release_export(<Export *>m.manager_ctx)


cdef void versioned_deleter(DLManagedTensorVersioned *m) noexcept nogil:
    release_export(<Export *>m.manager_ctx)


cdef void capsule_destructor(object capsule) noexcept:
    """A capsule dropped unconsumed gives its export back (a consumed one was renamed "used_…")."""
    cdef void *p
    if PyCapsule_IsValid(capsule, NAME):
        p = PyCapsule_GetPointer(capsule, NAME)
        legacy_deleter(<DLManagedTensor *>p)
    elif PyCapsule_IsValid(capsule, NAME_VERSIONED):
        p = PyCapsule_GetPointer(capsule, NAME_VERSIONED)
        versioned_deleter(<DLManagedTensorVersioned *>p)


def dlpack_export(uintptr_t ptr, tuple shape, int code, int bits, tuple strides, uint64_t byte_offset, keep,
                  bint versioned, bint copied):
    """A DLPack capsule over the memory at `ptr` (+ `byte_offset`) as a kDLCPU tensor of DLPack type
    (`code`, `bits`): DLPack 1.x ("dltensor_versioned") when `versioned`. `keep` is held until the
    consumer is done (or the capsule is dropped unconsumed)."""
    cdef Py_ssize_t i, n = len(shape)
    cdef DLTensor *dl
    if n > MAX_DIMS or len(strides) != n:
        raise BufferError(f"a tensor of {n} dimensions cannot be exported (at most {MAX_DIMS})")
    cdef Export *e = <Export *>malloc(sizeof(Export))
    if e == NULL:
        raise MemoryError()
    for i in range(n):
        e.dims[i] = shape[i]
        e.dims[MAX_DIMS + i] = strides[i]
    global exports_alive
    Py_INCREF(keep)
    e.keep = <PyObject *>keep
    exports_alive += 1
    dl = &e.versioned.dl_tensor if versioned else &e.legacy.dl_tensor
    dl.data = <void *>ptr
    dl.device.device_type, dl.device.device_id = KDL_CPU, 0
    dl.ndim = <int32_t>n
    dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = <uint8_t>code, <uint8_t>bits, 1
    dl.shape = e.dims if n else NULL
    dl.strides = e.dims + MAX_DIMS if n else NULL
    dl.byte_offset = byte_offset
    try:
        if versioned:
            e.versioned.version.major, e.versioned.version.minor = DLPACK_MAJOR, DLPACK_MINOR
            e.versioned.manager_ctx = e
            e.versioned.deleter = versioned_deleter
            e.versioned.flags = FLAG_IS_COPIED if copied else 0
            return PyCapsule_New(&e.versioned, NAME_VERSIONED, capsule_destructor)
        e.legacy.manager_ctx = e
        e.legacy.deleter = legacy_deleter
        return PyCapsule_New(&e.legacy, NAME, capsule_destructor)
    except BaseException:
        release_export(e)
        raise


@cython.final
cdef class ImportedMemory:
    """Keeps a consumed DLPack tensor alive; calls the producer's deleter when released or collected."""

    cdef void *managed
    cdef bint is_versioned
    cdef object producer

    def release(self):
        """Hand the tensor back to its producer now."""
        cdef void *m = self.managed
        self.managed = NULL
        self.producer = None
        if m == NULL:
            return
        if self.is_versioned:
            if (<DLManagedTensorVersioned *>m).deleter != NULL:
                (<DLManagedTensorVersioned *>m).deleter(<DLManagedTensorVersioned *>m)
        elif (<DLManagedTensor *>m).deleter != NULL:
            (<DLManagedTensor *>m).deleter(<DLManagedTensor *>m)

    def __dealloc__(self):
        self.release()


def dlpack_import(capsule, producer):
    """Consume a DLPack capsule: (address of element 0, shape, (code, bits), element strides or None,
    DLPack device type, an ImportedMemory keeping it alive). BufferError for a capsule that is not one,
    was consumed, or is of a newer DLPack major version."""
    cdef DLTensor *dl
    cdef ImportedMemory keep = ImportedMemory.__new__(ImportedMemory)
    if PyCapsule_IsValid(capsule, NAME_VERSIONED):
        m = <DLManagedTensorVersioned *>PyCapsule_GetPointer(capsule, NAME_VERSIONED)
        if m.version.major > DLPACK_MAJOR:
            raise BufferError(f"DLPack {m.version.major}.{m.version.minor} is newer than this consumer")
        keep.managed, keep.is_versioned, dl = m, True, &m.dl_tensor
        PyCapsule_SetName(capsule, USED_VERSIONED)  # now ours: the producer's capsule destructor leaves it alone
    elif PyCapsule_IsValid(capsule, NAME):
        legacy = <DLManagedTensor *>PyCapsule_GetPointer(capsule, NAME)
        keep.managed, keep.is_versioned, dl = legacy, False, &legacy.dl_tensor
        PyCapsule_SetName(capsule, USED)
    else:
        raise BufferError("not a DLPack capsule, or one already consumed")
    keep.producer = producer
    if dl.dtype.lanes != 1:
        raise BufferError(f"DLPack tensors with {dl.dtype.lanes} lanes are not supported")
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    strides = tuple(dl.strides[i] for i in range(dl.ndim)) if dl.strides != NULL else None
    return (<uintptr_t>dl.data + dl.byte_offset, shape, (dl.dtype.code, dl.dtype.bits), strides,
            dl.device.device_type, keep)


@cython.final
cdef class HostView:
    """`nbytes` of host memory at `ptr` as a Python buffer (numpy takes it zero-copy), keeping `owner`
    alive as long as any view of it lives."""

    cdef uintptr_t ptr
    cdef Py_ssize_t nbytes
    cdef bint writable
    cdef object owner

    def __cinit__(self, uintptr_t ptr, Py_ssize_t nbytes, owner, bint writable=True):
        if nbytes < 0:
            raise ValueError("HostView: nbytes must be >= 0")
        self.ptr, self.nbytes, self.owner, self.writable = ptr, nbytes, owner, writable

    def __getbuffer__(self, Py_buffer *view, int flags):
        if flags & PyBUF_WRITABLE and not self.writable:
            raise BufferError("HostView: read-only memory")
        PyBuffer_FillInfo(view, self, <void *>self.ptr, self.nbytes, not self.writable, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass
