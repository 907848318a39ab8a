# The launch every operator call ends in: one generation's C function, its two phases through the
# extension's run helper, the stream's workspace, the holds and the outputs' writer.

from .errors import check_aclnn

cdef object order_after_writes = None   # aclnn_py.runtime._stream.order_after_writes, at the first need


cdef int order_inputs_after_writes(StreamBase stream, object inputs) except -1:
    """The launch on `stream` waits for writes of `inputs` queued on other streams (a rare case: an
    event recorded on the writer, waited for on `stream`)."""
    global order_after_writes
    if order_after_writes is None:
        from .runtime._stream import order_after_writes as function
        order_after_writes = function
    order_after_writes(stream, inputs)
    return 0


cdef int check_passable(TensorBase t, str name) except -1:
    """`t` (the operator's `name`) may be passed to an operator: open, and not a recycled buffer result."""
    if t.issuer is not None and t.recycled:
        raise RecycledError(f"{name}: " + (<ResultSet>t.issuer).recycled_message(t._label(), "pass it to an operator"))
    t.check_readable("pass it to an operator")
    return 0


cdef inline object anchor_of(TensorBase t):
    """What keeps `t`'s memory allocated while queued work uses it."""
    return t._mem if t._mem is not None else t._owner


cdef inline void written_on(TensorBase t, StreamBase stream) noexcept:
    t._writer = stream
    t._rewritten = True


cdef int mark_written(object outputs, StreamBase stream) except -1:
    """Each Tensor of `outputs` (one Tensor, or a tuple or list with Nones) was last written on `stream`."""
    cdef Py_ssize_t j
    cdef PyObject *p
    if isinstance(outputs, TensorBase):
        written_on(<TensorBase>outputs, stream)
        return 0
    if isinstance(outputs, tuple):  # a NamedTuple of outputs: read by index, not through its iterator
        for j in range(PyTuple_GET_SIZE(outputs)):
            p = PyTuple_GET_ITEM(outputs, j)
            if <object>p is not None:
                written_on(<TensorBase>p, stream)
        return 0
    for t in outputs:
        if t is not None:
            written_on(<TensorBase>t, stream)
    return 0


@cython.final
cdef class Launcher:
    """One generation's operator as the operator functions reach it: both phases through the extension's
    run helper (csrc/aclnnpy.h), the function's tensors put in the C function's order (`in_at` /
    `out_at`: per C tensor, its index in the function's lists)."""

    cdef readonly object layout
    cdef readonly str phase1_name, phase2_name
    cdef aclnnpy_run_fn run_fn
    cdef aclnnpy_phase2_fn phase2_fn
    cdef readonly Py_ssize_t n_in, n_out
    cdef readonly Py_ssize_t generation   # of the C function (older ones refuse inputs they lack)
    cdef Py_ssize_t in_at[MAX_TENSORS]
    cdef Py_ssize_t out_at[MAX_TENSORS]
    cdef tuple input_names, output_names   # the operator function's (errors name them)

    def __init__(self, layout, uintptr_t run, uintptr_t phase2, tuple in_at, tuple out_at, tuple input_names,
                 tuple output_names, Py_ssize_t generation):
        if not run or not phase2:
            raise ValueError("Launcher: run and phase2 must be addresses")
        if len(in_at) != len(layout.inputs) or len(out_at) != len(layout.outputs) \
                or len(in_at) + len(out_at) > MAX_TENSORS:
            raise ValueError(f"Launcher: one index per tensor of {layout.phase1}, at most {MAX_TENSORS} in all")
        self.layout = layout
        self.phase1_name, self.phase2_name = layout.phase1, layout.phase2
        self.run_fn = <aclnnpy_run_fn>run
        self.phase2_fn = <aclnnpy_phase2_fn>phase2
        self.n_in, self.n_out = len(in_at), len(out_at)
        self.input_names, self.output_names = input_names, output_names
        self.generation = generation
        for k in range(self.n_in):
            self.in_at[k] = in_at[k]
        for k in range(self.n_out):
            self.out_at[k] = out_at[k]

    property input_positions:
        """Per C input, its index in the operator function's inputs."""
        def __get__(self):
            return tuple(self.in_at[k] for k in range(self.n_in))

    property output_positions:
        def __get__(self):
            return tuple(self.out_at[k] for k in range(self.n_out))

    cdef tuple gather(self, PyObject **ins, PyObject **outs, aclTensor **table):
        """The descriptors in the C order into `table` (a Tensor without one gets it; a closed or recycled
        one raises); returns what keeps their memory (None for a NULL)."""
        cdef Py_ssize_t k
        cdef PyObject *v
        cdef TensorBase t
        held = PyTuple_New(self.n_in + self.n_out)
        for k in range(self.n_in + self.n_out):
            v = ins[self.in_at[k]] if k < self.n_in else outs[self.out_at[k - self.n_in]]
            if v == NULL:
                table[k] = NULL
                Py_INCREF(None)  # PyTuple_SET_ITEM steals one
                PyTuple_SET_ITEM(held, k, None)
                continue
            t = <TensorBase>v
            if not t.desc or t.issuer is not None:
                check_passable(t, self.input_names[self.in_at[k]] if k < self.n_in else
                               self.output_names[self.out_at[k - self.n_in]])
                if not t.desc:
                    describe(t)
            table[k] = <aclTensor *>t.desc
            anchor = anchor_of(t)
            Py_INCREF(anchor)
            PyTuple_SET_ITEM(held, k, anchor)
        return held

    cdef int launch(self, PyObject **ins, PyObject **outs, PackedBase attrs, StreamBase stream,
                    object outputs) except -1:
        """Phase 1 and the launch on `stream`; then the holds, the status and the writer of `outputs`."""
        cdef aclTensor *table[MAX_TENSORS]
        cdef uint64_t size = 0
        cdef aclOpExecutor *executor = NULL
        cdef int launched = 0
        cdef aclnnStatus status
        cdef uintptr_t ws
        cdef aclrtStream handle = <aclrtStream>stream.handle
        cdef Py_ssize_t k
        held = self.gather(ins, outs, table)
        for k in range(self.n_in):  # an input last written on another stream: this launch waits for it
            if ins[self.in_at[k]] != NULL:
                w = (<TensorBase>ins[self.in_at[k]])._writer
                if w is not None and w is not stream and (<StreamBase>w)._key != stream._key:
                    order_inputs_after_writes(stream, [None if ins[self.in_at[j]] == NULL else
                                                       <object>ins[self.in_at[j]] for j in range(self.n_in)])
                    break
        cdef StreamStateBase st = stream_state(stream)  # kept: the stream may be destroyed meanwhile
        if launch_releases_gil:
            with nogil:
                status = self.run_fn(table, attrs.ints, attrs.strings, st.ws_ptr, st.ws_size, handle, &size,
                                     &executor, 1, &launched)
        else:
            status = self.run_fn(table, attrs.ints, attrs.strings, st.ws_ptr, st.ws_size, handle, &size, &executor,
                                 1, &launched)
        if not launched:
            if status:
                check_aclnn(status, self.phase1_name)
            try:  # more than the stream's block: grow it, then launch
                ws = <uintptr_t>grow_workspace(stream, size)
            except BaseException:
                destroy_executor(executor)  # never launched: nothing else would destroy it
                raise
            status = phase2(self.phase2_fn, <void *>ws if size else NULL, size, executor, handle)
        st.launches += 1
        hold_in(st, stream, held)  # launched: what it uses is held until the stream passes it, whatever the status
        if status:
            check_aclnn(status, self.phase2_name)
        mark_written(outputs, stream)
        return 0

    def run(self, inputs, outputs, ConfigBase config, StreamBase stream):
        """Both phases on `stream`, as an operator call ends: `inputs` and `outputs` are Tensors or None in
        the operator function's order."""
        cdef PyObject *ins[MAX_TENSORS]
        cdef PyObject *outs[MAX_TENSORS]
        fill_table(inputs, ins, MAX_TENSORS)
        fill_table(outputs, outs, MAX_TENSORS)
        self.launch(ins, outs, packed_for(config, self), stream, outputs)

    def phase1(self, inputs, outputs, ConfigBase config):
        """Phase 1 only, with the operator function's `inputs` and `outputs` (Tensors or None, in its
        order): (workspace size, executor address)."""
        cdef aclTensor *table[MAX_TENSORS]
        cdef PyObject *ins[MAX_TENSORS]
        cdef PyObject *outs[MAX_TENSORS]
        cdef uint64_t size = 0
        cdef aclOpExecutor *executor = NULL
        cdef int launched = 0
        cdef aclnnStatus status
        cdef PackedBase attrs = packed_for(config, self)
        fill_table(inputs, ins, MAX_TENSORS)
        fill_table(outputs, outs, MAX_TENSORS)
        held = self.gather(ins, outs, table)  # the Tensors stay referenced by the caller meanwhile
        with nogil:
            status = self.run_fn(table, attrs.ints, attrs.strings, 0, 0, NULL, &size, &executor, 0, &launched)
        if status:
            check_aclnn(status, self.phase1_name)
        return size, <uintptr_t>executor

    def launch_executor(self, uintptr_t executor, uint64_t size, StreamBase stream, inputs, outputs, workspace=None):
        """Phase 2 of an executor phase 1 made (`size` workspace bytes) on `stream`, with the stream's
        workspace unless `workspace` (an address) is given; then the holds of `inputs` and `outputs` and
        the outputs' writer."""
        cdef aclnnStatus status
        cdef aclrtStream handle = <aclrtStream>stream.handle
        cdef uintptr_t ws
        cdef StreamStateBase st = stream_state(stream)
        tensors = [t for group in (inputs, outputs) for t in group if t is not None]
        for t in inputs:
            if t is not None:
                w = (<TensorBase>t)._writer
                if w is not None and w is not stream and (<StreamBase>w)._key != stream._key:
                    order_inputs_after_writes(stream, list(inputs))
                    break
        if workspace is not None:
            ws = workspace
        else:
            ws = st.ws_ptr if size <= st.ws_size else <uintptr_t>grow_workspace(stream, size)
        status = phase2(self.phase2_fn, <void *>ws if size else NULL, size, <aclOpExecutor *>executor, handle)
        st.launches += 1
        hold_in(st, stream, [anchor_of(<TensorBase>t) for t in tensors])
        if status:
            check_aclnn(status, self.phase2_name)
        mark_written(outputs, stream)


cdef inline aclnnStatus phase2(aclnnpy_phase2_fn fn, void *workspace, uint64_t size, aclOpExecutor *executor,
                               aclrtStream stream):
    """A launch, without the GIL where it may block (launch_releases_gil)."""
    cdef aclnnStatus status
    if launch_releases_gil:
        with nogil:
            status = fn(workspace, size, executor, stream)
        return status
    return fn(workspace, size, executor, stream)


cdef PackedBase packed_for(ConfigBase config, Launcher launcher):
    """`config`'s attributes laid out for `launcher`'s run helper (made once per config and operator)."""
    packed = config._packed.get(launcher.phase2_name)
    if packed is None or (<PackedBase>packed).layout is not launcher.layout:
        packed = config.packed(launcher.layout)
    return <PackedBase>packed


def hccl_barrier(uintptr_t comm, uintptr_t stream) -> int:
    """``HcclBarrier(comm, stream)``: its status, or -1 when the backend has no HcclBarrier. The call
    only queues the barrier on the stream, so where a launch keeps the GIL (the mock) this does too:
    each barrier of a thread world's rank then costs no hand-over of the GIL among the ranks' threads,
    and its queued work no late start."""
    cdef int status
    if hccl_barrier_fn == NULL:
        return -1
    if launch_releases_gil:
        with nogil:
            status = hccl_barrier_fn(<void *>comm, <void *>stream)
        return status
    return hccl_barrier_fn(<void *>comm, <void *>stream)


def current_device() -> tuple:
    """``aclrtGetDevice``: (status, the calling thread's device). A thread-local read, so called with
    the GIL kept: every allocation asks it, and in a thread world each hand-over of the GIL among
    hundreds of rank threads costs far more than the call."""
    cdef int32_t device = -1
    if get_device_fn_ == NULL:
        raise RuntimeError("current_device: no backend bound")
    cdef int status = get_device_fn_(&device)
    return status, device


def destroy_executor_at(uintptr_t executor) -> int:
    """``aclDestroyAclOpExecutor``: its status. Host bookkeeping, called with the GIL kept where a launch
    keeps it (the mock): a thread world's teardown destroys a few executors per rank."""
    cdef aclnnStatus status
    if launch_releases_gil:
        with nogil:
            status = destroy_executor(<aclOpExecutor *>executor)
        return status
    return destroy_executor(<aclOpExecutor *>executor)
