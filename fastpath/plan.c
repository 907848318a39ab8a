/* PlanCall: a plan class's __call__ (fastpath.h). A plan is a repeatable executor with its own
 * buffers; a serving loop calls it with device Tensors of the plan's layout, often the same ones as
 * last step. The C path records the addresses of the Tensors that changed, calls the cffi extension's
 * aclnnpy_plan_launch (build_ffi_plan.c: rebinding and launch) and marks the outputs' writer. A failed
 * rebinding or launch is handed to the plan's `on_failure(status)`, which raises. */
#include "fastpath.h"

typedef int (*plan_launch_fn)(void *plan, void *stream);

/* A __call__ parameter that is not a plan argument: it must be None (or not given) for the C path. */
#define PARAM_NONE (-1)
/* The __call__ parameter that names the stream. */
#define PARAM_STREAM (-2)

typedef struct {
    plan_launch_fn launch;
    void *plan;              /* struct aclnnpy_plan * */
    uintptr_t *want_in;      /* the plan's in_want array */
    Py_ssize_t n_values;     /* how many arguments a call passes */
    Py_ssize_t *slots;       /* the input slot of each argument */
    Py_ssize_t n_params;     /* parameters of the plan's __call__ (after self) */
    Py_ssize_t *params;      /* per parameter: the argument it gives, or PARAM_NONE / PARAM_STREAM */
    PyObject *last_in;       /* list, shared with the Plan: what each slot was given last call */
    PyObject *own_shape;     /* tuple by slot: the plan's shape, or None for an absent slot */
    PyObject *own_dtype;     /* tuple by slot: the plan's DataType */
    PyObject *outputs;       /* tuple: the plan's own output Tensors */
    PyObject *last_out;      /* list, shared with the Plan: its first item None when outputs are the plan's */
    PyObject *tensor_type;
    PyObject *stream_type;
    PyObject *on_failure;    /* called with the status of a failed rebinding or launch; raises */
    /* offsets of the __slots__ read or written */
    Py_ssize_t t_open, t_contiguous, t_shape, t_dtype, t_ptr, t_offset_nbytes, t_writer, s_open, s_handle;
} State;

static const char CAPSULE[] = "aclnn_py._fastpath.State";

/* Frees a state and drops its references (fields not set yet are NULL). */
static void state_release(State *st) {
    Py_XDECREF(st->last_in);
    Py_XDECREF(st->own_shape);
    Py_XDECREF(st->own_dtype);
    Py_XDECREF(st->outputs);
    Py_XDECREF(st->last_out);
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

/* state(launch, plan, want_in, slots, params, last_in, own_shape, own_dtype, outputs, last_out, Tensor, Stream,
 *       on_failure) */
PyObject *make_state(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long launch, plan, want_in;
    PyObject *slots, *params, *last_in, *own_shape, *own_dtype, *outputs, *last_out, *tensor_type, *stream_type, *on_failure;
    if (!PyArg_ParseTuple(args, "KKKO!O!O!O!O!O!O!O!O!O:state", &launch, &plan, &want_in, &PyTuple_Type, &slots,
                          &PyTuple_Type, &params,
                          &PyList_Type, &last_in, &PyTuple_Type, &own_shape, &PyTuple_Type, &own_dtype,
                          &PyTuple_Type, &outputs, &PyList_Type, &last_out, &PyType_Type, &tensor_type,
                          &PyType_Type, &stream_type, &on_failure))
        return NULL;
    if (!PyCallable_Check(on_failure)) {
        PyErr_SetString(PyExc_TypeError, "state: on_failure must be callable");
        return NULL;
    }
    if (!launch || !plan || !want_in) {
        PyErr_SetString(PyExc_ValueError, "state: launch, plan and want_in must be addresses");
        return NULL;
    }
    Py_ssize_t n_slots = PyList_GET_SIZE(last_in);
    if (PyTuple_GET_SIZE(own_shape) != n_slots || PyTuple_GET_SIZE(own_dtype) != n_slots
        || PyList_GET_SIZE(last_out) == 0) {
        PyErr_SetString(PyExc_ValueError, "state: last_in, own_shape and own_dtype must have one item per "
                        "input slot, last_out at least one");
        return NULL;
    }
    State *st = (State *)PyMem_Calloc(1, sizeof(State));
    if (!st) return PyErr_NoMemory();
    struct { Py_ssize_t *offset; PyObject *type; const char *name; } members[] = {
        {&st->t_open, tensor_type, "_open"}, {&st->t_contiguous, tensor_type, "_contiguous"},
        {&st->t_shape, tensor_type, "shape"}, {&st->t_dtype, tensor_type, "dtype"},
        {&st->t_ptr, tensor_type, "_ptr"}, {&st->t_offset_nbytes, tensor_type, "_offset_nbytes"},
        {&st->t_writer, tensor_type, "_writer"}, {&st->s_open, stream_type, "_open"},
        {&st->s_handle, stream_type, "_handle"},
    };
    for (size_t m = 0; m < sizeof(members) / sizeof(members[0]); ++m)
        if ((*members[m].offset = slot_offset(members[m].type, members[m].name)) < 0) goto fail;
    st->n_values = PyTuple_GET_SIZE(slots);
    st->n_params = PyTuple_GET_SIZE(params);
    if (st->n_params > MAX_PARAMS) {
        PyErr_Format(PyExc_ValueError, "state: at most %d parameters", MAX_PARAMS);
        goto fail;
    }
    if (!(st->slots = index_array(slots, 0, n_slots, "slot"))
        || !(st->params = index_array(params, PARAM_STREAM, st->n_values, "parameter")))
        goto fail;
    st->launch = (plan_launch_fn)(uintptr_t)launch;
    st->plan = (void *)(uintptr_t)plan;
    st->want_in = (uintptr_t *)(uintptr_t)want_in;
    st->last_in = Py_NewRef(last_in);
    st->own_shape = Py_NewRef(own_shape);
    st->own_dtype = Py_NewRef(own_dtype);
    st->outputs = Py_NewRef(outputs);
    st->last_out = Py_NewRef(last_out);
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
    PyObject *shape = slot(t, st->t_shape);
    if (own_shape == Py_None || slot(t, st->t_open) != Py_True || slot(t, st->t_contiguous) != Py_True
        || slot(t, st->t_dtype) != PyTuple_GET_ITEM(st->own_dtype, i) || !shape)
        return 0;
    int same = PyObject_RichCompareBool(shape, own_shape, Py_EQ);
    if (same != 1) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t base = slot_size(t, st->t_ptr), offset = slot_size(t, st->t_offset_nbytes);
    if (base <= 0 || offset < 0) return 0;
    return (uintptr_t)base + (uintptr_t)offset;
}

/* Bind this call's arguments `values` (one per plan argument) and launch on `stream`: 1 when launched
 * (the outputs' writer set), 0 for the Python path, -1 with an exception set when a rebinding or the
 * launch failed (raised through on_failure). */
static int step(State *st, PyObject *const *values, PyObject *stream) {
    if ((PyObject *)Py_TYPE(stream) != st->stream_type || slot(stream, st->s_open) != Py_True
        || PyList_GET_ITEM(st->last_out, 0) != Py_None)
        return 0;
    Py_ssize_t handle = slot_size(stream, st->s_handle);  /* 0 for a default stream */
    if (handle < 0) return 0;
    for (Py_ssize_t k = 0; k < st->n_values; ++k) {
        PyObject *v = values[k];
        Py_ssize_t i = st->slots[k];
        if (v == PyList_GET_ITEM(st->last_in, i)) {
            if (v != Py_None && (Py_TYPE(v) != (PyTypeObject *)st->tensor_type || slot(v, st->t_open) != Py_True))
                return 0;  /* closed: the Python path raises */
            continue;
        }
        if ((PyObject *)Py_TYPE(v) != st->tensor_type) return 0;
        uintptr_t addr = usable_address(st, v, i);
        if (!addr) return 0;
        st->want_in[i] = addr;
        Py_INCREF(v);
        PyList_SetItem(st->last_in, i, v);  /* what the Python path records */
    }
    int ret;
    Py_BEGIN_ALLOW_THREADS
    ret = st->launch(st->plan, (void *)(uintptr_t)handle);
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
        set_slot(PyTuple_GET_ITEM(st->outputs, j), st->t_writer, stream);
    return 1;
}

/* ---- the call ---- */

typedef struct {
    CallHead head;
    PyObject *result;        /* str: the plan attribute returned after a launch */
} PlanCall;

static PyObject *STATE_ATTR;  /* "_c_state", interned */

/* The plan call with its arguments parsed into `params`: 1 launched, 0 for the Python function, -1
 * raised. */
static int fast_call(const PlanCall *pc, PyObject *plan, PyObject *const *params) {
    PyObject *values[MAX_PARAMS];
    PyObject *stream = Py_None;
    PyObject *capsule = PyObject_GetAttr(plan, STATE_ATTR);
    if (!capsule) {
        PyErr_Clear();
        return 0;
    }
    State *st = capsule == Py_None ? NULL : (State *)PyCapsule_GetPointer(capsule, CAPSULE);
    int launched = 0;
    if (!st) {
        PyErr_Clear();
        goto done;
    }
    if (st->n_params != PyTuple_GET_SIZE(pc->head.names)) goto done;
    for (Py_ssize_t k = 0; k < st->n_values; ++k) values[k] = Py_None;
    for (Py_ssize_t i = 0; i < st->n_params; ++i) {
        PyObject *v = params[i] ? params[i] : Py_None;
        Py_ssize_t a = st->params[i];
        if (a == PARAM_STREAM)
            stream = v;
        else if (a == PARAM_NONE) {
            if (v != Py_None) goto done;
        } else
            values[a] = v;
    }
    launched = step(st, values, stream);
done:
    Py_DECREF(capsule);
    return launched;
}

static PyObject *plan_call_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PlanCall *pc = (PlanCall *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *params[MAX_PARAMS] = {NULL};
    if (nargs >= 1 && parse_params(&pc->head, args + 1, nargs - 1, kwnames, params)) {
        int launched = fast_call(pc, args[0], params);
        if (launched < 0) return NULL;
        if (launched) return PyObject_GetAttr(args[0], pc->result);
    }
    return call_function(&pc->head, args, nargsf, kwnames);
}

static PyObject *CALL_ATTR;  /* "__call__", interned */

/* tp_call of a plan class whose __call__ is a PlanCall (adopt()). Calling an instance of a Python class
 * goes through slot_tp_call, which looks __call__ up and re-packs the argument tuple and keyword dict
 * the interpreter made for a method call — as much as the rest of the call. This parses them as they
 * are; anything else is called as slot_tp_call would. */
static PyObject *plan_tp_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    PyObject *call = _PyType_Lookup(Py_TYPE(self), CALL_ATTR);  /* borrowed */
    if (!call) {
        PyErr_Format(PyExc_TypeError, "'%s' object is not callable", Py_TYPE(self)->tp_name);
        return NULL;
    }
    if (Py_IS_TYPE(call, &PlanCallType)) {
        PlanCall *pc = (PlanCall *)call;
        PyObject *params[MAX_PARAMS] = {NULL};
        if (parse_tuple_params(&pc->head, args, kwargs, params)) {
            Py_INCREF(pc);  /* the class may drop it while the call runs */
            int launched = fast_call(pc, self, params);
            PyObject *r = launched > 0 ? PyObject_GetAttr(self, pc->result) : NULL;
            Py_DECREF(pc);
            if (launched) return r;
        }
    }
    descrgetfunc get = Py_TYPE(call)->tp_descr_get;
    PyObject *bound = get ? get(call, self, (PyObject *)Py_TYPE(self)) : Py_NewRef(call);
    if (!bound) return NULL;
    PyObject *r = PyObject_Call(bound, args, kwargs);
    Py_DECREF(bound);
    return r;
}

/* adopt(cls): calling an instance of `cls`, whose __call__ is a PlanCall, parses the call directly
 * (plan_tp_call). Setting cls.__call__ again gives the class the interpreter's slot back. */
PyObject *adopt_plan_call(PyObject *self, PyObject *cls) {
    (void)self;
    if (!PyType_Check(cls) || !(((PyTypeObject *)cls)->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        PyErr_SetString(PyExc_TypeError, "adopt: expected a class defined in Python");
        return NULL;
    }
    if (!CALL_ATTR && !(CALL_ATTR = PyUnicode_InternFromString("__call__"))) return NULL;
    PyObject *dict = ((PyTypeObject *)cls)->tp_dict;
    PyObject *call = dict ? PyDict_GetItemWithError(dict, CALL_ATTR) : NULL;
    if (!call || !Py_IS_TYPE(call, &PlanCallType)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "adopt: the class's own __call__ must be a PlanCall");
        return NULL;
    }
    ((PyTypeObject *)cls)->tp_call = plan_tp_call;
    Py_RETURN_NONE;
}

static PyObject *plan_call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *function, *result;
    static char *kwlist[] = {"function", "result", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU:PlanCall", kwlist, &function, &result)) return NULL;
    if (!STATE_ATTR && !(STATE_ATTR = PyUnicode_InternFromString("_c_state"))) return NULL;
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

static void plan_call_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    plan_call_clear(self);
    Py_TYPE(self)->tp_free(self);
}

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
