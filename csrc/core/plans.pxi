# Plans: one phase 1 with a repeatable executor, then each call binds this step's inputs and outputs
# (aclSetInputTensorAddr / aclSetOutputTensorAddr where an address moved; host arrays are copied into
# the plan's own buffers) and launches. A serving loop calls ``plan(...)``: CPython calls the plan
# classes by vectorcall (the entry below), so the call's arguments reach the method's own parser
# without being packed into a tuple and a dict.

cdef extern from "Python.h":
    Py_ssize_t PyVectorcall_NARGS(size_t nargsf)
    unsigned long Py_TPFLAGS_HAVE_VECTORCALL
    int METH_FASTCALL
    int METH_KEYWORDS
    ctypedef struct PyMethodDef:
        void *ml_meth
        int ml_flags
    ctypedef struct PyMethodDescrObject:
        PyMethodDef *d_method

import sys
from types import MethodDescriptorType

ctypedef object (*fastcall_method)(object self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)

cdef bint same_shape(object a, object b) except -1:
    """Two shapes are equal: compared as C integers when both are tuples of ints (a rebinding plan call
    compares one per Tensor)."""
    cdef Py_ssize_t i, n
    if a is b:
        return True
    if type(a) is not tuple or type(b) is not tuple:
        return a == b
    n = PyTuple_GET_SIZE(a)
    if PyTuple_GET_SIZE(b) != n:
        return False
    for i in range(n):
        x, y = <object>PyTuple_GET_ITEM(a, i), <object>PyTuple_GET_ITEM(b, i)
        if x is not y and (type(x) is not int or type(y) is not int or <Py_ssize_t>x != <Py_ssize_t>y):
            return False
    return True


cdef extern from "Python.h":
    # the list slot macros on raw pointers: the item changes hands without Cython's reference counting
    void list_set_raw "PyList_SET_ITEM"(object a, Py_ssize_t i, PyObject *v)
    void incref_raw "Py_INCREF"(PyObject *v)
    void decref_raw "Py_DECREF"(PyObject *v)


cdef inline void swap_items(list a, list b, Py_ssize_t i) noexcept:
    """Exchange a[i] and b[i] (both lists long enough)."""
    cdef PyObject *x = PyList_GET_ITEM(a, i)
    list_set_raw(a, i, PyList_GET_ITEM(b, i))
    list_set_raw(b, i, x)


cdef inline void put_item(list a, Py_ssize_t i, object v) noexcept:
    """a[i] = v without the generic item assignment (a long enough)."""
    cdef PyObject *old = PyList_GET_ITEM(a, i)
    incref_raw(<PyObject *>v)
    list_set_raw(a, i, <PyObject *>v)
    decref_raw(old)


cdef inline bint fits_slot(TensorBase t, TensorBase mine) except -1:
    """`t` may be bound where the plan's `mine` is: contiguous, of its shape and dtype."""
    return t.dtype is mine.dtype and t._contiguous and same_shape(t.shape, mine.shape)


cdef object UNSET = object()     # a slot whose next value must be checked again (host data is copied each call)
cdef object plan_helpers = None  # aclnn_py.ops.plan_parts: what plans do rarely (building, host data, release)


cdef object helpers():
    global plan_helpers
    if plan_helpers is None:
        from .ops import plan_parts
        plan_helpers = plan_parts
    return plan_helpers


cdef class Plan:
    """A prepared operator with fixed shapes, dtypes and attributes, launched many times.

    One phase 1 with a repeatable executor (``aclSetAclOpExecutorRepeatable``); the plan owns a device
    buffer per input and output and its workspace. Each call either copies host arrays into those
    buffers (stream-ordered) or binds Tensors at other addresses (``aclSetInputTensorAddr`` /
    ``aclSetOutputTensorAddr``), then launches. Nothing is allocated per call. Inputs that were absent
    at plan time stay absent; a different shape or dtype is refused (AclnnParamInvalid) — build another
    plan for it. The plan keeps the caller's Tensors last bound, and per input the one bound before (a
    loop alternating two sets of inputs rebinds without checking them again); one let go of is held until
    the stream passes the launches that read it. One call at a time: give each thread its own plan."""

    cdef void *entry                  # plan(...) by vectorcall (the type's tp_vectorcall_offset points here)
    cdef public bint _open
    cdef readonly object config       # the MoeConfig
    cdef readonly object prepared     # phase 1 done: the repeatable executor (a Prepared)
    cdef aclOpExecutor *executor
    cdef aclnnpy_phase2_fn phase2_fn
    cdef readonly str op              # the phase-2 function, e.g. aclnnMoeDistributeDispatchV5
    cdef readonly object workspace_memory  # its DeviceMemory, or None
    cdef void *ws
    cdef uint64_t ws_size
    cdef bint stream_workspace            # launches use their stream's workspace, not one of the plan's
    cdef bint moved                       # an address to bind differs from the one the executor holds
    cdef tuple input_names, output_names
    cdef Py_ssize_t n_in, n_out
    cdef Py_ssize_t c_in[MAX_TENSORS]     # per input (the operator function's order): its C index, -1: none
    cdef Py_ssize_t c_out[MAX_TENSORS]
    cdef aclTensor *desc_in[MAX_TENSORS]  # the executor's descriptors (of the plan's own Tensors)
    cdef aclTensor *desc_out[MAX_TENSORS]
    cdef uintptr_t want_in[MAX_TENSORS]   # the address this step binds
    cdef uintptr_t bound_in[MAX_TENSORS]  # the address the executor holds
    cdef uintptr_t want_out[MAX_TENSORS]
    cdef uintptr_t bound_out[MAX_TENSORS]
    cdef list own_in, own_out             # the plan's own Tensors (None: absent)
    cdef list last_in, last_out           # what each slot was given last call
    cdef list anchor_in, anchor_out       # what keeps the memory of the caller's Tensor bound there
    # The value each input was given before the last one, its anchor and address: a loop alternating two
    # sets of inputs (double-buffered activations) finds each one here, checked before, and swaps it back
    # in; the plan keeps its memory until a third value pushes it out (then it is held on the stream).
    cdef list prev_in, prev_anchor_in
    cdef uintptr_t prev_data_in[MAX_TENSORS]
    cdef public object _stream            # the stream of the last launch
    cdef object checked_stream            # the last stream the vocabulary's check passed
    cdef public object _vocabulary        # how the plan names parameters, and its stream check
    cdef object stale                     # why every call is refused now, or None
    cdef object closed_communicator       # the label of the context's communicator once it closed
    cdef object context_tensor
    cdef bint busy
    cdef object __weakref__

    def __cinit__(self, *args, **kwargs):
        self._open = False
        self.entry = NULL

    cdef int adopt(self, object prepared, object config, object context, Launcher launcher,
                   bint stream_workspace=False) except -1:
        """Take the repeatable executor of `prepared` (phase 1 of `launcher`'s operator); with
        `stream_workspace` its launches use their stream's workspace (as one-shot launches do)."""
        cdef Py_ssize_t i, k
        cdef TensorBase t
        self.prepared, self.config, self.context_tensor = prepared, config, context
        self.executor = <aclOpExecutor *><uintptr_t>prepared._executor_address
        self.phase2_fn = launcher.phase2_fn
        self.op = launcher.phase2_name
        self.own_in, self.own_out = list(prepared.inputs), list(prepared.outputs)
        self.n_in, self.n_out = len(self.own_in), len(self.own_out)
        if self.n_in > MAX_TENSORS or self.n_out > MAX_TENSORS:
            raise ValueError("Plan: too many tensors")
        for i in range(self.n_in):
            self.c_in[i] = -1
        for i in range(self.n_out):
            self.c_out[i] = -1
        for k in range(launcher.n_in):
            self.c_in[launcher.in_at[k]] = k
        for k in range(launcher.n_out):
            self.c_out[launcher.out_at[k]] = k
        for i in range(self.n_in):
            self.desc_in[i], self.want_in[i], self.bound_in[i] = NULL, 0, 0
            if self.own_in[i] is not None:
                t = <TensorBase>self.own_in[i]
                if not t.desc:
                    describe(t)
                self.desc_in[i], self.want_in[i], self.bound_in[i] = <aclTensor *>t.desc, t.data, t.data
        for i in range(self.n_out):
            self.desc_out[i], self.want_out[i], self.bound_out[i] = NULL, 0, 0
            if self.own_out[i] is not None:
                t = <TensorBase>self.own_out[i]
                if not t.desc:
                    describe(t)
                self.desc_out[i], self.want_out[i], self.bound_out[i] = <aclTensor *>t.desc, t.data, t.data
        self.ws_size = prepared.workspace_size
        self.stream_workspace = stream_workspace
        self.workspace_memory = None if stream_workspace else helpers().workspace_memory(self.ws_size)
        self.ws = <void *><uintptr_t>(self.workspace_memory.ptr if self.workspace_memory is not None else 0)
        # a present input starts unset so that None is refused; the context (input 0) is the plan's
        self.last_in = [UNSET if t is not None else None for t in self.own_in]
        self.last_in[0] = None
        self.last_out = [None] * self.n_out
        self.anchor_in = [None] * self.n_in
        self.anchor_out = [None] * self.n_out
        self.prev_in, self.prev_anchor_in = [None] * self.n_in, [None] * self.n_in
        for i in range(self.n_in):
            self.prev_data_in[i] = 0
        self._stream = None
        self._vocabulary = helpers().OPERATOR_WORDS
        self._open = True
        helpers().watch_context(self, context)
        return 0

    # ---- the call ----------------------------------------------------------------------------------------
    cdef object step(self, PyObject **values, Py_ssize_t n, const Py_ssize_t *slots, object outputs, object stream):
        """Bind `values` (`n` of them, borrowed, to the inputs `slots`) and `outputs` (None: the plan's own)
        and launch."""
        cdef Py_ssize_t i, k
        cdef PyObject *p
        cdef StreamBase s
        cdef bint reorder = False
        cdef list own_in = self.own_in, last_in = self.last_in, prev_in = self.prev_in
        if not self._open:
            raise ClosedError(self._label(), "launch it")
        if self.closed_communicator is not None:
            raise ClosedError(self.closed_communicator, f"launch {self._label()}, made with a context of it")
        if self.stale is not None:
            raise self.refusal(self.stale)
        if not (isinstance(stream, StreamBase) and (<StreamBase>stream)._open):
            stream = helpers().resolve_stream(stream)
        s = <StreamBase>stream
        if s is not self.checked_stream:
            check = self._vocabulary.check_stream
            if check is not None:
                check(s)
            self.checked_stream = s
        if self.busy:
            raise RuntimeError(f"{self._label()}: called while another thread's call of it is running; a plan runs "
                               "one call at a time (give each thread its own plan)")
        self.busy = True
        try:
            if outputs is not None:
                self.check_outputs(values, n, slots, outputs, s)
            for k in range(n):
                p, i = values[k], slots[k]
                if p == <PyObject *>None:
                    if PyList_GET_ITEM(own_in, i) != <PyObject *>None:
                        self.bind(i, None, s, False)  # refused: the plan was built with it
                    continue  # (an input absent from the plan and the call: nothing)
                # (the Tensors are read through borrowed pointers: no reference count is written)
                if isinstance(<object>p, TensorBase):
                    if not ((<TensorBase>p)._open and (<TensorBase>p).issuer is None):
                        self.bind(i, <object>p, s, False)  # checked there: refused, or a buffer's result bound
                    elif p == PyList_GET_ITEM(last_in, i) and (<TensorBase>p).data == self.want_in[i]:
                        pass  # bound as last call: nothing to check or bind
                    elif p == PyList_GET_ITEM(prev_in, i) and (<TensorBase>p).data == self.prev_data_in[i] \
                            and anchor_of(<TensorBase>p) is <object>PyList_GET_ITEM(self.prev_anchor_in, i):
                        self.swap_back(i)  # bound the call before: checked then
                    else:
                        self.bind(i, <object>p, s, False)
                    if (<TensorBase>p)._writer is not None and (<TensorBase>p)._writer is not s \
                            and (<StreamBase>(<TensorBase>p)._writer)._key != s._key:
                        reorder = True  # last written on another stream: the launch waits for that write
                else:
                    self.bind(i, <object>p, s, False)
            if outputs is not None:
                for k in range(self.n_out):
                    self.bind(k, outputs[k], s, True)
            else:
                for k in range(self.n_out):
                    if PyList_GET_ITEM(self.last_out, k) != <PyObject *>None:  # a caller's output: the plan's own again
                        self.bind(k, None, s, True)
            if reorder:
                order_inputs_after_writes(s, [<object>values[k] for k in range(n)])
            self.rebind_and_launch(s)
            self._stream = s
        finally:
            self.busy = False
        if outputs is None:
            for k in range(self.n_out):
                p = PyList_GET_ITEM(self.own_out, k)
                if p != <PyObject *>None and (<TensorBase>p)._writer is not s:
                    (<TensorBase>p)._writer = s
            return None
        for k in range(self.n_out):
            o = <object>PyList_GET_ITEM(self.own_out, k) if outputs[k] is None else outputs[k]
            if o is not None and (<TensorBase>o)._writer is not s:
                (<TensorBase>o)._writer = s
        return None

    cdef bint fits(self, PyObject **ins, Py_ssize_t n) except -1:
        """The inputs `ins` (all `n` of the operator function's, NULL: absent; open, contiguous Tensors) would
        each bind to this plan's slot: present where the plan has one, of its shape and dtype."""
        cdef Py_ssize_t i
        cdef PyObject *p
        cdef PyObject *own
        for i in range(1, n):
            p, own = ins[i], PyList_GET_ITEM(self.own_in, i)
            if (p == NULL) != (own == <PyObject *>None):
                return False
            if p == NULL or p == PyList_GET_ITEM(self.last_in, i) or p == PyList_GET_ITEM(self.prev_in, i):
                continue  # checked when it was bound
            if not fits_slot(<TensorBase>p, <TensorBase>own):
                return False
        return True

    cdef int check_outputs(self, PyObject **values, Py_ssize_t n, const Py_ssize_t *slots, object outputs,
                           StreamBase s) except -1:
        cdef PyObject *ins[MAX_TENSORS]
        cdef PyObject *outs[MAX_TENSORS]
        cdef Py_ssize_t k
        for k in range(n):
            ins[k] = values[k] if isinstance(<object>values[k], TensorBase) else NULL
        fill_table(outputs, outs, MAX_TENSORS)
        names = tuple(self.input_names[slots[k]] for k in range(n))
        problem = placement_problem(names, ins, n, self.output_names, outs, self.n_out, s.dev)
        if problem is not None:
            raise ValueError(problem)
        return 0

    cdef int bind(self, Py_ssize_t i, object value, StreamBase stream, bint output) except -1:
        """Check this step's `value` for slot `i` and record the address the launch binds; keep the memory
        of a caller's Tensor bound there (for an input, also of the one bound before it), hold the one let
        go of until `stream` passes the launches that read it."""
        cdef list own = self.own_out if output else self.own_in
        cdef list last = self.last_out if output else self.last_in
        cdef list anchors = self.anchor_out if output else self.anchor_in
        cdef uintptr_t *want = &self.want_out[0] if output else &self.want_in[0]
        cdef TensorBase t, mine
        cdef PyObject *mine_p = PyList_GET_ITEM(own, i)
        if mine_p == <PyObject *>None:
            if value is not None:
                names = self.output_names if output else self.input_names
                raise self.refusal(f"{names[i]}: this plan was built without it; build a plan with {names[i]}")
            return 0
        mine = <TensorBase>mine_p
        if value is None:
            if not output:
                raise self.refusal(f"{self.input_names[i]}: this plan was built with it; pass it on every call")
            target, remember, anchor = mine.data, None, None
        elif isinstance(value, TensorBase):
            t = <TensorBase>value
            if t._open and t.issuer is None:
                if <PyObject *>value == PyList_GET_ITEM(last, i) and t.data == want[i]:
                    return 0  # bound as last call
                if not output and <PyObject *>value == PyList_GET_ITEM(self.prev_in, i) \
                        and t.data == self.prev_data_in[i] and anchor_of(t) is <object>PyList_GET_ITEM(
                            self.prev_anchor_in, i):
                    self.swap_back(i)
                    return 0
            t.check_readable("pass it to a plan")
            if not fits_slot(t, mine):
                names = self.output_names if output else self.input_names
                raise self.refusal(f"{names[i]}: the plan is fixed to shape {mine.shape} {mine.dtype.name} contiguous "
                                   f"(got {t.shape} {t.dtype.name}{'' if t._contiguous else ' strided'})")
            target, remember, anchor = t.data, value, anchor_of(t)
        else:  # host data, copied into the plan's own buffer on every call
            names = self.output_names if output else self.input_names
            helpers().copy_host_value(self.op, mine, names[i], value, stream)
            target, remember, anchor = mine.data, UNSET, None
        if output:
            let_go = <object>PyList_GET_ITEM(anchors, i)
        else:  # the input bound so far becomes the previous one, and the previous one is let go of
            let_go = <object>PyList_GET_ITEM(self.prev_anchor_in, i)
            swap_items(last, self.prev_in, i)
            swap_items(anchors, self.prev_anchor_in, i)
            self.prev_data_in[i] = want[i]
        put_item(last, i, remember)
        put_item(anchors, i, anchor)
        want[i] = target
        self.moved = True
        # by anchor, not Tensor: a view rebound since may have a new one
        if let_go is not None and let_go is not anchor and (output or let_go is not <object>PyList_GET_ITEM(
                self.prev_anchor_in, i)):
            hold(stream, let_go)  # the launches queued so far may read it
        return 0

    cdef int let_go_of_input(self, Py_ssize_t i, StreamBase stream) except -1:
        """Keep nothing of input `i` beyond the launches queued so far (a temporary the caller made for
        this call, e.g. a host array uploaded): its memory, and that of the one bound before, is held on
        `stream` until it passes them; the next call binds its value anew."""
        for anchor in (<object>PyList_GET_ITEM(self.anchor_in, i), <object>PyList_GET_ITEM(self.prev_anchor_in, i)):
            if anchor is not None:
                hold(stream, anchor)
        put_item(self.last_in, i, UNSET)
        put_item(self.anchor_in, i, None)
        put_item(self.prev_in, i, None)
        put_item(self.prev_anchor_in, i, None)
        self.prev_data_in[i] = 0
        return 0

    cdef inline void swap_back(self, Py_ssize_t i) noexcept:
        """Input `i` takes the value it was given before the last one again (checked when it was bound)."""
        swap_items(self.last_in, self.prev_in, i)
        swap_items(self.anchor_in, self.prev_anchor_in, i)
        self.prev_data_in[i], self.want_in[i] = self.want_in[i], self.prev_data_in[i]
        self.moved = True

    cdef int rebind_and_launch(self, StreamBase stream) except -1:
        cdef aclnnStatus status = 0
        cdef aclrtStream handle = <aclrtStream>stream.handle
        cdef StreamStateBase st = stream_state(stream)  # kept: the stream may be destroyed meanwhile
        cdef void *ws = self.ws
        if self.stream_workspace and self.ws_size:
            ws = <void *>(st.ws_ptr if self.ws_size <= st.ws_size else <uintptr_t>grow_workspace(stream, self.ws_size))
        if self.moved:
            self.rebind()
        status = phase2(self.phase2_fn, ws, self.ws_size, self.executor, handle)
        st.launches += 1
        if status:
            check_aclnn(status, self.op)
        return 0

    cdef int rebind(self) except -1:
        """Bind the addresses that moved (``aclSetInputTensorAddr`` / ``aclSetOutputTensorAddr``)."""
        cdef Py_ssize_t i
        cdef aclnnStatus status
        for i in range(self.n_in):
            if self.want_in[i] != self.bound_in[i] and self.c_in[i] >= 0:
                status = set_input_addr(self.executor, <size_t>self.c_in[i], self.desc_in[i], <void *>self.want_in[i])
                if status:
                    check_aclnn(status, "aclSetInputTensorAddr")
                self.bound_in[i] = self.want_in[i]
        for i in range(self.n_out):
            if self.want_out[i] != self.bound_out[i] and self.c_out[i] >= 0:
                status = set_output_addr(self.executor, <size_t>self.c_out[i], self.desc_out[i],
                                         <void *>self.want_out[i])
                if status:
                    check_aclnn(status, "aclSetOutputTensorAddr")
                self.bound_out[i] = self.want_out[i]
        self.moved = False
        return 0

    cdef object refusal(self, str message):
        return helpers().param_invalid(self.op, message)

    cdef object rename_and_raise(self, object exc):
        names = self._vocabulary.names
        if names:
            reraise_as_caller(exc, names)
        raise exc

    # ---- the rest of its life ------------------------------------------------------------------------------
    property closed:
        def __get__(self):
            return not self._open

    property __signature__:
        """What ``inspect.signature(plan)`` reads: the parameters of :meth:`launch`."""
        def __get__(self):
            from inspect import signature
            return signature(self.launch)

    property workspace_size:
        def __get__(self):
            return self.ws_size

    property context:
        """The context tensor the plan was built with (None: a group-string generation)."""
        def __get__(self):
            return self.context_tensor

    def invalidate(self, str reason):
        """Refuse every later call with `reason` (e.g. the communicator the plan was built for changed)."""
        self.stale = reason

    def _communicator_closed(self, str label):
        """The communicator of the plan's context closed: every later call raises ClosedError naming it."""
        self.closed_communicator = label

    def close(self):
        """Destroy the executor and free the plan's buffers — and let go of the caller's Tensors it keeps —
        once the stream of the last launch has passed it (a launch may still be queued; launches on other
        streams are ordered before it by the caller, as they share these buffers). The plan's Tensors are
        closed at once. Idempotent."""
        if not self._open:
            return
        self._open = False
        own = [t for t in self.own_in[1:] + self.own_out if t is not None]  # input 0: the caller's context
        anchors = [anchor_of(<TensorBase>t) for t in own]
        anchors += [a for a in self.anchor_in + self.anchor_out + self.prev_anchor_in if a is not None]
        self.anchor_in, self.prev_anchor_in, self.prev_in = [None] * self.n_in, [None] * self.n_in, [None] * self.n_in
        self.anchor_out = [None] * self.n_out
        cdef PlanRelease release = PlanRelease.__new__(PlanRelease)
        release.descriptors = [(<TensorBase>t)._take_descriptor() for t in own]
        for t in own:
            (<TensorBase>t).close_now()  # refused from now on; the executor uses the descriptors until the release
        release.prepared, release.anchors, release.workspace = self.prepared, anchors, self.workspace_memory
        helpers().release_after(self._stream, release)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if self._open:
            try:
                self.close()
            except Exception:
                pass

    def _label(self):
        return f"{type(self).__name__}({self.op})"

    def __repr__(self):
        label = self._label()
        return label if self._open else f"{label[:len(label) - 1]}, closed)"


@cython.final
cdef class PlanRelease:
    """The end of a closed plan, called once the stream of its last launch has passed it: the executor,
    then the descriptors its slots referred to, then the memory `anchors` keep (the plan's buffers', and
    that of the caller's Tensors bound last, which the caller may have closed). Runs once."""

    cdef object prepared     # aclnn_py.ops.executor.Prepared: the repeatable executor
    cdef list descriptors    # addresses of the aclTensor descriptors taken from the plan's Tensors
    cdef list anchors
    cdef object workspace    # the plan's own workspace DeviceMemory, or None

    def __call__(self):
        prepared, self.prepared = self.prepared, None
        if prepared is None:
            return
        try:
            prepared.close()
        finally:
            descriptors, self.descriptors, self.anchors = self.descriptors, None, None
            for d in descriptors:
                if d and destroy_tensor != NULL:
                    destroy_tensor(<aclTensor *><uintptr_t>d)
            if self.workspace is not None:
                self.workspace.close()
                self.workspace = None


cdef Py_ssize_t FROM_ONE[MAX_TENSORS]  # the inputs of an operator function after the context: 1, 2, …
for _i in range(MAX_TENSORS):
    FROM_ONE[_i] = _i + 1


cdef Plan result_set_plan(Operator op, Launcher launcher, ConfigBase cfg, PyObject **ins, object outputs):
    """A plan writing a MoeDistributeBuffer result set's `outputs`, its executor made from the call's `ins`."""
    cdef Plan plan = Plan.__new__(Plan)
    prepared = helpers().result_set_executor(launcher, cfg, op.list_of(ins),
                                             [outputs] if isinstance(outputs, TensorBase) else list(outputs))
    plan.input_names, plan.output_names = op.input_names, op.output_names
    try:
        plan.adopt(prepared, cfg, None if ins[0] == NULL else <object>ins[0], launcher, True)
    except BaseException:
        prepared.close()
        raise
    return plan


# ---- plan(...) by vectorcall ----
cdef fastcall_method dispatch_plan_call = NULL
cdef fastcall_method combine_plan_call = NULL


cdef str STREAM_WORD = sys.intern("stream")


cdef inline bint at_most_stream(PyObject *kwnames, Py_ssize_t *at):
    """The call's keywords are none, or only `stream` (the interned name a call site passes; at[0]: its
    place among the arguments after the positional ones, -1 when absent). Anything else goes through the
    method's own parser."""
    if kwnames == NULL:
        at[0] = -1
        return True
    if PyTuple_GET_SIZE(<object>kwnames) == 1 and PyTuple_GET_ITEM(<object>kwnames, 0) == <PyObject *>STREAM_WORD:
        at[0] = 0
        return True
    return False


cdef object dispatch_plan_vectorcall(object plan, PyObject *const *args, size_t nargsf, PyObject *kwnames):
    cdef Py_ssize_t n = PyVectorcall_NARGS(nargsf), at
    if n == 2 and at_most_stream(kwnames, &at):  # plan(x, expert_ids[, stream=...]): no parser needed
        return (<DispatchPlan>plan).run(<object>args[0], <object>args[1], None, None, None, None, None,
                                        None if at < 0 else <object>args[2])
    return dispatch_plan_call(plan, args, n, kwnames)


cdef object combine_plan_vectorcall(object plan, PyObject *const *args, size_t nargsf, PyObject *kwnames):
    cdef Py_ssize_t n = PyVectorcall_NARGS(nargsf), at
    if (n == 4 or n == 5) and at_most_stream(kwnames, &at):  # plan(expand_x, ids, assist, counts[, scales][, stream=])
        return (<CombinePlan>plan).run(<object>args[0], <object>args[1], <object>args[2], <object>args[3],
                                       None if n == 4 else <object>args[4], None, None, None, None, None, None,
                                       None, None, None, None if at < 0 else <object>args[n])
    return combine_plan_call(plan, args, n, kwnames)


cdef void *fastcall_of(type cls, str name):
    """The C function of `cls`'s method `name` when it takes its arguments as a vectorcall does
    (METH_FASTCALL | METH_KEYWORDS), else NULL."""
    descriptor = cls.__dict__[name]
    if not isinstance(descriptor, MethodDescriptorType):
        return NULL
    cdef PyMethodDef *method = (<PyMethodDescrObject *><PyObject *>descriptor).d_method
    if method.ml_flags & (METH_FASTCALL | METH_KEYWORDS) != (METH_FASTCALL | METH_KEYWORDS):
        return NULL
    return method.ml_meth


cdef int enable_vectorcall(type cls, Plan probe) except -1:
    """Let CPython call instances of `cls` by vectorcall through their `entry` field."""
    cdef PyTypeObject *tp = <PyTypeObject *>cls
    tp.tp_vectorcall_offset = <Py_ssize_t>(<char *>&probe.entry - <char *><PyObject *>probe)
    tp.tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL
    return 0


# the operator function's input index of each value a plan call passes
cdef Py_ssize_t[5] DISPATCH_SLOTS = [1, 2, 3, 4, 5]  # x, expert_ids, scales, x_active_mask, expert_scales
# expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, x_active_mask,
# shared_expert_x, ori_x, const_expert_alpha_1, const_expert_alpha_2, const_expert_v
cdef Py_ssize_t[12] COMBINE_SLOTS = [1, 2, 3, 4, 5, 6, 7, 12, 14, 15, 16, 17]
cdef Py_ssize_t[11] COMBINE_SLOTS_UNWEIGHTED = [1, 2, 3, 4, 6, 7, 12, 14, 15, 16, 17]


cdef class DispatchPlan(Plan):
    """Dispatch with fixed shapes and attributes, launched many times (a repeatable executor), in the
    generation of its config.

    Build it with the shapes (`bs`, `hidden`, `topk`), x's type, which optional inputs exist, and the
    attributes (`config` or keywords); call it with this step's inputs (host arrays are copied into the
    plan's buffers; Tensors are bound by address). The returned outputs are the plan's own buffers,
    overwritten by the next call, unless `outputs` are given. Host weights follow the per-call rule
    (float64 converted to float32 when exact)."""

    cdef readonly Py_ssize_t bs, hidden, topk
    cdef readonly object x_dtype
    cdef object own_outputs       # the plan's own outputs as DispatchOutputs
    cdef object outputs_type

    def __cinit__(self, *args, **kwargs):
        if dispatch_plan_call != NULL:
            self.entry = <void *>dispatch_plan_vectorcall

    def __init__(self, context: Tensor | None, *, bs: int, hidden: int, topk: int, x_dtype: DTypeLike,
                 config: MoeConfig | None = None, scales_shape: tuple[int, ...] | None = None,
                 scales_dtype: DTypeLike | None = None, mask_shape: tuple[int, ...] | None = None,
                 with_expert_scales: bool = False, y_dtype: DTypeLike | None = None, stream: StreamArg = None,
                 **attrs: int | str):
        built = helpers().build_dispatch(context, bs, hidden, topk, x_dtype, config, scales_shape, scales_dtype,
                                         mask_shape, with_expert_scales, y_dtype, stream, attrs)
        self.input_names, self.output_names = built.input_names, built.output_names
        self.adopt(built.prepared, built.config, context, built.launcher)
        self.bs, self.hidden, self.topk, self.x_dtype = bs, hidden, topk, built.x_dtype
        self.outputs_type = built.outputs_type
        self.own_outputs = built.prepared.result

    property outputs:
        """The plan's own outputs: what a call without `outputs` writes and returns."""
        def __get__(self):
            return self.own_outputs

    def __call__(self, *args, **kwargs):
        """``plan(x, expert_ids, *, scales, x_active_mask, expert_scales, topk_weights, outputs, stream)``:
        phase 2 with this step's inputs (the parameters of :meth:`launch`, which CPython's vectorcall
        reaches directly)."""
        return self.launch(*args, **kwargs)

    @cython.binding(False)  # a method descriptor of the type: its C function is the vectorcall target
    @cython.embedsignature(True)
    @cython.embedsignature.format("clinic")  # its signature, readable by inspect
    def launch(self, x: TensorArg, expert_ids: TensorArg, *, scales: TensorArg | None = None,
              x_active_mask: TensorArg | None = None, expert_scales: TensorArg | None = None,
              topk_weights: TensorArg | None = None, outputs: DispatchOutputs | None = None,
              stream: StreamArg = None) -> DispatchOutputs:
        """Phase 2 with this step's inputs: ``plan(...)`` is this call. `topk_weights` is
        :class:`~aclnn_py.MoeDistributeBuffer`'s name of `expert_scales`: pass either. An entry of
        `outputs` left None is written to the plan's own buffer for it; the result holds the Tensors
        written."""
        return self.run(x, expert_ids, scales, x_active_mask, expert_scales, topk_weights, outputs, stream)

    cdef object run(self, x, expert_ids, scales, x_active_mask, expert_scales, topk_weights, outputs, stream):
        cdef PyObject *values[5]
        try:
            if topk_weights is not None:
                if expert_scales is not None:
                    raise TypeError("topk_weights: the same input as expert_scales (MoeDistributeBuffer's name of "
                                    "it); pass one of them, not both")
                expert_scales = topk_weights
            if expert_scales is not None and not isinstance(expert_scales, TensorBase):
                expert_scales = helpers().host_weights(expert_scales, "expert_scales", self.op)
            if expert_scales is not None and self.own_in[5] is None:
                raise self.refusal(self._vocabulary.unweighted())
            if outputs is not None and type(outputs) is not self.outputs_type:
                raise TypeError(f"outputs: expected DispatchOutputs, got {type(outputs).__name__}")
            values[0], values[1], values[2] = <PyObject *>x, <PyObject *>expert_ids, <PyObject *>scales
            values[3], values[4] = <PyObject *>x_active_mask, <PyObject *>expert_scales
            self.step(values, 5, DISPATCH_SLOTS, outputs, stream)
        except Exception as exc:
            self.rename_and_raise(exc)
        if outputs is None:
            return self.own_outputs
        return self.outputs_type(*[self.own_out[k] if outputs[k] is None else outputs[k] for k in range(self.n_out)])


cdef class CombinePlan(Plan):
    """Combine with fixed shapes and attributes, launched many times (a repeatable executor), in the
    generation of its config.

    `a` is the expand_x row capacity (dispatch's A), `assist_len` and `counts_len` the lengths of
    dispatch's assist_info_for_combine and ep_recv_counts. Optional inputs present at plan time are
    named by the ``with_*`` flags / shapes. Host weights follow the per-call rule (float64 converted
    to float32 when exact). With a TP domain (``tp_world_size=2``) every call takes `tp_send_counts`:
    the dispatch's tp_recv_counts."""

    cdef bint weighted

    def __cinit__(self, *args, **kwargs):
        if combine_plan_call != NULL:
            self.entry = <void *>combine_plan_vectorcall

    def __init__(self, context: Tensor | None, *, a: int, bs: int, hidden: int, topk: int,
                 dtype: DTypeLike, assist_len: int, counts_len: int, config: MoeConfig | None = None,
                 with_expert_scales: bool = False, mask_shape: tuple[int, ...] | None = None,
                 with_shared_expert_x: bool = False, with_ori_x: bool = False, const_experts: int = 0,
                 stream: StreamArg = None, **attrs: int | str):
        built = helpers().build_combine(context, a, bs, hidden, topk, dtype, assist_len, counts_len, config,
                                        with_expert_scales, mask_shape, with_shared_expert_x, with_ori_x,
                                        const_experts, stream, attrs)
        self.input_names, self.output_names = built.input_names, built.output_names
        self.adopt(built.prepared, built.config, context, built.launcher)
        self.weighted = with_expert_scales

    property x_out:
        """The plan's own output: what a call without `x_out` writes and returns."""
        def __get__(self):
            return self.own_out[0]

    def __call__(self, *args, **kwargs):
        """``plan(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, *, ...)``:
        phase 2 with this step's inputs (the parameters of :meth:`launch`, which CPython's vectorcall
        reaches directly)."""
        return self.launch(*args, **kwargs)

    @cython.binding(False)  # a method descriptor of the type: its C function is the vectorcall target
    @cython.embedsignature(True)
    @cython.embedsignature.format("clinic")  # its signature, readable by inspect
    def launch(self, expand_x: TensorArg, expert_ids: TensorArg, assist_info_for_combine: TensorArg,
              ep_send_counts: TensorArg, expert_scales: TensorArg | None = None, *,
              topk_weights: TensorArg | None = None, x_active_mask: TensorArg | None = None,
              shared_expert_x: TensorArg | None = None, ori_x: TensorArg | None = None,
              const_expert_alpha_1: TensorArg | None = None, const_expert_alpha_2: TensorArg | None = None,
              const_expert_v: TensorArg | None = None, tp_send_counts: TensorArg | None = None,
              x_out: Tensor | None = None, stream: StreamArg = None) -> Tensor:
        """Phase 2 with this step's inputs: ``plan(...)`` is this call. `topk_weights` is
        :class:`~aclnn_py.MoeDistributeBuffer`'s name of `expert_scales`: pass either (an unweighted plan
        takes None or an empty array)."""
        return self.run(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, topk_weights,
                         x_active_mask, shared_expert_x, ori_x, const_expert_alpha_1, const_expert_alpha_2,
                         const_expert_v, tp_send_counts, x_out, stream)

    cdef object run(self, expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, topk_weights,
                     x_active_mask, shared_expert_x, ori_x, const_expert_alpha_1, const_expert_alpha_2,
                     const_expert_v, tp_send_counts, x_out, stream):
        cdef PyObject *values[12]
        cdef Py_ssize_t k
        try:
            if topk_weights is not None:
                if expert_scales is not None:
                    raise TypeError("topk_weights: the same input as expert_scales (MoeDistributeBuffer's name of "
                                    "it); pass one of them, not both")
                expert_scales = topk_weights
            if expert_scales is not None and not isinstance(expert_scales, TensorBase):
                expert_scales = helpers().host_weights(expert_scales, "expert_scales", self.op)
            if expert_scales is not None and not self.weighted and helpers().size_of(expert_scales):
                raise self.refusal(self._vocabulary.unweighted())
            if x_out is not None and not isinstance(x_out, TensorBase):
                raise TypeError(f"x_out: outputs must be Tensors (device memory the operator writes into), got "
                                f"{type(x_out).__name__}")
            outputs = None if x_out is None else [x_out]
            values[0], values[1] = <PyObject *>expand_x, <PyObject *>expert_ids
            values[2], values[3] = <PyObject *>assist_info_for_combine, <PyObject *>ep_send_counts
            values[4], values[5], values[6] = <PyObject *>expert_scales, <PyObject *>tp_send_counts, \
                <PyObject *>x_active_mask
            values[7], values[8], values[9] = <PyObject *>shared_expert_x, <PyObject *>ori_x, \
                <PyObject *>const_expert_alpha_1
            values[10], values[11] = <PyObject *>const_expert_alpha_2, <PyObject *>const_expert_v
            if self.weighted:
                self.step(values, 12, COMBINE_SLOTS, outputs, stream)
            else:  # no expert_scales slot: the values after it move up one
                for k in range(4, 11):
                    values[k] = values[k + 1]
                self.step(values, 11, COMBINE_SLOTS_UNWEIGHTED, outputs, stream)
        except Exception as exc:
            self.rename_and_raise(exc)
        return self.own_out[0] if x_out is None else x_out


cdef int enable_plan_vectorcall() except -1:
    global dispatch_plan_call, combine_plan_call
    dispatch_plan_call = <fastcall_method>fastcall_of(DispatchPlan, "launch")
    combine_plan_call = <fastcall_method>fastcall_of(CombinePlan, "launch")
    probe = Plan.__new__(Plan)
    if dispatch_plan_call != NULL:
        enable_vectorcall(DispatchPlan, probe)
    if combine_plan_call != NULL:
        enable_vectorcall(CombinePlan, probe)
    return 0


enable_plan_vectorcall()
