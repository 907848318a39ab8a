"""Calls a careful user never makes, refused the same way whatever ran before: attribute values of the
wrong type (also after a call with the right one, on the steady-state route), outputs that overlap each
other or an input or lie on another device (named, with both parties), and a plan called after the
communicator of its context closed (ClosedError at the call, not a kernel failure at synchronisation)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from aclnn_py.dtypes import bfloat16

W, BS, H, K, E = 2, 4, 1024, 2, 4


def _inputs(rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rank)
    x = rng.uniform(-1, 1, (BS, H)).astype(bfloat16)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    return x, ids, rng.uniform(0, 1, (BS, K)).astype(np.float32)


def _refused(call: Any) -> str | None:
    try:
        call()
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


# ---- attribute types -------------------------------------------------------------------------------------
BAD_ATTRIBUTES = [("num_experts", 4.0), ("num_experts", Decimal(4)), ("shared_expert_num", True),
                  ("num_max_dispatch_tokens_per_rank", 4.0)]


def _attribute_types(rank: int, world_size: int, root: bytes, device_inputs: bool) -> list[tuple[str | None, str | None]]:
    """Per bad attribute: the refusal on a fresh buffer, and after a call with the right value."""
    import aclnn_py as acl

    x, ids, w = _inputs(rank)
    out = []
    with acl.hccl.Communicator(world_size, rank, root) as comm:
        s = acl.Device(rank).create_stream()
        if device_inputs:
            x, ids, w = (acl.Tensor.from_numpy(a) for a in (x, ids, w))
        for name, bad in BAD_ATTRIBUTES:
            good = {"num_experts": E, "shared_expert_num": 1, "num_max_dispatch_tokens_per_rank": BS}[name]
            with acl.MoeDistributeBuffer(comm) as buf:
                def call(value: object, buf: Any = buf, name: str = name) -> Any:
                    kw = {"num_experts": E, name: value}
                    return buf.low_latency_dispatch(x, ids, topk_weights=w, stream=s, **kw)

                fresh = _refused(lambda bad=bad: call(bad))
                for _ in range(2):  # the second good call takes the steady-state route with device Tensors
                    call(good)
                    s.synchronize()
                after = _refused(lambda bad=bad: call(bad))
                comm.barrier(s, wait=True)
            out.append((fresh, after))
        s.close()
    return out


@pytest.mark.parametrize("device_inputs", [False, True], ids=["host", "device"])
def test_an_attribute_of_the_wrong_type_is_refused_whatever_ran_before(acl: Any, device_inputs: bool) -> None:
    for per_rank in acl.worlds.run_threads(_attribute_types, W, device_inputs, timeout=120):
        for (name, bad), (fresh, after) in zip(BAD_ATTRIBUTES, per_rank):
            assert fresh is not None and fresh.startswith("TypeError"), (name, bad, fresh)
            assert after == fresh, (name, bad, after)


def test_operator_keyword_attributes_are_refused_after_a_cached_config(acl: Any) -> None:
    from aclnn_py.ops import MoeConfig

    attrs = dict(ep_world_size=2, ep_rank_id=0, ccl_buffer_size=0)
    MoeConfig.from_attrs({**attrs, "moe_expert_num": 4})
    for bad in (4.0, Decimal(4), True):
        with pytest.raises(TypeError, match="moe_expert_num: expected an int"):
            MoeConfig.from_attrs({**attrs, "moe_expert_num": bad})


# ---- where outputs lie -----------------------------------------------------------------------------------
def _placements(rank: int, world_size: int, root: bytes) -> dict[str, Any]:
    import aclnn_py as acl
    from aclnn_py.hccl import build_context
    from aclnn_py.ops import DispatchOutputs, MoeConfig, moe_distribute_combine, moe_distribute_dispatch

    x, ids, w = (acl.Tensor.from_numpy(a) for a in _inputs(rank))
    seen: dict[str, Any] = {}
    with acl.hccl.Communicator(world_size, rank, root) as comm:
        s = acl.Device(rank).create_stream()
        ctx, ccl = build_context(comm)
        cfg = MoeConfig(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl)
        good = moe_distribute_dispatch(ctx, x, ids, config=cfg, expert_scales=w, stream=s)

        def fresh() -> list[Any]:
            return [None if t is None else acl.Tensor.empty(t.shape, t.dtype) for t in good]

        for step in range(2):  # the first call checks the shape; the second is the steady-state route
            outs = DispatchOutputs(*fresh())
            for t in outs:
                if t is not None:
                    t.descriptor()
            moe_distribute_dispatch(ctx, x, ids, config=cfg, expert_scales=w, outputs=outs, stream=s)
            s.synchronize()
            # two outputs in one block of memory
            block = acl.Tensor.empty((64,), np.int64)
            counts = good.ep_recv_counts
            shared = fresh()
            shared[3] = acl.Tensor.from_address(block.ptr, good.expert_token_nums.shape, good.expert_token_nums.dtype,
                                                owner=block)
            shared[4] = acl.Tensor.from_address(block.ptr, counts.shape, counts.dtype, offset=2, owner=block)  # 8 bytes in
            for t in shared:
                if t is not None:
                    t.descriptor()
            seen[f"outputs overlap, step {step}"] = _refused(lambda shared=shared: moe_distribute_dispatch(
                ctx, x, ids, config=cfg, expert_scales=w, outputs=DispatchOutputs(*shared), stream=s))
            # an output in the memory of an input
            on_input = fresh()
            on_input[0] = acl.Tensor.from_address(x.ptr, good.expand_x.shape, good.expand_x.dtype, owner=x) \
                if good.expand_x.nbytes <= x.nbytes else acl.Tensor.from_address(
                    x.ptr, (BS, H), good.expand_x.dtype, owner=x)
            seen[f"output on an input, step {step}"] = _refused(lambda on_input=on_input: moe_distribute_dispatch(
                ctx, x, ids, config=cfg, expert_scales=w, outputs={"expand_x": on_input[0]}, stream=s))
            # an output on another device than the stream's
            elsewhere = acl.Tensor.empty(good.expert_token_nums.shape, good.expert_token_nums.dtype,
                                         device=rank + 8)
            seen[f"output on another device, step {step}"] = _refused(lambda elsewhere=elsewhere: moe_distribute_dispatch(
                ctx, x, ids, config=cfg, expert_scales=w, outputs={"expert_token_nums": elsewhere}, stream=s))
        # combine: x_out in the memory of expand_x
        d = moe_distribute_dispatch(ctx, x, ids, config=cfg, expert_scales=w, stream=s)
        s.synchronize()
        aliased = acl.Tensor.from_address(d.expand_x.ptr, (BS, H), bfloat16, owner=d.expand_x)
        seen["combine x_out on expand_x"] = _refused(lambda: moe_distribute_combine(
            ctx, d.expand_x, ids, d.assist_info_for_combine, d.ep_recv_counts, w, config=cfg, x_out=aliased,
            stream=s))
        moe_distribute_combine(ctx, d.expand_x, ids, d.assist_info_for_combine, d.ep_recv_counts, w, config=cfg,
                               stream=s)  # the world stays in step: every rank's refused calls launched nothing
        s.synchronize()
        comm.barrier(s, wait=True)
        s.close()
    return seen


def test_outputs_that_overlap_or_lie_elsewhere_are_refused_naming_both(acl: Any) -> None:
    for seen in acl.worlds.run_threads(_placements, W, timeout=120):
        for step in (0, 1):
            assert seen[f"outputs overlap, step {step}"] == (
                "ValueError: outputs: expert_token_nums and ep_recv_counts overlap in memory (each output needs "
                "memory of its own)"), seen
            assert seen[f"output on an input, step {step}"] == (
                "ValueError: outputs: expand_x overlaps the input x in memory (the operator would read what it "
                "writes)"), seen
            got = seen[f"output on another device, step {step}"]
            assert got is not None and got.startswith("ValueError: outputs: expert_token_nums is on device "), seen
            assert "but the call's stream is on device" in got
        assert seen["combine x_out on expand_x"] == (
            "ValueError: outputs: x_out overlaps the input expand_x in memory (the operator would read what it "
            "writes)"), seen


def _plan_outputs_overlap(rank: int, world_size: int, root: bytes) -> str | None:
    import aclnn_py as acl
    from aclnn_py.ops import DispatchOutputs

    x, ids, _ = (acl.Tensor.from_numpy(a) for a in _inputs(rank))
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16)
        own = plan.outputs
        outs = DispatchOutputs(own.expand_x, own.dynamic_scales, own.assist_info_for_combine,
                               acl.Tensor.from_address(own.ep_recv_counts.ptr, own.expert_token_nums.shape,
                                                       own.expert_token_nums.dtype, owner=own.ep_recv_counts),
                               own.ep_recv_counts, own.tp_recv_counts, own.expand_scales)
        refused = _refused(lambda: plan(x, ids, outputs=outs))
        plan.close()
        return refused


def test_a_plans_overlapping_outputs_are_refused(acl: Any) -> None:
    for refused in acl.worlds.run_threads(_plan_outputs_overlap, W, timeout=120):
        assert refused == ("ValueError: outputs: expert_token_nums and ep_recv_counts overlap in memory (each "
                           "output needs memory of its own)")


# ---- a plan whose communicator closed -----------------------------------------------------------------------
def _plan_after_close(rank: int, world_size: int, root: bytes, direct: bool) -> list[str]:
    import aclnn_py as acl
    from aclnn_py.hccl import build_context
    from aclnn_py.ops import DispatchPlan, MoeConfig

    x, ids, _ = (acl.Tensor.from_numpy(a) for a in _inputs(rank))
    s = acl.Device(rank).create_stream()
    comm = acl.hccl.Communicator(world_size, rank, root)
    if direct:
        ctx, ccl = build_context(comm)
        cfg = MoeConfig(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl)
        plan = DispatchPlan(ctx, bs=BS, hidden=H, topk=K, x_dtype=bfloat16, config=cfg)
    else:
        buf = acl.MoeDistributeBuffer(comm)
        plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16)
    for _ in range(2):  # the second call is the compiled step
        plan(x, ids, stream=s)
    s.synchronize()
    comm.barrier(s, wait=True)
    comm.close()
    errors = []
    for args in ((x, ids), (_inputs(rank)[0], _inputs(rank)[1])):  # the steady case, and host arrays
        try:
            plan(*args, stream=s)
            errors.append("launched")
        except acl.ClosedError as e:
            errors.append(str(e))
    s.synchronize()  # nothing was launched onto the closed communicator's windows
    plan.close()
    s.close()
    return errors


@pytest.mark.parametrize("direct", [False, True], ids=["buffer-plan", "plan-of-a-built-context"])
def test_a_plan_refuses_calls_once_its_communicator_closed(acl: Any, direct: bool) -> None:
    for errors in acl.worlds.run_threads(_plan_after_close, W, direct, timeout=120):
        assert len(errors) == 2 and all(e.startswith("Communicator(rank ") for e in errors), errors
        assert all("closed" in e and "DispatchPlan" in e for e in errors), errors
