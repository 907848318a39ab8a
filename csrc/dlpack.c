/* DLPack deleters and the capsule destructor of aclnn-py's exports, in C so that they run no Python
 * code: consumers call the deleter on their error paths with a Python exception already set, and a
 * Python callback there would replace that exception with a SystemError. The deleter only marks the
 * export finished; aclnn_py.dlpack.sweep() (scheduled here as a pending call) then releases the Python
 * objects that kept the memory alive. Struct layouts follow dlpack.h (DLPack 1.1). */

struct aclnnpy_dl_tensor {
    void *data;
    int32_t device_type, device_id;
    int32_t ndim;
    uint8_t code, bits;
    uint16_t lanes;
    int64_t *shape, *strides;
    uint64_t byte_offset;
};
struct aclnnpy_dl_managed {            /* DLManagedTensor */
    struct aclnnpy_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(void *);
};
struct aclnnpy_dl_managed_versioned {  /* DLManagedTensorVersioned */
    uint32_t major, minor;
    void *manager_ctx;
    void (*deleter)(void *);
    uint64_t flags;
    struct aclnnpy_dl_tensor dl_tensor;
};

static int aclnnpy_dl_sweep(void *unused) {
    (void)unused;
    PyObject *mod = PyImport_ImportModule("aclnn_py.dlpack");
    PyObject *r = mod ? PyObject_CallMethod(mod, "sweep", NULL) : NULL;
    if (!r) PyErr_Clear(); /* never surface in unrelated user code */
    Py_XDECREF(r);
    Py_XDECREF(mod);
    return 0;
}

static void aclnnpy_dl_finished(void *ctx) {
    if (ctx) __atomic_store_n((int64_t *)ctx, 1, __ATOMIC_RELEASE);
    Py_AddPendingCall(aclnnpy_dl_sweep, NULL);
}

void aclnnpy_dlpack_deleter(void *managed) {
    if (managed) aclnnpy_dl_finished(((struct aclnnpy_dl_managed *)managed)->manager_ctx);
}

void aclnnpy_dlpack_deleter_versioned(void *managed) {
    if (managed) aclnnpy_dl_finished(((struct aclnnpy_dl_managed_versioned *)managed)->manager_ctx);
}

/* An export nobody consumed: the capsule still has its original name. */
void aclnnpy_dlpack_capsule_destructor(void *capsule) {
    PyObject *obj = (PyObject *)capsule;
    if (PyCapsule_IsValid(obj, "dltensor"))
        aclnnpy_dlpack_deleter(PyCapsule_GetPointer(obj, "dltensor"));
    else if (PyCapsule_IsValid(obj, "dltensor_versioned"))
        aclnnpy_dlpack_deleter_versioned(PyCapsule_GetPointer(obj, "dltensor_versioned"));
}
