/* The callables an operator function and a plan class's __call__ become (csrc/_core.pyx,
 * compiled_operator() and compiled_plan_call()): heap types made once with PyType_FromSpec whose
 * instances are called by vectorcall, so a call reaches the core's parser with the arguments as they
 * are on the caller's stack — no tuple, no keyword dict. Public C API only; the types are complete when
 * made and never changed. Their instances have a __dict__ for the Python function's name, doc and
 * __wrapped__ (functools.update_wrapper). The method type binds to an instance like a function does
 * (a method descriptor: calling plan(...) makes no bound method), its route gets the instance first. */
#ifndef ACLNNPY_ENTRY_H
#define ACLNNPY_ENTRY_H

#include <Python.h>
#include <structmember.h>

/* what a call runs: the OpCall `route` with the caller's arguments (set by _core.pyx at import) */
typedef PyObject *(*aclnnpy_route_fn)(PyObject *route, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
static aclnnpy_route_fn aclnnpy_route_call = NULL;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *route;
    PyObject *dict;
} aclnnpy_Entry;

static PyObject *aclnnpy_entry_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return aclnnpy_route_call(((aclnnpy_Entry *)self)->route, args, PyVectorcall_NARGS(nargsf), kwnames);
}

static int aclnnpy_entry_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(((aclnnpy_Entry *)self)->route);
    Py_VISIT(((aclnnpy_Entry *)self)->dict);
    Py_VISIT(Py_TYPE(self));  /* a heap type's instances keep it */
    return 0;
}

static int aclnnpy_entry_clear(PyObject *self) {
    Py_CLEAR(((aclnnpy_Entry *)self)->route);
    Py_CLEAR(((aclnnpy_Entry *)self)->dict);
    return 0;
}

static void aclnnpy_entry_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    aclnnpy_entry_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMemberDef aclnnpy_entry_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(aclnnpy_Entry, vectorcall), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(aclnnpy_Entry, dict), READONLY, NULL},
    {"compiled", T_OBJECT, offsetof(aclnnpy_Entry, route), READONLY, "the compiled route (an OpCall or a PlanCall)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef aclnnpy_entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot aclnnpy_entry_slots[] = {
    {Py_tp_getset, (void *)aclnnpy_entry_getset},
    {Py_tp_call, (void *)PyVectorcall_Call},
    {Py_tp_traverse, (void *)aclnnpy_entry_traverse},
    {Py_tp_clear, (void *)aclnnpy_entry_clear},
    {Py_tp_dealloc, (void *)aclnnpy_entry_dealloc},
    {Py_tp_members, (void *)aclnnpy_entry_members},
    {Py_tp_doc, (void *)"An operator function with its compiled route in front (aclnn_py._core)."},
    {0, NULL},
};

static PyType_Spec aclnnpy_entry_spec = {
    "aclnn_py._core.CompiledOperator", sizeof(aclnnpy_Entry), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, aclnnpy_entry_slots,
};

/* plan.__call__ (through the class, the instance given): a bound method of the instance */
static PyObject *aclnnpy_method_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (!obj || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyType_Slot aclnnpy_method_slots[] = {
    {Py_tp_getset, (void *)aclnnpy_entry_getset},
    {Py_tp_call, (void *)PyVectorcall_Call},
    {Py_tp_descr_get, (void *)aclnnpy_method_get},
    {Py_tp_traverse, (void *)aclnnpy_entry_traverse},
    {Py_tp_clear, (void *)aclnnpy_entry_clear},
    {Py_tp_dealloc, (void *)aclnnpy_entry_dealloc},
    {Py_tp_members, (void *)aclnnpy_entry_members},
    {Py_tp_doc, (void *)"A plan class's __call__ with its compiled route in front (aclnn_py._core)."},
    {0, NULL},
};

static PyType_Spec aclnnpy_method_spec = {
    "aclnn_py._core.CompiledPlanCall", sizeof(aclnnpy_Entry), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    aclnnpy_method_slots,
};

/* A plan class whose instances CPython calls by vectorcall: a subclass of `base` (a Python class deriving
 * from _core.PlanBase) made with PyType_FromSpecWithBases, complete when made and never changed. On 3.11 a
 * class made by a class statement never has Py_TPFLAGS_HAVE_VECTORCALL, so plan(...) would pack its
 * arguments into a tuple and a dict for tp_call; this one has the flag, and each instance's entry sits at
 * `vectorcall_offset` (a PlanBase field set when the instance is made). It adds no field and no method:
 * the layout, the __dict__, weak references, GC and every method are the base's. `name` must outlive the
 * class (CPython 3.11 keeps the pointer as tp_name); `doc` may be NULL. A new reference, or NULL with an
 * exception set. */
static PyObject *aclnnpy_plan_class(PyObject *base, const char *name, const char *doc, Py_ssize_t vectorcall_offset) {
    PyMemberDef members[] = {  /* copied into the class */
        {"__vectorcalloffset__", T_PYSSIZET, vectorcall_offset, READONLY, NULL},
        {NULL, 0, 0, 0, NULL},
    };
    /* No tp_call of its own: CPython would then put a __call__ wrapper of it in the class, hiding the
     * base's compiled __call__ (its route, signature and doc). The inherited tp_call runs that same
     * __call__, and PyObject_Call uses the vectorcall entry anyway. */
    PyType_Slot slots[] = {
        {Py_tp_members, (void *)members},
        {doc ? Py_tp_doc : 0, (void *)doc},
        {0, NULL},
    };
    PyType_Spec spec = {name, 0, 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_VECTORCALL, slots};
    PyObject *bases = PyTuple_Pack(1, base);
    if (!bases) return NULL;
    PyObject *made = PyType_FromSpecWithBases(&spec, bases);
    Py_DECREF(bases);
    return made;
}

/* The types (new references), or NULL with an exception set. */
static PyObject *aclnnpy_entry_type(void) { return PyType_FromSpec(&aclnnpy_entry_spec); }
static PyObject *aclnnpy_method_type(void) { return PyType_FromSpec(&aclnnpy_method_spec); }

/* An instance of `type` calling `route`, or NULL with an exception set. */
static PyObject *aclnnpy_entry_new(PyObject *type, PyObject *route) {
    aclnnpy_Entry *e = PyObject_GC_New(aclnnpy_Entry, (PyTypeObject *)type);
    if (!e) return NULL;  /* it holds a reference to its heap type (dealloc drops it) */
    e->vectorcall = aclnnpy_entry_vectorcall;
    e->route = Py_NewRef(route);
    e->dict = NULL;
    PyObject_GC_Track((PyObject *)e);
    return (PyObject *)e;
}

#endif
