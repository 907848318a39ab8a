"""Misuse returns errors, never undefined behaviour (docs/reliability.md): each item of
the issue, on the real ops where it concerns them, with the status code and the message checked."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_python
from helpers.pool import pool_off

PARAM_NULLPTR, PARAM_INVALID, RUNTIME_ERROR, INNER_NULLPTR = 161001, 161002, 361001, 561103
ACL_INVALID_PARAM, RT_INVALID_HANDLE, RT_MEMORY_FREE = 100000, 107017, 207002
AICORE_TIMEOUT, AICORE_EXCEPTION = 507014, 507015
HCCL_E_PARA = 1
REPO = Path(__file__).resolve().parents[2]

# A small valid dispatch: W = 2, E = 2 (L = 1), BS = 2, H = 1024, K = 1.
BS, H, K, E = 2, 1024, 1, 2


def msg(acl) -> str:
    return acl.errors.recent_message() or ""


def c_handle(acl, obj) -> object:
    """The C handle (void *) of a Stream or Communicator, for raw calls."""
    return acl.backend().ffi.cast("void *", obj.handle)


def inputs(rank: int) -> tuple[np.ndarray, np.ndarray]:
    from ml_dtypes import bfloat16

    x = (np.arange(BS * H, dtype=np.float32).reshape(BS, H) % 7 + rank).astype(bfloat16)
    ids = np.array([[rank % E], [(rank + 1) % E]], dtype=np.int32)
    return x, ids


def _world_body(rank, world_size, root):
    from aclnn_py.hccl import Communicator, build_context

    comm = Communicator(world_size, rank, root)
    ctx, ccl = build_context(comm)
    return comm, ctx, ccl


@pytest.fixture(scope="module")
def world(acl):
    """A 2-rank threads world kept for the module: [(comm, context, ccl_buffer_size)] per rank."""
    from aclnn_py import worlds

    old = os.environ.get("HCCL_BUFFSIZE")
    os.environ["HCCL_BUFFSIZE"] = "8"
    try:
        res = worlds.run_threads(_world_body, 2)
    finally:
        if old is None:
            os.environ.pop("HCCL_BUFFSIZE", None)
        else:
            os.environ["HCCL_BUFFSIZE"] = old
    yield res
    for comm, _, _ in res:
        comm.close()


def prepare(acl, world, rank: int, **kw):
    from aclnn_py.ops import prepare_dispatch

    comm, ctx, ccl = world[rank]
    x, ids = inputs(rank)
    args = dict(ep_world_size=2, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl)
    args.update(kw)
    return prepare_dispatch(ctx, x, ids, **args)


def launch_raw(acl, p, workspace=None, size=None, stream=None) -> int:
    b = acl.backend()
    ws = b.ffi.cast("void *", 0 if workspace is None else workspace)
    return b.lib.aclnnMoeDistributeDispatchV5(ws, p.workspace_size if size is None else size, p.executor,
                                              b.ffi.NULL if stream is None else stream)


# ---- executors ---------------------------------------------------------------------------------------
def test_launch_of_a_consumed_executor(acl, mock, world):
    p = prepare(acl, world, 0)
    assert launch_raw(acl, p, workspace=None) == PARAM_INVALID     # NULL workspace: refused, and consumed
    assert "workspace is NULL" in msg(acl)
    mem = acl.DeviceMemory(p.workspace_size)
    assert launch_raw(acl, p, workspace=mem.ptr) == PARAM_INVALID
    m = msg(acl)
    assert "already launched" in m and "aclSetAclOpExecutorRepeatable" in m
    assert mock.stats()["executors"] == 0


def test_launch_of_a_destroyed_executor(acl, world):
    b = acl.backend()
    p = prepare(acl, world, 1)
    assert b.lib.aclDestroyAclOpExecutor(p.executor) == 0       # a never-launched executor may be destroyed
    mem = acl.DeviceMemory(p.workspace_size)
    assert launch_raw(acl, p, workspace=mem.ptr) == PARAM_INVALID
    assert "destroyed by aclDestroyAclOpExecutor" in msg(acl)
    assert b.lib.aclDestroyAclOpExecutor(p.executor) == PARAM_INVALID   # double destroy
    assert "destroyed" in msg(acl)
    assert b.lib.aclnnMoeDistributeDispatchV5(b.ffi.NULL, 0, b.ffi.NULL, b.ffi.NULL) == INNER_NULLPTR
    assert "executor must not be NULL" in msg(acl)
    garbage = b.ffi.cast("aclOpExecutor *", 0x1234)
    assert b.lib.aclnnMoeDistributeDispatchV5(b.ffi.NULL, 0, garbage, b.ffi.NULL) == PARAM_INVALID
    assert "not a live aclOpExecutor" in msg(acl)


def test_set_tensor_addr_on_a_non_repeatable_executor(acl, mock, world):
    b = acl.backend()
    p = prepare(acl, world, 0)
    x = p.inputs[1]
    other = acl.Tensor.empty(x.shape, x.dtype)
    for fn in (b.lib.aclSetInputTensorAddr, b.lib.aclSetTensorAddr):
        assert fn(p.executor, 1, x.descriptor(), b.ffi.cast("void *", other.ptr)) == PARAM_INVALID
        assert "not repeatable" in msg(acl)
    assert b.lib.aclSetOutputTensorAddr(p.executor, 0, p.outputs[0].descriptor(),
                                        b.ffi.cast("void *", other.ptr)) == PARAM_INVALID
    assert "not repeatable" in msg(acl)
    assert b.lib.aclDestroyAclOpExecutor(p.executor) == 0
    assert mock.stats()["executors"] == 0


# ---- tensors and addresses -----------------------------------------------------------------------
def _phase1_with(acl, world, rank: int, replace: dict[str, object]) -> int:
    """Raw phase 1 of a valid dispatch whose descriptors named in `replace` are swapped."""
    b = acl.backend()
    ffi, lib = b.ffi, b.lib
    comm, ctx, ccl = world[rank]
    x, ids = inputs(rank)
    xt, it = acl.Tensor.from_numpy(x), acl.Tensor.from_numpy(ids)
    A = 2 * BS * 1
    outs = {"expand_x": acl.Tensor.empty((A, H), xt.dtype), "dynamic_scales": acl.Tensor.empty((A,), np.float32),
            "assist_info_for_combine": acl.Tensor.empty((A * 128,), np.int32),
            "expert_token_nums": acl.Tensor.empty((1,), np.int64),
            "ep_recv_counts": acl.Tensor.empty((2,), np.int32), "tp_recv_counts": acl.Tensor.empty((0,), np.int32),
            "expand_scales": acl.Tensor.empty((0,), np.float32)}
    d = {"context": ctx.descriptor(), "x": xt.descriptor(), "expert_ids": it.descriptor()}
    d.update({k: v.descriptor() for k, v in outs.items()})
    d.update(replace)
    ws, ex = ffi.new("uint64_t *"), ffi.new("aclOpExecutor **")
    n = ffi.NULL
    ret = lib.aclnnMoeDistributeDispatchV5GetWorkspaceSize(
        d["context"], d["x"], d["expert_ids"], n, n, n, n, n, 2, rank, E, ccl, 0, 0, 0, 1, 0, 0, 0, 1, b"", 0, 0, 0,
        d["expand_x"], d["dynamic_scales"], d["assist_info_for_combine"], d["expert_token_nums"],
        d["ep_recv_counts"], d["tp_recv_counts"], d["expand_scales"], ws, ex)
    if ret == 0:
        assert lib.aclDestroyAclOpExecutor(ex[0]) == 0
    return ret


def test_destroyed_tensor_in_an_op_call(acl, mock, world):
    b = acl.backend()
    dims = b.ffi.new("int64_t[]", [BS, H])
    dead = b.lib.aclCreateTensor(dims, 2, 27, b.ffi.NULL, 0, 2, dims, 2, b.ffi.NULL)
    assert b.lib.aclDestroyTensor(dead) == 0
    assert _phase1_with(acl, world, 0, {"x": dead}) == PARAM_INVALID
    assert "x: must be a live aclTensor" in msg(acl)
    assert _phase1_with(acl, world, 0, {"expand_x": dead}) == PARAM_INVALID
    assert "expand_x: must be a live aclTensor" in msg(acl)
    assert _phase1_with(acl, world, 0, {"x": b.ffi.NULL}) == PARAM_NULLPTR
    assert "x: must not be NULL" in msg(acl)
    # the getters and a second destroy refuse the dead handle too
    cell = b.ffi.new("aclDataType *")
    assert b.lib.aclGetDataType(dead, cell) == PARAM_INVALID and "not a live aclTensor" in msg(acl)
    assert b.lib.aclDestroyTensor(dead) == PARAM_INVALID and "not a live aclTensor" in msg(acl)


def test_host_pointer_or_bad_address_as_tensor_data(acl, world):
    b = acl.backend()
    host = np.zeros(BS * H + 16, np.uint16)
    host_base = -(-host.ctypes.data // 32) * 32       # storage bases must be 32-byte aligned
    for addr, text in ((host_base, "not device memory"), (0x20, "not device memory"),
                       (0, "address is NULL")):
        bad = acl.Tensor.from_address(addr, (BS, H), "bfloat16", owner=host)
        p = prepare_with_x(acl, world, 0, bad)
        mem = acl.DeviceMemory(p.workspace_size)
        assert launch_raw(acl, p, workspace=mem.ptr) == PARAM_INVALID
        m = msg(acl)
        assert "input 1" in m and text in m, m
    # a storage base that is not 32-byte aligned never becomes a descriptor
    mem = acl.DeviceMemory(BS * H * 2 + 64)
    bad = acl.Tensor.from_address(mem.ptr + 1, (BS, H), "bfloat16", owner=mem)
    with pytest.raises(acl.AclnnError, match="tensorData \\(the storage base\\) must be 32-byte aligned"):
        bad.descriptor()
    # the context is read at phase 1: host memory there is refused at once
    ctx_host = acl.Tensor.from_address(host_base, (4100,), np.int32, owner=host)
    assert _phase1_with(acl, world, 0, {"context": ctx_host.descriptor()}) == PARAM_INVALID
    assert "context: data is not device memory" in msg(acl)
    del b


def prepare_with_x(acl, world, rank, xt):
    from aclnn_py.ops import prepare_dispatch

    comm, ctx, ccl = world[rank]
    _, ids = inputs(rank)
    return prepare_dispatch(ctx, xt, ids, ep_world_size=2, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl)


def unpooled_memory(acl, size):
    """DeviceMemory straight from aclrtMalloc, freed by aclrtFree (a pooled block is a whole size
    class, and cached once closed)."""
    with pool_off(acl):
        return acl.DeviceMemory(size)


def test_view_running_past_its_allocation(acl, world):
    mem = unpooled_memory(acl, BS * H * 2 - 512)        # 512 bytes short (the mock pads by 32)
    xt = acl.Tensor.from_address(mem.ptr, (BS, H), "bfloat16", owner=mem)
    p = prepare_with_x(acl, world, 0, xt)
    ws = acl.DeviceMemory(p.workspace_size)
    assert launch_raw(acl, p, workspace=ws.ptr) == PARAM_INVALID
    m = msg(acl)
    assert "input 1" in m and "bytes past the end of its block" in m, m
    # a strided view whose last element lies outside, and an offset view
    big = acl.DeviceMemory(BS * H * 2)
    b = acl.backend()
    dims = b.ffi.new("int64_t[]", [BS, H])
    for strides, offset in (([2 * H, 1], 0), ([H, 1], 64)):
        st = b.ffi.new("int64_t[]", strides)
        t = b.lib.aclCreateTensor(dims, 2, 27, st, offset, 2, dims, 2, b.ffi.cast("void *", big.ptr))
        assert t != b.ffi.NULL
        ret = _phase1_with(acl, world, 0, {"expand_x": t})
        assert ret == PARAM_INVALID   # phase 1 already refuses a non-contiguous or mis-sized output
        msg(acl)
        assert b.lib.aclDestroyTensor(t) == 0
    # sizes that overflow are refused when the descriptor is made
    huge = b.ffi.new("int64_t[]", [2 ** 40, 2 ** 40])
    assert b.lib.aclCreateTensor(huge, 2, 0, b.ffi.NULL, 0, 2, huge, 2, b.ffi.NULL) == b.ffi.NULL
    assert "2^62" in msg(acl)


def test_freed_workspace(acl, mock, world):
    p = prepare(acl, world, 0)
    ws = unpooled_memory(acl, p.workspace_size)
    ptr = ws.ptr
    ws.close()
    assert launch_raw(acl, p, workspace=ptr) == PARAM_INVALID
    m = msg(acl)
    assert "workspace" in m and "not device memory" in m, m


def _blocked_stream(acl, world):
    """A stream of rank 0 whose head is an HcclBarrier waiting for rank 1 (released by release())."""
    b = acl.backend()
    s = acl.Device(0).create_stream()
    assert b.lib.HcclBarrier(c_handle(acl, world[0][0]), c_handle(acl, s)) == 0

    def release():
        s1 = acl.Device(0).create_stream()
        assert b.lib.HcclBarrier(c_handle(acl, world[1][0]), c_handle(acl, s1)) == 0
        s1.synchronize()
        s1.close()

    return s, release


def test_memory_freed_while_work_is_queued_waits_for_it(acl, mock, world):
    """aclrtFree of memory a queued task still uses waits for the task (no use after free)."""
    b = acl.backend()
    s, release = _blocked_stream(acl, world)
    mem = acl.DeviceMemory(4096)
    assert b.lib.aclrtMemsetAsync(b.ffi.cast("void *", mem.ptr), 4096, 0x5A, 4096, c_handle(acl, s)) == 0
    waits0 = mock.stats()["free_waits"]
    done = threading.Event()
    result = []

    def free():
        result.append(b.lib.aclrtFree(b.ffi.cast("void *", mem.ptr)))
        done.set()

    t = threading.Thread(target=free)
    t.start()
    time.sleep(0.3)
    assert not done.is_set(), "aclrtFree returned while a queued memset still used the block"
    assert mock.stats()["pinned_blocks"] >= 1
    release()
    assert done.wait(10)
    t.join()
    mem._ptr = 0  # freed behind the wrapper's back
    assert result == [0]
    assert mock.stats()["free_waits"] == waits0 + 1
    s.synchronize()
    s.close()


def test_stream_destroyed_with_work_pending(acl, world):
    """Decision: aclrtDestroyStream runs what is queued first (bounded by the HCCL timeout for a
    collective), then the handle is dead (107017)."""
    b = acl.backend()
    s, release = _blocked_stream(acl, world)
    mem = acl.DeviceMemory(4096)
    assert b.lib.aclrtMemsetAsync(b.ffi.cast("void *", mem.ptr), 4096, 0x11, 4096, c_handle(acl, s)) == 0
    result = []
    h = c_handle(acl, s)
    t = threading.Thread(target=lambda: result.append(b.lib.aclrtDestroyStream(h)))
    t.start()
    time.sleep(0.2)
    assert not result, "aclrtDestroyStream returned before its queued work ran"
    release()
    t.join(10)
    assert result == [0]
    out = np.zeros(4096, np.uint8)
    acl.runtime.copy_to_host(out, mem.ptr, 4096)
    assert (out == 0x11).all()
    assert b.lib.aclrtSynchronizeStream(h) == RT_INVALID_HANDLE and "not a live stream" in msg(acl)
    s._owned = False  # destroyed behind the wrapper's back: its close() must not destroy it again


def test_double_free_of_everything(acl, world):
    b = acl.backend()
    ffi, lib = b.ffi, b.lib
    cell = ffi.new("void **")
    assert lib.aclrtMalloc(cell, 64, 0) == 0
    p = cell[0]
    assert lib.aclrtFree(p) == 0
    assert lib.aclrtFree(p) == RT_MEMORY_FREE and "not a live allocation" in msg(acl)
    assert lib.aclrtMallocHost(cell, 64) == 0
    h = cell[0]
    assert lib.aclrtFreeHost(h) == 0
    assert lib.aclrtFreeHost(h) == RT_MEMORY_FREE and "not a live allocation" in msg(acl)
    assert lib.aclrtFree(ffi.NULL) == ACL_INVALID_PARAM and msg(acl)
    s = ffi.new("aclrtStream *")
    assert lib.aclrtCreateStream(s) == 0
    assert lib.aclrtDestroyStream(s[0]) == 0
    assert lib.aclrtDestroyStream(s[0]) == RT_INVALID_HANDLE and "not a live stream" in msg(acl)
    e = ffi.new("aclrtEvent *")
    assert lib.aclrtCreateEvent(e) == 0
    assert lib.aclrtDestroyEvent(e[0]) == 0
    assert lib.aclrtDestroyEvent(e[0]) == RT_INVALID_HANDLE and "not a live event" in msg(acl)
    dims = ffi.new("int64_t[]", [4])
    t = lib.aclCreateTensor(dims, 1, 0, ffi.NULL, 0, 2, dims, 1, ffi.NULL)
    assert lib.aclDestroyTensor(t) == 0
    assert lib.aclDestroyTensor(t) == PARAM_INVALID and "not a live aclTensor" in msg(acl)


# ---- init / finalize (a fresh process: this one is initialised) ---------------------------------------
INIT_SCRIPT = r"""
import numpy as np
from aclnn_py._binding import loader as _loader
b = _loader.load("mock")
from aclnn_py import _mock
ffi, lib = b.ffi, b.lib
def m():
    p = lib.aclGetRecentErrMsg()
    return "" if p == ffi.NULL else ffi.string(p).decode()
def copy_exec():
    cell = ffi.new("void **")
    assert lib.aclrtMalloc(cell, 256, 0) == 0          # the runtime works without aclInit
    dims = ffi.new("int64_t[]", [16])
    src = lib.aclCreateTensor(dims, 1, 0, ffi.NULL, 0, 2, dims, 1, cell[0])
    dst = lib.aclCreateTensor(dims, 1, 0, ffi.NULL, 0, 2, dims, 1, cell[0])
    ex = _mock.make_copy_executor(int(ffi.cast("uintptr_t", src)), int(ffi.cast("uintptr_t", dst)), 0)
    return ex                                         # phase 1 works without aclInit
out = []
assert lib.aclrtSetDevice(0) == 0
out.append(_mock.launch_executor(copy_exec(), 0, 0)); out.append(m())
out.append(lib.aclInit(ffi.NULL))
out.append(_mock.launch_executor(copy_exec(), 0, 0))
out.append(lib.aclrtSynchronizeStream(ffi.NULL))
out.append(lib.aclFinalize())
out.append(_mock.launch_executor(copy_exec(), 0, 0)); out.append(m())
out.append(lib.aclFinalize())
out.append(lib.aclInit(ffi.NULL))
out.append(lib.aclInit(ffi.NULL))
out.append(_mock.launch_executor(copy_exec(), 0, 0))
print(repr(out))
"""


def test_calls_before_init_and_after_finalize(acl):
    r = run_python(INIT_SCRIPT, timeout=60)
    assert r.returncode == 0, r.stderr
    out = eval(r.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    assert out[0] == RUNTIME_ERROR and "aclInit" in out[1]            # before aclInit: launch refused
    assert out[2:5] == [0, 0, 0]                                        # aclInit, launch, sync
    assert out[5] == 0                                                  # aclFinalize
    assert out[6] == RUNTIME_ERROR and "aclFinalize" in out[7]        # after: refused again
    assert out[8] == 100037                                             # second aclFinalize
    assert out[9:12] == [0, 100002, 0]                                  # re-init (a repeat is 100002), works


# ---- communicators -------------------------------------------------------------------------------------
def test_a_communicator_a_thread_found_live_is_refused_once_destroyed(acl):
    """A thread remembers the communicator it found live last (a world's contexts ask each handle W
    times); destroying any communicator makes every thread look again."""
    from aclnn_py import worlds
    from aclnn_py.hccl import Communicator

    b = acl.backend()
    ffi, lib = b.ffi, b.lib

    def body(rank, world_size, root):
        comm = Communicator(world_size, rank, root)
        handle, cell = comm._cdata, ffi.new("uint32_t *")
        seen = [lib.HcclGetRankId(handle, cell)]  # found live: remembered by this thread
        comm.close()
        seen.append(lib.HcclGetRankId(handle, cell))
        return seen, msg(acl)

    for seen, text in worlds.run_threads(body, 2):
        assert seen == [0, HCCL_E_PARA] and "not a live communicator" in text


def test_communicator_used_after_destroy(acl):
    from aclnn_py import worlds
    from aclnn_py.errors import HcclError
    from aclnn_py.hccl import build_context

    res = worlds.run_threads(_world_body, 2)
    b = acl.backend()
    ffi, lib = b.ffi, b.lib
    comm, ctx, ccl = res[0]
    stale = c_handle(acl, comm)
    for c, _, _ in res:
        c.close()
    cell = ffi.new("uint32_t *")
    assert lib.HcclGetRankId(stale, cell) == HCCL_E_PARA and "not a live communicator" in msg(acl)
    assert lib.HcclBarrier(stale, ffi.NULL) == HCCL_E_PARA and "not a live communicator" in msg(acl)
    assert lib.HcclCommDestroy(stale) == HCCL_E_PARA and "not a live communicator" in msg(acl)
    with pytest.raises(acl.ClosedError, match=r"Communicator\(rank 0/2\) is closed: cannot build a context"):
        build_context(comm)
    comm._cdata, comm._open = stale, True  # a stale handle behind the wrapper's back
    with pytest.raises(HcclError):
        build_context(comm)
    comm._open = False
    # the context tensor made before the destroy names the problem at phase 1
    from aclnn_py.errors import AclnnParamInvalid
    from aclnn_py.ops import prepare_dispatch

    x, ids = inputs(0)
    with pytest.raises(AclnnParamInvalid, match="context"):
        prepare_dispatch(ctx, x, ids, ep_world_size=2, ep_rank_id=0, moe_expert_num=E, ccl_buffer_size=ccl)


# ---- parameters that differ across ranks (seen through the window) -----------------------------------
def _mismatch_body(rank, world_size, root, per_rank):
    from aclnn_py.errors import AclnnPyError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import prepare_dispatch

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        x, ids = inputs(rank)
        kw = dict(ep_world_size=2, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl)
        kw.update(per_rank[rank])
        s = __import__("aclnn_py").Device.current().create_stream()
        try:
            p = prepare_dispatch(ctx, x, ids, stream=s, **kw)
            p.launch(s)
            s.synchronize()
            return (0, "")
        except AclnnPyError as e:
            return (e.code, e.message or str(e))
        finally:
            try:
                s.synchronize()
            except AclnnPyError:
                pass
            s.close()


@pytest.mark.parametrize("field,per_rank,text", [
    ("moe_expert_num", [{}, {"moe_expert_num": 4}], "moe_expert_num: rank"),
    ("global_bs", [{}, {"global_bs": 8}], "maxBs (global_bs / ep_world_size): rank"),
    ("quant_mode", [{}, {"quant_mode": 2}], "quant_mode: rank"),
])
def test_mismatched_parameters_are_named(acl, field, per_rank, text):
    from aclnn_py import worlds

    res = worlds.run_threads(_mismatch_body, 2, per_rank, timeout=60)
    for rank, (code, m) in enumerate(res):
        assert code == AICORE_EXCEPTION, (rank, code, m)
        assert text in m, m


def test_mismatched_ep_world_size(acl, monkeypatch):
    """ep_world_size must equal the communicator's size, so a rank that passes another value is
    refused at phase 1 (naming it); its peer, which launched, times out naming that rank."""
    from aclnn_py import worlds

    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "1")
    t0 = time.monotonic()
    res = worlds.run_threads(_mismatch_body, 2, [{}, {"ep_world_size": 4}], timeout=60)
    assert time.monotonic() - t0 < 10
    assert res[1][0] == PARAM_INVALID and "ep_world_size" in res[1][1]
    assert res[0][0] == AICORE_TIMEOUT and "waiting for ranks [1]" in res[0][1]


def test_bad_operator_arguments_are_typed_errors_naming_the_parameter(acl, device0):
    """Refused before any C call, with the parameter and the rule named (found by the compiled-vs-Python
    differential, where both paths crashed alike or took the value): a missing required input, outputs
    of another type or with a misspelt name, a misspelt keyword next to a config, an attribute or a
    stream handle beyond 64 bits."""
    from ml_dtypes import bfloat16

    from aclnn_py.ops import MoeConfig, moe_distribute_combine, moe_distribute_dispatch

    cfg = MoeConfig(ep_world_size=2, ep_rank_id=0, moe_expert_num=E, ccl_buffer_size=1 << 30)
    ctx = acl.Tensor.from_numpy(np.zeros(8, np.int32))
    x, ids = np.zeros((BS, H), bfloat16), np.zeros((BS, K), np.int32)
    calls = {
        "x None": lambda: moe_distribute_dispatch(ctx, None, ids, config=cfg),
        "expand_x None": lambda: moe_distribute_combine(ctx, None, ids, ids, ids, config=cfg),
        "outputs tuple": lambda: moe_distribute_dispatch(ctx, x, ids, config=cfg, outputs=(None,) * 7),
        "outputs name": lambda: moe_distribute_dispatch(ctx, x, ids, config=cfg, outputs={"expandx": ctx}),
        "misspelt keyword": lambda: moe_distribute_dispatch(ctx, x, ids, config=cfg, strem=None),
        "huge attribute": lambda: moe_distribute_dispatch(ctx, x, ids, ep_world_size=2, ep_rank_id=0,
                                                          moe_expert_num=E, ccl_buffer_size=2**64),
        "huge stream": lambda: moe_distribute_dispatch(ctx, x, ids, config=cfg, stream=2**64),
        "negative stream": lambda: acl.Stream.from_handle(-1),
    }
    got = {}
    for name, call in calls.items():
        with pytest.raises((TypeError, ValueError)) as e:
            call()
        got[name] = (type(e.value).__name__, str(e.value))
    assert got["x None"] == ("TypeError", "x: expected a Tensor or an array, got None")
    assert got["expand_x None"] == ("TypeError", "expand_x: expected a Tensor or an array, got None")
    assert got["outputs tuple"] == ("TypeError", "outputs: expected DispatchOutputs or a mapping of output names "
                                                 "to Tensors, got tuple")
    assert got["outputs name"][1].startswith("outputs: unknown output name(s) expandx (the outputs are expand_x, ")
    assert got["misspelt keyword"][1].startswith("unexpected attribute(s) strem; MoeConfig takes ")
    assert got["huge attribute"] == ("ValueError", "ccl_buffer_size: must fit in int64 (got 18446744073709551616)")
    assert got["huge stream"] == ("ValueError", "stream: an aclrtStream handle is an address in [0, 2**64) "
                                                "(got 18446744073709551616)")
    assert got["negative stream"] == ("ValueError", "handle: an aclrtStream handle is an address in [0, 2**64) "
                                                    "(got -1)")
