"""Calling a plan: CPython calls DispatchPlan and CombinePlan by vectorcall, every way Python calls an
object reaches the same call, refusals are clear, Tensors a call replaces are held until the stream has
passed the launches that read them, a call overlapping another thread's call of the plan is refused, and
a plan is collected without close()."""

from __future__ import annotations

import functools
import gc
import inspect
import sys
import threading
import time
import weakref

import numpy as np

from aclnn_py.dtypes import bfloat16

BS, H, K, E = 4, 1024, 2, 4
HAVE_VECTORCALL = 1 << 11


def _world_rank(rank, world_size, root, body):
    import aclnn_py as acl

    stream = acl.Device.current().create_stream()
    try:
        with acl.hccl.Communicator(world_size, rank, root) as comm:
            buf = acl.MoeDistributeBuffer(comm)
            return body(acl, buf, stream, np.random.default_rng([5, rank]))
    finally:
        stream.close()


def _collected(*refs: weakref.ref) -> bool:
    """Whether every referent is gone once collected. gc.collect() returns at once, collecting nothing,
    while another thread's collection runs (the other rank's, which lets go of the GIL in the finalizers
    it calls): look again a few times before judging."""
    for _ in range(100):
        gc.collect()
        if all(r() is None for r in refs):
            return True
        time.sleep(0.005)
    return False


def _run(body):
    from aclnn_py.worlds import run_threads

    return run_threads(_world_rank, 2, body, timeout=120)


def _step_inputs(rng):
    x = rng.uniform(-2, 2, (BS, H)).astype(np.float32).astype(bfloat16)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    return x, ids


def _bytes(out, stream):
    stream.synchronize()
    n = int(out.ep_recv_counts.numpy()[-1])
    return out.expand_x.numpy()[:n].tobytes(), out.ep_recv_counts.numpy().tobytes()


def test_the_plan_classes_are_called_by_vectorcall_with_the_signature_of_their_call(acl):
    from aclnn_py.ops import CombinePlan, DispatchPlan

    for cls in (DispatchPlan, CombinePlan):
        assert cls.__flags__ & HAVE_VECTORCALL
        params = list(inspect.signature(cls.launch).parameters)
        assert params[0] == "self" and params[-1] == "stream"
        assert cls.launch.__doc__.startswith("Phase 2 with this step's inputs")


def _ways(acl, buf, stream, rng):
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16)
    assert list(inspect.signature(plan).parameters)[:2] == ["x", "expert_ids"]  # the bound launch's
    x, ids = (acl.Tensor.from_numpy(v) for v in _step_inputs(rng))
    want = _bytes(plan(x, ids, stream=stream), stream)

    got = {
        "keywords": plan(x=x, expert_ids=ids, stream=stream),
        "unpacked": plan(*(x, ids), **{"stream": stream}),
        "partial": functools.partial(plan, x, stream=stream)(ids),
        "map": list(map(functools.partial(plan, stream=stream), [x], [ids]))[0],
        "through the class": type(plan).__call__(plan, x, ids, stream=stream),
        "launch": plan.launch(x, ids, stream=stream),
    }
    out = {name: _bytes(r, stream) == want for name, r in got.items()}
    plan.close()
    return out


def test_every_way_of_calling_a_plan_gives_the_same_round(acl):
    for out in _run(_ways):
        assert all(out.values()), out


def test_a_subclass_keeps_its_own_call(acl):
    from aclnn_py.ops import DispatchPlan

    class Own(DispatchPlan):
        def __call__(self, *args, **kwargs):
            return ("own", super().__call__(*args, **kwargs))

    class Inherits(DispatchPlan):
        pass

    # CPython 3.12+ lets a subclass without a __call__ of its own keep the vectorcall entry; one that
    # overrides __call__ never has it (its __call__ runs)
    assert not Own.__flags__ & HAVE_VECTORCALL or sys.version_info < (3, 12)
    assert Own.__call__ is not DispatchPlan.__call__ and Inherits.__call__ is DispatchPlan.__call__


class _BlockingArray:
    """A host array whose conversion waits: the call that converts it is inside the plan meanwhile."""

    def __init__(self, array, entered, release):
        self.array, self.entered, self.release = array, entered, release

    def __array__(self, dtype=None, copy=None):
        self.entered.set()
        self.release.wait(10)
        return self.array


def _overlapping_calls(acl, buf, stream, rng):
    """While a call of the plan is running on another thread, a call is refused (its addresses would be
    written under the running launch); the plan stays usable."""
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16)
    host = _step_inputs(rng)
    x, ids = (acl.Tensor.from_numpy(v) for v in host)
    entered, release = threading.Event(), threading.Event()
    first = threading.Thread(target=lambda: plan(_BlockingArray(host[0], entered, release), ids, stream=stream))
    first.start()
    entered.wait(10)
    try:
        plan(x, ids, stream=stream)
        refused = None
    except RuntimeError as e:
        refused = str(e)
    release.set()
    first.join(10)
    after = _bytes(plan(x, ids, stream=stream), stream) == _bytes(
        buf.low_latency_dispatch(x, ids, E, stream=stream, keep=True), stream)
    plan.close()
    return refused, after


def test_a_call_overlapping_another_threads_call_of_the_plan_is_refused(acl):
    for refused, after in _run(_overlapping_calls):
        assert refused is not None and refused.startswith("DispatchPlan(aclnnMoeDistributeDispatchV5)")
        assert "another thread's call of it is running" in refused
        assert after


def _replaced_tensors_are_held(acl, buf, stream, rng):
    """A Tensor the plan lets go of was used by a launch before: dropped by the caller, its memory stays
    until the stream is synchronised — an input once two later ones pushed it out (the plan keeps the one
    bound before the last), given outputs once replaced."""
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16)
    x, ids = (acl.Tensor.from_numpy(v) for v in _step_inputs(rng))
    report = {}
    for what in ("input", "output"):
        first = acl.Tensor.from_numpy(_step_inputs(rng)[0])
        second = acl.Tensor.from_numpy(_step_inputs(rng)[0])
        out = None if what == "input" else [acl.Tensor.empty(t.shape, t.dtype) for t in plan.outputs]
        plan(first, ids, stream=stream, outputs=None if out is None else type(plan.outputs)(*out))
        memory = [weakref.ref(first._mem)] + ([weakref.ref(t._mem) for t in out] if out is not None else [])
        plan(second, ids, stream=stream)  # first is the one bound before (and the given outputs are replaced)
        plan(x, ids, stream=stream)       # pushes first out
        del first, second, out
        gc.collect()
        held = all(m() is not None for m in memory)
        stream.synchronize()
        report[what] = (held, _collected(*memory))
    plan.close()
    return report


def test_a_replaced_tensor_is_held_until_the_stream_passes_the_launch_that_used_it(acl):
    for report in _run(_replaced_tensors_are_held):
        assert report == {"input": (True, True), "output": (True, True)}


def _references(acl, buf, stream, rng):
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16)
    x, ids = (acl.Tensor.from_numpy(a) for a in _step_inputs(rng))
    first = acl.Tensor.from_numpy(_step_inputs(rng)[0])
    plan(first, ids, stream=stream)
    held = weakref.ref(first)
    del first
    kept_while_last = held() is not None  # the plan remembers what it was given last call
    plan(x, ids, stream=stream)           # replaced: kept as the one bound before
    kept_while_previous = held() is not None
    plan(acl.Tensor.from_numpy(_step_inputs(rng)[0]), ids, stream=stream)  # pushed out: the plan lets it go
    plan(x, ids, stream=stream)
    stream.synchronize()
    released = _collected(held) and kept_while_previous
    stream_refs = sys.getrefcount(stream)
    for _ in range(200):
        plan(x, ids, stream=stream)
    stream.synchronize()
    growth = sys.getrefcount(stream) - stream_refs
    writer = plan.outputs.expand_x.writer is stream
    unclosed = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16)
    unclosed(x, ids, stream=stream)
    stream.synchronize()
    refs = [weakref.ref(plan), weakref.ref(unclosed)]
    plan.close()
    del plan, unclosed
    return kept_while_last, released, growth, [_collected(r) for r in refs], writer


def test_a_plan_keeps_and_releases_references_and_is_collected_without_close(acl):
    for kept, released, growth, collected, writer in _run(_references):
        assert kept and released and writer
        assert growth == 0
        assert collected == [True, True]


def _refusals(acl, buf, stream, rng):
    plan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16)
    x, ids = (acl.Tensor.from_numpy(a) for a in _step_inputs(rng))
    plan(x, ids, stream=stream)
    stream.synchronize()
    out = {}

    def attempt(name, call):
        try:
            call()
            out[name] = None
        except (acl.AclnnError, acl.ClosedError, TypeError) as e:
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
    block = acl.DeviceMemory(BS * H * 2 + 64)
    skewed = acl.Tensor.from_address(block.ptr + 2, (BS, H), bfloat16, owner=block)  # not 32-byte aligned
    attempt("skewed", lambda: plan(skewed, ids, stream=stream))
    plan(x, ids, stream=stream)  # still works after a refused step
    stream.synchronize()
    ids.close()  # the tensor the plan was given last call
    attempt("closed, same as last call", lambda: plan(x, ids, stream=stream))
    plan.close()
    attempt("closed plan", lambda: plan(x, ids, stream=stream))
    return out


def test_refused_calls_say_why(acl):
    for out in _run(_refusals):
        assert out["other dtype"].startswith("AclnnParamInvalid") and "FLOAT16" in out["other dtype"]
        assert out["not a stream"].startswith("TypeError: stream: expected a Stream")
        assert out["closed tensor"].startswith("ClosedError")
        assert out["closed stream"].startswith("ClosedError") and "Stream(" in out["closed stream"]
        assert out["closed, same as last call"].startswith("ClosedError")
        assert out["closed plan"].startswith("ClosedError")
        assert out["strided"].startswith("AclnnParamInvalid") and "strided" in out["strided"]
        assert out["skewed"].startswith("AclnnParamInvalid") and "aclSetInputTensorAddr" in out["skewed"]
        assert "32-byte aligned" in out["skewed"]
        assert out["unknown keyword"].startswith("TypeError") and "unexpected keyword argument 'bogus'" in \
            out["unknown keyword"]
        assert out["too many positional"].startswith("TypeError") and "positional argument" in out["too many positional"]
        assert out["given twice"].startswith("TypeError") and "multiple values for keyword argument 'x'" in out["given twice"]


def _alternating(acl, buf, stream, rng):
    """Two input sets in turn (double-buffered activations): each step launches with the set it is given
    — the plan swaps back in the one bound before without checking it again — and one of them closed in
    between is refused all the same. Combine in turn, its expert_scales given positionally or by name."""
    dplan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=True)
    cplan = buf.plan_combine(dplan, with_weights=True, num_experts=E)
    sets = []
    for _ in range(2):
        x, ids = (acl.Tensor.from_numpy(v) for v in _step_inputs(rng))
        sets.append((x, ids, acl.Tensor.from_numpy(rng.uniform(0, 1, (BS, K)).astype(np.float32))))
    same = []
    for step in range(6):
        x, ids, w = sets[step % 2]
        d = dplan(x, ids, topk_weights=w, stream=stream)
        want = buf.low_latency_dispatch(x, ids, E, topk_weights=w, stream=stream, keep=True)
        y = cplan(d.expand_x, ids, d.assist_info_for_combine, d.ep_recv_counts, w, stream=stream) if step % 2 else \
            cplan(d.expand_x, ids, d.assist_info_for_combine, d.ep_recv_counts, topk_weights=w, stream=stream)
        y_want = buf.low_latency_combine(want.expand_x, ids, w, want.assist_info_for_combine, want.ep_recv_counts,
                                         num_experts=E, stream=stream, keep=True)
        same.append(_bytes(d, stream) == _bytes(want, stream)
                    and y.numpy(stream=stream).tobytes() == y_want.numpy(stream=stream).tobytes())
    x0, ids0, w0 = sets[0]
    x0.close()  # bound the call before the last: the plan would swap it back in
    try:
        dplan(x0, ids0, topk_weights=w0, stream=stream)
        refused = None
    except Exception as e:  # noqa: BLE001
        refused = type(e).__name__
    stream.synchronize()
    dplan.close()
    cplan.close()
    return same, refused


def test_a_plan_given_two_input_sets_in_turn_launches_each_and_refuses_one_closed_meanwhile(acl):
    for same, refused in _run(_alternating):
        assert same == [True] * 6
        assert refused == "ClosedError"
