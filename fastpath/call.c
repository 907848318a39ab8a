/* What the compiled calls share (fastpath.h): small helpers, and parsing, binding and
 * introspection by the Python function they stand for. */
#include "fastpath.h"

Py_ssize_t size_value(PyObject *v) {
    if (!v || !PyLong_CheckExact(v)) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    if (n < 0) {
        PyErr_Clear();
        return -1;
    }
    return n;
}

PyObject *fast_sequence(PyObject *obj, const char *message) {
    if (PyTuple_Check(obj) || PyList_Check(obj)) return Py_NewRef(obj);
    return PySequence_Fast(obj, message);
}

void *capsule_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name, const char *usage) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
        return NULL;
    }
    return PyCapsule_GetPointer(args[0], name);
}

Py_ssize_t *index_array(PyObject *tuple, Py_ssize_t lo, Py_ssize_t hi, const char *what) {
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    Py_ssize_t *out = (Py_ssize_t *)PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    if (!out) return (Py_ssize_t *)PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < n; ++k) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(tuple, k));
        if (i == -1 && PyErr_Occurred()) goto fail;
        if (i < lo || i >= hi) {
            PyErr_Format(PyExc_ValueError, "state: %s %zd is out of range [%zd, %zd)", what, i, lo, hi);
            goto fail;
        }
        out[k] = i;
    }
    return out;
fail:
    PyMem_Free(out);
    return NULL;
}

int call_head_init(CallHead *head, PyObject *function, Py_ssize_t skip, vectorcallfunc vectorcall) {
    if (!PyFunction_Check(function)) {
        PyErr_Format(PyExc_TypeError, "%s: function must be a Python function", Py_TYPE(head)->tp_name);
        return -1;
    }
    PyCodeObject *co = (PyCodeObject *)PyFunction_GET_CODE(function);
    Py_ssize_t n = co->co_argcount + co->co_kwonlyargcount - skip;
    if (co->co_argcount < skip || (co->co_flags & CO_VARARGS) || n > MAX_PARAMS) {
        PyErr_Format(PyExc_TypeError, "%s: function must take %s named parameters only (at most %d)",
                     Py_TYPE(head)->tp_name, skip ? "self and" : "", MAX_PARAMS);
        return -1;
    }
    PyObject *varnames = PyObject_GetAttrString((PyObject *)co, "co_varnames");
    if (!varnames) return -1;
    head->names = PyTuple_GetSlice(varnames, skip, skip + n);
    Py_DECREF(varnames);
    if (!head->names) return -1;
    head->vectorcall = vectorcall;
    head->function = Py_NewRef(function);
    head->n_positional = co->co_argcount - skip;
    head->var_keywords = (co->co_flags & CO_VARKEYWORDS) != 0;
    return 0;
}

/* The index of the parameter named `key`, or -1 (no exception). */
static Py_ssize_t param_index(const CallHead *head, PyObject *key) {
    Py_ssize_t n = PyTuple_GET_SIZE(head->names);
    for (Py_ssize_t i = 0; i < n; ++i)  /* call sites pass interned names */
        if (PyTuple_GET_ITEM(head->names, i) == key) return i;
    for (Py_ssize_t i = 0; i < n; ++i)
        if (PyUnicode_Compare(PyTuple_GET_ITEM(head->names, i), key) == 0) return i;
    if (PyErr_Occurred()) PyErr_Clear();
    return -1;
}

int parse_params(const CallHead *head, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                 PyObject **params) {
    if (nargs > head->n_positional) return 0;
    for (Py_ssize_t i = 0; i < nargs; ++i) params[i] = args[i];
    for (Py_ssize_t i = nargs; i < PyTuple_GET_SIZE(head->names); ++i) params[i] = NULL;
    Py_ssize_t n_kw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < n_kw; ++k) {
        Py_ssize_t i = param_index(head, PyTuple_GET_ITEM(kwnames, k));
        if (i < 0 || params[i]) return 0;  /* unknown (**kwargs included) or given twice */
        params[i] = args[nargs + k];
    }
    return 1;
}

int call_head_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(((CallHead *)self)->function);
    return 0;
}

void call_head_clear(PyObject *self) {
    CallHead *head = (CallHead *)self;
    Py_CLEAR(head->function);
    Py_CLEAR(head->names);
}

/* Bound to an instance like its function would be (plan.__call__ is a method). */
PyObject *call_head_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (!obj || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* __wrapped__, __name__, __qualname__, __module__, ...: the function's (inspect.signature and help()
 * follow __wrapped__). */
PyObject *call_head_getattro(PyObject *self, PyObject *name) {
    PyObject *r = PyObject_GenericGetAttr(self, name);
    if (r || !PyErr_ExceptionMatches(PyExc_AttributeError)) return r;
    PyErr_Clear();
    CallHead *head = (CallHead *)self;
    if (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0) return Py_NewRef(head->function);
    return PyObject_GetAttr(head->function, name);
}

static PyObject *call_head_doc(PyObject *self, void *closure) {
    (void)closure;
    return PyObject_GetAttrString(((CallHead *)self)->function, "__doc__");
}

PyGetSetDef call_head_getset[] = {
    {"__doc__", call_head_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
