/* The per-call path (fastpath.h): an operator's phase 1 and launch in one call of the cffi
 * extension's run helper (build_ffi_ops.c).
 *
 * OpCall stands for an operator function (moe_distribute_dispatch / _combine): its C path takes calls
 * whose tensors are Tensors with descriptors, with a MoeConfig, given outputs, a Stream and a shape the
 * config's pre-checks already passed, on a stream that has launched before. After the launch it holds
 * what the launch uses on the stream's state as aclnn_py.runtime.ordered.hold() does (ordered.c). The
 * Python path of the same functions uses gather() and written() for its tensors. */
#include <string.h>

#include "fastpath.h"

const char LAYOUT[] = "aclnn_py._fastpath.Layout";

static void layout_free(PyObject *capsule) {
    Layout *l = (Layout *)PyCapsule_GetPointer(capsule, LAYOUT);
    if (!l) return;
    Py_XDECREF(l->tensor_type);
    PyMem_Free(l);
}

/* layout(Tensor): where gather(), written() and an OpCall find a Tensor's slots. */
PyObject *make_layout(PyObject *self, PyObject *tensor_type) {
    (void)self;
    if (!PyType_Check(tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "layout: expected the Tensor type");
        return NULL;
    }
    Layout *l = (Layout *)PyMem_Calloc(1, sizeof(Layout));
    if (!l) return PyErr_NoMemory();
    if ((l->desc_addr = slot_offset(tensor_type, "_desc_addr")) < 0 || (l->mem = slot_offset(tensor_type, "_mem")) < 0
        || (l->owner = slot_offset(tensor_type, "_owner")) < 0 || (l->writer = slot_offset(tensor_type, "_writer")) < 0
        || (l->shape = slot_offset(tensor_type, "shape")) < 0) {
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

/* One entry: a Tensor's descriptor into *desc and what keeps its memory alive into *anchor
 * (borrowed); 0 when the Python path must do it (not a Tensor, no descriptor yet, closed). */
static int gather_one(const Layout *l, PyObject *t, void **desc, PyObject **anchor) {
    if (Py_TYPE(t) != (PyTypeObject *)l->tensor_type) return 0;
    PyObject *d = slot(t, l->desc_addr);
    if (!d || !PyLong_CheckExact(d)) return 0;
    void *p = PyLong_AsVoidPtr(d);
    if (!p) {
        PyErr_Clear();
        return 0;
    }
    PyObject *a = slot(t, l->mem);
    if (!a || a == Py_None) a = slot(t, l->owner);
    if (!a) return 0;
    *desc = p;
    *anchor = a;
    return 1;
}

/* A new list of the `n` objects `items` (borrowed): made at its size, as a launch's anchors are known
 * before the list is. */
static PyObject *list_of(PyObject *const *items, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (list)
        for (Py_ssize_t i = 0; i < n; ++i) PyList_SET_ITEM(list, i, Py_NewRef(items[i]));
    return list;
}

/* gather(layout, inputs, outputs, table, capacity): the descriptor table (inputs then outputs; an
 * absent one NULL) written at address `table`, and the list of what keeps the tensors alive; None
 * when any tensor needs the Python path. */
PyObject *gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Layout *l = (Layout *)capsule_arg(args, nargs, 5, LAYOUT, "gather(layout, inputs, outputs, table, capacity)");
    if (!l) return NULL;
    PyObject *ins = fast_sequence(args[1], "gather: inputs must be a sequence");
    if (!ins) return NULL;
    PyObject *outs = fast_sequence(args[2], "gather: outputs must be a sequence");
    if (!outs) {
        Py_DECREF(ins);
        return NULL;
    }
    void **table = (void **)PyLong_AsVoidPtr(args[3]);
    Py_ssize_t capacity = PyLong_AsSsize_t(args[4]);
    PyObject **anchors = NULL, *result = NULL;
    Py_ssize_t n_in = PySequence_Fast_GET_SIZE(ins), n_out = PySequence_Fast_GET_SIZE(outs), n_held = 0;
    if (PyErr_Occurred()) goto done;
    if (!table || n_in + n_out > capacity) {
        PyErr_SetString(PyExc_ValueError, "gather: the table is NULL or too small");
        goto done;
    }
    if (!(anchors = PyMem_Malloc((n_in + n_out + 1) * sizeof *anchors))) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_in + n_out; ++i) {
        PyObject *t = i < n_in ? PySequence_Fast_GET_ITEM(ins, i) : PySequence_Fast_GET_ITEM(outs, i - n_in);
        if (t == Py_None) {  /* an absent input, or an optional output the caller left NULL */
            table[i] = NULL;
            continue;
        }
        if (!gather_one(l, t, &table[i], &anchors[n_held++])) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = list_of(anchors, n_held);
done:
    PyMem_Free(anchors);
    Py_DECREF(ins);
    Py_DECREF(outs);
    return result;
}

/* written(layout, outputs, stream): every output's writer is `stream` (None: an output left NULL). */
PyObject *written(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Layout *l = (Layout *)capsule_arg(args, nargs, 3, LAYOUT, "written(layout, outputs, stream)");
    if (!l) return NULL;
    PyObject *outs = fast_sequence(args[1], "written: outputs must be a sequence");
    if (!outs) return NULL;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(outs); ++j) {
        PyObject *t = PySequence_Fast_GET_ITEM(outs, j);
        if (t == Py_None) continue;
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


/* ---- OpCall ---- */

typedef int (*destroy_fn)(void *executor);

/* Descriptor-table entries: the operators' inputs, then outputs. */
#define MAX_TABLE 64

typedef struct {
    PyObject *layout_obj;      /* the Layout capsule */
    const Layout *layout;
    PyObject *stream_type, *config_type;
    PyObject *outputs_type;    /* a tuple type holding the outputs, or None: one output Tensor */
    Py_ssize_t s_open, s_handle;
    Py_ssize_t n_params;
    Py_ssize_t *role;          /* per parameter: a table index, or ROLE_* (fastpath.h) */
    PyObject *none_as;         /* per parameter: for a tensor input given None, None (NULL is passed),
                                * False (the Python path) or a callable making the tensor */
    Py_ssize_t n_inputs, n_outputs;
    PyObject *key_op;          /* str: the pre-check key's operator */
    Py_ssize_t key_param[3], key_dim[3];  /* BS, H, K of the key: (parameter, dim) */
    PyObject *run_layout;      /* the operator's RunLayout, for config.packed() */
    PyObject *packed_name, *ints_attr, *strings_attr, *passed_attr;  /* config method and attributes */
    /* The config last used and its attributes (a MoeConfig is frozen: they stay what they were), and
     * the pre-check key last built with its BS, H, K. Read and replaced with the GIL held. */
    PyObject *config, *packed, *passed, *key;
    uintptr_t ints, strings;
    Py_ssize_t key_dims[3];
    aclnnpy_run_fn run;
    destroy_fn destroy;
    PyObject *on_failure;      /* on_failure(status) for a failed launch; raises */
    Ordered ordered;           /* the stream-ordered state: workspace blocks and holds */
} OpSpec;

static const char OP_SPEC[] = "aclnn_py._fastpath.OpSpec";

static void op_spec_release(OpSpec *sp) {
    Py_XDECREF(sp->layout_obj);
    Py_XDECREF(sp->stream_type);
    Py_XDECREF(sp->config_type);
    Py_XDECREF(sp->outputs_type);
    Py_XDECREF(sp->none_as);
    Py_XDECREF(sp->key_op);
    Py_XDECREF(sp->run_layout);
    Py_XDECREF(sp->packed_name);
    Py_XDECREF(sp->ints_attr);
    Py_XDECREF(sp->strings_attr);
    Py_XDECREF(sp->passed_attr);
    Py_XDECREF(sp->config);
    Py_XDECREF(sp->packed);
    Py_XDECREF(sp->passed);
    Py_XDECREF(sp->key);
    Py_XDECREF(sp->on_failure);
    ordered_release(&sp->ordered);
    PyMem_Free(sp->role);
    PyMem_Free(sp);
}

static void op_spec_free(PyObject *capsule) {
    OpSpec *sp = (OpSpec *)PyCapsule_GetPointer(capsule, OP_SPEC);
    if (sp) op_spec_release(sp);
}

/* op_spec(layout, Stream, MoeConfig, outputs_type, roles, none_as, n_inputs, n_outputs, key, run_layout, run,
 *         destroy, on_failure, ordered=ordered.compiled_view()) */
PyObject *make_op_spec(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"layout", "stream_type", "config_type", "outputs_type", "roles", "none_as", "n_inputs",
                             "n_outputs", "key", "run_layout", "run", "destroy", "on_failure", "ordered", NULL};
    PyObject *layout_obj, *stream_type, *config_type, *outputs_type, *roles, *none_as, *key, *run_layout,
        *on_failure, *ordered;
    Py_ssize_t n_inputs, n_outputs;
    unsigned long long run, destroy;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!OO!O!nnO!OKKOO!:op_spec", kwlist, &layout_obj,
                                     &PyType_Type, &stream_type, &PyType_Type, &config_type, &outputs_type,
                                     &PyTuple_Type, &roles, &PyTuple_Type, &none_as, &n_inputs, &n_outputs,
                                     &PyTuple_Type, &key, &run_layout, &run, &destroy, &on_failure,
                                     &PyTuple_Type, &ordered))
        return NULL;
    const Layout *layout = (const Layout *)PyCapsule_GetPointer(layout_obj, LAYOUT);
    if (!layout) return NULL;
    if (outputs_type != Py_None && !PyType_Check(outputs_type)) {
        PyErr_SetString(PyExc_TypeError, "op_spec: outputs_type must be a type or None");
        return NULL;
    }
    Py_ssize_t n_params = PyTuple_GET_SIZE(roles);
    if (PyTuple_GET_SIZE(none_as) != n_params || n_params > MAX_PARAMS || n_inputs < 0 || n_outputs < 1
        || n_inputs + n_outputs > MAX_TABLE || (outputs_type == Py_None && n_outputs != 1)) {
        PyErr_SetString(PyExc_ValueError, "op_spec: roles and none_as must have one item per parameter, and the "
                        "inputs and outputs must fit the table (one output without outputs_type)");
        return NULL;
    }
    if (!run || !destroy || !PyCallable_Check(on_failure)) {
        PyErr_SetString(PyExc_TypeError, "op_spec: run and destroy must be addresses, on_failure a callable");
        return NULL;
    }
    OpSpec *sp = (OpSpec *)PyMem_Calloc(1, sizeof(OpSpec));
    if (!sp) return PyErr_NoMemory();
    sp->n_params = n_params;
    struct { Py_ssize_t *offset; PyObject *type; const char *name; } members[] = {
        {&sp->s_open, stream_type, "_open"}, {&sp->s_handle, stream_type, "_handle"},
    };
    for (size_t m = 0; m < sizeof(members) / sizeof(members[0]); ++m)
        if ((*members[m].offset = slot_offset(members[m].type, members[m].name)) < 0) goto fail;
    if (ordered_init(&sp->ordered, ordered, stream_type) < 0) goto fail;
    if (!(sp->role = index_array(roles, ROLE_LOWEST, n_inputs, "role"))) goto fail;
    /* key: (op, (parameter, dim), (parameter, dim), (parameter, dim)) naming BS, H and K */
    if (PyTuple_GET_SIZE(key) != 4 || !PyUnicode_Check(PyTuple_GET_ITEM(key, 0))) {
        PyErr_SetString(PyExc_ValueError, "op_spec: key must be (op, (parameter, dim) x 3)");
        goto fail;
    }
    for (int k = 0; k < 3; ++k) {
        PyObject *pd = PyTuple_GET_ITEM(key, k + 1);
        if (!PyArg_ParseTuple(pd, "nn", &sp->key_param[k], &sp->key_dim[k])) goto fail;
        if (sp->key_param[k] < 0 || sp->key_param[k] >= n_params || sp->role[sp->key_param[k]] < 0
            || sp->key_dim[k] < 0) {
            PyErr_SetString(PyExc_ValueError, "op_spec: a key item must name a tensor parameter and a dim");
            goto fail;
        }
    }
    sp->layout_obj = Py_NewRef(layout_obj);
    sp->layout = layout;
    sp->stream_type = Py_NewRef(stream_type);
    sp->config_type = Py_NewRef(config_type);
    sp->outputs_type = Py_NewRef(outputs_type);
    sp->none_as = Py_NewRef(none_as);
    sp->n_inputs = n_inputs;
    sp->n_outputs = n_outputs;
    sp->key_op = Py_NewRef(PyTuple_GET_ITEM(key, 0));
    sp->run_layout = Py_NewRef(run_layout);
    if (!(sp->packed_name = PyUnicode_InternFromString("packed")) || !(sp->ints_attr = PyUnicode_InternFromString(
              "ints_address")) || !(sp->strings_attr = PyUnicode_InternFromString("strings_address"))
        || !(sp->passed_attr = PyUnicode_InternFromString("_passed")))
        goto fail;
    sp->run = (aclnnpy_run_fn)(uintptr_t)run;
    sp->destroy = (destroy_fn)(uintptr_t)destroy;
    sp->on_failure = Py_NewRef(on_failure);
    PyObject *capsule = PyCapsule_New(sp, OP_SPEC, op_spec_free);
    if (capsule) return capsule;
fail:
    op_spec_release(sp);
    return NULL;
}

/* Dim `dim` of the Tensor `t`'s 2-D shape, or -1. */
static Py_ssize_t dim_of(const Layout *l, PyObject *t, Py_ssize_t dim) {
    PyObject *shape = slot(t, l->shape);
    if (!shape || !PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) != 2 || dim > 1) return -1;
    Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, dim));
    if (d < 0) PyErr_Clear();
    return d;
}

/* An address from an int object, or 0 (with no exception) when it is not one. */
static uintptr_t address_of(PyObject *v) {
    if (!v || !PyLong_Check(v)) return 0;
    void *p = PyLong_AsVoidPtr(v);
    if (!p) PyErr_Clear();
    return (uintptr_t)p;
}

/* `config`'s attributes in the spec's cache: 1, 0 when they are not what the C path takes, -1 raised. */
/* What one call reads of its MoeConfig, taken once: a call launches with its own config's attributes
 * even when another thread's call replaces the spec's cache meanwhile (any code that may run Python —
 * a garbage collection's finalizer — lets another thread in). `comm` and `passed` are references. */
typedef struct {
    PyObject *packed, *passed;
    uintptr_t ints, strings;
} ConfigView;

/* This call's view of `config` (from the spec's cache when it is the config last used): 1, 0 for the
 * Python path, -1 raised. */
static int use_config(OpSpec *sp, PyObject *config, ConfigView *v) {
    if (config == sp->config) {  /* no Python code runs between the test and the copies */
        v->packed = Py_NewRef(sp->packed);
        v->passed = Py_NewRef(sp->passed);
        v->ints = sp->ints;
        v->strings = sp->strings;
        return 1;
    }
    /* config.packed(layout): the arrays the run helper reads, kept alive with the config (a parameter) */
    PyObject *packed = PyObject_CallMethodOneArg(config, sp->packed_name, sp->run_layout);
    PyObject *ints = packed ? PyObject_GetAttr(packed, sp->ints_attr) : NULL;
    PyObject *strings = ints ? PyObject_GetAttr(packed, sp->strings_attr) : NULL;
    PyObject *passed = strings ? PyObject_GetAttr(config, sp->passed_attr) : NULL;
    uintptr_t ints_address = address_of(ints), strings_address = address_of(strings);
    Py_XDECREF(ints);
    Py_XDECREF(strings);
    if (!passed || !ints_address || !strings_address || !PySet_Check(passed)) {
        Py_XDECREF(packed);
        Py_XDECREF(passed);
        return PyErr_Occurred() ? -1 : 0;
    }
    v->packed = packed;
    v->passed = passed;
    v->ints = ints_address;
    v->strings = strings_address;
    Py_XSETREF(sp->config, Py_NewRef(config));
    Py_XSETREF(sp->packed, Py_NewRef(packed));
    Py_XSETREF(sp->passed, Py_NewRef(passed));
    sp->ints = ints_address;
    sp->strings = strings_address;
    return 1;
}

/* `passed` (this call's config's set) holds this call's shape (the Python path checks, and records,
 * the shapes it has not seen): 1, 0 when not (or not known), -1 raised. */
static int prechecked(OpSpec *sp, PyObject *passed, PyObject **params) {
    Py_ssize_t d[3];
    for (int k = 0; k < 3; ++k)
        if ((d[k] = dim_of(sp->layout, params[sp->key_param[k]], sp->key_dim[k])) < 0) return 0;
    PyObject *key;
    if (sp->key && d[0] == sp->key_dims[0] && d[1] == sp->key_dims[1] && d[2] == sp->key_dims[2]) {
        key = Py_NewRef(sp->key);
    } else {
        if (!(key = Py_BuildValue("(Onnn)", sp->key_op, d[0], d[1], d[2]))) return -1;
        Py_XSETREF(sp->key, Py_NewRef(key));
        memcpy(sp->key_dims, d, sizeof d);
    }
    int found = PySet_Contains(passed, key);
    Py_DECREF(key);
    return found;
}

typedef struct {
    CallHead head;
    PyObject *setup;  /* setup(names) -> the OpSpec capsule, or None: every call is the function's */
    PyObject *spec;   /* NULL until setup answered */
    OpSpec *spec_ptr; /* spec's OpSpec, or NULL */
} OpCall;

/* The operator call: 1 with *result set, 0 for the Python function, -1 raised. */
static int fast_op(const OpCall *oc, OpSpec *sp, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   PyObject **result) {
    PyObject *params[MAX_PARAMS];
    void *table[MAX_TABLE];
    PyObject *anchors[MAX_TABLE];  /* borrowed from the tensors (and `made`) until held */
    PyObject *made[MAX_PARAMS];    /* tensors made for inputs given None (their references) */
    int n_made = 0, precheck = 1, rc = 0;
    Py_ssize_t n_held = 0;
    PyObject *config = NULL, *stream = NULL, *outputs = NULL, *held = NULL, *state = NULL;
    ConfigView view = {NULL, NULL, 0, 0};
    if (sp->n_params != PyTuple_GET_SIZE(oc->head.names) || !parse_params(&oc->head, args, nargs, kwnames, params))
        return 0;
    const Layout *l = sp->layout;
    for (Py_ssize_t i = 0; i < sp->n_params; ++i) {
        PyObject *v = params[i] ? params[i] : Py_None;
        Py_ssize_t role = sp->role[i];
        int g = 1;
        switch (role) {
        case ROLE_CONFIG:
            if (Py_TYPE(v) != (PyTypeObject *)sp->config_type) goto done;
            config = v;
            continue;
        case ROLE_STREAM:
            if ((PyObject *)Py_TYPE(v) != sp->stream_type || slot(v, sp->s_open) != Py_True
                || slot_size(v, sp->s_handle) < 0)
                goto done;
            stream = v;
            continue;
        case ROLE_OUTPUTS:
            if (sp->outputs_type == Py_None)
                g = gather_one(l, v, &table[sp->n_inputs], &anchors[n_held++]);
            else if ((PyObject *)Py_TYPE(v) != sp->outputs_type || PyTuple_GET_SIZE(v) != sp->n_outputs)
                goto done;
            else
                for (Py_ssize_t j = 0; j < sp->n_outputs && g == 1; ++j) {
                    PyObject *o = PyTuple_GET_ITEM(v, j);
                    if (o == Py_None)  /* an optional output left NULL: C refuses it where it is needed */
                        table[sp->n_inputs + j] = NULL;
                    else
                        g = gather_one(l, o, &table[sp->n_inputs + j], &anchors[n_held++]);
                }
            if (!g) goto gathered;
            outputs = v;
            continue;
        case ROLE_PRECHECK:  /* True unless given */
            if (params[i] && v != Py_True && v != Py_False) goto done;
            precheck = v != Py_False;
            continue;
        case ROLE_NONE:
            if (v != Py_None) goto done;
            continue;
        }
        if (v == Py_None) {
            PyObject *make = PyTuple_GET_ITEM(sp->none_as, i);
            if (make == Py_None) {
                table[role] = NULL;
                continue;
            }
            if (make == Py_False) goto done;
            if (!(v = made[n_made++] = PyObject_CallNoArgs(make))) {
                --n_made;
                rc = -1;
                goto done;
            }
            params[i] = v;
        }
        g = gather_one(l, v, &table[role], &anchors[n_held++]);
    gathered:
        if (!g) goto done;
    }
    if (!config || !stream || !outputs) goto done;  /* attributes as keywords, the current stream: Python */
    for (Py_ssize_t i = 0; i < sp->n_params; ++i) {
        /* an input last written on another stream: the Python path orders the launch after that write */
        PyObject *w = sp->role[i] >= 0 && params[i] && params[i] != Py_None ? slot(params[i], l->writer) : NULL;
        if (w && w != Py_None && w != stream) goto done;
    }
    if ((rc = use_config(sp, config, &view)) <= 0) goto done;
    if (precheck && (rc = prechecked(sp, view.passed, params)) <= 0) goto done;
    rc = 0;
    /* the stream's state: its workspace block now, its holds after the launch (a stream's first launch
     * is Python's, which makes the state) */
    if (!(state = ordered_state(&sp->ordered, stream))) {
        rc = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    Py_INCREF(state);  /* kept across the launch: the stream may be destroyed meanwhile */
    uintptr_t ws, ws_cap;
    if (!ordered_workspace(&sp->ordered, state, &ws, &ws_cap)) goto done;
    const int64_t *ints = (const int64_t *)view.ints;
    const char *const *strings = (const char *const *)view.strings;
    void *handle = (void *)(uintptr_t)slot_size(stream, sp->s_handle);
    uint64_t ws_size = 0;
    void *executor = NULL;
    int launched = 0, status;
    Py_BEGIN_ALLOW_THREADS
    status = sp->run((aclTensor *const *)table, ints, strings, ws, ws_cap, handle, &ws_size,
                     (aclOpExecutor **)&executor, 1, &launched);
    if (!launched && status == 0) sp->destroy(executor);  /* needs a larger workspace: Python grows it */
    Py_END_ALLOW_THREADS
    if (!launched) goto done;  /* phase 1 refused, or more workspace: the Python path redoes it and reports */
    /* launched: what it uses is held until the stream passes it, whatever the launch's status */
    if (!(held = list_of(anchors, n_held))) {
        rc = -1;
        goto done;
    }
    if (ordered_hold(&sp->ordered, state, stream, held) < 0) {
        rc = -1;
        goto done;
    }
    PyObject *r;
    if (status != 0) {
        if ((r = PyObject_CallFunction(sp->on_failure, "i", status))) {  /* on_failure must raise */
            Py_DECREF(r);
            PyErr_Format(PyExc_SystemError, "operator call: status %d was not raised", status);
        }
        rc = -1;
        goto done;
    }
    if (sp->outputs_type == Py_None)
        set_slot(outputs, l->writer, stream);
    else
        for (Py_ssize_t j = 0; j < sp->n_outputs; ++j)
            if (PyTuple_GET_ITEM(outputs, j) != Py_None) set_slot(PyTuple_GET_ITEM(outputs, j), l->writer, stream);
    *result = Py_NewRef(outputs);
    rc = 1;
done:
    Py_XDECREF(held);
    Py_XDECREF(state);
    Py_XDECREF(view.packed);
    Py_XDECREF(view.passed);
    while (n_made) Py_DECREF(made[--n_made]);
    return rc;
}

static PyObject *op_call_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    OpCall *oc = (OpCall *)self;
    if (!compiled_enabled) return call_function(&oc->head, args, nargsf, kwnames);
    if (!oc->spec) {
        PyObject *spec = PyObject_CallOneArg(oc->setup, oc->head.names);
        if (spec && spec != Py_None && !PyCapsule_IsValid(spec, OP_SPEC)) {
            Py_DECREF(spec);
            PyErr_SetString(PyExc_TypeError, "OpCall: setup(names) must return an op_spec() or None");
            return NULL;
        }
        if (!spec) {
            PyErr_Clear();  /* e.g. no runtime yet: the Python function meets the same problem and reports it */
        } else if (oc->spec) {
            Py_DECREF(spec);  /* another thread's first call set it up meanwhile (setup ran Python code) */
        } else {
            oc->spec = spec;
            oc->spec_ptr = spec != Py_None ? (OpSpec *)PyCapsule_GetPointer(spec, OP_SPEC) : NULL;
        }
    }
    if (oc->spec_ptr) {
        PyObject *result = NULL;
        int rc = fast_op(oc, oc->spec_ptr, args, PyVectorcall_NARGS(nargsf), kwnames, &result);
        if (rc < 0) return NULL;
        if (rc > 0) return result;
    }
    return call_function(&oc->head, args, nargsf, kwnames);
}

static PyObject *op_call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *function, *setup;
    static char *kwlist[] = {"function", "setup", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:OpCall", kwlist, &function, &setup)) return NULL;
    if (!PyCallable_Check(setup)) {
        PyErr_SetString(PyExc_TypeError, "OpCall: setup must be callable");
        return NULL;
    }
    OpCall *oc = (OpCall *)type->tp_alloc(type, 0);
    if (!oc) return NULL;
    if (call_head_init(&oc->head, function, 0, op_call_vectorcall) < 0) {
        Py_DECREF(oc);
        return NULL;
    }
    oc->setup = Py_NewRef(setup);
    return (PyObject *)oc;
}

static int op_call_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(((OpCall *)self)->setup);
    return call_head_traverse(self, visit, arg);
}

static int op_call_clear(PyObject *self) {
    call_head_clear(self);
    Py_CLEAR(((OpCall *)self)->setup);
    ((OpCall *)self)->spec_ptr = NULL;
    Py_CLEAR(((OpCall *)self)->spec);
    return 0;
}

static void op_call_dealloc(PyObject *self) { gc_dealloc(self, op_call_clear); }

static PyMemberDef op_call_members[] = {
    {"names", OBJECT_MEMBER, offsetof(CallHead, names), MEMBER_READONLY, "the function's parameter names"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject OpCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aclnn_py._fastpath.OpCall",
    .tp_basicsize = sizeof(OpCall),
    .tp_dealloc = op_call_dealloc,
    .tp_vectorcall_offset = offsetof(CallHead, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattro = call_head_getattro,
    .tp_flags = CALL_HEAD_FLAGS,
    .tp_doc = "OpCall(function, setup)\n"
              "An operator function whose steady state runs in C (setup(names) gives its op_spec at the first "
              "call, from the function's parameter names), every other call in `function`.",
    .tp_traverse = op_call_traverse,
    .tp_clear = op_call_clear,
    .tp_members = op_call_members,
    .tp_getset = call_head_getset,
    .tp_descr_get = call_head_get,
    .tp_new = op_call_new,
};
