# The bases of the hot objects (their fields: csrc/_core.pxd), the backend functions the core calls by
# address, Tensor descriptors, and where a call's outputs may lie.

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object obj, int *overflow) except? -1
    ctypedef object (*newfunc)(void *cls, object args, PyObject *kwargs)  # cls: the PyTypeObject
    ctypedef PyObject *(*allocfunc)(void *cls, Py_ssize_t n_items) except NULL
    ctypedef struct PyTypeObject:
        newfunc tp_new
        allocfunc tp_alloc
        unsigned long tp_flags
        Py_ssize_t tp_vectorcall_offset

ctypedef aclTensor *(*create_tensor_fn)(const int64_t *dims, uint64_t n_dims, int dtype, const int64_t *strides,
                                        int64_t offset, int fmt, const int64_t *storage, uint64_t n_storage,
                                        void *data) noexcept nogil
ctypedef aclnnStatus (*destroy_tensor_fn)(const aclTensor *tensor) noexcept nogil
ctypedef aclnnStatus (*set_tensor_addr_fn)(aclOpExecutor *executor, size_t index, aclTensor *tensor,
                                           void *addr) noexcept nogil
ctypedef aclnnStatus (*destroy_executor_fn)(aclOpExecutor *executor) noexcept nogil
ctypedef int (*refill_fn)(void *const *ptrs, const size_t *sizes, size_t n, void *stream) noexcept nogil
ctypedef int (*barrier_fn)(void *comm, void *stream) noexcept nogil
ctypedef int (*get_device_fn)(int32_t *device) noexcept nogil

cdef create_tensor_fn create_tensor = NULL
cdef destroy_tensor_fn destroy_tensor = NULL
cdef set_tensor_addr_fn set_input_addr = NULL
cdef set_tensor_addr_fn set_output_addr = NULL
cdef destroy_executor_fn destroy_executor = NULL
cdef refill_fn refill_poison = NULL   # the mock's aclmockRefillPoisonAsync; NULL on CANN
cdef barrier_fn hccl_barrier_fn = NULL
cdef get_device_fn get_device_fn_ = NULL
# A launch releases the GIL on CANN, where it may block (a full task queue) while another rank's
# thread must run; the mock's launch only appends to an unbounded queue, and keeping the GIL there
# spares every launch of a thread world a hand-over among its rank threads.
cdef bint launch_releases_gil = True
cdef int format_nd = 0

cdef enum:
    MAX_DIMS = 16       # dimensions of a Tensor the core describes
    MAX_TENSORS = 32    # an operator's inputs and outputs (combine has 19)


def bind_backend(*, uintptr_t create_tensor_address, uintptr_t destroy_tensor_address,
                 uintptr_t set_input_addr_address, uintptr_t set_output_addr_address,
                 uintptr_t destroy_executor_address, int format_nd_value, uintptr_t refill_poison_address=0,
                 uintptr_t hccl_barrier_address=0, uintptr_t get_device_address=0, bint launch_may_block=True):
    """The loaded backend's functions the core calls (the cffi extension's trampolines, by address):
    aclCreateTensor, aclDestroyTensor, aclSetInputTensorAddr, aclSetOutputTensorAddr,
    aclDestroyAclOpExecutor, ACL_FORMAT_ND, HcclBarrier, aclrtGetDevice, and on the mock its poison refill of reused
    memory; `launch_may_block`: a launch (or a barrier's queuing) may block, so the GIL is released
    around it."""
    global create_tensor, destroy_tensor, set_input_addr, set_output_addr, destroy_executor, format_nd
    global refill_poison, launch_releases_gil, hccl_barrier_fn, get_device_fn_
    if not (create_tensor_address and destroy_tensor_address and set_input_addr_address and set_output_addr_address
            and destroy_executor_address):
        raise ValueError("bind_backend: every function needs its address")
    create_tensor = <create_tensor_fn>create_tensor_address
    destroy_tensor = <destroy_tensor_fn>destroy_tensor_address
    set_input_addr = <set_tensor_addr_fn>set_input_addr_address
    set_output_addr = <set_tensor_addr_fn>set_output_addr_address
    destroy_executor = <destroy_executor_fn>destroy_executor_address
    format_nd = format_nd_value
    refill_poison = <refill_fn>refill_poison_address
    hccl_barrier_fn = <barrier_fn>hccl_barrier_address
    get_device_fn_ = <get_device_fn>get_device_address
    launch_releases_gil = launch_may_block


cdef class TensorBase:
    """The fields of aclnn_py.Tensor. It owns the descriptor `desc` unless a result set lends it (then
    the set destroys it): collected with one of its own, the Tensor destroys it, whoever made it."""

    def __dealloc__(self):
        self.drop_desc()

    cdef void drop_desc(self) noexcept:
        """Let the descriptor go: destroyed when it is this Tensor's (``aclDestroyTensor``)."""
        cdef aclTensor *d = <aclTensor *>self.desc
        self.desc = 0
        if d != NULL and self.owns_desc and destroy_tensor != NULL:
            destroy_tensor(d)

    property _ptr:
        """The storage base address (an int; 0 once closed)."""
        def __get__(self):
            return self.ptr_value

        def __set__(self, value):
            self.ptr_value = value
            self.refresh_data()

    property _offset_nbytes:
        """Element 0's offset from the storage base, in bytes."""
        def __get__(self):
            return self.offset_value

        def __set__(self, value):
            self.offset_value = value
            self.refresh_data()

    cdef void refresh_data(self) noexcept:
        """`data` for the values set: read by the compiled calls as a C integer, not as two objects."""
        cdef int overflow = 0
        cdef long long ptr = 0, offset = 0
        self.data = 0
        if type(self.ptr_value) is not int or type(self.offset_value) is not int:
            return
        ptr = PyLong_AsLongLongAndOverflow(self.ptr_value, &overflow)
        if not overflow:
            offset = PyLong_AsLongLongAndOverflow(self.offset_value, &overflow)
        if not overflow and ptr > 0 and offset >= 0:
            self.data = <uintptr_t>ptr + <uintptr_t>offset

    property _desc_addr:
        """The descriptor's address, or None."""
        def __get__(self):
            return self.desc if self.desc else None

    property device:
        """The id of the device the memory lives on; None when unknown."""
        def __get__(self):
            return None if self.dev < 0 else self.dev

        def __set__(self, value):
            self.dev = -1 if value is None else value

    property _span:
        """Bytes from element 0 to one past the last element the view reaches (0 when it has none)."""
        def __get__(self):
            return self.span

        def __set__(self, Py_ssize_t value):
            self.span = value

    property recycled:
        """A result of MoeDistributeBuffer whose result set a later call of the same method took
        again: every read of it raises RecycledError (docs/concepts.md, "Buffer results")."""
        def __get__(self):
            return self.issuer is not None and (<ResultSet>self.issuer).issue != self.issue

    def _describe(self):
        """Make the descriptor (``aclCreateTensor``) when it has none: the storage as 1-D from the base,
        as torch_npu describes it."""
        if not self.desc:
            self.check_readable("pass it to an operator")
            describe(self)

    def close(self):
        """Destroy the descriptor and release this Tensor's claim on its memory now; the memory is freed
        once no view, export, borrower or queued work uses it. Later use raises ClosedError."""
        self.close_now()

    cdef int close_now(self) except -1:
        if not self._open:
            return 0
        self._open = False
        self.drop_desc()
        self.ptr_value = 0
        self.data = 0
        self._mem = self._owner = self._writer = None
        return 0

    def _drop_descriptor(self):
        """Let the descriptor go now: destroyed when it is this Tensor's (``aclDestroyTensor``)."""
        self.drop_desc()

    def _take_descriptor(self):
        """The descriptor's address, no longer this Tensor's to destroy (0 when it has none): for an
        executor that refers to it and outlives the Tensor."""
        if self.desc and not self.owns_desc:
            raise ValueError("a descriptor lent by a result set cannot be taken; clone() the Tensor first")
        address, self.desc = self.desc, 0
        return address

    def _written_nbytes(self):
        """For an output of MoeDistributeBuffer.low_latency_dispatch written row by row: the bytes from
        element 0 its call wrote (the rows received, read from the device: the caller saw the stream
        that wrote the Tensor finish), -1 when unknown or not such an output."""
        return written_nbytes(self)

    def _rows_received(self):
        """For an output of MoeDistributeBuffer.low_latency_dispatch: the rows its call received when a
        download of its result read them already, else -1 (nothing is read here)."""
        if self.issuer is None or (<ResultSet>self.issuer).issue != self.issue:
            return -1
        return (<ResultSet>self.issuer).received_rows(False)

    def _check_readable(self, str operation):
        """ClosedError when closed, RecycledError when a later buffer call took its result set again."""
        self.check_readable(operation)

    cdef int check_readable(self, str operation) except -1:
        if not self._open:
            raise ClosedError(self._label(), operation)
        if self.issuer is not None and (<ResultSet>self.issuer).issue != self.issue:
            raise RecycledError((<ResultSet>self.issuer).recycled_message(self._label(), operation))
        return 0


cdef tuple EMPTY = ()


cdef inline TensorBase view_of(TensorBase t):
    """A new Tensor of `t`'s class with `t`'s layout, address and device, open; no memory, owner, writer
    or descriptor of its own yet."""
    cls = type(t)
    cdef TensorBase v = <TensorBase>(<PyTypeObject *>cls).tp_new(<void *>cls, EMPTY, NULL)
    v.shape, v.dtype, v.strides, v.offset = t.shape, t.dtype, t.strides, t.offset
    v.ptr_value, v.offset_value, v.data = t.ptr_value, t.offset_value, t.data
    v._open, v._contiguous, v._shared, v._rewritten = True, t._contiguous, False, False
    v.dev, v.span = t.dev, t.span
    return v


def private_view(TensorBase t, str hold):
    """A view of `t` with a descriptor of its own (made at its first use), for a repeatable executor:
    rebinding the executor's slot changes that descriptor's address, never `t`'s. What the view keeps of
    `t`'s memory, by `hold`: "export", an export of it (as a Tensor borrowing `t` does: `t` counts as
    exported); "memory", `t`'s own hold on it, for a Tensor nobody else sees (a MoeDistributeBuffer result
    set's output: no export to count, and none whose release tells the mock of host writes); "nothing"."""
    t.check_readable("use its address")
    cdef TensorBase v = view_of(t)
    if hold == "export":
        v._owner = t._export()
    elif hold == "memory":
        v._mem, v._owner = t._mem, t._owner
    elif hold != "nothing":
        raise ValueError(f"private_view: hold is 'export', 'memory' or 'nothing' (got {hold!r})")
    return v


cdef int describe(TensorBase t) except -1:
    """Give `t` its descriptor: its shape, strides and offset over a 1-D storage reaching its last
    element, from its storage base (aclCreateTensor copies the arrays)."""
    cdef int64_t dims[MAX_DIMS]
    cdef int64_t strides[MAX_DIMS]
    cdef int64_t storage, extent = 0, size = 1
    cdef Py_ssize_t i, n = len(t.shape)
    cdef aclTensor *made
    if create_tensor == NULL:
        raise RuntimeError("the compiled core has no backend: aclnn_py.init() binds it")
    if n > MAX_DIMS or len(t.strides) != n:
        raise ValueError(f"a Tensor of {n} dimensions cannot be described (at most {MAX_DIMS})")
    for i in range(n):
        dims[i] = t.shape[i]
        strides[i] = t.strides[i]
        size *= dims[i]
        extent += (dims[i] - 1) * strides[i]
    storage = t.offset + (extent + 1 if size else 0)
    if storage < 0:
        storage = 0
    made = create_tensor(dims if n else NULL, <uint64_t>n, <int>t.dtype, strides if n else NULL, t.offset,
                         format_nd, &storage, 1, <void *><uintptr_t>t.ptr_value)
    if made == NULL:
        raise aclnn_error(161002, "aclCreateTensor")
    t.desc = <uintptr_t>made
    t.owns_desc = True
    return 0


cdef class StreamBase:
    """The fields of aclnn_py.Stream."""

    property _handle:
        """The aclrtStream as an int (0: the default stream)."""
        def __get__(self):
            return self.handle

        def __set__(self, uintptr_t value):
            self.handle = value

    property _device:
        """The device the stream belongs to, or None (a borrowed handle)."""
        def __get__(self):
            return None if self.dev < 0 else self.dev

        def __set__(self, value):
            self.dev = -1 if value is None else value


cdef class StreamStateBase:
    """The fields of a stream's stream-ordered state (aclnn_py.runtime.ordered), and its segments' two
    steps. A hold goes into the open segment (``current``); a boundary — a checkpoint or the start of
    a synchronisation — closes it and opens the next. Everything in a closed segment was held after
    its launch was queued, so before the boundary: once the stream has passed the boundary the whole
    segment is released at once. Callers hold ordered's lock."""

    cdef Py_ssize_t close_segment(self) except -1:
        closed = self.first + len(self.segments) - 1
        self.current = []
        self.segments.append(self.current)
        return closed

    cdef int drop_passed(self, Py_ssize_t number, list released) except -1:
        segments = self.segments
        while self.first <= number and len(segments) > 1:
            released.append(segments.popleft())
            self.first += 1
        return 0

    def boundary(self):
        """Close the open segment; its number."""
        return self.close_segment()

    def drop_through(self, Py_ssize_t number, list released):
        """Take the segments up to `number`, which the stream has passed, into `released` (the caller
        drops them after releasing the lock)."""
        self.drop_passed(number, released)

    property workspace:
        """The stream's workspace block (a DeviceMemory), or None."""
        def __get__(self):
            return self.block

        def __set__(self, mem):
            self.block = mem
            self.ws_ptr = 0 if mem is None else <uintptr_t>mem._ptr
            self.ws_size = 0 if mem is None else <uintptr_t>mem.size


cdef class ConfigBase:
    """The fields of aclnn_py.ops.MoeConfig that a call reads."""


cdef class PackedBase:
    """A config's attribute arrays for one operator's run helper (made by MoeConfig.packed)."""

    property ints_address:
        def __get__(self):
            return <uintptr_t>self.ints

        def __set__(self, uintptr_t value):
            self.ints = <const int64_t *>value

    property strings_address:
        def __get__(self):
            return <uintptr_t>self.strings

        def __set__(self, uintptr_t value):
            self.strings = <const char **>value


# ---- where a call's outputs lie ----
cdef inline bint overlap(TensorBase a, TensorBase b) noexcept:
    return a.span > 0 and b.span > 0 and a.data < b.data + <uintptr_t>b.span and b.data < a.data + <uintptr_t>a.span


cdef str placement_problem(tuple in_names, PyObject **ins, Py_ssize_t n_in, tuple out_names, PyObject **outs,
                           Py_ssize_t n_out, int device):
    """What is wrong with where a call's caller-given outputs lie, or None: two outputs overlapping, an
    output overlapping an input (the operator would read what it writes), an output on another device
    than the call's stream (`device`, -1: unknown). `ins`/`outs`: Tensors or NULL, named in that order."""
    cdef Py_ssize_t i, j
    cdef TensorBase o
    for j in range(n_out):
        if outs[j] == NULL:
            continue
        o = <TensorBase>outs[j]
        if device >= 0 and o.dev >= 0 and o.dev != device:
            return (f"outputs: {out_names[j]} is on device {o.dev}, but the call's stream is on device "
                    f"{device}")
        for i in range(j):
            if outs[i] != NULL and overlap(o, <TensorBase>outs[i]):
                return (f"outputs: {out_names[i]} and {out_names[j]} overlap in memory (each output needs "
                        f"memory of its own)")
        for i in range(n_in):
            if ins[i] != NULL and overlap(o, <TensorBase>ins[i]):
                return (f"outputs: {out_names[j]} overlaps the input {in_names[i]} in memory (the operator "
                        f"would read what it writes)")
    return None


cdef int fill_table(object values, PyObject **table, Py_ssize_t n) except -1:
    """`table[i]` = the i-th of `values` when it is a Tensor, else NULL (borrowed: `values` keeps them)."""
    cdef Py_ssize_t i = 0
    if len(values) > n:
        raise ValueError(f"at most {n} tensors")
    for v in values:
        table[i] = <PyObject *>v if isinstance(v, TensorBase) else NULL
        i += 1
    while i < n:
        table[i] = NULL
        i += 1
    return 0


def destroy_descriptor(uintptr_t address):
    """``aclDestroyTensor`` of a descriptor taken from a Tensor (``_take_descriptor``); 0: nothing."""
    if address and destroy_tensor != NULL:
        destroy_tensor(<aclTensor *>address)


def check_placement(tuple in_names, inputs, tuple out_names, outputs, StreamBase stream):
    """Raise ValueError naming both parties when a call's outputs (the caller's Tensors; anything else is
    allocated by the call) overlap each other or its inputs, or lie on another device than `stream`."""
    cdef PyObject *ins[MAX_TENSORS]
    cdef PyObject *outs[MAX_TENSORS]
    fill_table(inputs, ins, MAX_TENSORS)
    fill_table(outputs, outs, MAX_TENSORS)
    problem = placement_problem(in_names, ins, len(inputs), out_names, outs, len(outputs), stream.dev)
    if problem is not None:
        raise ValueError(problem)
