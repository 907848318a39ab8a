/* The stream-ordered state (aclnn_py/runtime/ordered.py) as the compiled calls use it (fastpath.h): a
 * stream's workspace block, and holds of what a queued launch uses, read and written on the stream's
 * state as ordered.workspace_block() and ordered.hold() do, without a call into Python per launch. */
#include "fastpath.h"

int ordered_init(Ordered *o, PyObject *view) {
    PyObject *states, *state_type, *memory_type, *hold, *checkpoint;
    Py_ssize_t every;
    if (!PyArg_ParseTuple(view, "O!O!O!OOn:ordered view", &PyDict_Type, &states, &PyType_Type, &state_type,
                          &PyType_Type, &memory_type, &hold, &checkpoint, &every))
        return -1;
    if (!PyCallable_Check(hold) || !PyCallable_Check(checkpoint) || every < 1) {
        PyErr_SetString(PyExc_TypeError, "ordered view: hold and checkpoint must be callables, the checkpoint "
                        "period >= 1");
        return -1;
    }
    if (((PyTypeObject *)state_type)->tp_basicsize < (Py_ssize_t)sizeof(StateFields)) {
        PyErr_SetString(PyExc_TypeError, "ordered view: the state type does not derive from StreamStateBase");
        return -1;
    }
    o->states = Py_NewRef(states);
    o->state_type = Py_NewRef(state_type);
    o->hold = Py_NewRef(hold);
    o->checkpoint = Py_NewRef(checkpoint);
    o->every = every;
    return 0;
}

void ordered_release(Ordered *o) {
    Py_CLEAR(o->states);
    Py_CLEAR(o->state_type);
    Py_CLEAR(o->hold);
    Py_CLEAR(o->checkpoint);
}

PyObject *ordered_state(const Ordered *o, PyObject *stream) {
    PyObject *key = ((StreamFields *)stream)->_key;  /* a Stream: the plan checked its type */
    PyObject *state = key ? PyDict_GetItemWithError(o->states, key) : NULL;
    return state && Py_IS_TYPE(state, (PyTypeObject *)o->state_type) ? state : NULL;
}

int ordered_held_recently(const Ordered *o, PyObject *state, PyObject *obj, Py_ssize_t window) {
    (void)o;  /* the state's layout is the core's, whatever the view */
    PyObject *current = ((StateFields *)state)->current;
    if (!current || !PyList_CheckExact(current)) return 0;
    Py_ssize_t n = PyList_GET_SIZE(current);
    for (Py_ssize_t j = n - 1; j >= 0 && j >= n - window; --j)
        if (PyList_GET_ITEM(current, j) == obj) return 1;
    return 0;
}

int ordered_hold(const Ordered *o, PyObject *state, PyObject *stream, PyObject *held) {
    /* reading the current segment and appending to it is one step under the GIL: no boundary can
     * close the segment in between */
    PyObject *current = state ? ((StateFields *)state)->current : NULL;
    PyObject *r;
    if (!current || !PyList_CheckExact(current)) {  /* the stream's first hold: ordered.hold() makes its state */
        r = PyObject_CallFunctionObjArgs(o->hold, stream, held, NULL);
        Py_XDECREF(r);
        return r ? 0 : -1;
    }
    if (PyList_Append(current, held) < 0) return -1;
    if (PyList_GET_SIZE(current) < o->every) return 0;
    r = PyObject_CallOneArg(o->checkpoint, stream);
    Py_XDECREF(r);
    return r ? 0 : -1;
}
