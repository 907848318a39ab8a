# The typed state of the objects an operator call reads on every call, shared by the Python classes
# that derive from these bases (aclnn_py.Tensor, aclnn_py.Stream, the stream-ordered state, MoeConfig)
# and by the compiled core (csrc/_core.pyx), which reads their fields instead of looking them up by name.

cimport cython
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
    ctypedef aclnnStatus (*aclnnpy_destroy_fn)(aclOpExecutor *executor) noexcept nogil
    cdef struct aclnnpy_plan             # a plan's executor, slots and `busy` flag (csrc/plan.c)

# the cffi extension's plan helpers (csrc/aclnnpy.h), called by address
ctypedef aclnnStatus (*aclnnpy_plan_launch_fn)(aclnnpy_plan *plan, aclrtStream stream) noexcept nogil
ctypedef int (*aclnnpy_plan_enter_fn)(aclnnpy_plan *plan) noexcept nogil
ctypedef void (*aclnnpy_plan_leave_fn)(aclnnpy_plan *plan) noexcept nogil


cdef class TensorBase:
    cdef public object shape        # tuple of ints
    cdef public object dtype        # DataType
    cdef public object _mem         # DeviceMemory owned, or None
    cdef public object _owner       # what keeps borrowed memory valid, or None
    cdef public object _writer      # the Stream whose queued work last wrote it, or None
    cdef object ptr_value           # _ptr: int, the storage base
    cdef object offset_value        # _offset_nbytes: int, the view's start within it
    cdef uintptr_t data             # their sum, kept as they are set; 0 unless both are ints, base > 0, offset >= 0
    cdef public bint _open
    cdef public bint _contiguous
    cdef public bint _shared        # exported, or read by work on a stream other than its writer's
    cdef uintptr_t desc             # the aclTensor descriptor's address, 0 when it has none
    cdef int dev                    # device: the id of the device the memory lives on, -1 when unknown
    cdef Py_ssize_t span            # _span: bytes from element 0 to one past the last element (0 if empty)

    cdef void refresh_data(self) noexcept


cdef class StreamBase:
    cdef public bint _open
    cdef public object _key         # int: names the stream in this process
    cdef uintptr_t handle           # the aclrtStream (0: the default stream)
    cdef int dev                    # _device: the device it belongs to, -1 when unknown (a borrowed handle)


cdef class StreamStateBase:
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


@cython.final
cdef class PlanState:
    """A plan's fixed part, what its compiled __call__ reads (aclnn_py.ops.executor.Plan._fast_path)."""
    cdef aclnnpy_plan *plan
    cdef aclnnpy_plan_launch_fn launch
    cdef aclnnpy_plan_enter_fn enter
    cdef aclnnpy_plan_leave_fn leave
    cdef uintptr_t *want_in         # the plan's in_want array
    cdef Py_ssize_t n_values        # arguments a call passes
    cdef Py_ssize_t n_params        # parameters of the plan's __call__ (after self)
    cdef Py_ssize_t slots[64]       # the input slot of each argument
    cdef Py_ssize_t params[64]      # per parameter: the argument it gives, ROLE_STREAM or ROLE_NONE
    cdef list last_in, last_out, bound_in   # shared with the Plan
    cdef list seen_shape            # per slot, SHAPES_SEEN entries: shape objects found equal to the slot's
    cdef tuple own_shape, own_dtype, outputs
    cdef object tensor_type, stream_type, on_failure
    cdef object result              # what a launched call returns: the plan's own outputs
    cdef dict states                # ordered's states by stream key
    cdef object state_type, hold, checkpoint
    cdef Py_ssize_t every

    cdef int step(self, PyObject **values, object stream) except -1
    cdef int bind_and_launch(self, PyObject **values, object stream) except -1
    cdef bint own_outputs(self) noexcept
    cdef uintptr_t address(self, TensorBase t, Py_ssize_t i) except? 0
    cdef object retire(self, object stream, object state, object anchor)
    cdef object state_of(self, object stream)
    cdef bint held_recently(self, StreamStateBase state, object obj, Py_ssize_t window) noexcept


cdef class PlanBase:
    """The base of plan classes."""
    cdef void *_vectorcall          # plan(...)'s entry in a class made by compiled_plan_class
    cdef object _route              # the PlanCall of type(self).__call__, or None
    cdef public PlanState _c_state  # None: every call in Python
    cdef public object _stream      # the stream of the last launch, or None


cdef class KeptOutputs:
    """The outputs of one buffer call, kept so that a later call of the same layout on the same stream
    reuses them once the caller has let go of every one (aclnn_py.buffer)."""
    cdef object config, x_shape, x_dtype, ids_shape
    cdef int present                # which optional inputs the call had (a bit per parameter)
    cdef readonly object outputs    # what the operator wrote: a tuple, or one Tensor
    cdef readonly object result     # what the caller got: a tuple, or the same Tensor
    cdef tuple tensors              # the distinct Tensors of both
    cdef Py_ssize_t expected[16]    # per Tensor: the references this object holds to it
    cdef Py_ssize_t n_blocks
    cdef void *block_ptr[16]        # the Tensors' memory, refilled with poison on the mock at reuse
    cdef size_t block_size[16]

    cdef bint free_on(self, object stream)
    cdef bint matches(self, object config, object x, object ids, int present)
    cdef int refill(self, StreamBase stream) except -1


cdef class BufferRouteState:
    """What one of a buffer's operator methods remembers between calls."""
    cdef public tuple attrs         # the attribute arguments of the last call that made `config`
    cdef public object config       # that call's MoeConfig
    cdef public object stream       # the last Stream whose device was checked against the communicator's
    cdef public list kept           # KeptOutputs, newest last


cdef class BufferBase:
    """The base of MoeDistributeBuffer: what its compiled calls read."""
    cdef public object context      # the int32 context tensor (None: a group-string generation)
    cdef public object comm
    cdef public dict _configs       # config key (DISPATCH_KEY / COMBINE_KEY order) -> MoeConfig
    cdef public list _route_states  # one BufferRouteState per compiled method
