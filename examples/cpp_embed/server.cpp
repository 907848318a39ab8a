// A C++ "inference server" that embeds Python (CPython C API) and uses aclnn-py for the MoE layer.
//
// The server owns the resources, as a real one does: it initialises ACL, makes the HCCL root info,
// and per serving thread (= one expert-parallel rank on its own device) creates a stream and
// allocates the input and output buffers with aclrtMalloc. For each request it fills the inputs
// (without holding the GIL), takes the GIL only for the call into moe_model.Worker.forward — which
// borrows the raw addresses and the stream handle — then releases it, synchronises the stream and
// reads x_out back in C++. Two threads serve requests concurrently.
//
// usage: cpp_embed_server <out_dir> [requests per thread] [model_dir]
// Writes <out_dir>/req<i>_rank<r>_{x,expert_ids,weights,x_out}.npy (bf16 as '<u2') and prints one
// line per request and "OK <n> requests" at the end.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl_rt.h"
#include "hccl/hccl_comm.h"

#ifndef MODEL_DIR
#define MODEL_DIR "."
#endif
#ifndef PYTHON_PROGRAM
#define PYTHON_PROGRAM ""
#endif

namespace {

constexpr int kWorld = 2, kTokens = 8, kHidden = 1024, kTopk = 4, kExperts = 8;

struct AclFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void acl_check(int ret, const char *what) {
    if (ret != 0) {
        const char *msg = aclGetRecentErrMsg();
        throw AclFailure(std::string(what) + " returned " + std::to_string(ret) + ": " + (msg ? msg : ""));
    }
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

uint64_t splitmix64(uint64_t &s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float uniform01(uint64_t &s) { return static_cast<float>(splitmix64(s) >> 40) / static_cast<float>(1u << 24); }

void write_npy(const std::string &path, const char *descr, const void *data, size_t elem, std::vector<int64_t> shape) {
    std::string dims;
    size_t count = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
        dims += (i ? ", " : "") + std::to_string(shape[i]);
        count *= static_cast<size_t>(shape[i]);
    }
    if (shape.size() == 1) dims += ",";
    std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot write " + path);
    std::fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    uint16_t hlen = static_cast<uint16_t>(header.size());
    std::fputc(hlen & 0xff, f);
    std::fputc(hlen >> 8, f);
    std::fwrite(header.data(), 1, header.size(), f);
    std::fwrite(data, elem, count, f);
    std::fclose(f);
}

// Device memory owned by the server.
struct DeviceBuffer {
    void *ptr = nullptr;
    size_t bytes = 0;
    explicit DeviceBuffer(size_t n) : bytes(n) { acl_check(aclrtMalloc(&ptr, n, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc"); }
    ~DeviceBuffer() { if (ptr) aclrtFree(ptr); }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    uintptr_t address() const { return reinterpret_cast<uintptr_t>(ptr); }
    void upload(const void *src, size_t n) { acl_check(aclrtMemcpy(ptr, bytes, src, n, ACL_MEMCPY_HOST_TO_DEVICE), "aclrtMemcpy"); }
    void download(void *dst, size_t n) const { acl_check(aclrtMemcpy(dst, n, ptr, n, ACL_MEMCPY_DEVICE_TO_HOST), "aclrtMemcpy"); }
};

// Holds the GIL for one scope (the serving threads never hold it otherwise).
struct Gil {
    PyGILState_STATE state;
    Gil() : state(PyGILState_Ensure()) {}
    ~Gil() { PyGILState_Release(state); }
};

std::string python_error() {  // call with the GIL held
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    std::string text = "Python error";
    if (value) {
        PyObject *s = PyObject_Str(value);
        if (s) {
            text = std::string(Py_TYPE(value)->tp_name) + ": " + PyUnicode_AsUTF8(s);
            Py_DECREF(s);
        }
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return text;
}

struct Shared {
    PyObject *module = nullptr;
    HcclRootInfo root{};
    std::string out_dir;
    int requests = 3;
};

void serve(const Shared &sh, int rank, std::string &error) {
    try {
        acl_check(aclrtSetDevice(rank), "aclrtSetDevice");
        aclrtStream stream = nullptr;
        acl_check(aclrtCreateStream(&stream), "aclrtCreateStream");
        {
            DeviceBuffer x(sizeof(uint16_t) * kTokens * kHidden), ids(sizeof(int32_t) * kTokens * kTopk),
                weights(sizeof(float) * kTokens * kTopk), x_out(sizeof(uint16_t) * kTokens * kHidden);
            std::vector<uint16_t> hx(kTokens * kHidden), hout(kTokens * kHidden);
            std::vector<int32_t> hids(kTokens * kTopk);
            std::vector<float> hw(kTokens * kTopk);

            PyObject *worker = nullptr;
            {
                Gil gil;
                worker = PyObject_CallMethod(sh.module, "Worker", "iiy#Ki", rank, kWorld,
                                             reinterpret_cast<const char *>(&sh.root), (Py_ssize_t)sizeof sh.root,
                                             (unsigned long long)reinterpret_cast<uintptr_t>(stream), kExperts);
                if (!worker) throw std::runtime_error(python_error());
            }
            for (int req = 0; req < sh.requests; ++req) {
                // the request's inputs, made and uploaded by the server without the GIL
                uint64_t seed = 1000003ull * static_cast<uint64_t>(req + 1) + static_cast<uint64_t>(rank);
                for (auto &v : hx) v = f32_to_bf16(uniform01(seed) * 4.0f - 2.0f);
                for (int t = 0; t < kTokens; ++t) {
                    int perm[kExperts];
                    for (int e = 0; e < kExperts; ++e) perm[e] = e;
                    for (int k = 0; k < kTopk; ++k) {
                        int pick = k + static_cast<int>(splitmix64(seed) % static_cast<uint64_t>(kExperts - k));
                        std::swap(perm[k], perm[pick]);
                        hids[t * kTopk + k] = perm[k];
                        hw[t * kTopk + k] = uniform01(seed);
                    }
                }
                x.upload(hx.data(), x.bytes);
                ids.upload(hids.data(), ids.bytes);
                weights.upload(hw.data(), weights.bytes);

                long rows = 0;
                {
                    Gil gil;  // only for the call into Python
                    PyObject *r = PyObject_CallMethod(worker, "forward", "KKKKiii", (unsigned long long)x.address(),
                                                      (unsigned long long)ids.address(),
                                                      (unsigned long long)weights.address(),
                                                      (unsigned long long)x_out.address(), kTokens, kHidden, kTopk);
                    if (!r) throw std::runtime_error(python_error());
                    rows = PyLong_AsLong(r);
                    Py_DECREF(r);
                }
                // the server waits for its own stream and reads the result (GIL released)
                acl_check(aclrtSynchronizeStream(stream), "aclrtSynchronizeStream");
                x_out.download(hout.data(), x_out.bytes);

                std::string p = sh.out_dir + "/req" + std::to_string(req) + "_rank" + std::to_string(rank) + "_";
                write_npy(p + "x.npy", "<u2", hx.data(), 2, {kTokens, kHidden});
                write_npy(p + "expert_ids.npy", "<i4", hids.data(), 4, {kTokens, kTopk});
                write_npy(p + "weights.npy", "<f4", hw.data(), 4, {kTokens, kTopk});
                write_npy(p + "x_out.npy", "<u2", hout.data(), 2, {kTokens, kHidden});
                uint64_t sum = 0;
                for (uint16_t v : hout) sum = sum * 31 + v;
                std::printf("request %d rank %d: %ld expert rows, x_out checksum %016llx\n", req, rank, rows,
                            (unsigned long long)sum);
                std::fflush(stdout);
            }
            {
                Gil gil;
                PyObject *r = PyObject_CallMethod(worker, "close", nullptr);
                if (!r) error = python_error();
                Py_XDECREF(r);
                Py_DECREF(worker);
            }
        }
        aclrtDestroyStream(stream);
        aclrtResetDevice(rank);
    } catch (const std::exception &e) {
        error = e.what();
    }
}

PyObject *start_python(const char *model_dir) {
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    // Behave like the Python executable the server was built for (so a virtualenv's site-packages are
    // found); ACLNN_EMBED_PYTHON overrides it.
    const char *program = std::getenv("ACLNN_EMBED_PYTHON");
    if (!program || !*program) program = PYTHON_PROGRAM;
    if (*program) PyConfig_SetBytesString(&config, &config.program_name, program);
    PyStatus st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) throw std::runtime_error("cannot start Python");
    PyObject *sys_path = PySys_GetObject("path");  // borrowed
    PyObject *dir = PyUnicode_FromString(model_dir);
    PyList_Insert(sys_path, 0, dir);
    Py_DECREF(dir);
    PyObject *module = PyImport_ImportModule("moe_model");
    if (!module) throw std::runtime_error(python_error());
    return module;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s out_dir [requests per thread] [model_dir]\n", argv[0]);
        return 2;
    }
    Shared sh;
    sh.out_dir = argv[1];
    sh.requests = argc > 2 ? std::atoi(argv[2]) : 3;
    const char *model_dir = argc > 3 ? argv[3] : MODEL_DIR;
    PyThreadState *main_state = nullptr;
    try {
        acl_check(aclInit(nullptr), "aclInit");
        acl_check(HcclGetRootInfo(&sh.root), "HcclGetRootInfo");
        sh.module = start_python(model_dir);
        main_state = PyEval_SaveThread();  // the GIL is free: serving threads take it per call
    } catch (const std::exception &e) {
        std::fprintf(stderr, "start-up failed: %s\n", e.what());
        return 1;
    }

    std::vector<std::string> errors(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) threads.emplace_back(serve, std::cref(sh), r, std::ref(errors[r]));
    for (auto &t : threads) t.join();

    PyEval_RestoreThread(main_state);
    Py_DECREF(sh.module);
    Py_FinalizeEx();
    aclFinalize();
    int failed = 0;
    for (int r = 0; r < kWorld; ++r)
        if (!errors[r].empty()) {
            std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
            failed = 1;
        }
    if (failed) return 1;
    std::printf("OK %d requests\n", sh.requests * kWorld);
    return 0;
}
