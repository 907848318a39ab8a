/* aclnn_py._fastpath: plans' steady-state host path in C (aclnn_py/ops/executor.py). Operator calls
 * have theirs in the compiled core (csrc/_core.pyx), whose typed bases (csrc/_core.pxd, struct layouts
 * in the generated _core.h) this module reads Tensors, Streams and stream states through.
 *
 * A serving loop calls a plan with device Tensors it made once and the same stream every step. Here
 * that is a few reads of the objects' typed fields and a call of the cffi extension's helper by
 * address, with the GIL released as cffi releases it (on CANN a launch can block on a full task
 * queue while another rank's Python thread must run).
 *
 * Every call the C path does not take — host arrays, a tensor of another layout, a closed tensor or
 * stream, arguments that do not parse — goes to the Python function with the arguments as given,
 * before anything was launched, so the rules and messages live in one place. This module names no
 * CANN function.
 *
 *   call.c      what the compiled calls share: parsing by the Python function's parameter names,
 *               binding like a function, the function's name, doc and signature
 *   plan.c      PlanBase, the base of plan classes, whose instances the interpreter calls without
 *               packing the arguments; PlanCall, a plan class's __call__ (rebinding and launch of a
 *               repeatable executor); adopt(), which makes a plan class's instances call it directly
 *   ordered.c   the stream-ordered state: a stream's workspace block, and holds of what a launch uses
 *   module.c    the module */
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "aclnnpy.h"  /* the extension's helpers this module calls by address */
#include "_core.h"    /* the typed bases' struct layouts (generated from csrc/_core.pxd) */

typedef struct aclnnpy_TensorObject TensorFields;
typedef struct aclnnpy_StreamObject StreamFields;
typedef struct aclnnpy_StreamStateObject StateFields;

#if PY_VERSION_HEX >= 0x030C0000
#define OBJECT_MEMBER Py_T_OBJECT_EX
#define MEMBER_READONLY Py_READONLY
#else
#define OBJECT_MEMBER T_OBJECT_EX
#define MEMBER_READONLY READONLY
#endif

/* 0: every compiled call goes to its Python function (set_enabled(), for the ACLNN_PY_COMPILED switch
 * of aclnn_py/ops/_compiled.py). Read without a lock: a call that races a change takes either path,
 * and both give the same result. */
extern int compiled_enabled;

/* Parameters of a compiled call's function that the C path can parse. */
#define MAX_PARAMS 40

/* What a compiled call's parameter gives the C path: a tensor input (its index, >= 0) or one of these.
 * The module exports them (ROLE_*), and the Python side builds the role tables from them. */
enum {
    ROLE_CONFIG = -1,    /* the operator's MoeConfig */
    ROLE_STREAM = -2,    /* the stream */
    ROLE_OUTPUTS = -3,   /* the outputs the caller allocated */
    ROLE_PRECHECK = -4,  /* the pre-check switch (True unless given) */
    ROLE_NONE = -5,      /* anything else: the C path takes the call only when it is None or not given */
};
#define ROLE_LOWEST ROLE_NONE

/* ---- typed fields ---- */

/* Store `value` in the object field `*where`, releasing what was there. */
static inline void set_field(PyObject **where, PyObject *value) {
    PyObject *old = *where;
    if (old == value) return;  /* the steady state (an output's writer): no write, no reference counting */
    *where = Py_NewRef(value);
    Py_XDECREF(old);
}

/* tp_dealloc of a GC type whose tp_clear drops every reference it holds. */
static inline void gc_dealloc(PyObject *self, inquiry clear) {
    PyObject_GC_UnTrack(self);
    clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* A non-negative int object as an address-sized value; -1 when NULL or not one. */
Py_ssize_t size_value(PyObject *v);

/* `obj` for the PySequence_Fast_* macros (a new reference): lists and tuples as they are — named
 * tuples such as the dispatch outputs included, which PySequence_Fast would copy — anything else
 * copied into a list; NULL with `message` when it is not a sequence. */
PyObject *fast_sequence(PyObject *obj, const char *message);

/* The capsule args[0] of a call that takes `want` arguments (`usage` names them), or NULL with an
 * exception set. */
void *capsule_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name, const char *usage);

/* The items of `tuple` as indices in [lo, hi) (a PyMem array of one item at least), or NULL with an
 * exception set; `what` names an item in the message. */
Py_ssize_t *index_array(PyObject *tuple, Py_ssize_t lo, Py_ssize_t hi, const char *what);

/* ---- compiled calls (call.c) ----
 * A compiled call stands where a Python function stood. It parses a call by the function's parameter
 * names, tries its C path, and otherwise calls the function with the arguments as given. Like a
 * function it binds to an instance (a method descriptor, so calling a method makes no bound method),
 * and it shows the function's name, doc and signature (__wrapped__). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *function;      /* the Python function */
    PyObject *names;         /* tuple: its parameter names (after self for a method) */
    Py_ssize_t n_positional; /* how many of them may be given by position */
    int var_keywords;        /* the function takes **kwargs: an unknown keyword is the function's */
} CallHead;

/* Fill `head` from the Python `function` (`skip` leading parameters, e.g. self); -1 with an
 * exception set when it is not a function of named parameters. */
int call_head_init(CallHead *head, PyObject *function, Py_ssize_t skip, vectorcallfunc vectorcall);
/* The arguments parsed by name into `params` (NULL: not given): 1, or 0 when the function must parse
 * them (too many, unknown, given twice). */
int parse_params(const CallHead *head, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                 PyObject **params);
/* The function, with the arguments as given. */
static inline PyObject *call_function(const CallHead *head, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(head->function, args, nargsf, kwnames);
}
int call_head_traverse(PyObject *self, visitproc visit, void *arg);
void call_head_clear(PyObject *self);
PyObject *call_head_get(PyObject *self, PyObject *obj, PyObject *type);
PyObject *call_head_getattro(PyObject *self, PyObject *name);
extern PyGetSetDef call_head_getset[];
#define CALL_HEAD_FLAGS \
    (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR)

/* ---- the stream-ordered state (ordered.c) ----
 * aclnn_py.runtime.ordered.compiled_view(): its states by stream key, their type, the workspace block
 * type, hold(stream, obj) and checkpoint(stream), and the holds between checkpoints. */
typedef struct {
    PyObject *states;      /* dict: Stream._key -> state */
    PyObject *state_type;
    PyObject *hold;        /* ordered.hold: a stream's first hold, which makes its state */
    PyObject *checkpoint;  /* called once the current segment has `every` holds */
    Py_ssize_t every;
} Ordered;

/* Fill `o` from `view`: 0, or -1 with an exception set (release it). */
int ordered_init(Ordered *o, PyObject *view);
void ordered_release(Ordered *o);
/* The stream's state (borrowed), or NULL when it has none yet (an exception set only on an error). */
PyObject *ordered_state(const Ordered *o, PyObject *stream);
/* Keep `held` alive until `stream` passes the work queued so far, on its `state` (NULL: none yet, made
 * by ordered.hold): appended to the current segment, and a checkpoint once it has `every` holds. 0, or
 * -1 with an exception set. */
int ordered_hold(const Ordered *o, PyObject *state, PyObject *stream, PyObject *held);
/* `obj` is one of the last `window` holds in the state's current segment, so it is held already until
 * the stream passes the work queued so far: 1, else 0. */
int ordered_held_recently(const Ordered *o, PyObject *state, PyObject *obj, Py_ssize_t window);

/* The module's functions and types. */
PyObject *make_state(PyObject *self, PyObject *args);
PyObject *adopt_plan_class(PyObject *self, PyObject *cls);
int plan_init(void);
PyObject *set_enabled(PyObject *self, PyObject *flag);
PyObject *get_enabled(PyObject *self, PyObject *unused);
extern PyTypeObject PlanBaseType, PlanCallType;
