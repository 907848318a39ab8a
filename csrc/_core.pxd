# The typed state of the objects an operator call reads on every call, shared by the Python classes
# that derive from these bases (aclnn_py.Tensor, aclnn_py.Stream, the stream-ordered state, MoeConfig)
# and by the compiled core (csrc/_core.pyx). Each base is a public class: Cython writes its struct to
# _core.h, which the plan step in C (fastpath/plan.c) includes instead of looking fields up by name.

from libc.stdint cimport int64_t, uint64_t, uintptr_t


cdef extern from "aclnnpy.h":
    ctypedef int aclnnStatus
    ctypedef struct aclTensor
    ctypedef struct aclOpExecutor
    ctypedef void *aclrtStream
    ctypedef aclnnStatus (*aclnnpy_run_fn)(aclTensor **t, const int64_t *a, const char **s, uintptr_t workspace,
                                           uint64_t workspace_cap, aclrtStream stream, uint64_t *workspace_size,
                                           aclOpExecutor **executor, int launch, int *launched) noexcept nogil
    ctypedef aclnnStatus (*aclnnpy_phase2_fn)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                              aclrtStream stream) noexcept nogil
    ctypedef aclnnStatus (*aclnnpy_destroy_fn)(aclOpExecutor *executor) noexcept nogil


cdef public class TensorBase [object aclnnpy_TensorObject, type aclnnpy_TensorType]:
    cdef public object shape        # tuple of ints
    cdef public object dtype        # DataType
    cdef public object _mem         # DeviceMemory owned, or None
    cdef public object _owner       # what keeps borrowed memory valid, or None
    cdef public object _writer      # the Stream whose queued work last wrote it, or None
    cdef public object _ptr         # int: the storage base
    cdef public object _offset_nbytes
    cdef public bint _open
    cdef public bint _contiguous
    cdef uintptr_t desc             # the aclTensor descriptor's address, 0 when it has none


cdef public class StreamBase [object aclnnpy_StreamObject, type aclnnpy_StreamType]:
    cdef public bint _open
    cdef public object _key         # int: names the stream in this process
    cdef uintptr_t handle           # the aclrtStream (0: the default stream)


cdef public class StreamStateBase [object aclnnpy_StreamStateObject, type aclnnpy_StreamStateType]:
    cdef public list current        # the holds of the open segment
    cdef object block               # the workspace DeviceMemory, or None
    cdef uintptr_t ws_ptr, ws_size  # its address and size ((0, 0) without one)


cdef class ConfigBase:
    cdef public set _passed         # (op, BS, H, K) shapes that passed the pre-checks
    cdef public dict _packed        # phase-2 name -> PackedBase
    cdef public tuple _operators    # the phase-2 names of the generation the config's calls use


cdef class PackedBase:
    cdef public object layout       # the RunLayout these arrays follow
    cdef const int64_t *ints
    cdef const char **strings
