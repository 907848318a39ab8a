/* Plans in C (fastpath.h). A plan is a repeatable executor with its own buffers; a serving loop calls
 * it with device Tensors of the plan's layout, often the same ones as last step. The C path records the
 * addresses of the Tensors that changed, calls the cffi extension's aclnnpy_plan_launch
 * (build_ffi_plan.c: rebinding and launch) and marks the outputs' writer. The executor reads the memory
 * of the Tensors bound to it whenever a launch runs, so the plan keeps what keeps that memory valid
 * (Tensor._anchor(), taken when a Tensor is bound: the caller may close it right after the call) in
 * `bound_in`, shared with the Python path. A call that binds another Tensor holds the anchor it
 * replaces on the stream until the stream passes the launches that used it, as the Python path does.
 * A failed rebinding or launch is handed to the plan's `on_failure(status)`, which raises.
 *
 *   State      a plan's fixed part (state()), in a capsule the plan keeps as `_c_state`
 *   PlanBase   the plan classes' base: it holds `_c_state`, and lets the interpreter call a plan with
 *              the arguments as they are on its stack (vectorcall) once adopt() saw the class
 *   PlanCall   a plan class's __call__: parses the call by the Python __call__'s parameter names */
#include "fastpath.h"

typedef __typeof__(aclnnpy_plan_launch) *plan_launch_fn;  /* csrc/aclnnpy.h */

/* A Tensor found usable for a slot, and what made it so: while the Tensor lives (the reference is weak:
 * the plan keeps only what the Python path keeps) and these slots of it hold the same objects, its
 * address is `addr`. A serving loop alternates a few activation Tensors per slot; this spares reading
 * their shape and address integers on every call. */
typedef struct {
    PyObject *tensor;        /* weak reference, or NULL: an empty entry */
    PyObject *ptr, *offset, *shape;  /* its `_ptr`, `_offset_nbytes` and `shape` then (held, so that their
                                      * identity stands for their value) */
    uintptr_t addr;
} Known;

#define KNOWN_PER_SLOT 2

typedef struct {
    plan_launch_fn launch;
    void *plan;              /* struct aclnnpy_plan * */
    uintptr_t *want_in;      /* the plan's in_want array */
    int *busy;               /* the plan's `busy`: a step is running (aclnnpy_plan_enter) */
    Py_ssize_t n_values;     /* how many arguments a call passes */
    Py_ssize_t *slots;       /* the input slot of each argument */
    Py_ssize_t n_params;     /* parameters of the plan's __call__ (after self) */
    Py_ssize_t *params;      /* per parameter: the argument it gives, ROLE_STREAM or ROLE_NONE */
    PyObject *last_in;       /* list, shared with the Plan: what each slot was given last call */
    PyObject *own_shape;     /* tuple by slot: the plan's shape, or None for an absent slot */
    PyObject *own_dtype;     /* tuple by slot: the plan's DataType */
    PyObject *outputs;       /* tuple: the plan's own output Tensors */
    PyObject *last_out;      /* list, shared with the Plan: all None when the outputs are the plan's own */
    PyObject *bound_in;      /* list, shared with the Plan: per slot the anchor of the caller's Tensor bound
                              * there, or None */
    PyObject *tensor_type;
    PyObject *stream_type;
    PyObject *on_failure;    /* called with the status of a failed rebinding or launch; raises */
    Ordered ordered;         /* the stream-ordered state, for the holds of replaced Tensors */
    Known *known;            /* KNOWN_PER_SLOT per slot */
    unsigned char *known_next;  /* per slot: the entry to replace next */
    Py_ssize_t n_slots;
} State;

/* The typed fields of a Tensor / Stream (the plan checked the object's exact type first). */
#define TENSOR(t) ((TensorFields *)(t))
#define STREAM(s) ((StreamFields *)(s))

static const char CAPSULE[] = "aclnn_py._fastpath.State";

static void known_clear(Known *k) {
    Py_CLEAR(k->tensor);
    Py_CLEAR(k->ptr);
    Py_CLEAR(k->offset);
    Py_CLEAR(k->shape);
}

/* Frees a state and drops its references (fields not set yet are NULL). */
static void state_release(State *st) {
    if (st->known)
        for (Py_ssize_t k = 0; k < st->n_slots * KNOWN_PER_SLOT; ++k) known_clear(&st->known[k]);
    PyMem_Free(st->known);
    ordered_release(&st->ordered);
    PyMem_Free(st->known_next);
    Py_XDECREF(st->last_in);
    Py_XDECREF(st->own_shape);
    Py_XDECREF(st->own_dtype);
    Py_XDECREF(st->outputs);
    Py_XDECREF(st->last_out);
    Py_XDECREF(st->bound_in);
    Py_XDECREF(st->tensor_type);
    Py_XDECREF(st->stream_type);
    Py_XDECREF(st->on_failure);
    PyMem_Free(st->slots);
    PyMem_Free(st->params);
    PyMem_Free(st);
}

static void state_free(PyObject *capsule) {
    State *st = (State *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (st) state_release(st);
}

/* state(launch, plan, want_in, slots, params, last_in, own_shape, own_dtype, outputs, last_out, bound_in, Tensor,
 *       Stream, on_failure, ordered, busy) */
PyObject *make_state(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long launch, plan, want_in, busy;
    PyObject *slots, *params, *last_in, *own_shape, *own_dtype, *outputs, *last_out, *bound_in, *tensor_type,
        *stream_type, *on_failure, *ordered;
    if (!PyArg_ParseTuple(args, "KKKO!O!O!O!O!O!O!O!O!O!OO!K:state", &launch, &plan, &want_in, &PyTuple_Type, &slots,
                          &PyTuple_Type, &params,
                          &PyList_Type, &last_in, &PyTuple_Type, &own_shape, &PyTuple_Type, &own_dtype,
                          &PyTuple_Type, &outputs, &PyList_Type, &last_out, &PyList_Type, &bound_in,
                          &PyType_Type, &tensor_type, &PyType_Type, &stream_type, &on_failure, &PyTuple_Type,
                          &ordered, &busy))
        return NULL;
    if (!PyCallable_Check(on_failure)) {
        PyErr_SetString(PyExc_TypeError, "state: on_failure must be callable");
        return NULL;
    }
    if (!launch || !plan || !want_in || !busy) {
        PyErr_SetString(PyExc_ValueError, "state: launch, plan, want_in and busy must be addresses");
        return NULL;
    }
    Py_ssize_t n_slots = PyList_GET_SIZE(last_in);
    if (PyTuple_GET_SIZE(own_shape) != n_slots || PyTuple_GET_SIZE(own_dtype) != n_slots
        || PyList_GET_SIZE(bound_in) != n_slots || PyList_GET_SIZE(last_out) == 0) {
        PyErr_SetString(PyExc_ValueError, "state: last_in, bound_in, own_shape and own_dtype must have one item "
                        "per input slot, last_out at least one");
        return NULL;
    }
    State *st = (State *)PyMem_Calloc(1, sizeof(State));
    if (!st) return PyErr_NoMemory();
    if (((PyTypeObject *)tensor_type)->tp_basicsize < (Py_ssize_t)sizeof(TensorFields)
        || ((PyTypeObject *)stream_type)->tp_basicsize < (Py_ssize_t)sizeof(StreamFields)) {
        PyErr_SetString(PyExc_TypeError, "state: Tensor and Stream must derive from the core's TensorBase / StreamBase");
        goto fail;
    }
    if (ordered_init(&st->ordered, ordered) < 0) goto fail;
    st->n_values = PyTuple_GET_SIZE(slots);
    st->n_params = PyTuple_GET_SIZE(params);
    if (st->n_params > MAX_PARAMS) {
        PyErr_Format(PyExc_ValueError, "state: at most %d parameters", MAX_PARAMS);
        goto fail;
    }
    if (!(st->slots = index_array(slots, 0, n_slots, "slot"))
        || !(st->params = index_array(params, ROLE_LOWEST, st->n_values, "parameter")))
        goto fail;
    for (Py_ssize_t i = 0; i < st->n_params; ++i)
        if (st->params[i] < 0 && st->params[i] != ROLE_STREAM && st->params[i] != ROLE_NONE) {
            PyErr_Format(PyExc_ValueError, "state: parameter %zd: a plan's parameter is an argument, ROLE_STREAM "
                         "or ROLE_NONE (got %zd)", i, st->params[i]);
            goto fail;
        }
    st->n_slots = n_slots;
    if (!(st->known = (Known *)PyMem_Calloc((size_t)(n_slots * KNOWN_PER_SLOT), sizeof(Known)))
        || !(st->known_next = (unsigned char *)PyMem_Calloc((size_t)n_slots, 1))) {
        PyErr_NoMemory();
        goto fail;
    }
    st->launch = (plan_launch_fn)(uintptr_t)launch;
    st->plan = (void *)(uintptr_t)plan;
    st->want_in = (uintptr_t *)(uintptr_t)want_in;
    st->busy = (int *)(uintptr_t)busy;
    st->last_in = Py_NewRef(last_in);
    st->own_shape = Py_NewRef(own_shape);
    st->own_dtype = Py_NewRef(own_dtype);
    st->outputs = Py_NewRef(outputs);
    st->last_out = Py_NewRef(last_out);
    st->bound_in = Py_NewRef(bound_in);
    st->tensor_type = Py_NewRef(tensor_type);
    st->stream_type = Py_NewRef(stream_type);
    st->on_failure = Py_NewRef(on_failure);
    PyObject *capsule = PyCapsule_New(st, CAPSULE, state_free);
    if (capsule) return capsule;
fail:
    state_release(st);
    return NULL;
}

/* The device Tensor `t` matches slot `i` of the plan (open, contiguous, same DataType and shape):
 * its data address, else 0. */
static uintptr_t usable_address(const State *st, PyObject *t, Py_ssize_t i) {
    PyObject *own_shape = PyTuple_GET_ITEM(st->own_shape, i);
    PyObject *shape = TENSOR(t)->shape;
    if (own_shape == Py_None || !TENSOR(t)->_open || !TENSOR(t)->_contiguous
        || TENSOR(t)->dtype != PyTuple_GET_ITEM(st->own_dtype, i) || !shape)
        return 0;
    int same = PyObject_RichCompareBool(shape, own_shape, Py_EQ);
    if (same != 1) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t base = size_value(TENSOR(t)->_ptr), offset = size_value(TENSOR(t)->_offset_nbytes);
    if (base <= 0 || offset < 0) return 0;
    return (uintptr_t)base + (uintptr_t)offset;
}

#if PY_VERSION_HEX >= 0x030D0000
static PyObject *referent(PyObject *ref) {  /* borrowed; compared only, never used */
    PyObject *obj = NULL;
    if (PyWeakref_GetRef(ref, &obj) <= 0) return NULL;
    Py_DECREF(obj);
    return obj;
}
#else
#define referent(ref) PyWeakref_GET_OBJECT(ref)
#endif

/* The address of Tensor `t` for slot `i`, as usable_address() finds it: from the slot's known Tensors
 * when `t` is one of them and unchanged, else found and remembered. */
static uintptr_t slot_address(State *st, PyObject *t, Py_ssize_t i) {
    Known *known = &st->known[i * KNOWN_PER_SLOT];
    PyObject *ptr = TENSOR(t)->_ptr, *offset = TENSOR(t)->_offset_nbytes, *shape = TENSOR(t)->shape;
    for (int e = 0; e < KNOWN_PER_SLOT; ++e) {
        Known *k = &known[e];
        if (k->tensor && referent(k->tensor) == t && k->ptr == ptr && k->offset == offset && k->shape == shape
            && TENSOR(t)->_open && TENSOR(t)->_contiguous && TENSOR(t)->dtype == PyTuple_GET_ITEM(st->own_dtype, i))
            return k->addr;
    }
    uintptr_t addr = usable_address(st, t, i);
    if (!addr) return 0;
    PyObject *ref = PyWeakref_NewRef(t, NULL);
    if (!ref) {  /* not remembered: found again next time */
        PyErr_Clear();
        return addr;
    }
    Known *k = &known[st->known_next[i]];
    st->known_next[i] = (unsigned char)((st->known_next[i] + 1) % KNOWN_PER_SLOT);
    known_clear(k);
    k->tensor = ref;
    k->ptr = Py_NewRef(ptr);
    k->offset = Py_NewRef(offset);
    k->shape = Py_NewRef(shape);
    k->addr = addr;
    return addr;
}

/* Hold the `n` anchors (references, taken) of the Tensors a call replaced on `stream`: the launches
 * before it used them. An anchor among the stream's latest holds is held already — a loop that
 * alternates a few buffers retires the same ones again and again. 0, or -1 with an exception set. */
static int retire(const State *st, PyObject *stream, PyObject **anchors, Py_ssize_t n) {
    int rc = 0;
    PyObject *state = n ? ordered_state(&st->ordered, stream) : NULL;  /* borrowed: kept by the states */
    for (Py_ssize_t j = 0; j < n; ++j) {
        if (rc < 0 || (!state && PyErr_Occurred()))
            rc = -1;
        else if (!state || !ordered_held_recently(&st->ordered, state, anchors[j], 4 * st->n_values)) {
            rc = ordered_hold(&st->ordered, state, stream, anchors[j]);
            state = ordered_state(&st->ordered, stream);  /* made by the first hold; a checkpoint may run */
        }
        Py_DECREF(anchors[j]);
    }
    return rc;
}

/* What keeps Tensor `t`'s memory valid (Tensor._anchor()), borrowed; None when nothing does. */
static PyObject *anchor_of(const State *st, PyObject *t) {
    (void)st;  /* `t` is a Tensor: its fields are the core's */
    PyObject *a = TENSOR(t)->_mem;
    if (!a || a == Py_None) a = TENSOR(t)->_owner;
    return a ? a : Py_None;
}

/* The outputs bound to the executor are the plan's own (no caller's output is): 1, else 0. */
static int own_outputs(const State *st) {
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(st->last_out); ++j)
        if (PyList_GET_ITEM(st->last_out, j) != Py_None) return 0;
    return 1;
}

/* Bind this call's arguments `values` (one per plan argument) and launch on `stream`: 1 when launched
 * (the outputs' writer set), 0 for the Python path, -1 with an exception set when a rebinding or the
 * launch failed (raised through on_failure). */
static int bind_and_launch(State *st, PyObject *const *values, PyObject *stream) {
    if ((PyObject *)Py_TYPE(stream) != st->stream_type || !STREAM(stream)->_open || !own_outputs(st))
        return 0;
    uintptr_t handle = STREAM(stream)->handle;  /* 0 for a default stream */
    PyObject *retired[MAX_PARAMS];  /* anchors this call unbinds (references) */
    Py_ssize_t n_retired = 0;
    int taken = 1;
    for (Py_ssize_t k = 0; k < st->n_values && taken; ++k) {
        PyObject *v = values[k], *last = PyList_GET_ITEM(st->last_in, st->slots[k]);
        Py_ssize_t i = st->slots[k];
        if (v == Py_None && last == Py_None) continue;  /* absent */
        /* the same Tensor as last call too: a view's address may have moved since (Prepared.rebind_input) */
        uintptr_t addr = Py_TYPE(v) == (PyTypeObject *)st->tensor_type ? slot_address(st, v, i) : 0;
        PyObject *writer = addr ? TENSOR(v)->_writer : NULL;
        if (!addr || (writer && writer != Py_None && writer != stream)) {
            /* a host array, closed, not of the plan's layout, or last written on another stream (the
             * Python path orders the launch after that write): the Python path */
            taken = 0;
            break;
        }
        st->want_in[i] = addr;
        PyObject *anchor = anchor_of(st, v), *unbound = PyList_GET_ITEM(st->bound_in, i);
        if (anchor != unbound) {  /* by anchor, not Tensor: a view rebound since may have a new one */
            if (unbound != Py_None) retired[n_retired++] = Py_NewRef(unbound);
            PyList_SetItem(st->bound_in, i, Py_NewRef(anchor));
        }
        if (v != last) {
            Py_INCREF(v);
            PyList_SetItem(st->last_in, i, v);  /* what the Python path records */
        }
    }
    if (retire(st, stream, retired, n_retired) < 0) return -1;
    if (!taken) return 0;
    int ret;
    Py_BEGIN_ALLOW_THREADS
    ret = st->launch((struct aclnnpy_plan *)st->plan, (aclrtStream)(uintptr_t)handle);
    Py_END_ALLOW_THREADS
    if (ret != 0) {
        PyObject *r = PyObject_CallFunction(st->on_failure, "i", ret);
        if (r) {  /* on_failure must raise */
            Py_DECREF(r);
            PyErr_Format(PyExc_SystemError, "plan step: status %d was not raised", ret);
        }
        return -1;
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(st->outputs); ++j)
        set_field(&TENSOR(PyTuple_GET_ITEM(st->outputs, j))->_writer, stream);
    return 1;
}

/* One step, as aclnnpy_plan_enter / _leave bracket the Python path's: while another thread's step of the
 * plan runs, the call is the Python path's, which refuses it. */
static int step(State *st, PyObject *const *values, PyObject *stream) {
    if (__atomic_exchange_n(st->busy, 1, __ATOMIC_ACQUIRE)) return 0;
    int rc = bind_and_launch(st, values, stream);
    __atomic_store_n(st->busy, 0, __ATOMIC_RELEASE);
    return rc;
}


/* ---- PlanBase: the plan classes' base ---- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;  /* plan_vectorcall, used once adopt() saw the class */
    PyObject *capsule;          /* `_c_state`: the capsule of `state`, or NULL: every call in Python */
    State *state;
    PyObject *stream;           /* `_stream`: the stream of the last launch, or None */
} PlanBase;

/* ---- PlanCall: a plan class's __call__ ---- */

typedef struct {
    CallHead head;
    PyObject *result;        /* str: the plan attribute returned after a launch */
} PlanCall;

/* The call of `plan` with its arguments parsed into `params`: the plan's `result` after a launch in C,
 * NULL with an exception set when it raised, or NULL without one when the Python function must run. */
static PyObject *fast_call(const PlanCall *pc, PlanBase *plan, PyObject *const *params) {
    State *st = plan->state;
    if (!st || !compiled_enabled || st->n_params != PyTuple_GET_SIZE(pc->head.names)) return NULL;
    PyObject *values[MAX_PARAMS];
    PyObject *stream = Py_None;
    for (Py_ssize_t k = 0; k < st->n_values; ++k) values[k] = Py_None;
    for (Py_ssize_t i = 0; i < st->n_params; ++i) {
        PyObject *v = params[i] ? params[i] : Py_None;
        Py_ssize_t a = st->params[i];
        if (a == ROLE_STREAM)
            stream = v;
        else if (a == ROLE_NONE) {
            if (v != Py_None) return NULL;
        } else
            values[a] = v;
    }
    PyObject *capsule = Py_NewRef(plan->capsule);  /* `_c_state` may be reset while the launch runs without
                                                      * the GIL */
    int launched = step(st, values, stream);
    Py_DECREF(capsule);
    if (launched > 0 && plan->stream != stream) Py_XSETREF(plan->stream, Py_NewRef(stream));
    return launched > 0 ? PyObject_GetAttr((PyObject *)plan, pc->result) : NULL;
}

/* Called as a method (plan.__call__(...), type(plan).__call__(plan, ...), super().__call__(...)). */
static PyObject *plan_call_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PlanCall *pc = (PlanCall *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *params[MAX_PARAMS];
    if (nargs >= 1 && PyObject_TypeCheck(args[0], &PlanBaseType)
        && parse_params(&pc->head, args + 1, nargs - 1, kwnames, params)) {
        PyObject *r = fast_call(pc, (PlanBase *)args[0], params);
        if (r || PyErr_Occurred()) return r;
    }
    return call_function(&pc->head, args, nargsf, kwnames);
}

static PyObject *CALL_ATTR;  /* "__call__", interned */

/* `call`, the __call__ found on plan's class, bound to `plan` and called with the arguments. */
static PyObject *call_bound(PyObject *call, PyObject *plan, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    descrgetfunc get = Py_TYPE(call)->tp_descr_get;
    PyObject *bound = get ? get(call, plan, (PyObject *)Py_TYPE(plan)) : Py_NewRef(call);
    if (!bound) return NULL;
    PyObject *r = PyObject_Vectorcall(bound, args, nargsf, kwnames);
    Py_DECREF(bound);
    return r;
}

/* Calling a plan. The interpreter calls an instance of a Python class through its generic __call__
 * slot, which packs the arguments into a tuple and a keyword dict and then looks __call__ up, as much
 * as the rest of the call; a PlanBase instance of an adopted class is called with the arguments as
 * they are. Whatever the class's __call__ is now, the call is its. */
static PyObject *plan_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *call = _PyType_Lookup(Py_TYPE(self), CALL_ATTR);  /* borrowed */
    if (!call) {
        PyErr_Format(PyExc_TypeError, "'%s' object is not callable", Py_TYPE(self)->tp_name);
        return NULL;
    }
    Py_INCREF(call);  /* the class may drop it while the call runs */
    PyObject *r = NULL;
    if (Py_IS_TYPE(call, &PlanCallType)) {
        PlanCall *pc = (PlanCall *)call;
        PyObject *params[MAX_PARAMS];
        if (parse_params(&pc->head, args, PyVectorcall_NARGS(nargsf), kwnames, params))
            r = fast_call(pc, (PlanBase *)self, params);
    }
    if (!r && !PyErr_Occurred()) r = call_bound(call, self, args, nargsf, kwnames);
    Py_DECREF(call);
    return r;
}

static PyObject *plan_base_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)args;
    (void)kwargs;
    PyObject *empty = PyTuple_New(0);
    if (!empty) return NULL;
    /* object.__new__ without the arguments (__init__ takes them): it refuses abstract classes */
    PyObject *self = PyBaseObject_Type.tp_new(type, empty, NULL);
    Py_DECREF(empty);
    if (self) {
        ((PlanBase *)self)->vectorcall = plan_vectorcall;
        ((PlanBase *)self)->stream = Py_NewRef(Py_None);
    }
    return self;
}

static int plan_base_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(((PlanBase *)self)->capsule);
    Py_VISIT(((PlanBase *)self)->stream);
    return 0;
}

static int plan_base_clear(PyObject *self) {
    PlanBase *plan = (PlanBase *)self;
    plan->state = NULL;
    Py_CLEAR(plan->capsule);
    Py_CLEAR(plan->stream);
    return 0;
}

static PyObject *get_c_state(PyObject *self, void *closure) {
    (void)closure;
    PyObject *capsule = ((PlanBase *)self)->capsule;
    return Py_NewRef(capsule ? capsule : Py_None);
}

/* `_c_state = state(...)`, or None (or del): every call in Python. */
static int set_c_state(PyObject *self, PyObject *value, void *closure) {
    (void)closure;
    State *st = NULL;
    if (value == Py_None) value = NULL;
    if (value) {
        if (!PyCapsule_IsValid(value, CAPSULE)) {
            PyErr_SetString(PyExc_TypeError, "_c_state must be what _fastpath.state() returned, or None");
            return -1;
        }
        st = (State *)PyCapsule_GetPointer(value, CAPSULE);
    }
    PlanBase *plan = (PlanBase *)self;
    PyObject *old = plan->capsule;
    plan->capsule = Py_XNewRef(value);
    plan->state = st;
    Py_XDECREF(old);
    return 0;
}

static void plan_base_dealloc(PyObject *self) { gc_dealloc(self, plan_base_clear); }

static PyGetSetDef plan_base_getset[] = {
    {"_c_state", get_c_state, set_c_state,
     "the plan's fixed part for its compiled __call__ (state()), or None: every call in Python", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef plan_base_members[] = {
    {"_stream", OBJECT_MEMBER, offsetof(PlanBase, stream), 0,
     "the stream of the plan's last launch (what closing the plan waits for), or None"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject PlanBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aclnn_py._fastpath.PlanBase",
    .tp_basicsize = sizeof(PlanBase),
    .tp_dealloc = plan_base_dealloc,
    .tp_vectorcall_offset = offsetof(PlanBase, vectorcall),  /* inherited; used once adopt() sets the flag */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The base of plan classes: it holds the plan's `_c_state`, and an adopted class's instances are "
              "called without packing their arguments.",
    .tp_traverse = plan_base_traverse,
    .tp_clear = plan_base_clear,
    .tp_getset = plan_base_getset,
    .tp_members = plan_base_members,
    .tp_new = plan_base_new,
};

/* adopt(cls): the interpreter calls instances of `cls`, a PlanBase class defined in Python whose
 * __call__ is a PlanCall, through plan_vectorcall (again: nothing changes). Setting cls.__call__ later
 * is still honoured: plan_vectorcall calls whatever __call__ the class has. */
PyObject *adopt_plan_class(PyObject *self, PyObject *cls) {
    (void)self;
    PyTypeObject *type = (PyTypeObject *)cls;
    if (!PyType_Check(cls) || !(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || !PyType_IsSubtype(type, &PlanBaseType)) {
        PyErr_SetString(PyExc_TypeError, "adopt: expected a subclass of PlanBase defined in Python");
        return NULL;
    }
    PyObject *call = _PyType_Lookup(type, CALL_ATTR);
    if (!call || !Py_IS_TYPE(call, &PlanCallType)) {
        PyErr_SetString(PyExc_TypeError, "adopt: the class's __call__ must be a PlanCall");
        return NULL;
    }
    if (type->tp_vectorcall_offset != offsetof(PlanBase, vectorcall)) {
        PyErr_SetString(PyExc_TypeError, "adopt: the class does not keep PlanBase's layout");
        return NULL;
    }
    if (type->tp_call != PyVectorcall_Call || !(type->tp_flags & Py_TPFLAGS_HAVE_VECTORCALL)) {
        type->tp_call = PyVectorcall_Call;
        type->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
        PyType_Modified(type);
    }
    Py_RETURN_NONE;
}

static PyObject *plan_call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *function, *result;
    static char *kwlist[] = {"function", "result", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU:PlanCall", kwlist, &function, &result)) return NULL;
    PlanCall *pc = (PlanCall *)type->tp_alloc(type, 0);
    if (!pc) return NULL;
    if (call_head_init(&pc->head, function, 1, plan_call_vectorcall) < 0) {
        Py_DECREF(pc);
        return NULL;
    }
    pc->result = Py_NewRef(result);
    return (PyObject *)pc;
}

static int plan_call_clear(PyObject *self) {
    call_head_clear(self);
    Py_CLEAR(((PlanCall *)self)->result);
    return 0;
}

static void plan_call_dealloc(PyObject *self) { gc_dealloc(self, plan_call_clear); }

static PyMemberDef plan_call_members[] = {
    {"names", OBJECT_MEMBER, offsetof(CallHead, names), MEMBER_READONLY, "the function's parameter names after self"},
    {"result", OBJECT_MEMBER, offsetof(PlanCall, result), MEMBER_READONLY, "the plan attribute a launch returns"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject PlanCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aclnn_py._fastpath.PlanCall",
    .tp_basicsize = sizeof(PlanCall),
    .tp_dealloc = plan_call_dealloc,
    .tp_vectorcall_offset = offsetof(CallHead, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattro = call_head_getattro,
    .tp_flags = CALL_HEAD_FLAGS,
    .tp_doc = "PlanCall(function, result)\n"
              "A plan class's __call__: the steady state runs in C, every other call in `function`; after a "
              "launch in C it returns the plan's attribute `result`.",
    .tp_traverse = call_head_traverse,
    .tp_clear = plan_call_clear,
    .tp_members = plan_call_members,
    .tp_getset = call_head_getset,
    .tp_descr_get = call_head_get,
    .tp_new = plan_call_new,
};

/* The interned names this file looks up; 0, or -1 with an exception set. */
int plan_init(void) {
    if (!CALL_ATTR && !(CALL_ATTR = PyUnicode_InternFromString("__call__"))) return -1;
    return 0;
}
