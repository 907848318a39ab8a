"""The aclnn two-phase contract (phase 1 builds an executor, phase 2 launches it) on the mock's generic
executor, driven through a test copy op (aclnn_py._mock.make_copy_executor) and the public aclnn-meta
calls."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.pool import pool_off

PARAM_INVALID = 161002
INNER_NULLPTR = 561103


def addr(acl, cdata) -> int:
    return int(acl.backend().ffi.cast("uintptr_t", cdata))


@pytest.fixture
def copy_op(acl, mock):
    src = acl.Tensor.from_numpy(np.arange(16, dtype=np.float32))
    dst = acl.Tensor.empty((16,), np.float32)
    ws = acl.DeviceMemory(256)

    def make(workspace_size=128):
        return mock.make_copy_executor(addr(acl, src.descriptor()), addr(acl, dst.descriptor()), workspace_size)

    return src, dst, ws, make


def test_normal_executor_consumed_by_launch(acl, mock, copy_op):
    src, dst, ws, make = copy_op
    ex = make()
    assert mock.launch_executor(ex, ws.ptr, 128) == 0
    acl.Stream.default().synchronize()
    assert dst.numpy().tolist() == list(range(16))
    assert mock.launch_executor(ex, ws.ptr, 128) == PARAM_INVALID  # consumed
    assert "executor" in acl.errors.recent_message()


def test_workspace_null_or_too_small(acl, mock, copy_op):
    src, dst, ws, make = copy_op
    assert mock.launch_executor(make(), 0, 128) == PARAM_INVALID
    assert "workspace" in acl.errors.recent_message()
    assert mock.launch_executor(make(), ws.ptr, 64) == PARAM_INVALID
    assert "workspace" in acl.errors.recent_message()
    host = np.zeros(256, np.uint8)
    assert mock.launch_executor(make(), host.ctypes.data, 256) == PARAM_INVALID  # not device memory
    acl.errors.recent_message()
    assert mock.launch_executor(make(0), 0, 0) == 0  # no workspace needed, NULL fine
    acl.Stream.default().synchronize()


def test_repeatable_executor_rebinds_and_relaunches(acl, mock, copy_op):
    src, dst, ws, make = copy_op
    ffi, lib = acl.backend().ffi, acl.backend().lib
    ex_int = make()
    ex = ffi.cast("aclOpExecutor *", ex_int)
    assert lib.aclSetAclOpExecutorRepeatable(ex) == 0
    assert mock.launch_executor(ex_int, ws.ptr, 128) == 0
    acl.Stream.default().synchronize()
    src2 = acl.Tensor.from_numpy(np.arange(100, 116, dtype=np.float32))
    dst2 = acl.Tensor.empty((16,), np.float32)
    assert lib.aclSetInputTensorAddr(ex, 0, src.descriptor(), ffi.cast("void *", src2.ptr)) == 0
    assert lib.aclSetOutputTensorAddr(ex, 0, dst.descriptor(), ffi.cast("void *", dst2.ptr)) == 0
    assert mock.launch_executor(ex_int, ws.ptr, 128) == 0
    acl.Stream.default().synchronize()
    assert dst2.numpy().tolist() == list(range(100, 116))
    # aclSetTensorAddr counts inputs then outputs: index 1 is the output
    dst3 = acl.Tensor.empty((16,), np.float32)
    assert lib.aclSetTensorAddr(ex, 1, dst.descriptor(), ffi.cast("void *", dst3.ptr)) == 0
    assert mock.launch_executor(ex_int, ws.ptr, 128) == 0
    acl.Stream.default().synchronize()
    assert dst3.numpy().tolist() == list(range(100, 116))
    # index out of range, unaligned address
    assert lib.aclSetInputTensorAddr(ex, 1, src.descriptor(), ffi.cast("void *", src2.ptr)) == PARAM_INVALID
    assert lib.aclSetTensorAddr(ex, 2, src.descriptor(), ffi.cast("void *", src2.ptr)) == PARAM_INVALID
    assert lib.aclSetInputTensorAddr(ex, 0, src.descriptor(), ffi.cast("void *", src2.ptr + 4)) == PARAM_INVALID
    acl.errors.recent_message()
    assert lib.aclDestroyAclOpExecutor(ex) == 0


def test_rebinding_a_normal_executor_is_refused(acl, mock, copy_op):
    src, dst, ws, make = copy_op
    ffi, lib = acl.backend().ffi, acl.backend().lib
    ex = ffi.cast("aclOpExecutor *", make())
    assert lib.aclSetInputTensorAddr(ex, 0, src.descriptor(), ffi.cast("void *", src.ptr)) == PARAM_INVALID
    assert "repeatable" in acl.errors.recent_message()
    assert lib.aclDestroyAclOpExecutor(ex) == 0  # never launched: may be destroyed


def test_null_executor_and_tensor(acl, copy_op):
    src, dst, ws, make = copy_op
    ffi, lib = acl.backend().ffi, acl.backend().lib
    assert lib.aclSetAclOpExecutorRepeatable(ffi.NULL) == INNER_NULLPTR
    assert lib.aclDestroyAclOpExecutor(ffi.NULL) == INNER_NULLPTR
    ex = ffi.cast("aclOpExecutor *", make())
    lib.aclSetAclOpExecutorRepeatable(ex)
    assert lib.aclSetInputTensorAddr(ex, 0, ffi.NULL, ffi.cast("void *", src.ptr)) == INNER_NULLPTR
    assert lib.aclDestroyAclOpExecutor(ex) == 0
    assert lib.aclDestroyAclOpExecutor(ex) != 0  # destroyed: an error, not a crash
    acl.errors.recent_message()


def test_launch_checks_bound_addresses(acl, mock, copy_op):
    """A tensor whose memory was freed after phase 1 is caught at launch, not read."""
    src, dst, ws, make = copy_op
    with pool_off(acl):  # freed by aclrtFree, not cached
        tmp = acl.Tensor.from_numpy(np.zeros(16, np.float32))
    ex = mock.make_copy_executor(addr(acl, tmp.descriptor()), addr(acl, dst.descriptor()), 128)
    tmp._mem.close()
    assert mock.launch_executor(ex, ws.ptr, 128) == PARAM_INVALID
    m = acl.errors.recent_message()
    assert "input 0" in m and "not device memory" in m


def test_no_leaked_executors(acl, mock, copy_op):
    src, dst, ws, make = copy_op
    before = mock.stats()["executors"]
    for _ in range(20):
        assert mock.launch_executor(make(), ws.ptr, 128) == 0
    acl.Stream.default().synchronize()
    assert mock.stats()["executors"] == before


def test_set_raw_tensor_addr_between_the_phases_is_refused(acl, mock, copy_op):
    """The executor keeps the address phase 1 saw: changing the tensor's address before phase 2 would
    be lost silently, so it is refused; before phase 1 and after phase 2 it is allowed."""
    src, dst, ws, make = copy_op
    ffi, lib = acl.backend().ffi, acl.backend().lib
    other = acl.DeviceMemory(64)
    raw = ffi.cast("void *", other.ptr)
    ex_int = make()
    for d, what in ((src.descriptor(), "input 0"), (dst.descriptor(), "output 0")):
        assert lib.aclSetRawTensorAddr(d, raw) == PARAM_INVALID
        m = acl.errors._recent_message()
        assert "aclSetRawTensorAddr: tensor" in m and "MockCopy" in m and what in m, m
        assert "between its phase 1 and phase 2" in m, m
    # a repeatable executor that was never launched is still between its phases
    ex = ffi.cast("aclOpExecutor *", ex_int)
    assert lib.aclSetAclOpExecutorRepeatable(ex) == 0
    assert lib.aclSetRawTensorAddr(src.descriptor(), raw) == PARAM_INVALID
    acl.errors._recent_message()
    assert mock.launch_executor(ex_int, ws.ptr, 128) == 0    # phase 2: the tensors are free again
    acl.Stream.default().synchronize()
    assert dst.numpy().tolist() == list(range(16))
    assert lib.aclSetRawTensorAddr(src.descriptor(), ffi.cast("void *", src.ptr)) == 0
    assert lib.aclDestroyAclOpExecutor(ex) == 0
    # destroying a never-launched executor frees its tensors too
    ex2 = ffi.cast("aclOpExecutor *", make())
    assert lib.aclSetRawTensorAddr(dst.descriptor(), ffi.cast("void *", dst.ptr)) == PARAM_INVALID
    acl.errors._recent_message()
    assert lib.aclDestroyAclOpExecutor(ex2) == 0
    assert lib.aclSetRawTensorAddr(dst.descriptor(), ffi.cast("void *", dst.ptr)) == 0
    # a consumed normal executor (launched) no longer holds them
    assert mock.launch_executor(make(), ws.ptr, 128) == 0
    acl.Stream.default().synchronize()
    assert lib.aclSetRawTensorAddr(src.descriptor(), ffi.cast("void *", src.ptr)) == 0


def test_a_one_shot_prepared_closed_before_its_launch_destroys_its_executor(acl, mock):
    from helpers.moe_calls import World2

    from aclnn_py.dtypes import bfloat16
    from aclnn_py.ops import prepare_dispatch

    world = World2()
    try:
        ctx, ccl = world.ctx[0]
        x, ids = acl.Tensor.zeros((2, 1024), bfloat16), acl.Tensor.zeros((2, 1), np.int32)
        before = mock.stats()["executors"]
        p = prepare_dispatch(ctx, x, ids, ep_world_size=2, ep_rank_id=0, moe_expert_num=2, ccl_buffer_size=ccl)
        assert mock.stats()["executors"] == before + 1
        p.close()  # never launched: nothing else would destroy it
        assert mock.stats()["executors"] == before
    finally:
        world.close()
