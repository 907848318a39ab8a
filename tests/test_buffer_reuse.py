"""MoeDistributeBuffer hands a call the outputs of an earlier call of the same layout once nothing
refers to them any more — and never while the caller holds, views or exported any of them, nor after
one was read on another stream, nor to a call on another stream. The reused outputs give the bytes the
Python route gives, poison included where the operator writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers.routes import compiled_path

E, BS, H, K = 4, 8, 1024, 2
POISON = 0xA5


def _inputs(acl: Any, rank: int, i: int) -> tuple[Any, Any, Any]:
    """Input set `i`: each set sends a different number of rows to each rank, so rows one call leaves
    unwritten were written by the call before."""
    rng = np.random.default_rng(1000 * rank + i)
    x = rng.uniform(-1, 1, (BS, H)).astype(ml_dtypes.bfloat16)
    if i % 2:
        ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    else:  # every token to experts 0 and 1, both on rank 0
        ids = np.tile(np.array([0, 1], np.int32), (BS, 1))
    w = rng.uniform(0, 1, (BS, K)).astype(np.float32)
    return acl.Tensor.from_numpy(x), acl.Tensor.from_numpy(ids), acl.Tensor.from_numpy(w)


def _snapshot(out: Any, stream: Any) -> list[bytes]:
    """Every byte of every output, the unwritten ones included."""
    stream.synchronize()
    return [t.numpy().tobytes() for t in out]


Scenario = Callable[[Any, Any, Any, int, list[Any]], dict[str, Any]]


def _world(acl: Any, scenario: Scenario, compiled: bool = True) -> list[dict[str, Any]]:
    """`scenario(acl, buf, stream, rank, sets)` on two thread ranks, each with its buffer and stream."""

    def rank_fn(rank: int, world_size: int, root: bytes) -> dict[str, Any]:
        with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
            s = acl.Device(rank).create_stream()
            try:
                sets = [_inputs(acl, rank, i) for i in range(3)]
                result = scenario(acl, buf, s, rank, sets)
                s.synchronize()
                if not comm.closed:  # a scenario may close it
                    comm.barrier()
                return result
            finally:
                s.close()

    with compiled_path(compiled):
        return acl.launch.run_threads(rank_fn, 2, timeout=120)


def _dispatch(buf: Any, s: Any, data: tuple[Any, Any, Any]) -> Any:
    x, ids, w = data
    return buf.low_latency_dispatch(x, ids, E, topk_weights=w, stream=s)


def _sequence(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
    """Dispatch + combine over the input sets in turn, dropping each step's results before the next:
    whether a step got the objects of the step before, and every output byte."""
    same, seen, snapshots = [], [], []
    for step in range(6):
        data = sets[step % 3]
        out = _dispatch(buf, s, data)
        y = buf.low_latency_combine(out.expand_x, data[1], data[2], out.assist_info_for_combine,
                                    out.ep_recv_counts, num_experts=E, stream=s)
        same.append((id(out) in seen, id(y) in seen))
        seen += [id(out), id(y)]
        snapshots.append(_snapshot(list(out) + [y], s))
        del out, y
    return {"same": same, "bytes": snapshots, "kept": buf.kept_outputs}


def test_a_dropped_result_is_handed_out_again_with_the_python_routes_bytes(acl: Any) -> None:
    reused = _world(acl, _sequence)
    python = _world(acl, _sequence, compiled=False)
    for r, p in zip(reused, python):
        assert r["same"][0] == (False, False)
        assert all(step == (True, True) for step in r["same"][1:]), r["same"]
        assert r["bytes"] == p["bytes"]  # written rows and the poison of the unwritten ones alike
        assert r["kept"] == (1, 1)


def test_unwritten_rows_of_a_reused_output_show_poison(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        first = _dispatch(buf, s, sets[0])  # rank 0 receives every row
        s.synchronize()
        first_id = id(first)
        del first
        second = _dispatch(buf, s, sets[1])
        s.synchronize()
        rows = int(second.ep_recv_counts.numpy()[-1])
        tail = second.expand_x.numpy().view(np.uint8).reshape(second.expand_x.shape[0], -1)[rows:]
        return {"reused": id(second) == first_id, "rows": rows, "capacity": second.expand_x.shape[0],
                "tail_is_poison": bool((tail == POISON).all())}

    for r in _world(acl, scenario):
        assert r["reused"]
        assert r["rows"] < r["capacity"]
        assert r["tail_is_poison"]


def test_a_held_result_is_not_reused_nor_overwritten(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        held = _dispatch(buf, s, sets[0])
        before = _snapshot(held, s)
        later = [_dispatch(buf, s, sets[i % 3]) for i in range(1, 5)]
        objects = {id(t) for r in [held] + later for t in r}
        return {"distinct": len(objects) == 6 * 5, "held_same": _snapshot(held, s) == before,
                "kept": buf.kept_outputs[0]}

    for r in _world(acl, scenario):
        assert r["distinct"] and r["held_same"]
        assert r["kept"] == 2  # the newest sets, for when the caller lets go


def test_one_output_kept_by_the_caller_keeps_the_whole_set_out(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        counts = _dispatch(buf, s, sets[0]).ep_recv_counts  # the result tuple is gone, one Tensor is not
        before = counts.numpy(stream=s).tobytes()
        nxt = _dispatch(buf, s, sets[1])
        return {"new": nxt.ep_recv_counts is not counts, "kept_same": counts.numpy(stream=s).tobytes() == before}

    for r in _world(acl, scenario):
        assert r["new"] and r["kept_same"]


@pytest.mark.parametrize("export", ["numpy_view", "dlpack"])
def test_an_exported_output_is_never_reused(acl: Any, export: str) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        out = _dispatch(buf, s, sets[0])
        s.synchronize()
        if export == "numpy_view":
            claim: object = out.expand_x.numpy_view()
        else:
            claim = acl.Tensor.from_dlpack(out.expand_x)
        del claim  # the claim is gone; the memory was handed out once, so the buffer stays off it
        first = id(out)
        del out
        nxt = _dispatch(buf, s, sets[1])
        return {"new": id(nxt) != first}

    for r in _world(acl, scenario):
        assert r["new"]


def test_outputs_read_on_another_stream_are_not_reused(acl: Any) -> None:
    """Combine on a second stream reads dispatch's outputs: a later dispatch on the first stream must
    not overwrite them while that stream may still read them, so it gets new ones. (Here the first
    stream waits for the second before it, as collective calls must run in one order on every rank.)"""

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        s2 = acl.Device(rank).create_stream()
        try:
            x, ids, w = sets[0]
            out = _dispatch(buf, s, sets[0])
            first = id(out)
            y = buf.low_latency_combine(out.expand_x, ids, w, out.assist_info_for_combine, out.ep_recv_counts,
                                        num_experts=E, stream=s2)
            del out
            done = acl.Event()
            done.record(s2)
            s.wait_event(done)
            nxt = _dispatch(buf, s, sets[1])
            s2.synchronize()
            return {"new": id(nxt) != first, "y": y.numpy(stream=s2).tobytes()}
        finally:
            s.synchronize()
            s2.close()

    def same_stream(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        x, ids, w = sets[0]
        out = _dispatch(buf, s, sets[0])
        y = buf.low_latency_combine(out.expand_x, ids, w, out.assist_info_for_combine, out.ep_recv_counts,
                                    num_experts=E, stream=s)
        return {"y": y.numpy(stream=s).tobytes()}

    for r, want in zip(_world(acl, scenario), _world(acl, same_stream)):
        assert r["new"]
        assert r["y"] == want["y"]


def test_a_call_on_another_stream_gets_new_outputs(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        s2 = acl.Device(rank).create_stream()
        try:
            out = _dispatch(buf, s, sets[0])
            first = id(out)
            del out
            # collective calls must run in one order on every rank: the second waits for the first
            done = acl.Event()
            done.record(s)
            s2.wait_event(done)
            nxt = _dispatch(buf, s2, sets[1])
            s2.synchronize()
            return {"new": id(nxt) != first}
        finally:
            s.synchronize()
            s2.close()

    for r in _world(acl, scenario):
        assert r["new"]


def test_changed_attributes_take_their_own_config(acl: Any) -> None:
    """Alternating quantisation modes: each call gets its own attributes' results, and once both
    layouts have a kept set every call is the compiled route's."""

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        shapes = []
        for step in range(6):
            x, ids, w = sets[0]
            quant = step % 2 * 2  # 0: bf16 rows, 2: int8 rows with dynamic scales
            out = buf.low_latency_dispatch(x, ids, E, quant_mode=quant, topk_weights=w, stream=s)
            shapes.append((quant, str(out.expand_x.dtype), id(out)))
            del out
        return {"dtypes": shapes}

    for r in _world(acl, scenario):
        assert all(("INT8" in dt.upper()) == (q == 2) for q, dt, _ in r["dtypes"]), r["dtypes"]
        objects = [obj for _, _, obj in r["dtypes"]]
        assert objects[2:] == objects[:2] * 2  # each mode's set again


def test_the_compiled_key_is_the_methods_key(acl: Any) -> None:
    """The attributes the compiled route compares are the ones the Python method keys its config by."""
    from aclnn_py.buffer import MoeDistributeBuffer

    calls = [{}, {"num_experts": 8, "quant_mode": 2}, {"comm_alg": "fullmesh_v1", "shared_expert_num": 0},
             {"zero_expert_num": 1, "copy_expert_num": 2, "const_expert_num": 3, "expert_shard_type": 0},
             {"shared_expert_rank_num": 1, "expert_token_nums_type": 0, "num_max_dispatch_tokens_per_rank": 16}]
    route = MoeDistributeBuffer.low_latency_dispatch.compiled
    for kw in calls:
        kw = {"num_experts": 4, **kw}
        want = (kw["num_experts"], kw.get("comm_alg", ""), kw.get("quant_mode", 0), 0, kw.get("zero_expert_num", 0),
                kw.get("copy_expert_num", 0), kw.get("const_expert_num", 0), kw.get("expert_shard_type", 0),
                kw.get("shared_expert_num", 1), kw.get("shared_expert_rank_num", 0),
                kw.get("expert_token_nums_type", 1), kw.get("num_max_dispatch_tokens_per_rank", 0))
        assert route.attrs_of(**kw) == want
    combine = MoeDistributeBuffer.low_latency_combine.compiled
    assert combine.attrs_of(num_experts=4, comm_quant_mode=2, expert_shared_type=0) == (
        4, "", 0, 2, 0, 0, 0, 0, 1, 0, 1, 0)


def test_close_and_update_ctx_let_the_kept_outputs_go(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        del_out = _dispatch(buf, s, sets[0])
        del del_out
        before = buf.kept_outputs
        buf.update_ctx(buf.comm)
        after_update = buf.kept_outputs
        _dispatch(buf, s, sets[0])
        s.synchronize()
        buf.close()
        return {"before": before, "after_update": after_update, "after_close": buf.kept_outputs}

    for r in _world(acl, scenario):
        assert r["before"] == (1, 0) and r["after_update"] == (0, 0) and r["after_close"] == (0, 0)


def _refusal_after_a_kept_set(acl: Any, buf: Any, s: Any, sets: list[Any], x: Any, ids: Any) -> str:
    """Make a kept set free (so the compiled method would take the next call), then call with `x` and
    `ids`: the message of the AclnnPyError or ClosedError raised, or "" when none was."""
    out = _dispatch(buf, s, sets[0])
    s.synchronize()
    del out
    try:
        buf.low_latency_dispatch(x, ids, E, topk_weights=sets[0][2], stream=s)
    except (acl.AclnnPyError, acl.ClosedError) as exc:
        return str(exc)
    return ""


def test_a_closed_input_or_communicator_raises_through_the_compiled_method(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        x, ids, _ = sets[0]
        closed_x = acl.Tensor.from_numpy(x.numpy())
        closed_x.close()
        closed_input = _refusal_after_a_kept_set(acl, buf, s, sets, closed_x, ids)
        s.synchronize()
        buf.comm.close()  # with a kept set free, as the refused call above took none
        closed_comm = ""
        try:
            _dispatch(buf, s, sets[0])
        except acl.ClosedError as exc:
            closed_comm = str(exc)
        return {"closed_input": closed_input, "closed_comm": closed_comm}

    for r in _world(acl, scenario):
        assert "closed" in r["closed_input"]
        assert "closed" in r["closed_comm"] and "Communicator" in r["closed_comm"], r["closed_comm"]


def test_a_group_string_generation_keeps_no_outputs(acl: Any) -> None:
    """Generation 4 calls take the Python method (it names the communicator, no context tensor):
    the buffer keeps nothing for a route that will not take it, and the results stay right."""

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        with acl.MoeDistributeBuffer(buf.comm, generation=4) as old:
            first = _dispatch(old, s, sets[0])
            want = _snapshot(first, s)
            del first
            again = _dispatch(old, s, sets[0])
            return {"kept": old.kept_outputs, "same_bytes": _snapshot(again, s) == want}

    for r in _world(acl, scenario):
        assert r["kept"] == (0, 0) and r["same_bytes"]


def test_an_error_of_the_compiled_method_names_the_callers_parameter(acl: Any) -> None:
    """A call the compiled method takes (a kept set is free) whose topk_idx has the wrong element type:
    the operator's phase 1 refuses it, and the error names topk_idx, as the Python method's would."""

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        x, ids, _ = sets[0]
        wide = acl.Tensor.from_numpy(ids.numpy().astype(np.int64))
        message = _refusal_after_a_kept_set(acl, buf, s, sets, x, wide)
        again = _dispatch(buf, s, sets[0])  # the buffer is still usable, with the right bytes
        return {"message": message, "counts": again.ep_recv_counts.numpy(stream=s).tolist()}

    def plain(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        out = _dispatch(buf, s, sets[0])
        return {"counts": out.ep_recv_counts.numpy(stream=s).tolist()}

    for r, want in zip(_world(acl, scenario), _world(acl, plain)):
        assert "topk_idx" in r["message"] and "expert_ids" not in r["message"], r["message"]
        assert r["counts"] == want["counts"]


def test_new_input_tensors_are_described_by_the_compiled_call(acl: Any) -> None:
    """A serving loop's activations are new Tensors each step, with no descriptor yet: the compiled
    route makes it (the layout Tensor.descriptor() makes: the same bytes as the Python route), the
    Tensor owns it as if it had made it itself, and closing the Tensor destroys it."""

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        b = acl.backend()
        ffi, lib = b.ffi, b.lib
        made_in_call, snapshots, alive_after_close = [], [], []
        for step in range(4):
            x, ids, w = (acl.Tensor.from_numpy(t.numpy()) for t in sets[step % 2])  # new, undescribed
            out = _dispatch(buf, s, (x, ids, w))
            made_in_call.append(x._desc is None and x._desc_addr is not None)
            snapshots.append(_snapshot(out, s))
            addr = x._desc_addr
            same = int(ffi.cast("uintptr_t", x.descriptor())) == addr  # the Tensor hands out the one made
            kind = ffi.new("aclDataType *")
            described = lib.aclGetDataType(ffi.cast("aclTensor *", addr), kind) == 0 and kind[0] == int(x.dtype)
            del out
            for t in (x, ids, w):
                t.close()
            gone = lib.aclGetDataType(ffi.cast("aclTensor *", addr), kind) != 0  # destroyed with the Tensor
            alive_after_close.append((same, described, gone))
        return {"made in call": made_in_call, "snapshots": snapshots, "checks": alive_after_close}

    compiled, python = _world(acl, scenario), _world(acl, scenario, compiled=False)
    for c, p in zip(compiled, python):
        assert c["made in call"] == [False, True, True, True]  # the first call is the method's (it keeps outputs)
        assert p["made in call"] == [False] * 4
        assert c["snapshots"] == p["snapshots"]
        assert c["checks"] == p["checks"] == [(True, True, True)] * 4
