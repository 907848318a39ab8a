# The fields of the hot objects, stated once: the compiled core (csrc/_core.pyx and the files it
# includes) reads and writes them as C fields; the Python classes that derive from these bases
# (aclnn_py.Tensor, aclnn_py.Stream, the stream-ordered state, MoeConfig, MoeDistributeBuffer) add
# methods only. aclnn_py/_core.pyi states the same fields for type checkers; tests/test_stubs.py holds
# the two to the same names.

from cpython.ref cimport PyObject
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


cdef class TensorBase:
    cdef public object shape        # tuple of ints: elements per dimension
    cdef public object dtype        # DataType
    cdef public object strides      # tuple of ints: elements between neighbours of each dimension
    cdef public Py_ssize_t offset   # elements from the storage base to element 0
    cdef public object _mem         # the DeviceMemory it owns (or shares with a result set), or None
    cdef public object _owner       # what keeps borrowed memory valid, or None
    cdef public object _writer      # the Stream whose queued work last wrote it, or None
    cdef object ptr_value           # _ptr: int, the storage base (0 once closed)
    cdef object offset_value        # _offset_nbytes: int, element 0's byte offset from the base
    cdef uintptr_t data             # their sum, kept as they are set; 0 unless both are ints, base > 0
    cdef public bint _open
    cdef public bint _contiguous
    cdef public bint _shared        # exported, or read by work on a stream other than its writer's
    cdef public bint _rewritten     # written through the Tensor (a copy, a fill, an operator's output)
    cdef uintptr_t desc             # the aclTensor descriptor's address, 0 when it has none
    cdef bint owns_desc             # the descriptor is this Tensor's to destroy (not a result set's)
    cdef int dev                    # device: the device the memory lives on, -1 when unknown
    cdef Py_ssize_t span            # _span: bytes from element 0 to one past the last element (0 if empty)
    cdef object issuer              # the ResultSet that handed this Tensor out, or None
    cdef Py_ssize_t issue           # the set's issue number when it did
    cdef object __weakref__

    cdef void refresh_data(self) noexcept
    cdef void drop_desc(self) noexcept
    cdef int close_now(self) except -1
    cdef int check_readable(self, str operation) except -1


cdef class StreamBase:
    cdef public bint _open
    cdef public object _key         # an int naming the stream in this process
    cdef uintptr_t handle           # _handle: the aclrtStream (0: the default stream)
    cdef int dev                    # _device: the device it belongs to, -1 when unknown (a borrowed handle)
    cdef object hold_state          # its StreamStateBase as last looked up (valid while hold_epoch is current)
    cdef Py_ssize_t hold_epoch
    cdef object __weakref__


cdef class StreamStateBase:
    cdef public list current        # the holds of the open segment
    cdef public object segments     # a deque of the segments' lists, the open one (current) last
    cdef public Py_ssize_t first    # the number of segments[0]; they are numbered in order
    cdef public object checkpoints  # a deque of (event, number of the segment it closed)
    cdef object block               # workspace: the workspace DeviceMemory, or None
    cdef uintptr_t ws_ptr, ws_size  # its address and size ((0, 0) without one)
    cdef public Py_ssize_t launches         # operator launches queued on the stream so far
    cdef public Py_ssize_t launches_passed  # how many of them a synchronisation saw complete

    cdef Py_ssize_t close_segment(self) except -1
    cdef int drop_passed(self, Py_ssize_t number, list released) except -1


cdef class ConfigBase:
    cdef public set _passed         # (op, BS, H, K): shapes whose pre-checked rules passed; (op, -1, mask): inputs the generation has
    cdef public dict _packed        # phase-2 name -> PackedBase
    cdef public tuple _operators    # the phase-2 names (dispatch, combine) of the generation the config's calls use
    cdef object launchers           # (dispatch Launcher, combine Launcher), made at the first call
    cdef object __weakref__


cdef class PackedBase:
    cdef public object layout       # the RunLayout these arrays follow
    cdef const int64_t *ints
    cdef const char **strings
