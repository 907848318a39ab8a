# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, auto_pickle=False
# (auto_pickle off: a copy of a base's C fields would share the handle or descriptor that it releases)
"""aclnn_py._core: the operators' one launch path, compiled (docs/concepts.md, "The compiled steady state").

An operator call ends here whichever way it came: :meth:`OpCore.run` gathers the tensors' descriptors
(making a missing one through ``Tensor.descriptor()``), orders the launch after writes queued on other
streams, runs the extension's run helper (both phases) with the GIL released, grows the stream's
workspace when phase 1 asks for more, holds what the launch uses until the stream passes it, raises a
failed status and marks the outputs' writer. :class:`OpCall` stands where an operator function stood:
a call in the serving shape (device Tensors with descriptors, a MoeConfig whose pre-checks passed for
this shape, given outputs, a Stream) is parsed here and goes straight to the same launch; any other
call goes to the Python function, which converts its arguments and then calls :meth:`OpCore.run`.
A plan's ``__call__`` is a :class:`PlanCall` the same way: its steady state (:class:`PlanState`) rebinds
and launches the plan's repeatable executor here, every other call is the plan's Python ``__call__``.

The objects' state is read through the typed bases of _core.pxd, which the Python classes derive from.
"""

import functools
import inspect

cimport cython
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE


cdef extern from "Python.h":
    object PyObject_Vectorcall(object callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
    Py_ssize_t PyVectorcall_NARGS(size_t nargsf)
    long long PyLong_AsLongLongAndOverflow(object obj, int *overflow) except? -1
    size_t PY_VECTORCALL_ARGUMENTS_OFFSET
    Py_ssize_t Py_REFCNT(PyObject *o)

# the mock's queued poison refill of reused blocks (aclmockRefillPoisonAsync); NULL on CANN
ctypedef int (*refill_fn)(void *const *ptrs, const size_t *sizes, size_t n, void *stream) noexcept nogil
cdef refill_fn refill_async = NULL


# aclCreateTensor, with plain C types for its enum parameters (aclDataType, aclFormat)
ctypedef aclTensor *(*create_tensor_fn)(const int64_t *dims, uint64_t n_dims, int dtype, const int64_t *strides,
                                        int64_t offset, int fmt, const int64_t *storage, uint64_t n_storage,
                                        void *data) noexcept nogil
ctypedef aclnnStatus (*destroy_tensor_fn)(const aclTensor *tensor) noexcept nogil
cdef create_tensor_fn create_tensor = NULL
cdef destroy_tensor_fn destroy_tensor = NULL
cdef int format_nd = 0


def set_descriptor_functions(uintptr_t create, uintptr_t destroy, int fmt):
    """The backend's aclCreateTensor, aclDestroyTensor and ACL_FORMAT_ND, set when it is loaded: an
    operator's compiled call describes a plain input Tensor that has no descriptor yet (a model's new
    activations) as Tensor.descriptor() describes it, and a Tensor collected with a descriptor destroys
    it, whoever made it."""
    global create_tensor, destroy_tensor, format_nd
    create_tensor, destroy_tensor, format_nd = <create_tensor_fn>create, <destroy_tensor_fn>destroy, fmt


cdef enum:
    MAX_DESCRIBED_DIMS = 16  # a Tensor of more dimensions is described by Tensor.descriptor()


cdef bint describe_plain(TensorBase t) except -1:
    """Give `t` its descriptor here when it is contiguous from the start of its storage, with the
    layout Tensor.descriptor() gives (row-major strides, offset 0, 1-D storage of its elements): True
    when made; False leaves it to that method (another layout, or aclCreateTensor refused)."""
    cdef int64_t dims[MAX_DESCRIBED_DIMS]
    cdef int64_t strides[MAX_DESCRIBED_DIMS]
    cdef int64_t storage = 1, step = 1, d
    cdef Py_ssize_t i, n
    cdef aclTensor *made
    if create_tensor == NULL or not t.data or not t._contiguous or type(t.shape) is not tuple \
            or t.offset_value != 0 or not isinstance(t.dtype, int):
        return False
    n = PyTuple_GET_SIZE(t.shape)
    if n > MAX_DESCRIBED_DIMS:
        return False
    for i in range(n - 1, -1, -1):
        d = <object>PyTuple_GET_ITEM(t.shape, i)
        dims[i], strides[i] = d, step
        step *= d if d > 1 else 1
        storage *= d
    made = create_tensor(dims if n else NULL, <uint64_t>n, <int>t.dtype, strides if n else NULL, 0, format_nd,
                         &storage, 1, <void *>t.data)
    if made == NULL:
        return False
    t.desc = <uintptr_t>made
    return True


def set_poison_refill(uintptr_t address):
    """The mock's aclmockRefillPoisonAsync (0: none, as on CANN): outputs a buffer reuses get the
    poison of new memory again, queued on the stream of the call that reuses them."""
    global refill_async
    refill_async = <refill_fn>address


cdef extern from "entry.h":
    ctypedef object (*aclnnpy_route_fn)(PyObject *route, PyObject *const *args, Py_ssize_t nargs,
                                        PyObject *kwnames)
    aclnnpy_route_fn aclnnpy_route_call
    object aclnnpy_entry_type()
    object aclnnpy_method_type()
    object aclnnpy_entry_new(object type, object route)
    object aclnnpy_plan_class(object base, const char *name, const char *doc, Py_ssize_t vectorcall_offset)
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from cpython.mem cimport PyMem_Malloc, PyMem_Free

# 0: every OpCall goes to its Python function (set_enabled()). Read without a lock: a call that races
# a change takes either route, and both give the same result.
cdef bint compiled_enabled = True

cdef enum:
    MAX_TABLE = 64   # descriptor-table entries: an operator's inputs, then its outputs
    MAX_PARAMS = 64  # parameters of an operator function
    SHAPES_SEEN = 4  # per plan input: the shape objects last found equal to its shape (double buffers and more)

# what a parameter of an operator function is to the parser, when it is not a tensor input (>= 0)
cdef enum:
    ROLE_CONFIG = -1
    ROLE_STREAM = -2
    ROLE_OUTPUTS = -3
    ROLE_PRECHECK = -4
    ROLE_NONE = -5   # anything else: the compiled route takes the call only when it is None or not given

ROLES = {"config": ROLE_CONFIG, "stream": ROLE_STREAM, "outputs": ROLE_OUTPUTS, "precheck": ROLE_PRECHECK,
         "none": ROLE_NONE}


def set_enabled(bint flag):
    """False: every operator call goes to its Python function; returns the previous setting."""
    global compiled_enabled
    previous = compiled_enabled
    compiled_enabled = flag
    return previous


def enabled():
    """Whether operator calls in the serving shape take the compiled route."""
    return compiled_enabled


cdef class TensorBase:
    """The typed part of aclnn_py.Tensor. It owns the descriptor whose address `desc` holds: the one
    place that destroys it when the Tensor is collected (Tensor.close() and release_descriptor() destroy
    it earlier and clear the field)."""

    def __dealloc__(self):
        cdef aclTensor *d = <aclTensor *>self.desc
        self.desc = 0
        if d != NULL and destroy_tensor != NULL:
            destroy_tensor(d)

    property _ptr:
        """The storage base address (an int; 0 once closed)."""
        def __get__(self):
            return self.ptr_value

        def __set__(self, value):
            self.ptr_value = value
            self.refresh_data()

    property _offset_nbytes:
        """The view's start within the storage, in bytes."""
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

        def __set__(self, value):
            self.desc = 0 if value is None else <uintptr_t>value

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


cdef class StreamBase:
    """The typed part of aclnn_py.Stream."""

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
    """The typed part of a stream's stream-ordered state (aclnn_py.runtime.ordered)."""

    property workspace:
        """The stream's workspace block (a DeviceMemory), or None."""
        def __get__(self):
            return self.block

        def __set__(self, mem):
            self.block = mem
            self.ws_ptr = 0 if mem is None else <uintptr_t>mem._ptr
            self.ws_size = 0 if mem is None else <uintptr_t>mem.size


cdef class ConfigBase:
    """The typed part of aclnn_py.ops.MoeConfig: what a call reads of it on every call."""


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


cdef inline bint overlap(TensorBase a, TensorBase b) noexcept:
    return a.span > 0 and b.span > 0 and a.data < b.data + <uintptr_t>b.span and b.data < a.data + <uintptr_t>a.span


cdef str placement_problem(tuple in_names, PyObject **ins, Py_ssize_t n_in, tuple out_names, PyObject **outs,
                           Py_ssize_t n_out, int device):
    """What is wrong with where a call's caller-given outputs lie, or None: two outputs overlapping, an
    output overlapping an input (the operator would read what it writes), an output on another device
    than the call's stream (`device`, -1: unknown). `ins`/`outs`: Tensors or NULL, named in that order."""
    cdef Py_ssize_t i, j
    cdef TensorBase o, t
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


def check_placement(tuple in_names, inputs, tuple out_names, outputs, StreamBase stream):
    """Raise ValueError naming both parties when a call's outputs (the caller's Tensors, or None) overlap
    each other or its inputs, or lie on another device than `stream` (see placement_problem)."""
    cdef PyObject *ins[MAX_TABLE]
    cdef PyObject *outs[MAX_TABLE]
    cdef Py_ssize_t i
    if len(inputs) > MAX_TABLE or len(outputs) > MAX_TABLE:
        raise ValueError(f"check_placement: at most {MAX_TABLE} inputs and outputs")
    for i, t in enumerate(inputs):
        ins[i] = <PyObject *>t if isinstance(t, TensorBase) else NULL
    for i, t in enumerate(outputs):
        outs[i] = <PyObject *>t if isinstance(t, TensorBase) else NULL
    problem = placement_problem(in_names, ins, len(inputs), out_names, outs, len(outputs), stream.dev)
    if problem is not None:
        raise ValueError(problem)


cdef class OpCore:
    """An operator's launch: its run helper, phase 2 and the runtime functions it calls."""

    cdef readonly object layout
    cdef object phase1_name, phase2_name
    cdef aclnnpy_run_fn run_fn
    cdef aclnnpy_phase2_fn phase2_fn
    cdef aclnnpy_destroy_fn destroy_fn
    cdef dict states           # ordered's states by stream key
    cdef object state_of       # ordered.state(stream): the stream's state, made when missing
    cdef object checkpoint     # ordered's checkpoint(stream)
    cdef Py_ssize_t every      # holds that make a checkpoint
    cdef object grow           # ordered.workspace(stream, size)
    cdef object order_after_writes
    cdef object raise_status   # raise_status(status, function): raises

    def __init__(self, layout, uintptr_t run, uintptr_t phase2, uintptr_t destroy, dict states, state_of,
                 checkpoint, Py_ssize_t every, grow, order_after_writes, raise_status):
        if not run or not phase2 or not destroy or every < 1:
            raise ValueError("OpCore: run, phase2 and destroy must be addresses, every >= 1")
        if len(layout.inputs) + len(layout.outputs) > MAX_TABLE:
            raise ValueError(f"OpCore: {layout.phase1} has more than {MAX_TABLE} tensors")
        self.layout = layout
        self.phase1_name = layout.phase1
        self.phase2_name = layout.phase2
        self.run_fn = <aclnnpy_run_fn>run
        self.phase2_fn = <aclnnpy_phase2_fn>phase2
        self.destroy_fn = <aclnnpy_destroy_fn>destroy
        self.states = states
        self.state_of = state_of
        self.checkpoint = checkpoint
        self.every = every
        self.grow = grow
        self.order_after_writes = order_after_writes
        self.raise_status = raise_status

    cdef inline PackedBase attrs_of(self, ConfigBase config):
        packed = config._packed.get(self.phase2_name)
        if packed is None or (<PackedBase>packed).layout is not self.layout:
            packed = config.packed(self.layout)  # made once per config and operator
        return <PackedBase>packed

    cdef int gather(self, object tensors, aclTensor **table, list held) except -1:
        """The descriptors of `tensors` (Tensors or None) into `table`, what keeps their memory valid into
        `held`; a Tensor without a descriptor gets one (a closed one raises ClosedError)."""
        cdef Py_ssize_t i = 0
        cdef TensorBase tb
        for t in tensors:
            if t is None:
                table[i] = NULL
            elif isinstance(t, TensorBase):
                tb = <TensorBase>t
                if not tb.desc:
                    t.descriptor()
                table[i] = <aclTensor *>tb.desc
                held.append(tb._mem if tb._mem is not None else tb._owner)
            else:
                raise TypeError(f"{self.phase1_name}: expected Tensors, got {type(t).__name__}")
            i += 1
        return 0

    def run(self, inputs, outputs, ConfigBase config, StreamBase stream):
        """Both phases on `stream` with `inputs` and `outputs` (Tensors or None, in the prototype's
        order) and `config`'s attributes."""
        cdef aclTensor *table[MAX_TABLE]
        cdef list held = []
        cdef Py_ssize_t n_in = len(inputs)
        if n_in != len(self.layout.inputs) or len(outputs) != len(self.layout.outputs):
            raise ValueError(f"{self.phase1_name}: {len(self.layout.inputs)} inputs and "
                             f"{len(self.layout.outputs)} outputs")
        self.gather(inputs, table, held)
        self.gather(outputs, table + n_in, held)
        self.launch(table, held, self.attrs_of(config), stream, inputs, outputs, written_elsewhere(inputs, stream))

    def phase1(self, inputs, outputs, ConfigBase config):
        """Phase 1 only: (workspace size, executor address)."""
        cdef aclTensor *table[MAX_TABLE]
        cdef list held = []
        cdef uint64_t size = 0
        cdef aclOpExecutor *executor = NULL
        cdef int launched = 0
        cdef aclnnStatus status
        cdef PackedBase attrs = self.attrs_of(config)
        cdef Py_ssize_t n_in = len(inputs)
        self.gather(inputs, table, held)
        self.gather(outputs, table + n_in, held)
        with nogil:
            status = self.run_fn(table, attrs.ints, attrs.strings, 0, 0, NULL, &size, &executor, 0, &launched)
        if status:
            self.raise_status(status, self.phase1_name)
        return size, <uintptr_t>executor

    cdef int launch(self, aclTensor **table, list held, PackedBase attrs, StreamBase stream, object inputs,
                    object outputs, bint order) except -1:
        """Phase 1 and the launch; then the holds, the status and the outputs' writer."""
        cdef uint64_t size = 0
        cdef aclOpExecutor *executor = NULL
        cdef int launched = 0
        cdef aclnnStatus status
        cdef uintptr_t ws
        cdef aclrtStream handle = <aclrtStream>stream.handle
        if order:  # an input last written on another stream: this launch waits for that write
            self.order_after_writes(stream, inputs)
        state = self.states.get(stream._key)
        if state is None:
            state = self.state_of(stream)
        cdef StreamStateBase st = <StreamStateBase>state  # kept: the stream may be destroyed meanwhile
        with nogil:
            status = self.run_fn(table, attrs.ints, attrs.strings, st.ws_ptr, st.ws_size, handle, &size, &executor,
                                 1, &launched)
        if not launched:
            if status:
                self.raise_status(status, self.phase1_name)
            try:  # more than the stream's block: grow it, then launch
                ws = <uintptr_t>self.grow(stream, size)
            except BaseException:
                self.destroy_fn(executor)  # never launched: nothing else would destroy it
                raise
            with nogil:
                status = self.phase2_fn(<void *>ws if size else NULL, size, executor, handle)
        # launched: what it uses is held until the stream passes it, whatever the status. Reading the
        # open segment and appending to it is one step under the GIL: no boundary closes it in between.
        current = st.current
        current.append(held)
        if len(current) >= self.every:
            self.checkpoint(stream)
        if status:
            self.raise_status(status, self.phase2_name)
        cdef Py_ssize_t j
        if isinstance(outputs, TensorBase):
            (<TensorBase>outputs)._writer = stream
        elif isinstance(outputs, tuple):
            for j in range(PyTuple_GET_SIZE(outputs)):
                t = <object>PyTuple_GET_ITEM(outputs, j)
                if t is not None:
                    (<TensorBase>t)._writer = stream
        else:
            for t in outputs:
                if t is not None:
                    (<TensorBase>t)._writer = stream
        return 0


cdef inline bint written_elsewhere(object inputs, StreamBase stream):
    """An input's last write was queued on another stream object (ordering then decides by key)."""
    for t in inputs:
        if isinstance(t, TensorBase):
            w = (<TensorBase>t)._writer
            if w is not None and w is not stream:
                return True
    return False


@cython.final
cdef class Parameters:
    """A function's parameter names, and how a vectorcall's arguments bind to them."""

    cdef readonly tuple names       # in order
    cdef dict index                 # name -> position
    cdef Py_ssize_t n, n_positional

    def __init__(self, tuple names, Py_ssize_t n_positional):
        if len(names) > MAX_PARAMS or not 0 <= n_positional <= len(names):
            raise ValueError(f"Parameters: at most {MAX_PARAMS} names, n_positional within them")
        self.names = names
        self.index = {name: i for i, name in enumerate(names)}
        self.n = len(names)
        self.n_positional = n_positional

    cdef bint bind(self, PyObject **given, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) except -1:
        """given[i] = the argument of parameter i, NULL where none was passed (borrowed: the caller's
        live until its call returns). False for a call the function's own code must answer: more
        positional arguments than it takes, an unknown keyword, one given twice."""
        cdef Py_ssize_t i, k, n_kw = 0 if kwnames == NULL else PyTuple_GET_SIZE(<object>kwnames)
        if nargs > self.n_positional:
            return False
        for i in range(self.n):
            given[i] = args[i] if i < nargs else NULL
        for k in range(n_kw):
            i = self.position(PyTuple_GET_ITEM(<object>kwnames, k))
            if i < 0 or given[i] != NULL:
                return False
            given[i] = args[nargs + k]
        return True

    cdef inline Py_ssize_t position(self, PyObject *name) except -2:
        """The parameter `name` names, or -1. Call sites pass the interned names the function's code
        holds, so identity finds them; anything else is looked up by value."""
        cdef Py_ssize_t i
        for i in range(self.n):
            if <PyObject *>PyTuple_GET_ITEM(self.names, i) == name:
                return i
        where = self.index.get(<object>name)
        return -1 if where is None else <Py_ssize_t>where


cdef class OpSpec:
    """How an OpCall reads its function's parameters: per parameter its role (a tensor input's index, or
    ROLE_*), per input what None means, the outputs' type, the pre-check key."""

    cdef OpCore core
    cdef Parameters params       # the function's parameters
    cdef dict index              # parameter name -> position
    cdef Py_ssize_t n_params, n_inputs, n_outputs
    cdef Py_ssize_t roles[MAX_PARAMS]
    cdef tuple none_as           # per input: None (NULL is passed), False (Python's call) or a maker
    cdef tuple in_names, out_names  # the operator's inputs and outputs, as its errors name them
    cdef object tensor_type, stream_type, config_type, outputs_type
    cdef str key_op
    cdef Py_ssize_t key_input[3]
    cdef Py_ssize_t key_dim[3]
    # the pre-check key last built and its (BS, H, K): a value, read and replaced with the GIL held
    cdef tuple last_key
    cdef Py_ssize_t last_dims[3]

    def __init__(self, OpCore core, tuple names, Py_ssize_t n_positional, tuple roles, tuple none_as,
                 outputs_type, tuple key, tensor_type, stream_type, config_type, tuple in_names, tuple out_names):
        cdef Py_ssize_t n = len(names)
        if n > MAX_PARAMS or len(roles) != n or n_positional > n:
            raise ValueError(f"OpSpec: one role per parameter, at most {MAX_PARAMS}")
        self.core = core
        self.n_params = n
        self.params = Parameters(names, n_positional)
        self.index = self.params.index
        self.n_inputs = len(core.layout.inputs)
        self.n_outputs = len(core.layout.outputs)
        if len(in_names) != self.n_inputs or len(out_names) != self.n_outputs:
            raise ValueError("OpSpec: one name per input and per output")
        self.in_names, self.out_names = in_names, out_names
        if len(none_as) != self.n_inputs:
            raise ValueError("OpSpec: none_as has one entry per input")
        for i in range(n):
            if not ROLE_NONE <= roles[i] < self.n_inputs:
                raise ValueError(f"OpSpec: role {roles[i]} of {names[i]} is out of range")
            self.roles[i] = roles[i]
        if outputs_type is None and self.n_outputs != 1:
            raise ValueError("OpSpec: outputs as one Tensor need an operator with one output")
        if outputs_type is not None and not issubclass(outputs_type, tuple):
            raise TypeError("OpSpec: outputs_type must be a tuple type (or None: one Tensor)")
        self.none_as = none_as
        self.outputs_type = outputs_type
        op, *dims = key
        self.key_op = op
        for k in range(3):
            self.key_input[k], self.key_dim[k] = dims[k]
            if not 0 <= self.key_input[k] < self.n_inputs or not 0 <= self.key_dim[k] < 2:
                raise ValueError("OpSpec: a key item is (input index, dim 0 or 1)")
        self.tensor_type = tensor_type
        self.stream_type = stream_type
        self.config_type = config_type

    cdef object call(self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames):
        """The outputs after a launch, or None when the Python function must take the call (before
        anything ran). `args` are the caller's (positional ones, then the values of `kwnames`), borrowed:
        they live until the call returns."""
        cdef PyObject *given[MAX_PARAMS]
        cdef PyObject *ins[MAX_TABLE]
        cdef Py_ssize_t i, role
        cdef bint precheck = True
        if not self.params.bind(given, args, nargs, kwnames):
            return None  # an attribute keyword, a misspelling, a duplicate: Python's
        config = stream = outputs = None
        for i in range(self.n_inputs):
            ins[i] = NULL
        for i in range(self.n_params):
            if given[i] == NULL:
                continue
            role = self.roles[i]
            if role >= 0:
                ins[role] = given[i] if <object>given[i] is not None else NULL
            elif role == ROLE_CONFIG:
                config = <object>given[i]
            elif role == ROLE_STREAM:
                stream = <object>given[i]
            elif role == ROLE_OUTPUTS:
                outputs = <object>given[i]
            elif role == ROLE_PRECHECK:
                if <object>given[i] is not True and <object>given[i] is not False:
                    return None
                precheck = <object>given[i] is True
            elif <object>given[i] is not None:
                return None
        return self.run_parsed(ins, config, stream, outputs, precheck, None, False)

    cdef object run_parsed(self, PyObject **ins, object config, object stream, object outputs, bint precheck,
                           KeptOutputs reused, bint describe):
        """Launch a parsed call (`ins`: the inputs by index, NULL where None; changed where a None input
        stands for a made one) and return `outputs`; None, before anything ran, when the Python function
        must take it. `reused`: outputs a buffer takes again, refilled with poison just before the launch.
        `describe`: an open input Tensor without a descriptor gets one here (a model's new activations)."""
        cdef aclTensor *table[MAX_TABLE]
        cdef Py_ssize_t i
        cdef TensorBase tb
        cdef bint order = False
        cdef list made = None
        cdef object first_made = None
        if type(config) is not self.config_type or type(stream) is not self.stream_type \
                or not (<StreamBase>stream)._open:
            return None  # attributes as keywords, the current stream, a closed stream: Python's
        cdef list held = [None] * (self.n_inputs + self.n_outputs)
        for i in range(self.n_inputs):
            if ins[i] == NULL:
                make = self.none_as[i]
                if make is None:
                    table[i] = NULL
                    continue
                if make is False:
                    return None
                if first_made is None:  # kept alive until the call returns (usually the only one)
                    first_made = make()
                    ins[i] = <PyObject *>first_made
                else:
                    if made is None:
                        made = []
                    made.append(make())
                    ins[i] = <PyObject *>made[len(made) - 1]
            t = <object>ins[i]
            if type(t) is not self.tensor_type:
                return None  # host data, a foreign object: Python converts or refuses it
            tb = <TensorBase>t
            if not tb.desc:
                if not describe or not tb._open:
                    return None  # no descriptor yet, or closed: Python makes it or raises
                if not describe_plain(tb):
                    t.descriptor()
            table[i] = <aclTensor *>tb.desc
            held[i] = tb._mem if tb._mem is not None else tb._owner
            w = tb._writer
            if w is not None and w is not stream:
                order = True
        cdef PyObject *outs[MAX_TABLE]
        if not self.gather_outputs(outputs, table + self.n_inputs, held, self.n_inputs, outs):
            return None
        if reused is None and placement_problem(self.in_names, ins, self.n_inputs, self.out_names, outs,
                                                self.n_outputs, (<StreamBase>stream).dev) is not None:
            return None  # the caller's outputs overlap or lie on another device: Python raises, naming them
        cdef ConfigBase cfg = <ConfigBase>config
        if self.core.phase2_name not in cfg._operators:
            return None  # a config of another generation: the Python function picks its operator
        if precheck and not self.prechecked(cfg, ins):
            return None  # a shape the config has not checked yet: Python checks and records it
        inputs = [None if ins[i] == NULL else <object>ins[i] for i in range(self.n_inputs)] if order else None
        if reused is not None:
            reused.refill(<StreamBase>stream)
        self.core.launch(table, held, self.core.attrs_of(cfg), <StreamBase>stream, inputs, outputs, order)
        return outputs

    cdef bint gather_outputs(self, object outputs, aclTensor **table, list held, Py_ssize_t at,
                             PyObject **outs) except -1:
        """The outputs' descriptors into `table`, anchors into `held` from `at`, the Tensors (or NULL) into
        `outs`; False for outputs the Python function handles."""
        cdef TensorBase tb
        cdef Py_ssize_t j
        if self.outputs_type is None:
            single = True
        elif type(outputs) is self.outputs_type and PyTuple_GET_SIZE(outputs) == self.n_outputs:
            single = False
        else:
            return False  # outputs to allocate, or a mapping: Python's
        for j in range(self.n_outputs):
            # PyTuple_GET_ITEM: a named tuple's items without its class's item lookup
            t = outputs if single else <object>PyTuple_GET_ITEM(outputs, j)
            if t is None and not single:
                table[j] = NULL  # an optional output left NULL: C refuses it where it is needed
                outs[j] = NULL
                continue
            if type(t) is not self.tensor_type:
                return False
            tb = <TensorBase>t
            if not tb.desc:
                return False
            table[j] = <aclTensor *>tb.desc
            outs[j] = <PyObject *>t
            held[at + j] = tb._mem if tb._mem is not None else tb._owner
        return True

    cdef bint prechecked(self, ConfigBase config, PyObject **ins) except -1:
        """The config's pre-checks passed for this call's (BS, H, K) (`ins`: the inputs, all Tensors
        where the key reads them)."""
        cdef Py_ssize_t d[3]
        for k in range(3):
            if ins[self.key_input[k]] == NULL:
                return False
            shape = (<TensorBase>ins[self.key_input[k]]).shape
            if len(shape) != 2:
                return False
            d[k] = shape[self.key_dim[k]]
        key = self.last_key
        if key is None or d[0] != self.last_dims[0] or d[1] != self.last_dims[1] or d[2] != self.last_dims[2]:
            key = (self.key_op, d[0], d[1], d[2])
            self.last_dims[0], self.last_dims[1], self.last_dims[2] = d[0], d[1], d[2]
            self.last_key = key
        return key in config._passed


cdef class Route:
    """What a compiled callable (csrc/entry.h) runs."""

    cdef object call(self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames):
        # the base of OpCall and PlanCall, which define it; a bare Route is never made by the package
        raise TypeError(f"{type(self).__name__} is a Route without a call of its own")


cdef class OpCall(Route):
    """The compiled route of an operator function: `setup(names, n_positional)` gives its OpSpec at the
    first call (None: every call is the function's)."""

    cdef readonly object function
    cdef object setup
    cdef object spec                # None until set up; False: no compiled route
    cdef readonly tuple names       # the function's parameter names
    cdef readonly Py_ssize_t n_positional

    def __init__(self, function, setup):
        if not callable(setup):
            raise TypeError("OpCall: setup must be callable")
        code = function.__code__
        self.function = function
        self.setup = setup
        self.spec = None
        self.names = tuple(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
        self.n_positional = code.co_argcount

    cdef object call(self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames):
        if compiled_enabled:
            spec = self.spec
            if spec is None:
                spec = self.set_up()
            if spec is not False:
                result = (<OpSpec>spec).call(args, nargs, kwnames)
                if result is not None:
                    return result
        return PyObject_Vectorcall(self.function, args, <size_t>nargs, kwnames)

    cdef object set_up(self):
        try:
            spec = self.setup(self.names, self.n_positional)
        except Exception:
            return False  # not now (no runtime yet): the Python function meets the problem and reports it
        if spec is not None and not isinstance(spec, OpSpec):
            raise TypeError("OpCall: setup must return an OpSpec or None")
        if self.spec is None:  # another thread's first call may have set it up meanwhile
            self.spec = False if spec is None else spec
        return self.spec


cdef object route_call(PyObject *route, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames):
    return (<Route>route).call(args, nargs, kwnames)


aclnnpy_route_call = route_call
CompiledOperator = aclnnpy_entry_type()
CompiledPlanCall = aclnnpy_method_type()


def compiled_operator(function, setup):
    """`function` (an operator's Python function) with its compiled route in front: a
    CompiledOperator (csrc/entry.h), called by vectorcall, with the Python function's name, doc and
    signature (``__wrapped__``) and the route as ``compiled`` (an OpCall)."""
    operator = aclnnpy_entry_new(CompiledOperator, OpCall(function, setup))
    functools.update_wrapper(operator, function)
    return operator


# ---- plans ----
# A plan is a repeatable executor with its own buffers; a serving loop calls it with device Tensors of
# the plan's layout, often the same ones as last step. The compiled call records the addresses of the
# Tensors given, calls aclnnpy_plan_launch (csrc/plan.c: rebinding and launch) and marks the outputs'
# writer. The executor reads the memory of the Tensors bound to it whenever a launch runs, so the plan
# keeps their anchors (Tensor._anchor()) in `bound_in`, shared with the Python path; an anchor a call
# replaces is held on the stream until the stream passes the launches that used it. Every other call
# (host arrays, another layout, a closed Tensor or stream, the caller's outputs, a Tensor last written on
# another stream) is the Python __call__'s, before anything was launched.


cdef inline int list_put(list items, Py_ssize_t i, object value) except -1:
    """items[i] = value, without the generic item assignment's call (a plan step makes several)."""
    if not 0 <= i < PyList_GET_SIZE(items):
        raise IndexError("PlanState: a list it shares with the plan changed length")
    cdef PyObject *old = PyList_GET_ITEM(items, i)
    Py_INCREF(value)
    PyList_SET_ITEM(items, i, value)
    Py_XDECREF(old)  # last: its release may run a finalizer
    return 0


cdef class PlanState:

    def __init__(self, uintptr_t launch, uintptr_t enter, uintptr_t leave, uintptr_t plan, uintptr_t want_in,
                 tuple slots, tuple params, list last_in, tuple own_shape, tuple own_dtype, tuple outputs,
                 list last_out, list bound_in, tensor_type, stream_type, on_failure, tuple ordered, result):
        cdef Py_ssize_t n_slots = len(last_in)
        if not launch or not enter or not leave or not plan or not want_in:
            raise ValueError("PlanState: launch, enter, leave, plan and want_in must be addresses")
        if len(own_shape) != n_slots or len(own_dtype) != n_slots or len(bound_in) != n_slots or not last_out:
            raise ValueError("PlanState: last_in, bound_in, own_shape and own_dtype must have one item per input "
                             "slot, last_out at least one")
        if len(slots) > MAX_PARAMS or len(params) > MAX_PARAMS:
            raise ValueError(f"PlanState: at most {MAX_PARAMS} arguments and parameters")
        if not issubclass(tensor_type, TensorBase) or not issubclass(stream_type, StreamBase):
            raise TypeError("PlanState: Tensor and Stream must derive from TensorBase / StreamBase")
        if not callable(on_failure):
            raise TypeError("PlanState: on_failure must be callable")
        if len(ordered) != 6:
            raise TypeError("PlanState: ordered must be ordered.compiled_view()")
        self.states, self.state_type, _, self.hold, self.checkpoint, self.every = ordered
        if not issubclass(self.state_type, StreamStateBase) or not callable(self.hold) \
                or not callable(self.checkpoint) or self.every < 1:
            raise TypeError("PlanState: the ordered view's states must derive from StreamStateBase, hold and "
                            "checkpoint be callables, the checkpoint period >= 1")
        self.n_values = len(slots)
        self.n_params = len(params)
        for k in range(self.n_values):
            if not 0 <= slots[k] < n_slots:
                raise ValueError(f"PlanState: slot {slots[k]} is out of range")
            self.slots[k] = slots[k]
        for k in range(self.n_params):
            if not (0 <= params[k] < self.n_values or params[k] == ROLE_STREAM or params[k] == ROLE_NONE):
                raise ValueError(f"PlanState: parameter {k}: an argument's index, ROLE_STREAM or ROLE_NONE "
                                 f"(got {params[k]})")
            self.params[k] = params[k]
        self.launch = <aclnnpy_plan_launch_fn>launch
        self.enter = <aclnnpy_plan_enter_fn>enter
        self.leave = <aclnnpy_plan_leave_fn>leave
        self.plan = <aclnnpy_plan *>plan
        self.want_in = <uintptr_t *>want_in
        self.last_in, self.last_out, self.bound_in = last_in, last_out, bound_in
        self.seen_shape = [shape for shape in own_shape for _ in range(SHAPES_SEEN)]
        self.own_shape, self.own_dtype, self.outputs = own_shape, own_dtype, outputs
        self.tensor_type, self.stream_type, self.on_failure = tensor_type, stream_type, on_failure
        self.result = result

    cdef int step(self, PyObject **values, object stream) except -1:
        """One step, as aclnnpy_plan_enter / _leave bracket the Python path's (while another thread's step
        runs, the call is the Python path's, which refuses it): 1 when launched, 0 for the Python path."""
        if self.enter(self.plan):
            return 0
        try:
            return self.bind_and_launch(values, stream)
        finally:
            self.leave(self.plan)

    cdef int bind_and_launch(self, PyObject **values, object stream) except -1:
        cdef Py_ssize_t k, i
        cdef uintptr_t addr
        cdef TensorBase tb
        cdef PyObject *v
        cdef PyObject *last
        cdef PyObject *unbound
        cdef aclnnStatus status
        if type(stream) is not self.stream_type or not (<StreamBase>stream)._open or not self.own_outputs():
            return 0
        if PyList_GET_SIZE(self.last_in) != PyTuple_GET_SIZE(self.own_shape) \
                or PyList_GET_SIZE(self.bound_in) != PyTuple_GET_SIZE(self.own_shape):
            return 0  # the lists it shares with the plan are read by index below: the Python path
        cdef aclrtStream handle = <aclrtStream>(<StreamBase>stream).handle
        cdef object state = None  # the stream's hold state, looked up at the first anchor unbound
        cdef bint looked_up = False
        for k in range(self.n_values):
            v = values[k]
            i = self.slots[k]
            last = PyList_GET_ITEM(self.last_in, i)
            if v == <PyObject *>None and last == <PyObject *>None:
                continue  # absent
            # the same Tensor as last call too: a view's address may have moved since
            addr = self.address(<TensorBase>v, i) if type(<object>v) is self.tensor_type else 0
            if not addr:
                return 0  # a host array, closed, not of the plan's layout: the Python path
            tb = <TensorBase>v
            if tb._writer is not None and tb._writer is not stream:
                return 0  # the Python path orders the launch after that write
            self.want_in[i] = addr
            anchor = tb._mem if tb._mem is not None else tb._owner
            unbound = PyList_GET_ITEM(self.bound_in, i)
            if <PyObject *>anchor != unbound:  # by anchor, not Tensor: a view rebound since may have a new one
                # held before the list lets go of it: the launches queued before this call read it
                if unbound != <PyObject *>None:
                    if not looked_up:
                        state, looked_up = self.state_of(stream), True
                    state = self.retire(stream, state, <object>unbound)
                list_put(self.bound_in, i, anchor)
            if v != last:
                list_put(self.last_in, i, <object>v)  # what the Python path records
        with nogil:
            status = self.launch(self.plan, handle)
        if status:
            self.on_failure(status)
            raise SystemError(f"plan step: status {status} was not raised")
        for t in self.outputs:
            if (<TensorBase>t)._writer is not stream:
                (<TensorBase>t)._writer = stream
        return 1

    cdef bint own_outputs(self) noexcept:
        """The outputs bound to the executor are the plan's own (no caller's output is)."""
        cdef Py_ssize_t j
        for j in range(PyList_GET_SIZE(self.last_out)):
            if PyList_GET_ITEM(self.last_out, j) != <PyObject *>None:
                return False
        return True

    cdef uintptr_t address(self, TensorBase t, Py_ssize_t i) except? 0:
        """The data address of `t` when it matches slot `i` (open, contiguous, the slot's DataType and
        shape), else 0."""
        cdef Py_ssize_t j, first = i * SHAPES_SEEN
        own_shape = <object>PyTuple_GET_ITEM(self.own_shape, i)
        if own_shape is None or not t._open or not t._contiguous \
                or t.dtype is not <object>PyTuple_GET_ITEM(self.own_dtype, i):
            return 0
        shape = t.shape
        for j in range(first, first + SHAPES_SEEN):  # a loop passes the same few Tensors
            if shape is <object>PyList_GET_ITEM(self.seen_shape, j):
                break
        else:
            if shape != own_shape:
                return 0
            for j in range(first + SHAPES_SEEN - 1, first, -1):
                self.seen_shape[j] = self.seen_shape[j - 1]
            self.seen_shape[first] = shape
        return t.data  # 0 for a base or an offset that is not a plain address

    cdef object retire(self, object stream, object state, object anchor):
        """Hold an anchor a call unbound on `stream` (whose hold state is `state`, or None): the launches
        before it used it. One among the stream's latest holds is held already (a loop alternating a
        few buffers retires the same ones). Returns the stream's state after the hold."""
        if state is not None and self.held_recently(<StreamStateBase>state, anchor, 4 * self.n_values):
            return state
        if state is None:  # the stream's first hold: ordered.hold() makes its state
            self.hold(stream, anchor)
            return self.state_of(stream)
        # reading the open segment and appending to it is one step under the GIL
        current = (<StreamStateBase>state).current
        current.append(anchor)
        if len(current) >= self.every:
            self.checkpoint(stream)
            return self.state_of(stream)  # the checkpoint opened a new segment
        return state

    cdef object state_of(self, object stream):
        state = self.states.get((<StreamBase>stream)._key)
        if type(state) is not self.state_type or (<StreamStateBase>state).current is None:
            return None
        return state

    cdef bint held_recently(self, StreamStateBase state, object obj, Py_ssize_t window) noexcept:
        cdef list current = state.current
        if current is None:
            return False
        cdef Py_ssize_t n = PyList_GET_SIZE(current), j
        for j in range(n - 1, max(n - window, 0) - 1, -1):
            if PyList_GET_ITEM(current, j) == <PyObject *>obj:
                return True
        return False


cdef class PlanBase:
    """The base of plan classes: it holds the plan's ``_c_state`` (a PlanState, or None: every call in
    Python) and ``_stream``, the stream of its last launch, and the entry by which a class made by
    :func:`compiled_plan_class` is called."""

    def __cinit__(self, *args, **kwargs):
        self._vectorcall = <void *>plan_vectorcall
        route = getattr(getattr(type(self), "__call__", None), "compiled", None)
        self._route = route if isinstance(route, PlanCall) else None


cdef class PlanCall(Route):
    """The compiled route of a plan class's ``__call__``: a call of a plan whose ``_c_state`` is set, in
    the steady state, is launched here and returns the plan's attribute `result`, a read-only one (the
    plan's state holds its object); every other call goes to the Python `function` with the arguments
    as given."""

    cdef readonly object function
    cdef readonly str result
    cdef Parameters params          # the function's parameters after self

    def __init__(self, function, str result):
        code = getattr(function, "__code__", None)
        if code is None:
            raise TypeError("PlanCall: function must be a Python function")
        n = code.co_argcount + code.co_kwonlyargcount
        if code.co_argcount < 1 or code.co_flags & 0x04 or n - 1 > MAX_PARAMS:  # CO_VARARGS
            raise TypeError(f"PlanCall: function must take self and at most {MAX_PARAMS} named parameters")
        self.function = function
        self.params = Parameters(tuple(code.co_varnames[1:n]), code.co_argcount - 1)
        self.result = result

    property names:
        """The function's parameter names after self."""
        def __get__(self):
            return self.params.names

    cdef object call(self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames):
        """A call through the method (the plan first): ``Plan.__call__(plan, ...)``, or ``plan(...)`` of
        a class made by a class statement."""
        if nargs >= 1 and isinstance(<object>args[0], PlanBase):
            return self.call_plan(<PlanBase>args[0], args + 1, <size_t>(nargs - 1), kwnames)
        return PyObject_Vectorcall(self.function, args, <size_t>nargs, kwnames)

    cdef object call_plan(self, PlanBase plan, PyObject *const *args, size_t nargsf, PyObject *kwnames):
        """A call of `plan` with the arguments after it: ``plan(...)`` of a class made by
        compiled_plan_class, or through the method."""
        cdef PlanState st = plan._c_state  # kept: `_c_state` may be reset while the launch runs
        if compiled_enabled and st is not None and self.fast_call(plan, st, args, PyVectorcall_NARGS(nargsf), kwnames):
            return st.result
        return call_with_self(self.function, plan, args, nargsf, kwnames)

    cdef bint fast_call(self, PlanBase plan, PlanState st, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames) except -1:
        """Parse the call by the function's parameter names and launch it: True when launched."""
        cdef PyObject *given[MAX_PARAMS]
        cdef PyObject *values[MAX_PARAMS]
        cdef PyObject *v
        cdef PyObject *stream = <PyObject *>None
        cdef Py_ssize_t i, k, a
        cdef Py_ssize_t n = self.params.n
        if st.n_params != n or not self.params.bind(given, args, nargs, kwnames):
            return False
        for k in range(st.n_values):
            values[k] = <PyObject *>None
        for i in range(n):  # the arguments are the caller's: alive until this call returns
            v = <PyObject *>None if given[i] == NULL else given[i]
            a = st.params[i]
            if a == ROLE_STREAM:
                stream = v
            elif a == ROLE_NONE:
                if v != <PyObject *>None:
                    return False
            else:
                values[a] = v
        if not st.step(values, <object>stream):
            return False
        if plan._stream is not <object>stream:
            plan._stream = <object>stream
        return True


cdef object plan_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames):
    """The vectorcall entry of a plan whose class compiled_plan_class made."""
    plan = <PlanBase>self
    if plan._route is not None:
        return (<PlanCall>plan._route).call_plan(plan, args, nargsf, kwnames)
    return call_with_self(type(plan).__call__, plan, args, nargsf, kwnames)


cdef object call_with_self(object function, object first, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames):
    """`function` called with `first` before a vectorcall's arguments, without packing them."""
    cdef Py_ssize_t nargs = PyVectorcall_NARGS(nargsf)
    cdef Py_ssize_t n = nargs + (0 if kwnames == NULL else PyTuple_GET_SIZE(<object>kwnames))
    cdef PyObject **stack
    cdef PyObject *saved
    cdef PyObject *local[MAX_PARAMS + 1]
    if nargsf & PY_VECTORCALL_ARGUMENTS_OFFSET:  # the caller lets args[-1] be borrowed for the call
        stack = <PyObject **>args - 1
        saved = stack[0]
        stack[0] = <PyObject *>first
        try:
            return PyObject_Vectorcall(function, stack, <size_t>(nargs + 1), kwnames)
        finally:
            stack[0] = saved
    stack = <PyObject **>local
    if n > MAX_PARAMS:
        stack = <PyObject **>PyMem_Malloc((n + 1) * sizeof(PyObject *))
    if stack == NULL:
        raise MemoryError()
    try:
        stack[0] = <PyObject *>first
        memcpy(stack + 1, args, n * sizeof(PyObject *))
        return PyObject_Vectorcall(function, stack, <size_t>(nargs + 1), kwnames)
    finally:
        if stack != <PyObject **>local:
            PyMem_Free(stack)


cdef list plan_class_names = []  # tp_name of the classes compiled_plan_class made (3.11 keeps the pointer)


def compiled_plan_class(cls):
    """The class a plan class's instances are made from: a subclass of `cls` made here whose instances
    CPython calls by vectorcall (csrc/entry.h, aclnnpy_plan_class), so that ``plan(...)`` reaches the
    compiled ``__call__`` with the arguments as they are on the caller's stack. It has `cls`'s module,
    name and doc and adds nothing else. `cls` derives from PlanBase, its ``__call__`` is a
    compiled_plan_call, and its metaclass is ``type`` (a class made from a spec takes no metaclass with
    a ``__new__`` of its own)."""
    if not isinstance(cls, type) or not issubclass(cls, PlanBase):
        raise TypeError(f"compiled_plan_class: expected a subclass of PlanBase, got {cls!r}")
    if type(cls) is not type:
        raise TypeError(f"compiled_plan_class: {cls.__name__}'s metaclass must be type, got "
                        f"{type(cls).__name__}")
    if not isinstance(getattr(getattr(cls, "__call__", None), "compiled", None), PlanCall):
        raise TypeError(f"compiled_plan_class: {cls.__name__}.__call__ must be a compiled_plan_call")
    cdef PlanBase probe = PlanBase.__new__(PlanBase)
    cdef Py_ssize_t offset = <char *>&probe._vectorcall - <char *><PyObject *>probe
    name = f"{cls.__module__}.{cls.__name__}".encode()
    plan_class_names.append(name)
    cdef bytes doc = cls.__doc__.encode() if cls.__doc__ else None
    cdef const char *doc_text = NULL
    if doc is not None:
        doc_text = doc
    return aclnnpy_plan_class(cls, name, doc_text, offset)


def compiled_plan_call(str result):
    """Decorate a plan class's ``__call__``: a CompiledPlanCall (csrc/entry.h) whose route is a
    :class:`PlanCall` (``compiled``), with the function's name, doc and signature (``__wrapped__``)."""

    def decorate(function):
        method = aclnnpy_entry_new(CompiledPlanCall, PlanCall(function, result))
        functools.update_wrapper(method, function)
        return method

    return decorate



# ---- MoeDistributeBuffer ----
# A buffer call allocates its outputs; a serving loop lets go of them before the next call of the same
# layout, so instead of giving the blocks back to the pool and taking them again (a Tensor, a block and
# a descriptor per output, every call) the buffer keeps the last few calls' outputs and hands them out
# again once nothing but the buffer refers to them. That reuse follows the pool's rule for a block freed
# by work on a stream: reusable at once by later work on the same stream, so a kept set is taken only by
# a call on the stream that last wrote it, and never when any of its Tensors was exported (a numpy view,
# DLPack) or read on another stream since (TensorBase._shared), or closed. The first call of a layout,
# a call while every kept set is still referenced, and every unusual call take the Python method.

cdef enum:
    MAX_KEPT_TENSORS = 16
    KIND_INPUT = 0   # a tensor input of the operator (slot: its index)
    KIND_ATTR = 1    # an attribute of the buffer's config key (slot: its position)
    KIND_STREAM = 2
    KIND_NONE = 3    # the fast call takes only None (or the parameter not given)


cdef class KeptOutputs:

    def __init__(self, config, x, ids, int present, outputs, result):
        tensors = []
        for group in (outputs, result):
            for t in ((group,) if isinstance(group, TensorBase) else group):
                if t is not None and not any(t is u for u in tensors):
                    tensors.append(t)
        if len(tensors) > MAX_KEPT_TENSORS:
            raise ValueError(f"KeptOutputs: at most {MAX_KEPT_TENSORS} Tensors")
        self.config, self.present = config, present
        self.x_shape, self.x_dtype, self.ids_shape = (<TensorBase>x).shape, (<TensorBase>x).dtype, \
            (<TensorBase>ids).shape
        self.outputs, self.result, self.tensors = outputs, result, tuple(tensors)
        self.n_blocks = 0
        for j, t in enumerate(tensors):
            held = 1  # self.tensors
            for group in (outputs, result):
                if group is t:
                    held += 1
                elif isinstance(group, tuple):
                    held += sum(1 for u in group if u is t)
            self.expected[j] = held
            mem = (<TensorBase>t)._mem
            if mem is not None and mem.size > 0:
                self.block_ptr[self.n_blocks] = <void *><uintptr_t>mem._ptr
                self.block_size[self.n_blocks] = <size_t>mem.size
                self.n_blocks += 1

    cdef bint matches(self, object config, object x, object ids, int present):
        """This set has the layout of a call with `config`, `x`, `ids` and the optional inputs `present`."""
        if config is not self.config or present != self.present:
            return False
        xs, ids_s = (<TensorBase>x).shape, (<TensorBase>ids).shape
        return (<TensorBase>x).dtype is self.x_dtype and (xs is self.x_shape or xs == self.x_shape) \
            and (ids_s is self.ids_shape or ids_s == self.ids_shape)

    cdef bint free_on(self, object stream):
        """Nothing but this object refers to the set's Tensors, none was exported, read on another
        stream or closed, and `stream` wrote them last (or the same stream under another object)."""
        cdef Py_ssize_t j, n = PyTuple_GET_SIZE(self.tensors)
        cdef PyObject *p
        # the caller's references first, counted before this function takes any of its own
        if isinstance(self.result, tuple) and Py_REFCNT(<PyObject *>self.result) != 1:
            return False
        if isinstance(self.outputs, tuple) and self.outputs is not self.result \
                and Py_REFCNT(<PyObject *>self.outputs) != 1:
            return False
        for j in range(n):
            p = PyTuple_GET_ITEM(self.tensors, j)
            if Py_REFCNT(p) != self.expected[j]:
                return False
        cdef TensorBase tb
        for j in range(n):
            tb = <TensorBase>PyTuple_GET_ITEM(self.tensors, j)
            if not tb._open or tb._shared or not tb.desc:
                return False
            w = tb._writer
            if w is not None and w is not stream and (<StreamBase>w)._key != (<StreamBase>stream)._key:
                return False
        return True

    cdef int refill(self, StreamBase stream) except -1:
        """On the mock with its poison on: the blocks get the poison of new memory again, in stream order
        (work queued before this call may still read them)."""
        cdef int status
        if refill_async != NULL and self.n_blocks:
            # the GIL stays held: the mock only queues the refill (its queues take every task at once)
            status = refill_async(self.block_ptr, self.block_size, self.n_blocks, <void *>stream.handle)
            if status:
                raise RuntimeError(f"the mock's poison refill of reused outputs failed (status {status})")
        return 0


cdef class BufferRouteState:

    def __init__(self):
        self.attrs = None
        self.config = None
        self.stream = None
        self.kept = []


cdef class BufferBase:
    """The base of MoeDistributeBuffer: its context tensor and communicator, and what its compiled
    methods remember between calls."""

    def _forget_calls(self):
        """Drop every remembered config, stream and kept output set (a new communicator, close())."""
        self._route_states = [BufferRouteState(), BufferRouteState()]

    property kept_outputs:
        """How many output sets each compiled method keeps now (dispatch, combine)."""
        def __get__(self):
            if self._route_states is None:
                return (0, 0)
            return tuple(len((<BufferRouteState>st).kept) for st in self._route_states)


cdef class BufferCall(Route):
    """The compiled route of a MoeDistributeBuffer operator method (`which`: 0 dispatch, 1 combine): a
    call whose arguments are device Tensors, a Stream (or the current one) and the attributes of the
    method's last Python call, with a free kept output set of its layout, is parsed and launched here
    through the operator's OpSpec; every other call is the Python `function`'s."""

    cdef readonly object function
    cdef Parameters params          # the method's parameters after self
    cdef Py_ssize_t n_params, which
    cdef Py_ssize_t kind[MAX_PARAMS]
    cdef Py_ssize_t slot[MAX_PARAMS]
    cdef Py_ssize_t bit[MAX_PARAMS]     # a tensor parameter's bit in `present`, -1 for required ones
    cdef tuple tensor_params            # (method parameter, operator parameter, optional) per tensor
    cdef tuple defaults                 # the config key's values where no parameter gives them
    cdef tuple attr_params              # the config key's parameter per position (None: a constant)
    cdef object op                      # the operator's compiled function
    cdef object spec                    # its OpSpec once set up; False: no compiled route
    cdef Py_ssize_t x_input, ids_input, ctx_input
    cdef object current_stream, reraise, caller_names

    def __init__(self, function, Py_ssize_t which, tuple tensor_params, tuple attr_params, op, current_stream,
                 reraise, caller_names):
        code = getattr(function, "__wrapped__", function).__code__
        n = code.co_argcount + code.co_kwonlyargcount
        if code.co_argcount < 1 or n - 1 > MAX_PARAMS:
            raise TypeError(f"BufferCall: function must take self and at most {MAX_PARAMS} named parameters")
        if which not in (0, 1):
            raise ValueError("BufferCall: which is 0 (dispatch) or 1 (combine)")
        self.function, self.which, self.op = function, which, op
        self.params = Parameters(tuple(code.co_varnames[1:n]), code.co_argcount - 1)
        self.n_params = n - 1
        self.tensor_params, self.attr_params = tensor_params, attr_params
        self.current_stream, self.reraise, self.caller_names = current_stream, reraise, caller_names
        self.spec = None
        index = self.params.index
        defaults = {name: p.default for name, p in inspect.signature(function).parameters.items()}
        for i in range(self.n_params):
            self.kind[i], self.slot[i], self.bit[i] = KIND_NONE, -1, -1
        values = []
        for k, (param, constant) in enumerate(attr_params):
            if param is None:
                values.append(constant)
                continue
            i = index[param]
            self.kind[i], self.slot[i] = KIND_ATTR, k
            values.append(defaults.get(param))
        self.defaults = tuple(values)
        bit = 0
        for param, _, optional in tensor_params:
            i = index[param]
            self.kind[i] = KIND_INPUT
            if optional:
                self.bit[i] = bit
                bit += 1
        self.kind[index["stream"]] = KIND_STREAM

    def remember(self, BufferBase buf, tuple attrs, config, stream, tuple tensors, outputs, result,
                 Py_ssize_t keep):
        """After the Python method ran for `buf`: its config key `attrs` and config, its stream (which
        passed the device check) and, when the call's tensor arguments `tensors` (in `tensor_params`
        order) are device Tensors where required and every output is a Tensor the call allocated, its
        outputs for reuse (at most `keep` sets, the oldest dropped)."""
        cdef int present = 0
        if buf._route_states is None:
            buf._forget_calls()
        cdef BufferRouteState st = <BufferRouteState>buf._route_states[self.which]
        st.attrs, st.config, st.stream = attrs, config, stream
        if len(tensors) != len(self.tensor_params) or keep < 1 or not compiled_enabled or buf.context is None:
            return  # kept sets serve the compiled route only, which calls the context's generation
        for (param, _, _), v in zip(self.tensor_params, tensors):
            bit = self.bit[self.params.index[param]]  # the bits fast_call sets
            if bit >= 0 and v is not None:
                present |= 1 << bit
        x, ids = tensors[0], tensors[1]
        if not isinstance(x, TensorBase) or not isinstance(ids, TensorBase):
            return
        for group in (outputs, result):
            for t in ((group,) if isinstance(group, TensorBase) else group):
                if t is not None and (not isinstance(t, TensorBase) or (<TensorBase>t)._mem is None
                                      or (<TensorBase>t)._owner is not None):
                    return  # not a plain allocation of the call's own
        kept = st.kept
        kept.append(KeptOutputs(config, x, ids, present, outputs, result))
        while len(kept) > keep:
            del kept[0]

    def attrs_of(self, **kwargs):
        """The config key the fast call reads for a call with these keyword arguments (a test's view)."""
        return tuple(kwargs.get(param, d) if param is not None else d
                     for (param, _), d in zip(self.attr_params, self.defaults))

    cdef object set_up(self):
        spec = (<OpCall>self.op.compiled).spec
        if spec is None:
            spec = (<OpCall>self.op.compiled).set_up()
        if spec is False:
            self.spec = False
            return False
        cdef OpSpec sp = <OpSpec>spec
        index = self.params.index
        for param, op_param, _ in self.tensor_params:
            self.slot[index[param]] = sp.roles[sp.index[op_param]]
        self.x_input = self.slot[index[self.tensor_params[0][0]]]
        self.ids_input = self.slot[index[self.tensor_params[1][0]]]
        self.ctx_input = sp.roles[sp.index["context"]]
        self.spec = spec
        return spec

    cdef object call(self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames):
        if compiled_enabled and nargs >= 1 and isinstance(<object>args[0], BufferBase):
            result = self.fast_call(<BufferBase>args[0], args + 1, nargs - 1, kwnames)
            if result is not None:
                return result
        return PyObject_Vectorcall(self.function, args, <size_t>nargs, kwnames)

    cdef object fast_call(self, BufferBase buf, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames):
        """The result after a launch, or None (before anything ran) for the Python method."""
        cdef PyObject *given[MAX_PARAMS]
        cdef PyObject *ins[MAX_TABLE]
        cdef Py_ssize_t i, k
        cdef int present = 0
        cdef Py_ssize_t kind
        cdef BufferRouteState st
        cdef KeptOutputs entry
        spec = self.spec
        if spec is None:
            spec = self.set_up()
        if spec is False or buf._route_states is None:
            return None
        st = <BufferRouteState>buf._route_states[self.which]
        attrs = st.attrs
        config = st.config
        if config is None or attrs is None or not st.kept or not self.params.bind(given, args, nargs, kwnames):
            return None
        for i in range((<OpSpec>spec).n_inputs):
            ins[i] = NULL
        stream = None
        same_attrs = True
        for i in range(self.n_params):
            kind = self.kind[i]
            if kind == KIND_ATTR:
                # the last call's attributes: by identity (a loop passes the same objects), else by value
                if same_attrs:
                    k = self.slot[i]
                    v = <object>given[i] if given[i] != NULL else <object>PyTuple_GET_ITEM(self.defaults, k)
                    last = <object>PyTuple_GET_ITEM(attrs, k)
                    if v is not last and (type(v) is not type(last) or v != last):
                        same_attrs = False
                continue
            if given[i] == NULL or <object>given[i] is None:
                continue
            if kind == KIND_INPUT:
                ins[self.slot[i]] = given[i]
                if self.bit[i] >= 0:
                    present |= 1 << self.bit[i]
            elif kind == KIND_STREAM:
                stream = <object>given[i]
            else:
                return None
        if not same_attrs:  # another of the buffer's configs, found by its key as the method finds it
            config = buf._configs.get(self.key_of(given)) if buf._configs is not None else None
            if config is None:
                return None
        if ins[self.x_input] == NULL or ins[self.ids_input] == NULL:
            return None
        x, ids = <object>ins[self.x_input], <object>ins[self.ids_input]
        if not isinstance(x, TensorBase) or not isinstance(ids, TensorBase):
            return None
        if stream is None:
            stream = self.current_stream()
        if stream is not st.stream:
            return None  # the method checks a new stream's device
        comm = buf.comm
        if not comm._open:
            return None  # the method raises ClosedError
        ctx = buf.context
        if ctx is None:
            return None
        ins[self.ctx_input] = <PyObject *>ctx
        for entry in st.kept:
            if entry.matches(config, x, ids, present) and entry.free_on(stream):
                break
        else:
            return None
        # taken: the reference makes the set busy for another thread's call until this one returns
        result = entry.result
        try:
            done = (<OpSpec>spec).run_parsed(ins, config, stream, entry.outputs, True, entry, True)
        except Exception as exc:
            self.reraise(exc, self.caller_names)  # raises it, naming the caller's parameters
            raise
        return None if done is None else result

    cdef tuple key_of(self, PyObject **given):
        """The config key of a call's attributes (`given`: per parameter, NULL where not given)."""
        key = list(self.defaults)
        for i in range(self.n_params):
            if self.kind[i] == KIND_ATTR and given[i] != NULL:
                v = <object>given[i]
                if type(v) is not int and type(v) is not str:
                    return None  # the method's config lookup takes plain ints and strs only, and names the rest
                key[self.slot[i]] = v
        return tuple(key)


def compiled_buffer_method(Py_ssize_t which, tuple tensor_params, tuple attr_params, op, current_stream, reraise,
                           caller_names):
    """Decorate a MoeDistributeBuffer operator method: a CompiledPlanCall (csrc/entry.h, a method
    descriptor) whose route is a :class:`BufferCall` (``compiled``)."""

    def decorate(function):
        method = aclnnpy_entry_new(CompiledPlanCall, BufferCall(function, which, tensor_params, attr_params, op,
                                                                current_stream, reraise, caller_names))
        functools.update_wrapper(method, function)
        return method

    return decorate
