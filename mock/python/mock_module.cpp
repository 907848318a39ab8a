// aclnn_py._mock: the control module of the mock CANN backend. It reads and changes the same state
// the mock libraries hold (it links them), for tests and diagnostics: live allocations, streams,
// tensors, executors and communicators; the SoC profile and poison settings; a copy executor for
// testing the two-phase contract without the MoE ops.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "aclnn/executor.h"
#include "hccl/hccl_core.h"
#include "ops/lowp.h"
#include "runtime/rt_core.h"

namespace py = pybind11;
using namespace aclmock;

static py::dict stats() {
    py::dict d;
    MemStats m = mem_stats();
    d["allocations"] = m.live_allocations;
    d["allocated_bytes"] = m.live_bytes;
    StreamStats s = stream_stats();
    d["streams"] = s.live_streams;
    d["events"] = s.live_events;
    d["tasks_run"] = s.tasks_run;
    d["tasks_run_by_synchronise"] = s.tasks_run_by_synchronise;
    d["stream_workers_started"] = s.stream_workers_started;
    d["late_starts"] = s.late_starts;
    TensorStats t = tensor_stats();
    d["tensors"] = t.live_tensors;
    d["executors"] = t.live_executors;
    PinStats ps = pin_stats();
    d["pinned_blocks"] = ps.pinned_blocks;
    d["free_waits"] = ps.free_waits;
    FaultStats fs = fault_stats();
    d["faults_armed"] = fs.armed;
    d["faults_fired"] = fs.fired;
    hccl::HcclStats h = hccl::hccl_stats();
    d["communicators"] = h.live_comms;
    d["mapped_windows"] = h.mapped_windows;
    d["mapped_window_bytes"] = h.mapped_bytes;
    d["liveness_probes"] = h.liveness_probes;
    return d;
}

static void set_soc_by_name(const std::string &name) {
    std::string why;
    if (!set_soc_name(name, &why)) throw py::value_error("set_soc: " + why);
}

static void reload_config_checked() {
    reload_config();
    if (std::string why = config_error(); !why.empty()) throw py::value_error("reload_config: " + why);
}

// Test hook of the 950 casts (mock/ops/lowp.h, the same inline code the kernels run).
static moe::Fmt lowp_format(const std::string &name) {
    if (name == "float8_e4m3fn") return moe::Fmt::E4M3;
    if (name == "float8_e5m2") return moe::Fmt::E5M2;
    if (name == "float4_e2m1") return moe::Fmt::E2M1;
    if (name == "float4_e1m2") return moe::Fmt::E1M2;
    if (name == "hifloat8") return moe::Fmt::HiF8;
    if (name == "float8_e8m0") return moe::Fmt::None;
    throw py::value_error("unknown low-precision format '" + name + "'");
}

static py::array_t<uint8_t> lowp_encode(const std::string &name, py::array_t<float, py::array::c_style | py::array::forcecast> x,
                                        bool saturate) {
    const moe::Fmt f = lowp_format(name);
    if (f == moe::Fmt::None) throw py::value_error("lowp_encode: float8_e8m0 has no encoder here");
    if (!saturate && (f == moe::Fmt::E2M1 || f == moe::Fmt::E1M2))
        throw py::value_error("lowp_encode: fp4 casts must saturate");
    if (saturate && f == moe::Fmt::HiF8) throw py::value_error("lowp_encode: the HiF8 cast does not saturate");
    py::array_t<uint8_t> out(x.request().shape);
    const float *src = x.data();
    uint8_t *dst = out.mutable_data();
    const py::ssize_t n = x.size();
    {
        py::gil_scoped_release nogil;
        for (py::ssize_t i = 0; i < n; ++i) dst[i] = moe::encode_fmt(f, src[i], saturate);
    }
    return out;
}

static py::array_t<float> lowp_decode(const std::string &name, py::array_t<uint8_t, py::array::c_style | py::array::forcecast> c) {
    const moe::Fmt f = lowp_format(name);
    if (f == moe::Fmt::HiF8) throw py::value_error("lowp_decode: the mock never decodes HiF8");
    py::array_t<float> out(c.request().shape);
    const uint8_t *src = c.data();
    float *dst = out.mutable_data();
    for (py::ssize_t i = 0; i < c.size(); ++i)
        dst[i] = f == moe::Fmt::None ? moe::e8m0_to_f32(src[i]) : moe::decode_fmt(f, src[i]);
    return out;
}

PYBIND11_MODULE(_mock, m) {
    m.doc() = "Control module of the aclnn-py CPU mock (statistics, profiles, test hooks).";
    m.def("stats", &stats, "Live objects of the mock in this process: allocations, bytes, streams, events, "
                           "tensors, executors, communicators, mapped windows.");
    m.def("soc", [] { return std::string(soc_name(config().soc)); }, "The active SoC profile.");
    m.def("set_soc", &set_soc_by_name, py::arg("name"),
          "Switch the SoC profile by the family of `name` (Ascend910_93..., Ascend950..., Ascend910B...); aclrtGetSocName "
          "then reports `name` exactly. ValueError for a name of no known family.");
    m.def("cann_rules", [] { return std::string(cann_rules_name(config().rules)); },
          "The CANN rule set the ops apply where releases differ: 'newest' or '8.3.RC1' (ACLNN_MOCK_CANN_VERSION).");
    m.def("cann_version", [] { return config().release; },
          "ACLNN_MOCK_CANN_VERSION as given ('' when unset: the newest rules).");
    m.def(
        "set_cann_version",
        [](const std::string &value) {
            std::string why;
            if (!set_cann_version(value, &why)) throw py::value_error("set_cann_version: " + why);
        },
        py::arg("value"),
        "Answer as the CANN release `value` (8.3.RC1, 8.5.0, ..., or '' / 'newest'), as ACLNN_MOCK_CANN_VERSION "
        "would. ValueError for a value that is no release.");
    m.def("poison", [] { return config().poison; }, "Whether new allocations are filled with 0xA5.");
    m.def("set_poison", &set_poison, py::arg("on"), "Turn the poison fill of new allocations on or off.");
    m.def("poison_stripe", [] { return config().poison_stripe; },
          "Whether a reused block above 64 KiB is refilled striped (ACLNN_MOCK_POISON=stripe) rather than whole.");
    m.def("set_poison_stripe", &set_poison_stripe, py::arg("stripe"),
          "Refill reused blocks above 64 KiB striped (True) or whole (False, the default).");
    m.def(
        "refill_poison",
        [](uintptr_t address, size_t nbytes) {
            if (!refill_poison(reinterpret_cast<void *>(address), nbytes))
                throw py::value_error(format("refill_poison: 0x%zx (+%zu bytes) is not inside one device block",
                                             static_cast<size_t>(address), nbytes));
        },
        py::arg("address"), py::arg("nbytes"),
        "Give a block a caching allocator hands out again the poison of a new one, when the fill is on: "
        "whole, or with poison_stripe and above 64 KiB one 64-byte line in every 512 bytes and the last line.");
    m.def(
        "written_extent",
        [](uintptr_t address) -> py::object {
            WrittenExtent w;
            if (!written_extent(reinterpret_cast<const void *>(address), &w)) return py::none();
            py::dict d;
            d["base"] = w.base;
            d["size"] = w.size;
            d["lo"] = w.lo;
            d["hi"] = w.hi;
            d["poison_outside"] = w.poison_outside;
            d["lazy"] = w.lazy;
            return d;
        },
        py::arg("address"),
        "The registered block that contains `address`: its base and size, the range written since it last held "
        "the poison throughout (lo, hi: offsets from the base; empty when lo >= hi), whether every byte outside "
        "that range holds the poison, and whether its unwritten pages take no memory (lazy). None when no "
        "block contains the address.");
    m.def(
        "mark_written",
        [](uintptr_t address, size_t nbytes) { mark_written(reinterpret_cast<const void *>(address), nbytes); },
        py::arg("address"), py::arg("nbytes"),
        "Record that [address, address + nbytes) was written by code the mock does not see (a host view or "
        "DLPack consumer of device memory), so that a refill of the block restores the poison there too.");
    m.def("refill_poison_async_address", [] { return reinterpret_cast<uintptr_t>(&refill_poison_async); },
          "The address of the mock's queued poison refill (int (*)(void *const *ptrs, const size_t *sizes, "
          "size_t n, aclrtStream stream)), for a compiled caller that reuses device blocks.");
    m.def("set_skip_kernels", &set_skip_kernels, py::arg("on"),
          "Benchmarks only: phase 2 checks and queues as usual but the kernels do nothing.");
    m.def("skip_kernels", &skip_kernels);
    m.def(
        "set_row_streaming",
        [](std::optional<bool> on) { set_row_streaming(on ? int(*on) : -1); }, py::arg("on"),
        "Tests: whether the kernels write the rows they send into peers' windows with streaming stores "
        "(True), with ordinary copies (False), or as the world's volume says (None, the default: "
        "streaming when W times a rank's rows of a call exceed a quarter of the last-level cache).");
    m.def(
        "inject_fault",
        [](const std::string &op, int rank, const std::string &kind, double seconds, int count) {
            if (op != "dispatch" && op != "combine" && op != "barrier")
                throw py::value_error("inject_fault: op must be 'dispatch', 'combine' or 'barrier' (got '" + op + "')");
            FaultKind k;
            if (kind == "skip") k = FaultKind::Skip;
            else if (kind == "delay") k = FaultKind::Delay;
            else if (kind == "crash") k = FaultKind::Crash;
            else throw py::value_error("inject_fault: kind must be 'skip', 'delay' or 'crash' (got '" + kind + "')");
            if (k == FaultKind::Delay && !(seconds > 0))
                throw py::value_error("inject_fault: a delay needs seconds > 0");
            if (count == 0 || count < -1) throw py::value_error("inject_fault: count must be >= 1, or -1 for always");
            inject_fault(op, rank, k, seconds, count);
        },
        py::arg("op"), py::arg("rank") = -1, py::arg("kind") = "skip", py::arg("seconds") = 0.0,
        py::arg("count") = 1,
        "Arm a fault for the next `count` collective calls `op` ('dispatch' | 'combine' | 'barrier') of "
        "communicator rank `rank` (-1: any) in this process: 'skip' (the rank never takes part; its own "
        "call fails at once, its peers time out naming it), 'delay' (sleep `seconds` before taking part) "
        "or 'crash' (SIGKILL this process in the middle of the call: use it in process worlds).");
    m.def("clear_faults", &clear_faults, "Disarm every fault of this process.");
    m.def(
        "fault_stats", [] {
            FaultStats fs = fault_stats();
            py::dict d;
            d["armed"] = fs.armed;
            d["fired"] = fs.fired;
            return d;
        },
        "Armed faults and how many times a fault fired in this process.");
    m.def("reload_config", &reload_config_checked,
          "Re-read ACLNN_MOCK_* from the environment; ValueError (the configuration stays refused, aclInit "
          "fails) for an ACLNN_MOCK_SOC of no known family.");
    m.def("device_count", [] { return config().device_count; });
    m.def("clear_error", &clear_error, "Drop this thread's recent error message.");
    m.def("exec_timeout", &hccl::exec_timeout_seconds, "HCCL_EXEC_TIMEOUT as the mock reads it (s).");
    m.def(
        "make_copy_executor",
        [](uintptr_t src, uintptr_t dst, uint64_t workspace) {
            aclOpExecutor *e = make_copy_executor(reinterpret_cast<const aclTensor *>(src),
                                                  reinterpret_cast<aclTensor *>(dst), workspace);
            if (e == nullptr) throw py::value_error("make_copy_executor: " + take_error());
            return reinterpret_cast<uintptr_t>(e);
        },
        py::arg("src"), py::arg("dst"), py::arg("workspace_size") = 0,
        "Phase 1 of a test op that copies src to dst (aclTensor addresses); returns the executor "
        "address for aclnnpy tests of the two-phase rules (launch it with launch_executor).");
    m.def(
        "launch_executor",
        [](uintptr_t exec, uintptr_t workspace, uint64_t size, uintptr_t stream) {
            py::gil_scoped_release nogil;
            return launch_executor(reinterpret_cast<aclOpExecutor *>(exec), reinterpret_cast<void *>(workspace),
                                   size, reinterpret_cast<aclrtStream>(stream), "aclnnMockCopy");
        },
        py::arg("executor"), py::arg("workspace"), py::arg("workspace_size"), py::arg("stream") = 0,
        "Phase 2 of the test copy op; returns the aclnnStatus.");
    m.def("lowp_encode", &lowp_encode, py::arg("format"), py::arg("values"), py::arg("saturate"),
          "Test hook: float32 values -> codes (uint8) with the mock's 950 cast of `format` (float8_e4m3fn, "
          "float8_e5m2, float4_e2m1, float4_e1m2: RNE, saturating or not; hifloat8: ties away, saturate=False).");
    m.def("lowp_decode", &lowp_decode, py::arg("format"), py::arg("codes"),
          "Test hook: codes -> float32 with the mock's decoder (fp8 / fp4 formats and float8_e8m0).");
}
