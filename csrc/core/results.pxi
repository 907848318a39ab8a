# MoeDistributeBuffer's result sets: each method keeps a fixed ring of them. A call takes the next set
# of the ring and writes its outputs into the set's memory when the set holds outputs of this call's
# layout (same config, shapes and optional inputs; written on the same stream; never exported or read
# on another stream), else into new outputs the set adopts. With the outputs the set keeps a repeatable
# executor of their layout (a Plan: phase 1 once per layout, then each call rebinds the inputs that
# moved and launches), and the device Tensors its calls' host arrays are copied into (HostInputs); a
# call with dtype overrides or a strided input runs both phases instead. A set keeps the outputs and
# executors of its LAYOUTS_KEPT latest layouts: a serving loop whose token count varies among a few
# values finds its layout kept instead of allocating outputs and running phase 1 at every call. The
# call hands out new Tensor objects over the set's memory; the ones handed out before over that set are
# recycled, and every read of a recycled Tensor raises RecycledError. So a result stays valid until the
# ring comes round: `size` more calls of the same method (docs/concepts.md, "Buffer results").

cdef enum:
    LAYOUTS_KEPT = 4   # layouts whose outputs and executor a result set keeps (the current one and those set aside)
#: How many layouts (outputs and executor) a MoeDistributeBuffer result set keeps.
RESULT_SET_LAYOUTS = LAYOUTS_KEPT
cdef object make_host_inputs = None   # aclnn_py.ops.host_inputs.HostInputs, at the first need


cdef inline TensorBase new_view(TensorBase t, ResultSet issuer):
    """A new Tensor of `t`'s class over `t`'s memory, lending `t`'s descriptor, handed out by `issuer`."""
    cdef TensorBase v = view_of(t)
    v._mem, v._owner, v._writer = t._mem, t._owner, t._writer
    v.desc, v.owns_desc = t.desc, False
    v.issuer, v.issue = issuer, issuer.issue
    return v


@cython.final
cdef class Layout:
    """Outputs a result set writes and the executor writing them, with what they were made for."""

    cdef object outputs               # as the operator returns them
    cdef tuple own                    # the same, one Tensor or None per output (never handed out)
    cdef tuple views                  # the Tensors handed out over them last (None before the first)
    cdef object config, x_shape, x_dtype, ids_shape
    cdef long long present            # which inputs the call had (a bit per input)
    cdef bint prechecked              # the outputs were made after the pre-checks of their layout passed
    cdef object stream                # the stream that last wrote them
    cdef Plan plan                    # the repeatable executor writing them, or None

    cdef bint suits(self, ConfigBase cfg, TensorBase x, TensorBase ids, long long present, tuple dtypes,
                    StreamBase stream):
        """The outputs are of this call's layout, last written on `stream`, and may be written again."""
        if cfg is not self.config or present != self.present:
            return False
        for d in dtypes:
            if d is not None:
                return False  # a dtype override: the operator's module lays the outputs out
        if stream is not self.stream and (self.stream is None or (<StreamBase>self.stream)._key != stream._key):
            return False
        if x.dtype is not self.x_dtype or not (x.shape is self.x_shape or x.shape == self.x_shape) \
                or not (ids.shape is self.ids_shape or ids.shape == self.ids_shape):
            return False
        return self.reusable()

    cdef bint reusable(self):
        """None of the Tensors handed out over the outputs was exported or read on another stream (someone
        else may still read their memory)."""
        if self.views is not None:
            for v in self.views:
                if v is not None and (<TensorBase>v)._shared:
                    return False
        return True

    cdef int close_plan(self) except -1:
        if self.plan is not None:
            plan, self.plan = self.plan, None
            plan.close()  # released once the stream of its last launch has passed it
        return 0


@cython.final
cdef class ResultSet:
    """One set of a ring: the layout whose outputs a call writes (and those set aside), and the issue
    number of the Tensors handed out last."""

    cdef readonly Py_ssize_t issue
    cdef ResultRing ring
    cdef Layout cur                   # the outputs the set wrote last, or None before its first call
    cdef list aside                   # Layouts of earlier calls, latest first (at most LAYOUTS_KEPT - 1)
    cdef Py_ssize_t n_blocks
    cdef void *block_ptr[MAX_TENSORS]  # cur's blocks, refilled with the poison of new memory on the mock
    cdef size_t block_size[MAX_TENSORS]
    cdef Py_ssize_t rows, rows_issue   # the rows the call of issue `rows_issue` received, once read
    cdef object host_inputs           # aclnn_py.ops.host_inputs.HostInputs: its calls' host data on the device

    def __cinit__(self, ResultRing ring):
        self.ring = ring
        self.rows_issue = -1
        self.aside = []

    cdef Py_ssize_t received_rows(self, bint read) except -2:
        """The rows the call of the current issue received (a dispatch's N), or -1: unknown (not read yet
        and not `read`; or outputs whose layout the ring has no rule for). `read`: the caller saw the
        stream that wrote the set finish, so the count may be read from the device."""
        if self.rows_issue == self.issue:
            return self.rows
        if not read or self.ring.read_rows is None or self.cur is None:
            return -1
        self.rows = self.ring.read_rows(self.cur.outputs, self.cur.config, self.cur.present)
        self.rows_issue = self.issue
        return self.rows

    cdef object plan_for(self, Operator op, Launcher launcher, ConfigBase cfg, PyObject **ins, tuple dtypes,
                         bint precheck, StreamBase stream):
        """The plan a call of `op` launches: the set's own when its outputs and executor suit the call, else
        one over new outputs (made after the pre-checks) that the set keeps from now on; None for a call
        with dtype overrides or a strided input, which runs both phases (outputs_for)."""
        cdef Py_ssize_t i
        cdef TensorBase t
        for d in dtypes:
            if d is not None:
                return None
        for i in range(1, op.n_in):
            if ins[i] != NULL:
                t = <TensorBase>ins[i]
                if not t._open or t.issuer is not None:
                    check_passable(t, op.input_names[i])
                if not t._contiguous:
                    return None
        made = self.outputs_for(op, cfg, ins, dtypes, precheck, stream)
        cdef Layout cur = self.cur
        if cur.plan is not None and not cur.plan.fits(ins, op.n_in):
            cur.close_plan()  # other shapes of an input the outputs do not depend on
        if cur.plan is None:
            cur.plan = result_set_plan(op, launcher, cfg, ins, made)
        return cur.plan

    cdef object host_inputs_on(self, StreamBase stream):
        """The Tensors this set keeps for host inputs, for a call on `stream`."""
        global make_host_inputs
        if self.host_inputs is None:
            if make_host_inputs is None:
                from .ops.host_inputs import HostInputs
                make_host_inputs = HostInputs
            self.host_inputs = make_host_inputs()
        return self.host_inputs.on(stream)

    cdef bint keeps(self, PyObject *t):
        """`t` is one of the Tensors this set keeps for host inputs."""
        if self.host_inputs is None:
            return False
        return id(<object>t) in <set>self.host_inputs.ids

    cdef int launch(self, Plan plan, PyObject **ins, PyObject **given, Py_ssize_t n, StreamBase stream) except -1:
        """`plan` writes the set's outputs from `ins` (the operator function's order, NULL: absent) on `stream`;
        an input that is neither the caller's `given` one nor one the set keeps (an upload made for this
        call) is not kept by the plan."""
        cdef PyObject *values[MAX_TENSORS]
        cdef Py_ssize_t i
        for i in range(1, n):
            values[i - 1] = ins[i] if ins[i] != NULL else <PyObject *>None
        plan.step(values, n - 1, FROM_ONE, None, stream)
        mark_written(self.cur.outputs, stream)
        for i in range(1, n):
            if ins[i] != NULL and ins[i] != given[i] and not self.keeps(ins[i]):
                plan.let_go_of_input(i, stream)
        return 0

    cdef object outputs_for(self, Operator op, ConfigBase cfg, PyObject **ins, tuple dtypes, bint precheck,
                            StreamBase stream):
        """The outputs a call of `op` writes: the set's own when they suit it (its current layout's, or a
        layout it set aside), else new ones (made after the pre-checks) that the set keeps from now on."""
        cdef long long present = 0
        cdef Py_ssize_t i
        for i in range(op.n_in):
            if ins[i] != NULL:
                present |= 1LL << i
        x, ids = <TensorBase>ins[1], <TensorBase>ins[2]
        if self.cur is not None and (self.cur.suits(cfg, x, ids, present, dtypes, stream)
                                     or self.take_aside(cfg, x, ids, present, dtypes, stream)) \
                and (self.cur.prechecked or not precheck):
            # the pre-checks of this layout ran when the set's outputs were made: the verdict is the same
            self.refill(stream)
            return self.cur.outputs
        made = op.make_outputs(cfg, op.list_of(ins), None, dtypes, precheck, stream)
        cdef Layout new = Layout.__new__(Layout)
        new.outputs, new.own = made, (made,) if isinstance(made, TensorBase) else tuple(made)
        new.config, new.x_shape, new.x_dtype, new.ids_shape = cfg, x.shape, x.dtype, ids.shape
        new.present, new.prechecked = present, precheck
        self.use(new)
        return made

    cdef bint take_aside(self, ConfigBase cfg, TensorBase x, TensorBase ids, long long present, tuple dtypes,
                         StreamBase stream) except -1:
        """A layout set aside suits the call: it becomes the current one."""
        cdef Py_ssize_t i
        for i in range(len(self.aside)):
            if (<Layout>self.aside[i]).suits(cfg, x, ids, present, dtypes, stream):
                self.use(<Layout>self.aside.pop(i))
                return True
        return False

    cdef int use(self, Layout layout) except -1:
        """`layout` becomes the current one; the one before is set aside unless its outputs cannot be
        written again, and the oldest beyond LAYOUTS_KEPT let go of (an executor once its stream has
        passed it)."""
        cdef Layout before = self.cur
        if before is not None:
            if before.reusable():
                self.aside.insert(0, before)
                if len(self.aside) >= LAYOUTS_KEPT:
                    (<Layout>self.aside.pop()).close_plan()
            else:  # outputs someone else may still read: not kept for later
                before.close_plan()
        self.cur = layout
        self.n_blocks = 0
        for t in layout.own:
            if t is None:
                continue
            mem = (<TensorBase>t)._mem
            if mem is not None and mem.size > 0 and self.n_blocks < MAX_TENSORS:
                self.block_ptr[self.n_blocks] = <void *><uintptr_t>mem._ptr
                self.block_size[self.n_blocks] = <size_t>mem.size
                self.n_blocks += 1
        return 0

    cdef int close_plans(self) except -1:
        """Let go of the executors of every layout kept."""
        if self.cur is not None:
            self.cur.close_plan()
        aside, self.aside = self.aside, []
        for kept in aside:
            (<Layout>kept).close_plan()
        return 0

    cdef int refill(self, StreamBase stream) except -1:
        """On the mock with its poison on: the set's memory gets the poison of new memory again, in stream
        order (work queued before may still read it), as a block the pool hands out again does."""
        cdef int status
        if refill_poison != NULL and self.n_blocks:
            status = refill_poison(self.block_ptr, self.block_size, self.n_blocks, <void *>stream.handle)
            if status:
                raise RuntimeError(f"the mock's poison refill of a result set failed (status {status})")
        return 0

    cdef tuple hand_out(self, StreamBase stream, long long wanted):
        """New Tensors over the set's memory for the caller (the outputs whose bit is set in `wanted`;
        None for the others), written on `stream`; the ones handed out before are recycled from now on."""
        cdef Layout cur = self.cur
        cdef Py_ssize_t j, n = PyTuple_GET_SIZE(cur.own)
        self.issue += 1
        cur.stream = stream
        views = PyTuple_New(n)
        for j in range(n):
            t = <object>PyTuple_GET_ITEM(cur.own, j)
            v = None if t is None or not (wanted >> j) & 1 else new_view(<TensorBase>t, self)
            Py_INCREF(v)  # PyTuple_SET_ITEM steals one
            PyTuple_SET_ITEM(views, j, v)
        cur.views = views
        return views

    cdef str recycled_message(self, str label, str operation):
        return (f"{label} is a result of MoeDistributeBuffer.{self.ring.method} that was recycled: a later call "
                f"of the method wrote its next result into the same memory (a result stays valid until "
                f"{self.ring.size} more calls of the method); cannot {operation}. To keep a result longer, "
                f"clone() it or pass keep=True")


@cython.final
cdef class ResultRing:
    """A buffer method's ring of result sets."""

    cdef readonly str method
    cdef readonly Py_ssize_t size
    cdef list sets
    cdef Py_ssize_t next
    # Outputs written row by row (a dispatch's): read_rows(outputs, config, present) -> the rows received, read
    # from the device (-1: a layout without the rule), and per output the elements a received row
    # takes (-1: one row of dim 0; 0: the output is not written row by row). None: no such outputs.
    cdef object read_rows
    cdef tuple row_elements

    def __init__(self, str method, Py_ssize_t size, read_rows=None, tuple row_elements=None):
        if size < 1:
            raise ValueError(f"result_sets: must be >= 1 (got {size})")
        self.method, self.size, self.next = method, size, 0
        self.read_rows, self.row_elements = read_rows, row_elements
        self.sets = [ResultSet(self) for _ in range(size)]

    cdef ResultSet take(self):
        cdef ResultSet found = <ResultSet>PyList_GET_ITEM(self.sets, self.next)
        self.next = (self.next + 1) % self.size
        return found

    property held:
        """How many sets hold outputs."""
        def __get__(self):
            return sum(1 for s in self.sets if (<ResultSet>s).cur is not None)

    def close_plans(self):
        """Let go of the sets' executors and kept host inputs (each once its stream has passed its last
        launch)."""
        for s in self.sets:
            (<ResultSet>s).close_plans()
            if (<ResultSet>s).host_inputs is not None:
                (<ResultSet>s).host_inputs.release()


cdef Py_ssize_t written_nbytes(TensorBase t) except -2:
    """The bytes from element 0 of `t` that its call wrote, when `t` is an output a dispatch result set
    handed out row by row (its received rows read from the device if not read yet: its writer has
    finished); else -1 (all of it may hold written bytes)."""
    cdef ResultSet issued
    cdef Py_ssize_t j, n, per, total
    if t.issuer is None:
        return -1
    issued = <ResultSet>t.issuer
    if issued.issue != t.issue or issued.ring.row_elements is None or issued.cur.views is None:
        return -1
    for j in range(PyTuple_GET_SIZE(issued.cur.views)):
        if <object>PyTuple_GET_ITEM(issued.cur.views, j) is t:
            break
    else:
        return -1
    per = issued.ring.row_elements[j]
    if per == 0 or t._shared or t._rewritten or not t._contiguous or t.offset != 0 or len(t.shape) == 0:
        return -1  # what someone else may have written since (an export, a copy into it) is copied too
    n = issued.received_rows(True)
    if n < 0:
        return -1
    if per < 0:
        per = 1
        for d in t.shape[1:]:
            per *= <Py_ssize_t>d
    total = t.span
    return min(total, (n * per * <Py_ssize_t>t.dtype.bits + 7) // 8)
