/* aclnn_py._fastpath: the operators' steady-state host path in C (aclnn_py/ops/executor.py).
 *
 * Per call: gather() fills the descriptor table of the extension's run helper and lists what keeps
 * each tensor's memory alive, written() marks the outputs' writer stream. Tensors without a
 * descriptor yet (or closed) make gather() return None: Python then does the same in its own way.
 *
 * Plans: a serving loop calls a plan with device Tensors of the plan's layout, often the same ones as last
 * step. In Python, checking those arguments, recording their addresses and marking the outputs'
 * writer costs more than the mock's own rebinding and launch; here it is a few attribute reads per
 * argument, read straight from the objects' __slots__ (the state checks once that Tensor and Stream
 * have them). Anything else — host arrays, an absent or wrong-layout input, a closed tensor or stream,
 * given outputs — is left to the Python path (the step returns NotImplemented before launching, having
 * changed only what that path redoes identically), so the rules and messages stay in one place. A
 * failed rebinding or launch is handed to the plan's `on_failure(status)`, which raises.
 *
 * The launch itself is aclnnpy_plan_launch of the cffi extension (build_ffi_plan.c), called through
 * the address the plan passes in, with its argument struct: this module names no CANN function. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#if PY_VERSION_HEX >= 0x030C0000
#define OBJECT_MEMBER Py_T_OBJECT_EX
#define MEMBER_READONLY Py_READONLY
#else
#define OBJECT_MEMBER T_OBJECT_EX
#define MEMBER_READONLY READONLY
#endif

typedef int (*plan_launch_fn)(void *plan, void *stream);

typedef struct {
    plan_launch_fn launch;
    void *plan;              /* struct aclnnpy_plan * */
    uintptr_t *want_in;      /* the plan's in_want array */
    Py_ssize_t n_values;     /* how many arguments a call passes */
    Py_ssize_t *slots;       /* the input slot of each argument */
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
    PyMem_Free(st);
}

static void state_free(PyObject *capsule) {
    State *st = (State *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (st) state_release(st);
}

/* The offset of `type`'s __slots__ member `name` (an object slot), or -1 with an exception set. */
static Py_ssize_t slot_offset(PyObject *type, const char *name) {
    PyObject *d = PyObject_GetAttrString(type, name);
    if (!d) return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == OBJECT_MEMBER && !(m->flags & MEMBER_READONLY)) offset = m->offset;
    }
    Py_DECREF(d);
    if (offset < 0)
        PyErr_Format(PyExc_TypeError, "state: %s.%s is not a __slots__ member", ((PyTypeObject *)type)->tp_name,
                     name);
    return offset;
}

/* The object in slot `offset` of `obj` (borrowed; NULL when unset). */
static inline PyObject *slot(PyObject *obj, Py_ssize_t offset) { return *(PyObject **)((char *)obj + offset); }

/* Store `value` in slot `offset` of `obj`, releasing what was there. */
static inline void set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value) {
    PyObject **where = (PyObject **)((char *)obj + offset);
    PyObject *old = *where;
    *where = Py_NewRef(value);
    Py_XDECREF(old);
}

/* The capsule args[0] of a call that takes `want` arguments (`usage` names them), or NULL with an
 * exception set. */
static void *capsule_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name,
                         const char *usage) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
        return NULL;
    }
    return PyCapsule_GetPointer(args[0], name);
}


/* state(launch, plan, want_in, slots, last_in, own_shape, own_dtype, outputs, last_out, Tensor, Stream,
 *       on_failure) */
static PyObject *make_state(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long launch, plan, want_in;
    PyObject *slots, *last_in, *own_shape, *own_dtype, *outputs, *last_out, *tensor_type, *stream_type, *on_failure;
    if (!PyArg_ParseTuple(args, "KKKO!O!O!O!O!O!O!O!O:state", &launch, &plan, &want_in, &PyTuple_Type, &slots,
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
    st->slots = (Py_ssize_t *)PyMem_Calloc(st->n_values ? st->n_values : 1, sizeof(Py_ssize_t));
    if (!st->slots) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < st->n_values; ++k) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(slots, k));
        if (i == -1 && PyErr_Occurred()) goto fail;
        if (i < 0 || i >= n_slots) {
            PyErr_Format(PyExc_ValueError, "state: slot %zd is not an input slot (0..%zd)", i, n_slots - 1);
            goto fail;
        }
        st->slots[k] = i;
    }
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

/* A non-negative int slot as an address-sized value; -1 when unset or not one. */
static Py_ssize_t slot_size(PyObject *obj, Py_ssize_t offset) {
    PyObject *v = slot(obj, offset);
    if (!v || !PyLong_CheckExact(v)) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    if (n < 0) {
        PyErr_Clear();
        return -1;
    }
    return n;
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

/* step(state, values, stream): None when launched (outputs' writer set), NotImplemented for the
 * Python path; a failed rebinding or launch raises through on_failure. */
static PyObject *step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    State *st = (State *)capsule_arg(args, nargs, 3, CAPSULE, "step(state, values, stream)");
    if (!st) return NULL;
    PyObject *values = args[1], *stream = args[2];
    if (!PyTuple_CheckExact(values) || PyTuple_GET_SIZE(values) != st->n_values) {
        PyErr_SetString(PyExc_TypeError, "step: values must be a tuple with one item per plan argument");
        return NULL;
    }
    if ((PyObject *)Py_TYPE(stream) != st->stream_type || slot(stream, st->s_open) != Py_True
        || PyList_GET_ITEM(st->last_out, 0) != Py_None)
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t handle = slot_size(stream, st->s_handle);  /* 0 for a default stream */
    if (handle < 0) Py_RETURN_NOTIMPLEMENTED;
    for (Py_ssize_t k = 0; k < st->n_values; ++k) {
        PyObject *v = PyTuple_GET_ITEM(values, k);
        Py_ssize_t i = st->slots[k];
        if (v == PyList_GET_ITEM(st->last_in, i)) {
            if (v != Py_None && (Py_TYPE(v) != (PyTypeObject *)st->tensor_type || slot(v, st->t_open) != Py_True))
                Py_RETURN_NOTIMPLEMENTED;  /* closed: the Python path raises */
            continue;
        }
        if ((PyObject *)Py_TYPE(v) != st->tensor_type) Py_RETURN_NOTIMPLEMENTED;
        uintptr_t addr = usable_address(st, v, i);
        if (!addr) Py_RETURN_NOTIMPLEMENTED;
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
        return NULL;
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(st->outputs); ++j)
        set_slot(PyTuple_GET_ITEM(st->outputs, j), st->t_writer, stream);
    Py_RETURN_NONE;
}

/* ---- per call ------------------------------------------------------------------------------------ */

typedef struct {
    PyObject *tensor_type;
    Py_ssize_t desc_addr, mem, owner, writer;  /* Tensor slot offsets */
} Layout;

static const char LAYOUT[] = "aclnn_py._fastpath.Layout";

static void layout_free(PyObject *capsule) {
    Layout *l = (Layout *)PyCapsule_GetPointer(capsule, LAYOUT);
    if (!l) return;
    Py_XDECREF(l->tensor_type);
    PyMem_Free(l);
}

/* layout(Tensor): where gather() and written() find a Tensor's slots. */
static PyObject *make_layout(PyObject *self, PyObject *tensor_type) {
    (void)self;
    if (!PyType_Check(tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "layout: expected the Tensor type");
        return NULL;
    }
    Layout *l = (Layout *)PyMem_Calloc(1, sizeof(Layout));
    if (!l) return PyErr_NoMemory();
    if ((l->desc_addr = slot_offset(tensor_type, "_desc_addr")) < 0 || (l->mem = slot_offset(tensor_type, "_mem")) < 0
        || (l->owner = slot_offset(tensor_type, "_owner")) < 0 || (l->writer = slot_offset(tensor_type, "_writer")) < 0) {
        PyMem_Free(l);
        return NULL;
    }
    l->tensor_type = Py_NewRef(tensor_type);
    PyObject *capsule = PyCapsule_New(l, LAYOUT, layout_free);
    if (!capsule) {
        Py_DECREF(l->tensor_type);
        PyMem_Free(l);
    }
    return capsule;
}

/* One entry: a Tensor's descriptor into *desc and its anchor appended to `held`; 0 when the Python
 * path must do it (not a Tensor, no descriptor yet, closed), -1 on error. */
static int gather_one(const Layout *l, PyObject *t, void **desc, PyObject *held) {
    if (Py_TYPE(t) != (PyTypeObject *)l->tensor_type) return 0;
    PyObject *d = slot(t, l->desc_addr);
    if (!d || !PyLong_CheckExact(d)) return 0;
    void *p = PyLong_AsVoidPtr(d);
    if (!p) {
        PyErr_Clear();
        return 0;
    }
    PyObject *anchor = slot(t, l->mem);
    if (!anchor || anchor == Py_None) anchor = slot(t, l->owner);
    if (!anchor) return 0;
    *desc = p;
    return PyList_Append(held, anchor) < 0 ? -1 : 1;
}

/* gather(layout, inputs, outputs, table, capacity): the descriptor table (inputs then outputs; an
 * absent input NULL) written at address `table`, and the list of what keeps the tensors alive; None
 * when any tensor needs the Python path. */
static PyObject *gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Layout *l = (Layout *)capsule_arg(args, nargs, 5, LAYOUT, "gather(layout, inputs, outputs, table, capacity)");
    if (!l) return NULL;
    PyObject *ins = PySequence_Fast(args[1], "gather: inputs must be a sequence");
    if (!ins) return NULL;
    PyObject *outs = PySequence_Fast(args[2], "gather: outputs must be a sequence");
    if (!outs) {
        Py_DECREF(ins);
        return NULL;
    }
    void **table = (void **)PyLong_AsVoidPtr(args[3]);
    Py_ssize_t capacity = PyLong_AsSsize_t(args[4]);
    PyObject *held = NULL, *result = NULL;
    Py_ssize_t n_in = PySequence_Fast_GET_SIZE(ins), n_out = PySequence_Fast_GET_SIZE(outs);
    if (PyErr_Occurred()) goto done;
    if (!table || n_in + n_out > capacity) {
        PyErr_SetString(PyExc_ValueError, "gather: the table is NULL or too small");
        goto done;
    }
    held = PyList_New(0);
    if (!held) goto done;
    for (Py_ssize_t i = 0; i < n_in + n_out; ++i) {
        PyObject *t = i < n_in ? PySequence_Fast_GET_ITEM(ins, i) : PySequence_Fast_GET_ITEM(outs, i - n_in);
        if (t == Py_None && i < n_in) {
            table[i] = NULL;
            continue;
        }
        int r = gather_one(l, t, &table[i], held);
        if (r < 0) goto done;
        if (r == 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = Py_NewRef(held);
done:
    Py_XDECREF(held);
    Py_DECREF(ins);
    Py_DECREF(outs);
    return result;
}

/* written(layout, outputs, stream): every output's writer is `stream` (outputs are Tensors). */
static PyObject *written(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Layout *l = (Layout *)capsule_arg(args, nargs, 3, LAYOUT, "written(layout, outputs, stream)");
    if (!l) return NULL;
    PyObject *outs = PySequence_Fast(args[1], "written: outputs must be a sequence");
    if (!outs) return NULL;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(outs); ++j) {
        PyObject *t = PySequence_Fast_GET_ITEM(outs, j);
        if (Py_TYPE(t) != (PyTypeObject *)l->tensor_type) {
            if (PyObject_SetAttrString(t, "_writer", args[2]) < 0) {
                Py_DECREF(outs);
                return NULL;
            }
            continue;
        }
        set_slot(t, l->writer, args[2]);
    }
    Py_DECREF(outs);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"state", make_state, METH_VARARGS,
     "state(launch, plan, want_in, slots, last_in, own_shape, own_dtype, outputs, last_out, Tensor, Stream, "
     "on_failure)\n"
     "A plan's fixed part, for step()."},
    {"step", (PyCFunction)(void (*)(void))step, METH_FASTCALL,
     "step(state, values, stream) -> None | NotImplemented\n"
     "Bind this call's Tensor arguments and launch (None), or leave the call to the Python path "
     "(NotImplemented); a failed launch raises through the state's on_failure."},
    {"layout", make_layout, METH_O, "layout(Tensor)\nWhere gather() and written() find a Tensor's slots."},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(layout, inputs, outputs, table, capacity) -> list | None\n"
     "Fill the descriptor table at address `table` and return what keeps the tensors alive, or None when a "
     "tensor has no descriptor yet or is closed (the Python path handles it)."},
    {"written", (PyCFunction)(void (*)(void))written, METH_FASTCALL,
     "written(layout, outputs, stream)\nMark every output as written by `stream`."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModule_Create(&module); }
