"""A plan's steady state runs in the compiled core (aclnn_py._core.PlanCall): it must give what the Python path gives —
the same bytes, the same refusals and errors, the same objects kept alive — and hand every other
call to the Python path."""

from __future__ import annotations

import abc
import gc
import sys
import weakref

import numpy as np
import pytest
from helpers.routes import PythonOpCalls

from aclnn_py.dtypes import bfloat16

BS, H, K, E = 4, 1024, 2, 4


def _world_rank(rank, world_size, root, body):
    import aclnn_py as acl
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator

    stream = acl.Device.current().create_stream()
    try:
        with Communicator(world_size, rank, root) as comm:
            buf = MoeDistributeBuffer(comm)
            return body(acl, buf, stream, np.random.default_rng([5, rank]))
    finally:
        stream.close()


def _run(body):
    from aclnn_py.launch import run_threads

    return run_threads(_world_rank, 2, body, timeout=120)


def _step_inputs(rng):
    x = rng.uniform(-2, 2, (BS, H)).astype(np.float32).astype(bfloat16)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    return x, ids


class _PythonPathCalls:
    """Counts the calls that reach the plan's Python path."""

    def __init__(self, plan):
        self.n = 0
        self._run = plan._run
        plan._run = self

    def __call__(self, *args, **kwargs):
        self.n += 1
        return self._run(*args, **kwargs)


def _same_as_per_call(buf, stream, d, host):
    """The plan's outputs `d` (synchronised) hold what the per-call path gives for host inputs `host`."""
    ref = buf.low_latency_dispatch(host[0], host[1], E, stream=stream)
    buf.synchronize(stream)
    n = int(ref.ep_recv_counts.numpy()[-1])
    return (d.expand_x.numpy()[:n].tobytes() == ref.expand_x.numpy()[:n].tobytes()
            and d.ep_recv_counts.numpy().tobytes() == ref.ep_recv_counts.numpy().tobytes()
            and d.assist_info_for_combine.numpy()[:3 * n].tobytes()
            == ref.assist_info_for_combine.numpy()[:3 * n].tobytes())


def _mixed_sequence(acl, buf, stream, rng):
    """Tensors, host arrays, the same Tensor again after a host array, a Tensor at a new address:
    every step compared with the per-call path; and which steps reached the Python path."""
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=False)
    python_path = _PythonPathCalls(plan)
    steps = [_step_inputs(rng) for _ in range(3)]
    xa, ida = (acl.Tensor.from_numpy(a) for a in steps[0])
    xb, idb = (acl.Tensor.from_numpy(a) for a in steps[2])
    schedule = [("tensors A", (xa, ida), steps[0]), ("host arrays", steps[1], steps[1]),
                ("tensors A again", (xa, ida), steps[0]), ("same tensors", (xa, ida), steps[0]),
                ("tensors B", (xb, idb), steps[2]), ("by keyword", {"x": xa, "expert_ids": ida}, steps[0]),
                ("bound method", (xb, idb), steps[2])]
    report = []
    for name, args, host in schedule:
        before = python_path.n
        if isinstance(args, dict):
            d = plan(**args, stream=stream)
        elif name == "bound method":
            d = plan.__call__(*args, stream=stream)
        else:
            d = plan(*args, stream=stream)
        stream.synchronize()
        same = _same_as_per_call(buf, stream, d, host)
        report.append((name, same, python_path.n - before, d.expand_x._writer is stream, d is plan.outputs))
    try:
        plan.outputs = d  # type: ignore[misc]
        report.append(("outputs assigned", True, 0, True, True))
    except AttributeError:
        pass  # read-only: what the C step returns is always what the attribute gives
    plan.close()
    return report


def test_the_c_step_gives_the_python_paths_bytes_and_takes_only_its_calls(acl):
    for report in _run(_mixed_sequence):
        assert [(name, same, writer, own) for name, same, _, writer, own in report] == \
            [(name, True, True, True) for name, *_ in report]
        # host arrays are uploaded by the Python path; Tensors of the plan's layout never reach it
        assert {name: python for name, _, python, *_ in report} == {
            "tensors A": 0, "host arrays": 1, "tensors A again": 0, "same tensors": 0, "tensors B": 0,
            "by keyword": 0, "bound method": 0}


def _alternating_tensors(acl, buf, stream, rng):
    """Two input sets alternate (the C path remembers the Tensors it found usable per slot); then a
    remembered Tensor is closed, a remembered view is moved to other memory, and one is dropped."""
    from aclnn_py import ClosedError
    from aclnn_py.ops import prepare_dispatch

    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=False)
    python_path = _PythonPathCalls(plan)
    host = [_step_inputs(rng) for _ in range(3)]
    a, b, c = ([acl.Tensor.from_numpy(v) for v in step] for step in host)
    out = {}
    same = []
    for k in range(6):
        step = k % 2
        d = plan(*(a, b)[step], stream=stream)
        stream.synchronize()
        same.append(_same_as_per_call(buf, stream, d, host[step]))
    out["alternating"] = (all(same), python_path.n)
    # a view the caller rebinds (Prepared.rebind_input moves its address): found again at its new address
    prepared = prepare_dispatch(buf.context, a[0], a[1], config=plan.config, repeatable=True)
    view = prepared.inputs[1]
    for x in (view, b[0], view):
        plan(x, a[1], stream=stream)
    prepared.rebind_input(1, c[0])
    d = plan(view, c[1], stream=stream)
    stream.synchronize()
    out["moved view"] = (_same_as_per_call(buf, stream, d, host[2]), python_path.n)
    prepared.rebind_input(1, a[0])  # and the Python function sees it move too
    d = type(plan).__call__.__wrapped__(plan, view, a[1], stream=stream)
    stream.synchronize()
    out["moved view, Python"] = (_same_as_per_call(buf, stream, d, host[0]), python_path.n)
    prepared.close()
    plan(b[0], b[1], stream=stream)
    a[0].close()  # remembered, not the last call's: the Python path refuses it
    try:
        plan(a[0], b[1], stream=stream)
        out["closed"] = None
    except ClosedError as e:
        out["closed"] = f"{type(e).__name__}: {e}"
    plan(c[0], c[1], stream=stream)
    stream.synchronize()
    dropped = weakref.ref(b[0])
    del b
    gc.collect()
    out["dropped released"] = dropped() is None  # the plan remembers Tensors without keeping them
    plan.close()
    return out


def test_alternating_tensors_stay_in_c_and_every_change_is_seen(acl):
    for out in _run(_alternating_tensors):
        assert out["alternating"] == (True, 0)
        assert out["moved view"] == (True, 0)
        assert out["moved view, Python"] == (True, 1)
        assert out["closed"].startswith("ClosedError")
        assert out["dropped released"]


def _replaced_tensors_are_held(acl, buf, stream, rng):
    """A Tensor a call replaces was used by the launch before it: dropped by the caller, its memory
    stays until the stream is synchronised — on the C path and the Python path (given outputs)."""
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=False)
    python_path = _PythonPathCalls(plan)
    x, ids = (acl.Tensor.from_numpy(v) for v in _step_inputs(rng))
    report = {}
    for path in ("C", "Python"):
        first = acl.Tensor.from_numpy(_step_inputs(rng)[0])
        out = None if path == "C" else [acl.Tensor.empty(t.shape, t.dtype) for t in plan.outputs]
        plan(first, ids, stream=stream, outputs=None if out is None else type(plan.outputs)(*out))
        memory = [weakref.ref(first._mem)]
        if out is not None:
            memory += [weakref.ref(t._mem) for t in out]
        before = python_path.n
        plan(x, ids, stream=stream)  # replaces first (and the given outputs by the plan's own)
        del first, out
        gc.collect()
        held = all(m() is not None for m in memory)
        stream.synchronize()
        gc.collect()
        report[path] = (held, all(m() is None for m in memory), python_path.n - before)
    plan.close()
    return report


def test_a_replaced_tensor_is_held_until_the_stream_passes_the_launch_that_used_it(acl):
    for report in _run(_replaced_tensors_are_held):
        assert report == {"C": (True, True, 0), "Python": (True, True, 1)}


def _overlapping_calls(acl, buf, stream, rng):
    """While another thread's call of the plan runs (its step is entered), a call is refused on both
    paths — its addresses would be written under the running launch — and the plan stays usable."""
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=False)
    host = _step_inputs(rng)
    x, ids = (acl.Tensor.from_numpy(v) for v in host)
    out = {}
    plan._args.busy = 1  # as aclnnpy_plan_enter leaves it for the running step
    for name, args in (("C path", (x, ids)), ("Python path", host)):
        try:
            plan(*args, stream=stream)
            out[name] = None
        except RuntimeError as e:
            out[name] = str(e)
    plan._args.busy = 0
    d = plan(x, ids, stream=stream)
    stream.synchronize()
    out["after"] = (_same_as_per_call(buf, stream, d, host), plan._args.busy)
    plan.close()
    return out


def test_a_call_overlapping_another_threads_call_of_the_plan_is_refused(acl):
    for out in _run(_overlapping_calls):
        for name in ("C path", "Python path"):
            assert "another thread's call of it is running" in out[name]
            assert out[name].startswith("DispatchPlan(aclnnMoeDistributeDispatchV5)")
        assert out["after"] == (True, 0)


def _refusals(acl, buf, stream, rng):
    from aclnn_py import ClosedError

    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=False)
    x, ids = (acl.Tensor.from_numpy(a) for a in _step_inputs(rng))
    plan(x, ids, stream=stream)
    stream.synchronize()
    out = {}

    def attempt(name, call):
        try:
            call()
            out[name] = None
        except (acl.AclnnError, ClosedError, TypeError) as e:
            out[name] = f"{type(e).__name__}: {e}"

    wide = acl.Tensor.zeros((BS, 2 * H), bfloat16)
    strided = acl.Tensor.from_address(wide.ptr, (BS, H), bfloat16, strides=(2 * H, 1), owner=wide)
    attempt("strided", lambda: plan(strided, ids, stream=stream))
    attempt("other dtype", lambda: plan(acl.Tensor.zeros((BS, H), np.float16), ids, stream=stream))
    attempt("not a stream", lambda: plan(x, ids, stream="s"))
    gone = acl.Tensor.from_numpy(_step_inputs(rng)[0])
    gone.close()
    attempt("closed tensor", lambda: plan(gone, ids, stream=stream))
    other = acl.Device.current().create_stream()
    other.close()
    attempt("closed stream", lambda: plan(x, ids, stream=other))
    attempt("unknown keyword", lambda: plan(x, ids, stream=stream, bogus=1))
    attempt("too many positional", lambda: plan(x, ids, None, stream=stream))
    attempt("given twice", lambda: plan(x, ids, x=x, stream=stream))
    ids.close()  # the tensor the plan was given last call
    attempt("closed, same as last call", lambda: plan(x, ids, stream=stream))
    plan.close()
    attempt("closed plan", lambda: plan(x, ids, stream=stream))
    return out


def test_what_the_c_step_leaves_is_refused_by_the_python_path(acl):
    for out in _run(_refusals):
        assert out["other dtype"].startswith("AclnnParamInvalid") and "FLOAT16" in out["other dtype"]
        assert out["not a stream"].startswith("TypeError: stream: expected a Stream")
        assert out["closed tensor"].startswith("ClosedError")
        assert out["closed stream"].startswith("ClosedError") and "Stream(" in out["closed stream"]
        assert out["closed, same as last call"].startswith("ClosedError")
        assert out["closed plan"].startswith("ClosedError")
        assert out["strided"].startswith("AclnnParamInvalid") and "strided" in out["strided"]
        # a call that does not parse is Python's to refuse, in Python's words
        assert out["unknown keyword"] == "TypeError: DispatchPlan.__call__() got an unexpected keyword argument 'bogus'"
        assert out["too many positional"].startswith("TypeError: DispatchPlan.__call__() takes 3 positional")
        assert out["given twice"] == "TypeError: DispatchPlan.__call__() got multiple values for argument 'x'"


def test_a_plan_class_keeps_its_signature_and_a_subclass_its_own_call(acl):
    import inspect

    from aclnn_py.ops import CombinePlan, DispatchPlan

    for cls in (DispatchPlan, CombinePlan):
        params = list(inspect.signature(cls.__call__).parameters)
        assert params[0] == "self" and params[-1] == "stream"
        assert cls.__call__.__doc__.startswith("Phase 2 with this step's inputs")

    class Traced(DispatchPlan):
        def __call__(self, *args, **kwargs):
            return ("traced", super().__call__(*args, **kwargs))

    from aclnn_py import _core

    assert not hasattr(Traced.__call__, "compiled")  # its __call__ is its own: no compiled state is made for it
    for cls in (DispatchPlan, CombinePlan):
        assert isinstance(cls.__call__, _core.CompiledPlanCall) and isinstance(cls.__call__.compiled, _core.PlanCall)
        # the compiled call returns the object its state holds: the attribute it names cannot be reassigned
        result = getattr(cls, cls.__call__.compiled.result)
        assert isinstance(result, property) and result.fset is None


def _launch_failure(acl, buf, stream, rng):
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=False)
    x, ids = (acl.Tensor.from_numpy(a) for a in _step_inputs(rng))
    plan(x, ids, stream=stream)
    stream.synchronize()
    # same layout, an address the runtime refuses (not 32-byte aligned)
    block = acl.DeviceMemory(BS * H * 2 + 64)
    skewed = acl.Tensor.from_address(block.ptr + 2, (BS, H), bfloat16, owner=block)
    try:
        plan(skewed, ids, stream=stream)
        failure = None
    except acl.AclnnError as e:
        failure = (e.func, e.message)
    plan(x, ids, stream=stream)  # the plan still works after a refused step
    stream.synchronize()
    plan.close()
    return failure


def test_a_failed_rebinding_in_the_c_step_names_the_call(acl):
    for api, message in _run(_launch_failure):
        assert api == "aclSetInputTensorAddr"
        assert "32-byte aligned" in message


def _references(acl, buf, stream, rng):
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=False)
    x, ids = (acl.Tensor.from_numpy(a) for a in _step_inputs(rng))
    first = acl.Tensor.from_numpy(_step_inputs(rng)[0])
    plan(first, ids, stream=stream)
    held = weakref.ref(first)
    del first
    kept_while_last = held() is not None  # the plan remembers what it was given last call
    plan(x, ids, stream=stream)           # replaced: the plan lets it go
    stream.synchronize()
    gc.collect()
    released = held() is None
    stream_refs = sys.getrefcount(stream)
    for _ in range(200):
        plan(x, ids, stream=stream)
    stream.synchronize()
    stream_refs_after = sys.getrefcount(stream)
    writer = plan.outputs.expand_x._writer is stream
    plan_ref = weakref.ref(plan)
    plan.close()
    del plan
    gc.collect()
    return kept_while_last, released, stream_refs_after - stream_refs, plan_ref() is None, writer


def test_the_c_step_keeps_and_releases_references_like_python(acl):
    for kept, released, stream_ref_growth, plan_collected, writer in _run(_references):
        assert kept and released
        assert stream_ref_growth == 0
        assert plan_collected
        assert writer


def _unclosed_plan_is_collected(acl, buf, stream, rng):
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=False)
    x, ids = (acl.Tensor.from_numpy(a) for a in _step_inputs(rng))
    plan(x, ids, stream=stream)
    stream.synchronize()
    ref = weakref.ref(plan)
    del plan
    gc.collect()
    return ref() is None


def test_a_plan_with_a_c_step_is_collected_without_close(acl):
    assert all(_run(_unclosed_plan_is_collected))


def test_the_step_state_checks_what_it_is_given(acl):
    from aclnn_py import _core
    from aclnn_py.runtime import Stream, ordered
    from aclnn_py.tensor import Tensor

    class NoSlots:  # the attributes exist, but as class attributes: no typed field to read
        _open = _contiguous = shape = dtype = _ptr = _offset_nbytes = _writer = _mem = _owner = None

    view = ordered.compiled_view()
    stream_role, none_role = _core.ROLES["stream"], _core.ROLES["none"]

    def state(launch, slots, params, tensor_type=Tensor, on_failure=print, ordered_view=view):
        return _core.PlanState(launch, 1, 1, 1, 1, slots, params, [None], (None,), (None,), (), [None], [None],
                               tensor_type, Stream, on_failure, ordered_view, None)

    with pytest.raises(TypeError, match="must derive from TensorBase / StreamBase"):
        state(1, (0,), (0,), tensor_type=NoSlots)
    with pytest.raises(ValueError, match="slot 3 is out of range"):
        state(1, (3,), (0,))
    with pytest.raises(ValueError, match="parameter 1: an argument's index, ROLE_STREAM or ROLE_NONE"):
        state(1, (0,), (0, 1))
    for role in ("config", "outputs", "precheck"):  # an operator's, not a plan's
        with pytest.raises(ValueError, match=f"parameter 1: .* \\(got {_core.ROLES[role]}\\)"):
            state(1, (0,), (0, _core.ROLES[role]))
    with pytest.raises(ValueError, match="must be addresses"):
        state(0, (0,), (0,))
    with pytest.raises(TypeError, match="on_failure must be callable"):
        state(1, (0,), (0,), on_failure=None)
    with pytest.raises(TypeError, match=r"ordered must be ordered.compiled_view\(\)"):
        state(1, (0,), (0,), ordered_view=view[:-1])
    with pytest.raises(TypeError, match="hold and checkpoint be callables"):
        state(1, (0,), (0,), ordered_view=view[:3] + (None,) + view[4:])
    assert isinstance(state(1, (0,), (none_role, 0, stream_role)), _core.PlanState)


def test_a_plan_call_is_made_from_a_function_with_named_parameters(acl):
    from aclnn_py import _core

    def call(self, a, b=None, *, c=None, stream=None):
        """Doc."""
        return "python", a, b, c, stream

    method = _core.compiled_plan_call("out")(call)
    pc = method.compiled
    assert (pc.names, pc.result) == (("a", "b", "c", "stream"), "out")
    assert method.__wrapped__ is call and method.__doc__ == "Doc." and method.__name__ == "call"
    for bad in (print, lambda self, *a: None, lambda: None):
        with pytest.raises(TypeError, match="PlanCall: function must"):
            _core.PlanCall(bad, "out")

    with pytest.raises(TypeError, match="OpCall: setup must be callable"):
        _core.OpCall(call, None)

    class NotAPlan:  # not a PlanBase: every call is the Python function's, bound like a method
        __call__ = method

    obj = NotAPlan()
    assert obj(1, 2, c=3) == ("python", 1, 2, 3, None)
    assert obj.__call__(1, stream=4) == ("python", 1, None, None, 4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'd'"):
        obj(1, d=2)
    with pytest.raises(TypeError, match="multiple values for argument 'a'"):
        obj(1, a=2)


# ---- the per-call path: descriptor table, anchors, writers ----------------------------------------------
def _recording_core(acl, n_in, n_out, launch_status=0):
    """An OpCore whose run helper records the descriptor table it is given and says it launched."""
    from aclnn_py._abi import RunLayout
    from aclnn_py._core import OpCore
    from aclnn_py.errors import check_aclnn
    from aclnn_py.runtime import order_after_writes, ordered

    b = acl.backend()
    seen = []

    @b.ffi.callback("aclnnStatus(aclTensor *const *, const int64_t *, const char *const *, uintptr_t, uint64_t, "
                    "aclrtStream, uint64_t *, aclOpExecutor **, int, int *)")
    def run_helper(table, ints, strings, ws, cap, stream, ws_size, ex, launch, launched):
        seen.append([table[i] for i in range(n_in + n_out)])
        launched[0] = launch
        return launch_status

    def address(fn):
        return int(b.ffi.cast("uintptr_t", fn))

    layout = RunLayout("phase1", "phase2", tuple(f"in{i}" for i in range(n_in)),
                       tuple(f"out{j}" for j in range(n_out)), (), (), ())
    states, _, _, _, checkpoint, every = ordered.compiled_view()
    core = OpCore(layout, address(run_helper), address(b.function_pointer("aclnnMoeDistributeDispatchV5")),
                  address(b.function_pointer("aclDestroyAclOpExecutor")), states, ordered.state, checkpoint, every,
                  ordered.workspace, order_after_writes, check_aclnn)
    return core, seen, run_helper


def test_the_launch_gathers_descriptors_holds_anchors_and_marks_writers(acl, device0):
    from aclnn_py.ops import MoeConfig
    from aclnn_py.runtime import ordered
    from aclnn_py.tensor import Tensor

    cfg = MoeConfig(ep_world_size=2, ep_rank_id=0, moe_expert_num=2, ccl_buffer_size=1 << 20)
    owned = Tensor.from_numpy(np.arange(64, dtype=np.float32))
    borrowed = Tensor.from_address(owned.ptr, (8,), np.float32, owner=owned)
    out = Tensor.empty((4, 4), np.float32)
    ins, outs = [owned, None, borrowed], [out]
    core, seen, _keep = _recording_core(acl, 3, 1)
    stream = device0.create_stream()
    assert owned._desc_addr is None  # no descriptor yet: the launch makes them
    core.run(ins, outs, cfg, stream)
    null = acl.backend().ffi.NULL
    assert seen[-1] == [owned._desc, null, borrowed._desc, out._desc] and owned._desc_addr
    held = ordered._states[stream._key].current[-1]
    assert held == [owned._mem, borrowed._owner, out._mem]  # what keeps each tensor's memory valid
    refs = sys.getrefcount(stream)
    for _ in range(100):
        core.run(ins, outs, cfg, stream)
    stream.synchronize()
    growth = sys.getrefcount(stream) - refs  # before the assert: pytest's rewriting holds its operands
    assert growth == 0  # out's writer is the same stream: no reference taken per call
    assert out._writer is stream
    borrowed.close()
    with pytest.raises(acl.ClosedError):
        core.run(ins, outs, cfg, stream)
    with pytest.raises(TypeError, match="expected Tensors, got int"):
        core.run([owned, None, 3], outs, cfg, stream)
    with pytest.raises(ValueError, match="3 inputs and 1 outputs"):
        core.run([owned], outs, cfg, stream)
    out._writer = None
    stream.close()
    for t in (owned, out):
        t.close()


def test_the_core_checks_what_it_is_built_with(acl):
    from aclnn_py._abi import RunLayout
    from aclnn_py._core import OpCore, OpSpec
    from aclnn_py.runtime import Stream, ordered
    from aclnn_py.tensor import Tensor

    layout = RunLayout("p1", "p2", ("a",), ("b",), (), (), ())
    states, _, _, _, checkpoint, every = ordered.compiled_view()
    with pytest.raises(ValueError, match="must be addresses"):
        OpCore(layout, 0, 1, 1, states, print, checkpoint, every, print, print, print)
    huge = RunLayout("p1", "p2", tuple(f"i{k}" for k in range(70)), ("b",), (), (), ())
    with pytest.raises(ValueError, match="more than 64 tensors"):
        OpCore(huge, 1, 1, 1, states, print, checkpoint, every, print, print, print)
    core = OpCore(layout, 1, 1, 1, states, print, checkpoint, every, print, print, print)
    args = dict(outputs_type=None, key=("op", (0, 0), (0, 1), (0, 1)), tensor_type=Tensor, stream_type=Stream,
                config_type=object, in_names=("a",), out_names=("b",))
    with pytest.raises(ValueError, match="one role per parameter"):
        OpSpec(core, ("a", "b"), 2, (0,), (False,), **args)
    with pytest.raises(ValueError, match="role 3 of b is out of range"):
        OpSpec(core, ("a", "b"), 2, (0, 3), (False,), **args)
    with pytest.raises(ValueError, match="none_as has one entry per input"):
        OpSpec(core, ("a", "b"), 2, (0, -5), (), **args)
    with pytest.raises(TypeError, match="outputs_type must be a tuple type"):
        OpSpec(core, ("a", "b"), 2, (0, -5), (False,), **dict(args, outputs_type=list))
    with pytest.raises(ValueError, match=r"a key item is \(input index, dim 0 or 1\)"):
        OpSpec(core, ("a", "b"), 2, (0, -5), (False,), **dict(args, key=("op", (0, 0), (1, 0), (0, 1))))


# ---- the operator functions' compiled call -------------------------------------------------------------
def _operator_calls(acl, buf, stream, rng, counter):
    """A round of dispatch and combine, then the same calls in the shape a serving loop makes (taken in
    C) and in others (the Python functions'): per call shape, whether the bytes are the first round's,
    and how many dispatch / combine calls reached Python."""
    from aclnn_py.ops import MoeConfig, moe_distribute_combine, moe_distribute_dispatch
    from aclnn_py.runtime import ordered

    attrs = dict(ep_world_size=buf.world_size, ep_rank_id=buf.rank_id, moe_expert_num=E,
                 ccl_buffer_size=buf.ccl_buffer_size)
    cfg = MoeConfig(**attrs)
    x, ids = (acl.Tensor.from_numpy(a) for a in _step_inputs(rng))
    ctx = buf.context
    d = moe_distribute_dispatch(ctx, x, ids, config=cfg, stream=stream)  # outputs made here: Python
    y = acl.Tensor.from_numpy(d.expand_x.numpy())
    out = moe_distribute_combine(ctx, y, ids, d.assist_info_for_combine, d.ep_recv_counts, config=cfg,
                                 stream=stream)
    stream.synchronize()

    def result():  # the rows dispatch received (the others are not written), the counts, combine's output
        n = int(d.ep_recv_counts.numpy()[-1])
        return d.expand_x.numpy()[:n].tobytes(), d.ep_recv_counts.numpy().tobytes(), out.numpy().tobytes()

    want = result()
    calls = {
        "config, outputs, stream": dict(config=cfg, stream=stream),
        "precheck given": dict(config=cfg, stream=stream, precheck=True),
        "attributes as keywords": dict(stream=stream, **attrs),
        "current stream": dict(config=cfg),
        "x_dtype given": dict(config=cfg, stream=stream, x_dtype=bfloat16),
    }
    report = {}
    for name, kw in calls.items():
        for t in (*d, out):
            t.copy_from(np.zeros(t.shape, t.dtype.numpy_dtype), stream)
        stream.synchronize()
        before = counter.seen()
        holds = ordered.held(stream)
        got_d = moe_distribute_dispatch(ctx, x, ids, outputs=d, **kw)
        if name == "config, outputs, stream":  # held like the Python path's launches: once, until a sync
            report["holds after a C call"] = (ordered.held(stream) - holds, ordered._states[stream._key].current[-1])
        kw.pop("x_dtype", None)
        got_c = moe_distribute_combine(ctx, y, ids, d.assist_info_for_combine, d.ep_recv_counts, x_out=out, **kw)
        same = got_d is d and got_c is out and result() == want  # numpy() waits for the writer stream
        report[name] = (same, [n - b for n, b in zip(counter.seen(), before)])
    anchors = report.pop("holds after a C call")
    present = [a for a in anchors[1] if a is not None]  # one entry per table slot; absent ones None
    report["holds"] = (anchors[0], present == [t._anchor() for t in (ctx, x, ids, *d)], ordered.held(stream))
    return report


def test_operator_calls_in_the_serving_shape_run_in_c_with_the_python_paths_bytes(acl, monkeypatch):
    counter = PythonOpCalls(monkeypatch)
    for report in _run(lambda *a: _operator_calls(*a, counter)):
        assert report.pop("holds") == (1, True, 0)  # one hold of every tensor's anchor; released by the syncs
        assert {name: same for name, (same, _) in report.items()} == dict.fromkeys(report, True)
        assert {name: python for name, (_, python) in report.items()} == {
            "config, outputs, stream": [0, 0], "precheck given": [0, 0], "attributes as keywords": [1, 1],
            "current stream": [1, 1], "x_dtype given": [1, 0]}


def _operator_failures(acl, buf, stream, rng, counter, ranks):
    """What the compiled call does when phase 1 refuses, when the launch fails and when the stream's
    workspace must grow: the errors (with those of the Python path), and the executors left."""
    from aclnn_py import _mock
    from aclnn_py.ops import MoeConfig, moe_distribute_dispatch

    attrs = dict(ep_world_size=buf.world_size, ep_rank_id=buf.rank_id, moe_expert_num=E,
                 ccl_buffer_size=buf.ccl_buffer_size)
    cfg = MoeConfig(**attrs)
    x, ids = (acl.Tensor.from_numpy(a) for a in _step_inputs(rng))
    ctx = buf.context
    d = moe_distribute_dispatch(ctx, x, ids, config=cfg, stream=stream)
    stream.synchronize()
    out = {}

    def attempt(name, call):
        before = counter.seen()[0]
        try:
            call()
            err = None
        except acl.AclnnError as e:
            err = (type(e).__name__, e.func, e.message)
        out[name] = (err, counter.seen()[0] - before)

    # phase 1 refuses int64 ids (the pre-checks look at shapes only): the Python path reports it
    wide_ids = acl.Tensor.from_numpy(ids.numpy().astype(np.int64))
    attempt("phase 1, C", lambda: moe_distribute_dispatch(ctx, x, wide_ids, config=cfg, outputs=d, stream=stream))
    attempt("phase 1, Python", lambda: moe_distribute_dispatch(ctx, x, wide_ids, outputs=d, stream=stream, **attrs))
    wide_ids.descriptor()  # now the call is in the serving shape: the compiled route raises phase 1's refusal
    attempt("phase 1, compiled", lambda: moe_distribute_dispatch(ctx, x, wide_ids, config=cfg, outputs=d,
                                                                 stream=stream))
    # the launch refuses an x in host memory (descriptors may address anything; the launch checks)
    host = np.zeros(BS * H * 2 + 64, np.uint8)
    start = -host.ctypes.data % 32
    on_host = acl.Tensor.from_address(host.ctypes.data + start, (BS, H), bfloat16, owner=host)
    on_host.descriptor()
    attempt("launch, C", lambda: moe_distribute_dispatch(ctx, on_host, ids, config=cfg, outputs=d, stream=stream))
    attempt("launch, Python", lambda: moe_distribute_dispatch(ctx, on_host, ids, outputs=d, stream=stream, **attrs))
    stream.synchronize()
    # a new stream has no workspace yet: the first call grows it and launches its executor
    fresh = acl.Device.current().create_stream()
    stream.synchronize()
    ranks.wait()  # the executor count is the process's: it is read while both ranks wait
    executors = _mock.stats()["executors"]
    ranks.wait()
    attempt("fresh stream, first", lambda: moe_distribute_dispatch(ctx, x, ids, config=cfg, outputs=d, stream=fresh))
    attempt("fresh stream, second", lambda: moe_distribute_dispatch(ctx, x, ids, config=cfg, outputs=d, stream=fresh))
    fresh.synchronize()
    ranks.wait()
    out["executors left"] = _mock.stats()["executors"] - executors
    ranks.wait()
    fresh.close()
    return out


def test_operator_call_failures_are_the_python_paths(acl, monkeypatch):
    import threading

    counter, ranks = PythonOpCalls(monkeypatch), threading.Barrier(2)
    for out in _run(lambda *a: _operator_failures(*a, counter, ranks)):
        (c_err, c_python), (py_err, _) = out["phase 1, C"], out["phase 1, Python"]
        assert c_err == py_err and c_err[1] == "aclnnMoeDistributeDispatchV5GetWorkspaceSize"
        assert c_python == 1  # a new Tensor (no descriptor yet) is converted in Python, then launched
        assert out["phase 1, compiled"] == (py_err, 0)
        (c_err, c_python), (py_err, _) = out["launch, C"], out["launch, Python"]
        assert c_err == py_err and c_err[1] == "aclnnMoeDistributeDispatchV5" and "input 1" in c_err[2]
        assert c_python == 0  # raised by the C path itself
        assert out["fresh stream, first"] == (None, 0) and out["fresh stream, second"] == (None, 0)
        assert out["executors left"] == 0


def test_an_operator_function_keeps_its_name_doc_and_signature(acl):
    import inspect

    from aclnn_py import _core
    from aclnn_py.ops import moe_distribute_combine, moe_distribute_dispatch

    for fn in (moe_distribute_dispatch, moe_distribute_combine):
        assert isinstance(fn.compiled, _core.OpCall)
        python = fn.__wrapped__
        assert inspect.isfunction(python)
        assert inspect.signature(fn) == inspect.signature(python)
        assert (fn.__name__, fn.__qualname__, fn.__module__, fn.__doc__) == \
            (python.__name__, python.__qualname__, python.__module__, python.__doc__)
        assert fn.compiled.names == tuple(inspect.signature(python).parameters)[:-1]  # all but **attrs


def test_an_op_call_without_a_spec_is_its_python_function(acl):
    from aclnn_py import _core

    def fn(a, *, stream=None, **attrs):
        return "python", a, stream, attrs

    asked = []

    def failing(names, n_positional):
        asked.append((names, n_positional))
        raise RuntimeError("no runtime yet")

    oc = _core.compiled_operator(fn, failing)
    assert oc(1) == ("python", 1, None, {}) and oc(2, stream=3, w=4) == ("python", 2, 3, {"w": 4})
    assert asked == [(("a", "stream"), 1)] * 2  # a failed setup is asked again at the next call
    assert _core.compiled_operator(fn, lambda names, n: None)(5) == ("python", 5, None, {})
    with pytest.raises(TypeError, match="must return an OpSpec"):
        _core.compiled_operator(fn, lambda names, n: 42)(6)


def test_a_plan_class_with_a_compiled_call_leaves_what_it_cannot_take_to_python(acl):
    from aclnn_py import _core

    class P(_core.PlanBase):
        tag = "p"

        @_core.compiled_plan_call("out")
        def __call__(self, a, b=None, *, stream=None):
            return "python", self.tag, a, b, stream

    p = P()
    assert p._c_state is None and p._stream is None
    assert p(1, b=2, stream=3) == ("python", "p", 1, 2, 3)  # no _c_state: the Python function
    assert p(*(1,), **{"stream": 3}) == ("python", "p", 1, None, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        p(1, c=2)
    with pytest.raises(TypeError, match="Cannot convert str to _core.PlanState"):
        p._c_state = "not a state"
    p._c_state = None
    assert p._c_state is None

    class Sub(P):
        def __call__(self, *args, **kwargs):
            return ("sub", *super().__call__(*args, **kwargs))

    class Inherits(P):
        tag = "inherits"

    assert Sub()(1) == ("sub", "python", "p", 1, None, None)
    assert Inherits()(1, stream=2) == ("python", "inherits", 1, None, 2)

    class Abstract(_core.PlanBase, abc.ABC):
        @abc.abstractmethod
        def method(self) -> None: ...

    with pytest.raises(TypeError, match="abstract"):
        Abstract()


HAVE_VECTORCALL = 1 << 11  # Py_TPFLAGS_HAVE_VECTORCALL


def test_the_plan_classes_are_made_to_be_called_without_packed_arguments(acl):
    """DispatchPlan and CombinePlan are the classes compiled_plan_class made from the class statements:
    instances CPython calls by vectorcall, with the statement's name, module and doc, nothing added."""
    from aclnn_py.ops import CombinePlan, DispatchPlan

    for cls in (DispatchPlan, CombinePlan):
        written = cls.__mro__[1]
        assert cls.__flags__ & HAVE_VECTORCALL and not written.__flags__ & HAVE_VECTORCALL
        assert (cls.__name__, cls.__qualname__, cls.__module__, cls.__doc__) == \
            (written.__name__, written.__qualname__, written.__module__, written.__doc__)
        assert set(vars(cls)) <= {"__module__", "__doc__", "__vectorcalloffset__"}  # the last: 3.11 only
        assert cls.__call__ is vars(written)["__call__"]


def test_a_made_plan_class_reaches_its_call_every_way_it_is_called(acl):
    """Each way Python calls an object (direct, by keyword, unpacked, through partial, map, the class,
    a subclass) reaches the compiled __call__ with the plan first; what the core refuses to make."""
    import functools

    from aclnn_py import _core

    class Written(_core.PlanBase):
        """A plan class."""

        tag = "p"

        @_core.compiled_plan_call("out")
        def __call__(self, a, b=None, *, stream=None):
            return "python", self.tag, a, b, stream

    P = _core.compiled_plan_class(Written)
    p = P()
    assert type(p) is P and isinstance(p, Written) and P.__flags__ & HAVE_VECTORCALL
    assert p(1) == ("python", "p", 1, None, None)
    assert p(1, 2, stream=3) == ("python", "p", 1, 2, 3)
    assert p(*(1,), **{"stream": 3}) == ("python", "p", 1, None, 3)  # no spare slot before the arguments
    assert functools.partial(p, 1, stream=4)(2) == ("python", "p", 1, 2, 4)
    assert list(map(p, [5, 6])) == [("python", "p", 5, None, None), ("python", "p", 6, None, None)]
    assert P.__call__(p, 7) == ("python", "p", 7, None, None)
    assert [p(i)[2] for i in range(3)] == [0, 1, 2]
    with pytest.raises(TypeError, match="unexpected keyword argument 'k0'"):
        p(1, **{f"k{i}": i for i in range(80)})  # more than the core's stack holds
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        p()

    class Inherits(P):
        tag = "inherits"

    class Own(P):
        def __call__(self, *args, **kwargs):
            return ("own", *super().__call__(*args, **kwargs))

    assert Inherits()(1, stream=2) == ("python", "inherits", 1, None, 2)
    assert Own()(1) == ("own", "python", "p", 1, None, None)

    class NotCompiled(_core.PlanBase):
        def __call__(self):
            return None

    class Abstract(_core.PlanBase, abc.ABC):
        __call__ = Written.__call__

    with pytest.raises(TypeError, match="expected a subclass of PlanBase"):
        _core.compiled_plan_class(int)
    with pytest.raises(TypeError, match="NotCompiled.__call__ must be a compiled_plan_call"):
        _core.compiled_plan_class(NotCompiled)
    with pytest.raises(TypeError, match="Abstract's metaclass must be type, got ABCMeta"):
        _core.compiled_plan_class(Abstract)


def test_the_switch_to_the_python_path(acl):
    """set_compiled_path() returns the previous setting and takes a bool only; ACLNN_PY_COMPILED=0 at
    import turns the compiled path off, a value other than 0 / 1 fails the import naming it."""
    from conftest import run_python

    from aclnn_py import _core
    from aclnn_py.ops import compiled_path_enabled, set_compiled_path

    assert compiled_path_enabled() and _core.enabled()
    try:
        assert set_compiled_path(False) is True
        assert not compiled_path_enabled() and not _core.enabled()
        assert set_compiled_path(False) is False
    finally:
        assert set_compiled_path(True) is False
    assert compiled_path_enabled()
    with pytest.raises(TypeError, match=r"set_compiled_path\(\): enabled: expected a bool, got int 0"):
        set_compiled_path(0)  # type: ignore[arg-type]
    assert compiled_path_enabled()
    probe = "from aclnn_py.ops import compiled_path_enabled; print(compiled_path_enabled())"
    assert [run_python(probe, ACLNN_PY_COMPILED=v).stdout.strip() for v in ("0", "1", "")] == ["False", "True", "True"]
    bad = run_python(probe, ACLNN_PY_COMPILED="off")
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == (
        "ValueError: ACLNN_PY_COMPILED must be 0 (every operator and plan call in Python) or 1 (the default), "
        "got 'off'")
