"""MoeDistributeBuffer speaks its caller's language: an error names the parameter as the caller passed
it (topk_idx, topk_weights, x_smooth_scale, combine's x, num_experts, ...) with the class, status,
function and rule of the operator below, per call and through the plans the buffer makes; those
plans take ``topk_weights=`` and say ``with_weights=True``; host float64 weights follow one rule on
every path; a stream of another device than the communicator's is refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aclnn_py.dtypes import bfloat16

W, BS, H, K, E = 2, 4, 1024, 2, 4


def _outcome(call: Any) -> tuple[str, Any, Any, str] | None:
    """(class name, status code, C function, message) of what `call` raises, or None."""
    try:
        call()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, getattr(e, "code", None), getattr(e, "func", None), getattr(e, "message", str(e))
    return None


def _inputs(rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rank)
    x = rng.uniform(-1, 1, (BS, H)).astype(bfloat16)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    w = rng.uniform(0, 1, (BS, K)).astype(np.float32)
    return x, ids, w


# ---- the translation itself ---------------------------------------------------------------------------------
def test_only_the_leading_parameter_is_renamed_as_a_whole_word() -> None:
    from aclnn_py.ops._caller import renamed_message

    names = {"x": "hidden", "expert_ids": "topk_idx"}
    assert renamed_message("x: dim 1 (H) must be in [1024, 8192] (got 8)", names) == \
        "hidden: dim 1 (H) must be in [1024, 8192] (got 8)"
    assert renamed_message("x_out: dtype must be ACL_BF16 (expand_x's dtype)", names) is None  # not a prefix match
    assert renamed_message("expert_ids2: must be 2-D", names) is None
    assert renamed_message("ep_world_size: must be in [2, 384] (got 1); x and expert_ids", names) is None
    assert renamed_message("expert_ids: dim 0 must equal x dim 0 (BS = 4) (got 5)", names) == \
        "topk_idx: dim 0 must equal x dim 0 (BS = 4) (got 5)"  # the rule text stays as the operator says it


def test_a_renamed_error_keeps_class_status_and_function(acl: Any) -> None:
    from aclnn_py.errors import AclnnParamInvalid, param_invalid
    from aclnn_py.ops._caller import renamed

    exc = param_invalid("aclnnMoeDistributeDispatchV5GetWorkspaceSize", "expert_scales: shape must be (BS, K)")
    new = renamed(exc, {"expert_scales": "topk_weights"})
    assert type(new) is AclnnParamInvalid and isinstance(new, ValueError)
    assert (new.func, new.code, new.name) == (exc.func, exc.code, exc.name)
    assert new.message == "topk_weights: shape must be (BS, K)"
    assert str(new) == str(exc).replace("expert_scales:", "topk_weights:")
    assert renamed(TypeError("expert_scales: expected a Tensor"), {"expert_scales": "w"}).args == ("w: expected a Tensor",)
    unrelated = ValueError("stream: belongs to device 1")
    assert renamed(unrelated, {"expert_scales": "w"}) is unrelated


# ---- per call: the buffer's error equals the operator's, with the caller's name -------------------------------
def _per_call_errors(rank: int, world_size: int, root: bytes) -> list[tuple[str, Any, Any, str]]:
    """For each bad call: (caller's name, operator's name, the buffer's outcome, the operator's outcome)."""
    import aclnn_py as acl
    from aclnn_py.golden import rows_capacity
    from aclnn_py.ops import MoeConfig, moe_distribute_combine, moe_distribute_dispatch

    x, ids, w = _inputs(rank)
    a = rows_capacity(W, rank, E, 1, 0, 0, BS, K)
    assist, counts = np.zeros(max(BS * K, a * 128), np.int32), np.zeros(W * (E // W), np.int32)
    y = np.zeros((a, H), bfloat16)
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device(rank).create_stream()
        cfg = MoeConfig(ep_world_size=W, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=buf.ccl_buffer_size)

        def dispatch(caller: dict[str, Any], operator: dict[str, Any], *, config: Any = cfg, **both: Any) -> tuple:
            bx, bids, experts = both.pop("x", x), both.pop("ids", ids), caller.pop("num_experts", E)
            return (_outcome(lambda: buf.low_latency_dispatch(bx, bids, experts, stream=s, **caller, **both)),
                    _outcome(lambda: moe_distribute_dispatch(buf.context, bx, bids, config=config, stream=s,
                                                             **operator, **both)))

        def combine(caller: dict[str, Any], operator: dict[str, Any], *, config: Any = cfg, ex: Any = y,
                    cids: Any = ids, weights: Any = None, cnt: Any = counts) -> tuple:
            return (_outcome(lambda: buf.low_latency_combine(ex, cids, weights, assist, cnt, num_experts=E, stream=s,
                                                             **caller)),
                    _outcome(lambda: moe_distribute_combine(buf.context, ex, cids, assist, cnt, weights, config=config,
                                                            stream=s, **operator)))

        cases = [
            ("topk_idx", "expert_ids", dispatch({}, {}, ids=np.zeros((BS, 17), np.int32))),        # pre-check
            ("topk_idx", "expert_ids", dispatch({}, {}, ids=ids.astype(np.float32))),              # TypeError
            ("topk_weights", "expert_scales",                                                      # C check
             dispatch({"topk_weights": w[:, :1]}, {"expert_scales": w[:, :1]})),
            ("x_smooth_scale", "scales",
             dispatch({"x_smooth_scale": np.ones(H, np.float32)}, {"scales": np.ones(H, np.float32)})),
            ("num_experts", "moe_expert_num",
             dispatch({"num_experts": 3}, {}, config=cfg.replace(moe_expert_num=3))),
            ("num_max_dispatch_tokens_per_rank", "global_bs",
             dispatch({"num_max_dispatch_tokens_per_rank": BS - 1}, {}, config=cfg.replace(global_bs=(BS - 1) * W))),
            ("x", "expand_x", combine({}, {}, ex=y.astype(np.float32))),
            ("x", "expand_x", combine({}, {}, ex=y[:a - 1])),
            ("topk_idx", "expert_ids", combine({}, {}, cids=ids.reshape(-1))),
            ("topk_weights", "expert_scales", combine({}, {}, weights=w[:, :1])),
            ("expert_shared_type", "expert_shard_type",
             combine({"expert_shared_type": 1}, {}, config=cfg.replace(expert_shard_type=1))),
            ("ep_send_counts", "ep_send_counts", combine({}, {}, cnt=counts[:1])),
        ]
        acl.Device(rank).synchronize()
        s.close()
        return [(caller, op, buffer_out, op_out) for caller, op, (buffer_out, op_out) in cases]


def test_per_call_errors_name_the_callers_parameters(acl: Any) -> None:
    from aclnn_py.worlds import run_threads

    for caller, op, buffer_out, op_out in run_threads(_per_call_errors, W)[0]:
        assert op_out is not None and op_out[3].startswith(f"{op}: "), (op, op_out)
        cls, code, func, message = op_out
        assert buffer_out == (cls, code, func, caller + message[len(op):]), (caller, buffer_out, op_out)


def test_combine_given_fewer_than_a_rows_says_to_pass_them_all(acl: Any) -> None:
    from aclnn_py.worlds import run_threads

    messages = {(caller, buffer_out[3]) for caller, op, buffer_out, _ in run_threads(_per_call_errors, W)[0]
                if "dim 0 must be >= A" in buffer_out[3]}
    assert messages == {("x", "x: dim 0 must be >= A = 16 (got 15): pass all A rows of dispatch's expand_x; rows >= N "
                              "are not read (N = the rows this rank received, the last running total of "
                              "ep_send_counts)")}


# ---- plans the buffer makes ------------------------------------------------------------------------------------
def _plan_errors(rank: int, world_size: int, root: bytes) -> dict[str, Any]:
    import aclnn_py as acl
    from aclnn_py.ops import DispatchPlan

    x, ids, w = _inputs(rank)
    out: dict[str, Any] = {}
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device(rank).create_stream()
        dplan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, stream=s)
        cplan = buf.plan_combine(dplan, num_experts=E, stream=s)
        d = dplan.outputs
        a = d.expand_x.shape[0]
        y = np.zeros((a, H), bfloat16)
        out["dispatch topk_weights="] = _outcome(lambda: dplan(x, ids, topk_weights=w, stream=s))
        out["dispatch expert_scales="] = _outcome(lambda: dplan(x, ids, expert_scales=w, stream=s))
        out["dispatch topk_idx"] = _outcome(lambda: dplan(x, ids[:, :1], stream=s))
        out["dispatch both names"] = _outcome(lambda: dplan(x, ids, expert_scales=w, topk_weights=w, stream=s))
        out["combine topk_weights="] = _outcome(
            lambda: cplan(y, ids, d.assist_info_for_combine, d.ep_recv_counts, topk_weights=w, stream=s))
        out["combine positional weights"] = _outcome(
            lambda: cplan(y, ids, d.assist_info_for_combine, d.ep_recv_counts, w, stream=s))
        out["combine x"] = _outcome(lambda: cplan(y[:-1], ids, d.assist_info_for_combine, d.ep_recv_counts, stream=s))
        out["plan_dispatch topk"] = _outcome(lambda: buf.plan_dispatch(BS, H, E, 17, x_dtype=bfloat16, stream=s))
        # a plan built directly speaks the operator's names
        direct = DispatchPlan(buf.context, bs=BS, hidden=H, topk=K, x_dtype=bfloat16, config=dplan.config, stream=s)
        out["direct expert_scales="] = _outcome(lambda: direct(x, ids, expert_scales=w, stream=s))
        out["direct topk_weights="] = _outcome(lambda: direct(x, ids, topk_weights=w, stream=s))
        direct.close()
        acl.Device(rank).synchronize()
        s.close()
    return out


def test_plans_made_by_the_buffer_speak_its_names(acl: Any) -> None:
    from aclnn_py.worlds import run_threads

    out = run_threads(_plan_errors, W)[0]
    dispatch, combine = "aclnnMoeDistributeDispatchV5", "aclnnMoeDistributeCombineV5"
    unweighted = "topk_weights: this plan was built without weights; build it with with_weights=True"
    assert out["dispatch topk_weights="] == ("AclnnParamInvalid", 161002, dispatch, unweighted)
    assert out["dispatch expert_scales="] == ("AclnnParamInvalid", 161002, dispatch, unweighted)
    assert out["combine topk_weights="] == ("AclnnParamInvalid", 161002, combine, unweighted)
    assert out["combine positional weights"] == ("AclnnParamInvalid", 161002, combine, unweighted)
    assert out["dispatch topk_idx"][3] == "topk_idx: the plan is fixed to shape (4, 2) (got (4, 1))"
    assert out["combine x"][3].startswith("x: the plan is fixed to shape (16, 1024)")
    assert out["dispatch both names"] == ("TypeError", None, None, "topk_weights: the same input as expert_scales "
                                          "(MoeDistributeBuffer's name of it); pass one of them, not both")
    assert out["plan_dispatch topk"] == ("AclnnParamInvalid", 161002, "aclnnMoeDistributeDispatchV5GetWorkspaceSize",
                                         "topk_idx: dim 1 (K) must be in [1, 16] (got 17)")
    direct = ("AclnnParamInvalid", 161002, dispatch,
              "expert_scales: this plan was built without weights; build it with with_expert_scales=True")
    assert out["direct expert_scales="] == direct
    assert out["direct topk_weights="] == direct


# ---- one rule for float64 weights, and topk_weights= on plans --------------------------------------------------
def _weights_round(rank: int, world_size: int, root: bytes) -> dict[str, Any]:
    """The same weighted round with float32 weights, float64 ones (exact), and through weighted plans
    called with topk_weights=; then float64 weights that float32 cannot hold, on every path."""
    import aclnn_py as acl
    from aclnn_py.ops import moe_distribute_combine

    x, ids, w32 = _inputs(rank)
    w64 = w32.astype(np.float64)
    inexact = w64.copy()
    inexact[1, 1] = 0.1
    got: dict[str, Any] = {}
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        s = acl.Device(rank).create_stream()

        def per_call(weights: Any) -> tuple[bytes, bytes]:
            d = buf.low_latency_dispatch(x, ids, E, topk_weights=weights, stream=s)
            y = buf.low_latency_combine(d.expand_x, ids, weights, d.assist_info_for_combine, d.ep_recv_counts,
                                        num_experts=E, stream=s)
            return _received(d.expand_scales, d.ep_recv_counts, s), y.numpy(stream=s).tobytes()

        got["float32"] = per_call(w32)
        got["float64"] = per_call(w64)
        got["list of floats"] = per_call(w64.tolist())
        dplan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=True, stream=s)
        cplan = buf.plan_combine(dplan, with_weights=True, num_experts=E, stream=s)
        d = dplan(x, ids, topk_weights=w64, stream=s)
        yp = cplan(d.expand_x, ids, d.assist_info_for_combine, d.ep_recv_counts, topk_weights=w64, stream=s)
        got["plans"] = _received(d.expand_scales, d.ep_recv_counts, s), yp.numpy(stream=s).tobytes()
        got["refused"] = [
            _outcome(lambda: buf.low_latency_dispatch(x, ids, E, topk_weights=inexact, stream=s)),
            _outcome(lambda: buf.low_latency_combine(d.expand_x, ids, inexact, d.assist_info_for_combine,
                                                     d.ep_recv_counts, num_experts=E, stream=s)),
            _outcome(lambda: dplan(x, ids, topk_weights=inexact, stream=s)),
            _outcome(lambda: cplan(d.expand_x, ids, d.assist_info_for_combine, d.ep_recv_counts, inexact, stream=s)),
            _outcome(lambda: moe_distribute_combine(buf.context, d.expand_x, ids, d.assist_info_for_combine,
                                                    d.ep_recv_counts, inexact, config=cplan.config, stream=s)),
        ]
        s.synchronize()
        s.close()
    return got


def _received(scales: Any, counts: Any, s: Any) -> bytes:
    """The entries of a dispatch's expand_scales its call wrote (one per received row)."""
    return scales.numpy(stream=s)[:int(counts.numpy(stream=s)[-1])].tobytes()


def test_float64_weights_are_converted_when_exact_and_refused_otherwise(acl: Any) -> None:
    from aclnn_py.worlds import run_threads

    for got in run_threads(_weights_round, W):
        assert got["float64"] == got["float32"]
        assert got["list of floats"] == got["float32"]
        assert got["plans"] == got["float32"]
        rule = "float64 values must convert to float32 exactly; pass float32 (got 0.1 at index (1, 1))"
        phase1 = ("aclnnMoeDistributeDispatchV5GetWorkspaceSize", "aclnnMoeDistributeCombineV5GetWorkspaceSize")
        assert got["refused"] == [
            ("AclnnParamInvalid", 161002, phase1[0], f"topk_weights: {rule}"),
            ("AclnnParamInvalid", 161002, phase1[1], f"topk_weights: {rule}"),
            ("AclnnParamInvalid", 161002, "aclnnMoeDistributeDispatchV5", f"topk_weights: {rule}"),
            ("AclnnParamInvalid", 161002, "aclnnMoeDistributeCombineV5", f"topk_weights: {rule}"),
            ("AclnnParamInvalid", 161002, phase1[1], f"expert_scales: {rule}"),  # the operator's own name
        ]


def test_host_weights_rule(acl: Any) -> None:
    from aclnn_py.errors import AclnnParamInvalid
    from aclnn_py.ops._args import host_weights

    exact = np.array([[0.5, 0.25], [np.nan, -np.inf]])
    narrowed = host_weights(exact, "w", "f")
    assert isinstance(narrowed, np.ndarray) and narrowed.dtype == np.float32
    assert np.array_equal(narrowed, exact, equal_nan=True)
    as_given = np.ones(3, np.float16)
    assert host_weights(as_given, "w", "f") is as_given  # a wrong dtype is the operator's to name
    with pytest.raises(AclnnParamInvalid, match=r"w: float64 values must convert to float32 exactly; pass float32 "
                                               r"\(got 1e\+300 at index \(1,\)\)"):
        host_weights(np.array([1.0, 1e300]), "w", "f")


# ---- streams of another device -------------------------------------------------------------------------------
def _other_device_stream(rank: int, world_size: int, root: bytes) -> dict[str, Any]:
    import aclnn_py as acl

    x, ids, _ = _inputs(rank)
    out: dict[str, Any] = {}
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        other = acl.Device(rank + world_size).create_stream()
        own = acl.Device(rank).create_stream()  # and the rank's device current again
        dplan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, stream=own)
        cplan = buf.plan_combine(dplan, num_experts=E, stream=own)
        d = dplan.outputs
        out["dispatch"] = _outcome(lambda: buf.low_latency_dispatch(x, ids, E, stream=other))
        out["combine"] = _outcome(lambda: buf.low_latency_combine(d.expand_x, ids, None, d.assist_info_for_combine,
                                                                  d.ep_recv_counts, num_experts=E, stream=other))
        out["plan_dispatch"] = _outcome(lambda: buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, stream=other))
        out["plan_combine"] = _outcome(lambda: buf.plan_combine(dplan, num_experts=E, stream=other))
        out["dispatch plan call"] = _outcome(lambda: dplan(x, ids, stream=other))
        out["combine plan call"] = _outcome(lambda: cplan(d.expand_x, ids, d.assist_info_for_combine,
                                                          d.ep_recv_counts, stream=other))
        acl.Device(rank + world_size).set_current()  # the current stream is now another device's
        out["current stream"] = _outcome(lambda: buf.low_latency_dispatch(x, ids, E))
        acl.Device(rank).set_current()
        out["labels"] = other._label(), acl.Stream.default(rank + world_size)._label(), comm._label()
        own.synchronize()
        other.close()
        own.close()
    return out


def test_a_stream_of_another_device_is_refused_naming_both(acl: Any) -> None:
    from aclnn_py.worlds import run_threads

    for rank, out in enumerate(run_threads(_other_device_stream, W)):
        other, default_other, comm = out.pop("labels")
        want = (f"stream: {other} belongs to device {rank + W}, but {comm} is on device {rank}; pass a stream of "
                f"device {rank}")
        for call, outcome in out.items():
            if call == "current stream":
                assert outcome == ("ValueError", None, None, f"stream: the current stream, {default_other}, belongs to "
                                   f"device {rank + W}, but {comm} is on device {rank}; pass a stream of device {rank}")
            else:
                assert outcome == ("ValueError", None, None, want), call
