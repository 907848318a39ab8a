/* The aclnn_py._fastpath module (fastpath.h). */
#include "fastpath.h"

int compiled_enabled = 1;

/* set_enabled(flag) -> the previous setting */
PyObject *set_enabled(PyObject *self, PyObject *flag) {
    (void)self;
    if (!PyBool_Check(flag)) {
        PyErr_Format(PyExc_TypeError, "set_enabled: expected a bool, got %s", Py_TYPE(flag)->tp_name);
        return NULL;
    }
    int previous = compiled_enabled;
    compiled_enabled = flag == Py_True;
    return PyBool_FromLong(previous);
}

PyObject *get_enabled(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(compiled_enabled);
}

static PyMethodDef methods[] = {
    {"state", make_state, METH_VARARGS,
     "state(launch, plan, want_in, slots, params, last_in, own_shape, own_dtype, outputs, last_out, bound_in, Tensor, "
     "Stream, on_failure, ordered, busy)\n"
     "A plan's fixed part: what its PlanCall runs."},
    {"adopt", adopt_plan_class, METH_O,
     "adopt(cls)\nThe interpreter calls instances of `cls` (a PlanBase class whose __call__ is a PlanCall) "
     "with their arguments unpacked."},
    {"set_enabled", set_enabled, METH_O,
     "set_enabled(flag) -> bool\nFalse: every compiled call goes to its Python function; returns the previous "
     "setting."},
    {"enabled", get_enabled, METH_NOARGS, "enabled() -> bool\nWhether compiled calls take the calls they can."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (plan_init() < 0 || PyType_Ready(&PlanBaseType) < 0 || PyType_Ready(&PlanCallType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddObjectRef(m, "PlanBase", (PyObject *)&PlanBaseType) < 0
              || PyModule_AddObjectRef(m, "PlanCall", (PyObject *)&PlanCallType) < 0
              || PyModule_AddIntConstant(m, "ROLE_CONFIG", ROLE_CONFIG) < 0
              || PyModule_AddIntConstant(m, "ROLE_STREAM", ROLE_STREAM) < 0
              || PyModule_AddIntConstant(m, "ROLE_OUTPUTS", ROLE_OUTPUTS) < 0
              || PyModule_AddIntConstant(m, "ROLE_PRECHECK", ROLE_PRECHECK) < 0
              || PyModule_AddIntConstant(m, "ROLE_NONE", ROLE_NONE) < 0))
        Py_CLEAR(m);
    return m;
}
