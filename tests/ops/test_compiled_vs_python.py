"""The compiled steady state and the Python path give the same answer (docs/concepts.md, "The compiled
steady state"): the same calls — operators per call and plans, valid and invalid — run once with the
compiled path enabled and once with every call sent to the Python functions
(``aclnn_py.ops.set_compiled_path``), and each pair must give the same output bytes, or the same
exception type and message. A call whose validity is known must also succeed, or fail, on both.

Seeded and broad, in one 2-rank thread world: every target's standard call and every single mutation
once, then ``ACLNN_PY_DIFF_EXAMPLES`` cases (default 300) drawn from ``ACLNN_PY_DIFF_SEED`` (default
0), each a standard steady-state call with zero to two mutations: an argument as a host array, of another dtype or shape, a non-contiguous or offset view, a
closed Tensor, a Tensor subclass, a fresh Tensor, None or not an array; the stream as the current
one, closed, an int handle, a bool, an int beyond int64, another stream or a stream-like object;
misspelt keywords; attributes as keywords (with a bool or a huge int among them); the pre-check
switch; outputs allocated, given as a mapping or with optional outputs as None; a closed plan."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aclnn_py.dtypes import bfloat16

N_CASES = int(os.environ.get("ACLNN_PY_DIFF_EXAMPLES", "300"))
SEED = int(os.environ.get("ACLNN_PY_DIFF_SEED", "0"))
W, BS, H, K, E = 2, 4, 1024, 2, 4
PATHS = ("compiled", "python")

# ---- what a case is: a target call and its mutations, as plain data both ranks read alike ------------------
# A mutation is (name, expectation): "ok" (the call must succeed on both paths), "error" (it must raise on
# both) or None (either, as long as both paths agree).
TENSOR_MUTATIONS = {
    "host": "ok", "host_int64": "ok", "host_float64": "ok", "list": None, "wrong_dtype": "error",
    "wrong_shape": "error", "strided": None, "offset_view": "ok", "closed": "error", "subclass": "ok",
    "fresh": "ok", "none": None, "not_an_array": "error",
}
STREAM_MUTATIONS = {
    "current": "ok", "closed": "error", "handle": "ok", "bool": "error", "huge": "error", "other": "ok",
    "stream_like": "ok",
}
#: per target: its tensor arguments (name, where: an index of args or a keyword), and what its other
#: mutations are
TARGETS: dict[str, dict[str, Any]] = {
    "dispatch": {
        "tensors": {"x": 1, "expert_ids": 2},
        "calls": {"misspelt": "error", "attrs": "ok", "attrs_bool": "error", "attrs_huge": "error",
                  "config_and_attrs": "error", "precheck_false": "ok", "precheck_int": "ok",
                  "precheck_numpy_bool": "ok", "outputs_allocated": "ok", "outputs_mapping_with_none": "ok",
                  "outputs_optional_none": "ok", "outputs_required_none": "error", "outputs_closed": "error", "outputs_tuple": "error",
                  "outputs_misspelt_name": "error",
                  "outputs_wrong_shape": "error", "x_dtype": "ok", "huge_ccl_attr": "error"},
    },
    "combine": {
        "tensors": {"expand_x": 1, "expert_ids": 2, "assist_info_for_combine": 3, "ep_send_counts": 4,
                    "expert_scales": 5},
        "calls": {"misspelt": "error", "attrs": "ok", "attrs_bool": "error", "attrs_huge": "error",
                  "config_and_attrs": "error", "precheck_false": "ok", "precheck_int": "ok",
                  "x_out_allocated": "ok", "x_out_closed": "error", "x_out_wrong_dtype": "error",
                  "x_out_host": "error"},
    },
    "dispatch_plan": {
        "tensors": {"x": 0, "expert_ids": 1, "expert_scales": "expert_scales"},
        "calls": {"misspelt": "error", "closed_plan": "error", "plan_outputs": "ok",
                  "plan_outputs_with_none": "ok", "plan_outputs_closed": "error",
                  "plan_outputs_wrong_shape": "error", "absent_input_given": "error"},
    },
    "combine_plan": {
        "tensors": {"expand_x": 0, "expert_ids": 1, "assist_info_for_combine": 2, "ep_send_counts": 3,
                    "expert_scales": 4},
        "calls": {"misspelt": "error", "closed_plan": "error", "plan_x_out": "ok", "plan_x_out_closed": "error",
                  "plan_x_out_wrong_dtype": "error", "absent_input_given": "error"},
    },
}
#: integer inputs: host arrays of another integer type are converted, float ones refused
INTEGER_INPUTS = {"expert_ids", "assist_info_for_combine", "ep_send_counts"}
#: inputs a call may leave out (None): the weights of combine are optional, a plan's present inputs not
OPTIONAL = {("combine", "expert_scales")}


@dataclass(frozen=True)
class Case:
    index: int
    target: str
    mutations: tuple[tuple[str, ...], ...]  # ("tensor", argument, kind) | ("stream", kind) | ("call", kind)

    def expectation(self) -> str | None:
        """"error" when a mutation makes the call invalid, "ok" when every one keeps it valid, else None."""
        seen = [self._expect(m) for m in self.mutations]
        if "error" in seen:
            return "error"
        return "ok" if all(e == "ok" for e in seen) else None

    def _expect(self, m: tuple[str, ...]) -> str | None:
        if m[0] == "tensor":
            _, name, kind = m
            if kind == "none":
                return "ok" if (self.target, name) in OPTIONAL else "error"
            if kind == "host_int64" and name not in INTEGER_INPUTS:
                return "error"  # a float input given as an int64 host array: another dtype
            if kind == "host_float64" and name != "expert_scales":
                # only weights are narrowed from float64 (when exact, as here); other inputs: another dtype
                return "error"
            return TENSOR_MUTATIONS[kind]
        if m[0] == "stream":
            return STREAM_MUTATIONS[m[1]]
        return TARGETS[self.target]["calls"][m[1]]


def single_mutations() -> list[tuple[str, tuple[str, ...]]]:
    """Every mutation of every target, as (target, mutation)."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for target, spec in TARGETS.items():
        out += [(target, ("tensor", name, kind)) for name in spec["tensors"] for kind in TENSOR_MUTATIONS]
        out += [(target, ("stream", kind)) for kind in STREAM_MUTATIONS]
        out += [(target, ("call", kind)) for kind in spec["calls"]]
    return out


def draw_cases(n: int, seed: int) -> list[Case]:
    """Each target's standard call, every single mutation once, then `n` seeded draws of zero to two."""
    cases = [Case(i, target, ()) for i, target in enumerate(TARGETS)]
    cases += [Case(len(cases) + i, target, (m,)) for i, (target, m) in enumerate(single_mutations())]
    rng = np.random.default_rng(seed)
    for index in range(len(cases), len(cases) + n):
        target = list(TARGETS)[int(rng.integers(len(TARGETS)))]
        spec = TARGETS[target]
        mutations: list[tuple[str, ...]] = []
        for _ in range(int(rng.choice(3, p=[0.15, 0.6, 0.25]))):
            family = rng.choice(["tensor", "stream", "call"], p=[0.5, 0.2, 0.3])
            if family == "tensor":
                name = list(spec["tensors"])[int(rng.integers(len(spec["tensors"])))]
                m: tuple[str, ...] = ("tensor", name, str(rng.choice(list(TENSOR_MUTATIONS))))
            elif family == "stream":
                m = ("stream", str(rng.choice(list(STREAM_MUTATIONS))))
            else:
                m = ("call", str(rng.choice(list(spec["calls"]))))
            if all(m[:-1] != other[:-1] for other in mutations):  # one mutation per argument
                mutations.append(m)
        cases.append(Case(index, target, tuple(mutations)))
    return cases


# ---- one rank: the objects the calls use, and a case made into a call -----------------------------------------
class SubTensor:  # replaced by a real subclass of Tensor in the rank (the package is imported there)
    pass


@dataclass(frozen=True)
class StreamLike:
    protocol: tuple[int, int]

    def __acl_stream__(self) -> tuple[int, int]:
        return self.protocol


@dataclass
class Call:
    fn: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]
    before: Callable[[], Any] | None = None  # the dispatch round a combine is fed from
    keep: list[Any] = field(default_factory=list)  # objects made for the case, alive until it ends


class Rank:
    """What one rank's calls use: a buffer, a config, device inputs, preallocated outputs, two plans
    and their warm-up, so that the standard calls are the steady state the compiled path takes."""

    def __init__(self, acl: Any, buf: Any, rank: int):
        from aclnn_py.ops import MoeConfig, moe_distribute_combine, moe_distribute_dispatch

        global SubTensor
        if not issubclass(SubTensor, acl.Tensor):
            SubTensor = type("SubTensor", (acl.Tensor,), {"__slots__": ()})
        self.acl, self.buf = acl, buf
        self.dispatch, self.combine = moe_distribute_dispatch, moe_distribute_combine
        self.stream = acl.Device.current().create_stream()
        self.other = acl.Device.current().create_stream()
        self.attrs = dict(ep_world_size=buf.world_size, ep_rank_id=buf.rank_id, moe_expert_num=E,
                          ccl_buffer_size=buf.ccl_buffer_size)
        self.cfg = MoeConfig(**self.attrs)
        rng = np.random.default_rng([7, rank])
        self.x = acl.Tensor.from_numpy(rng.uniform(-2, 2, (BS, H)).astype(np.float32).astype(bfloat16))
        self.ids = acl.Tensor.from_numpy(np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32))
        self.w = acl.Tensor.from_numpy(rng.uniform(0, 1, (BS, K)).astype(np.float32))
        ctx = buf.context
        self.d = moe_distribute_dispatch(ctx, self.x, self.ids, config=self.cfg, stream=self.stream)
        self.x_out = moe_distribute_combine(ctx, self.d.expand_x, self.ids, self.d.assist_info_for_combine,
                                            self.d.ep_recv_counts, self.w, config=self.cfg, stream=self.stream)
        self.dplan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=True)
        self.cplan = buf.plan_combine(self.dplan, with_weights=True, num_experts=E)
        self.closed_dplan = buf.plan_dispatch(BS, H, E, K, x_dtype=bfloat16, with_weights=True)
        self.closed_cplan = buf.plan_combine(self.closed_dplan, with_weights=True, num_experts=E)
        self.closed_dplan.close()
        self.closed_cplan.close()
        for s in (self.stream, self.other):  # every stream has launched before: the compiled path takes it
            self.std_dispatch(s)()
            self.std_combine(s)()
            s.synchronize()  # a communicator's collectives run in call order: one stream at a time
        self.std_plans()
        self.sync()
        # the values of the standard inputs, as every standard round leaves them: what host-array and
        # copy variants of an argument hold
        p = self.dplan.outputs
        self.snapshot = {id(t): t.numpy() for t in (self.x, self.ids, self.w, self.d.expand_x,
                                                     self.d.assist_info_for_combine, self.d.ep_recv_counts,
                                                     p.expand_x, p.assist_info_for_combine, p.ep_recv_counts)}


    # the standard calls: the steady state
    def std_dispatch(self, stream: Any = None) -> Callable[[], Any]:
        s = stream or self.stream
        return lambda: self.dispatch(self.buf.context, self.x, self.ids, config=self.cfg, outputs=self.d, stream=s)

    def std_combine(self, stream: Any = None) -> Callable[[], Any]:
        s, d = stream or self.stream, self.d
        return lambda: self.combine(self.buf.context, d.expand_x, self.ids, d.assist_info_for_combine,
                                    d.ep_recv_counts, self.w, config=self.cfg, x_out=self.x_out, stream=s)

    def std_plans(self) -> None:
        self.dplan(self.x, self.ids, expert_scales=self.w, stream=self.stream)
        p = self.dplan.outputs
        self.cplan(p.expand_x, self.ids, p.assist_info_for_combine, p.ep_recv_counts, self.w, stream=self.stream)

    def sync(self) -> None:
        for s in (self.stream, self.other):
            s.synchronize()
        self.acl.current_stream().synchronize()

    def outputs(self) -> list[Any]:
        return [*self.d, self.x_out, *self.dplan.outputs, self.cplan.x_out]

    # a case as a call
    def call(self, case: Case) -> Call:
        ctx, s = self.buf.context, self.stream
        if case.target == "dispatch":
            c = Call(self.dispatch, [ctx, self.x, self.ids], dict(config=self.cfg, outputs=self.d, stream=s))
        elif case.target == "combine":
            d = self.d
            c = Call(self.combine, [ctx, d.expand_x, self.ids, d.assist_info_for_combine, d.ep_recv_counts, self.w],
                     dict(config=self.cfg, x_out=self.x_out, stream=s), before=self.std_dispatch())
        elif case.target == "dispatch_plan":  # each path starts from the plan's standard call
            c = Call(self.dplan, [self.x, self.ids], dict(expert_scales=self.w, stream=s), before=self.std_plans)
        else:
            p = self.dplan.outputs

            def before() -> None:  # the standard round, then the dispatch this combine is fed from
                self.std_plans()
                self.dplan(self.x, self.ids, expert_scales=self.w, stream=s)

            c = Call(self.cplan, [p.expand_x, self.ids, p.assist_info_for_combine, p.ep_recv_counts, self.w],
                     dict(stream=s), before=before)
        for m in case.mutations:
            getattr(self, f"_{m[0]}")(case, c, *m[1:])
        return c

    def _tensor(self, case: Case, c: Call, name: str, kind: str) -> None:
        where = TARGETS[case.target]["tensors"][name]
        t = c.args[where] if isinstance(where, int) else c.kwargs[where]
        value = self._tensor_variant(t, kind)
        c.keep.append(value)
        if isinstance(where, int):
            c.args[where] = value
        else:
            c.kwargs[where] = value

    def _tensor_variant(self, t: Any, kind: str) -> Any:
        acl = self.acl
        host = self.snapshot[id(t)]
        if kind == "host":
            return host
        if kind == "host_int64":
            return host.astype(np.int64)
        if kind == "host_float64":
            return host.astype(np.float64)
        if kind == "list":
            return host.tolist()
        if kind == "wrong_dtype":
            other = np.float16 if host.dtype != np.float16 else np.float32
            return acl.Tensor.from_numpy(host.astype(np.int64 if host.dtype == np.int32 else other))
        if kind == "wrong_shape":
            return acl.Tensor.from_numpy(host[:-1] if host.shape[0] > 1 else np.concatenate([host, host]))
        if kind == "strided":  # every other element of a buffer twice as long in the last dimension
            wide = np.repeat(host, 2, axis=-1)
            owner = acl.Tensor.from_numpy(wide)
            return acl.Tensor.from_address(owner.ptr, host.shape, owner.dtype, strides=owner.strides[:-1] + (2,),
                                           owner=owner)
        if kind == "offset_view":  # the same values after 16 elements of something else
            flat = np.concatenate([np.zeros(16, host.dtype), host.reshape(-1)])
            owner = acl.Tensor.from_numpy(flat)
            return acl.Tensor.from_address(owner.ptr, host.shape, owner.dtype, offset=16, owner=owner)
        if kind == "closed":
            closed = acl.Tensor.from_numpy(host)
            closed.descriptor()
            closed.close()
            return closed
        if kind == "subclass":
            return SubTensor(t.ptr, t.shape, t.dtype, t.strides, t.offset, owner=t)
        if kind == "fresh":
            return acl.Tensor.from_numpy(host)
        if kind == "none":
            return None
        if kind == "not_an_array":
            return "not an array"
        raise AssertionError(kind)

    def _stream(self, case: Case, c: Call, kind: str) -> None:
        if kind == "current":
            c.kwargs.pop("stream")
        elif kind == "closed":
            closed = self.acl.Device.current().create_stream()
            closed.close()
            c.kwargs["stream"] = closed
        elif kind == "stream_like":  # any object naming a stream (the __acl_stream__ protocol)
            c.kwargs["stream"] = StreamLike(self.stream.__acl_stream__())
        else:
            c.kwargs["stream"] = {"handle": self.stream.handle, "bool": True, "huge": 2**70, "other": self.other}[kind]

    def _call(self, case: Case, c: Call, kind: str) -> None:
        from aclnn_py.ops import DispatchOutputs

        acl, kw = self.acl, c.kwargs
        if kind == "misspelt":
            kw["strem" if "stream" in kw else "confg"] = self.stream
        elif kind == "attrs":
            del kw["config"]
            kw.update(self.attrs)
        elif kind == "attrs_bool":
            del kw["config"]
            kw.update(self.attrs, ep_world_size=True)
        elif kind == "attrs_huge":
            del kw["config"]
            kw.update(self.attrs, moe_expert_num=2**70)
        elif kind == "huge_ccl_attr":
            del kw["config"]
            kw.update(self.attrs, ccl_buffer_size=2**64)
        elif kind == "config_and_attrs":
            kw["ep_world_size"] = self.attrs["ep_world_size"]
        elif kind == "precheck_false":
            kw["precheck"] = False
        elif kind == "precheck_int":
            kw["precheck"] = 1
        elif kind == "precheck_numpy_bool":
            kw["precheck"] = np.bool_(True)
        elif kind == "outputs_allocated":
            del kw["outputs"]
        elif kind == "outputs_mapping_with_none":
            kw["outputs"] = {"expand_x": self.d.expand_x, "ep_recv_counts": self.d.ep_recv_counts,
                             "tp_recv_counts": None}
        elif kind == "outputs_optional_none":  # CANN: outputs a caller may leave NULL (no weights here)
            kw["outputs"] = self.d._replace(tp_recv_counts=None, expand_scales=None)
        elif kind == "outputs_required_none":  # a NULL phase 1 needs: its 161001, on both paths
            kw["outputs"] = self.d._replace(dynamic_scales=None)
        elif kind == "outputs_closed":
            closed = acl.Tensor.empty(self.d.ep_recv_counts.shape, self.d.ep_recv_counts.dtype)
            closed.close()
            kw["outputs"] = self.d._replace(ep_recv_counts=closed)
        elif kind == "outputs_tuple":
            kw["outputs"] = tuple(self.d)
        elif kind == "outputs_misspelt_name":
            kw["outputs"] = {"expand_X": self.d.expand_x}
        elif kind == "outputs_wrong_shape":
            kw["outputs"] = self.d._replace(expand_x=acl.Tensor.empty((1, H), self.d.expand_x.dtype))
        elif kind == "x_dtype":
            kw["x_dtype"] = bfloat16
        elif kind == "x_out_allocated":
            del kw["x_out"]
        elif kind == "x_out_closed":
            closed = acl.Tensor.empty(self.x_out.shape, self.x_out.dtype)
            closed.close()
            kw["x_out"] = closed
        elif kind == "x_out_wrong_dtype":
            kw["x_out"] = acl.Tensor.empty(self.x_out.shape, np.float16)
        elif kind == "x_out_host":
            kw["x_out"] = np.zeros(self.x_out.shape, bfloat16)
        elif kind == "closed_plan":
            c.fn = self.closed_dplan if c.fn is self.dplan else self.closed_cplan
        elif kind == "plan_outputs":
            kw["outputs"] = DispatchOutputs(*(acl.Tensor.empty(t.shape, t.dtype) for t in self.dplan.outputs))
        elif kind == "plan_outputs_with_none":
            own = self.dplan.outputs
            kw["outputs"] = own._replace(expand_x=acl.Tensor.empty(own.expand_x.shape, own.expand_x.dtype),
                                         assist_info_for_combine=None, ep_recv_counts=None)
        elif kind == "plan_outputs_closed":
            closed = [acl.Tensor.empty(t.shape, t.dtype) for t in self.dplan.outputs]
            closed[0].close()
            kw["outputs"] = DispatchOutputs(*closed)
        elif kind == "plan_outputs_wrong_shape":
            own = self.dplan.outputs
            kw["outputs"] = own._replace(expand_x=acl.Tensor.empty((1, H), own.expand_x.dtype))
        elif kind == "plan_x_out":
            kw["x_out"] = acl.Tensor.empty(self.cplan.x_out.shape, self.cplan.x_out.dtype)
        elif kind == "plan_x_out_closed":
            closed = acl.Tensor.empty(self.cplan.x_out.shape, self.cplan.x_out.dtype)
            closed.close()
            kw["x_out"] = closed
        elif kind == "plan_x_out_wrong_dtype":
            kw["x_out"] = acl.Tensor.empty(self.cplan.x_out.shape, np.float16)
        elif kind == "absent_input_given":
            kw["x_active_mask"] = np.ones(BS, bool)
        else:
            raise AssertionError(kind)
        c.keep.append(dict(kw))

    # running it
    def run(self, c: Call) -> tuple[tuple[Any, ...], int, bool]:
        """The outcome of the call — ("ok", digests of the outputs it returned) or ("raise", type, message)
        —, how many times the call reached a Python function, and whether an exception it raised is a
        typed refusal (TypeError, ValueError or the package's errors), not a crash of the code."""
        for t in [*self.outputs(), *given_outputs(c.kwargs)]:
            t.fill_bytes(0)
        if c.before is not None:
            c.before()
            self.sync()  # the call may use another stream: its collective must come after these
        before = reached_python()
        try:
            result = c.fn(*c.args, **c.kwargs)
        except Exception as e:
            reached = reached_python() - before
            self.sync()
            typed = isinstance(e, (TypeError, ValueError, self.acl.AclnnPyError))
            return ("raise", type(e).__name__, str(e)), reached, typed
        reached = reached_python() - before
        try:  # a launch accepted but failed on the device, as an outcome of the case (the stream goes on)
            self.sync()
            return ("ok", digest(result)), reached, True
        except self.acl.AclnnPyError as e:
            return ("failed on the stream", type(e).__name__, str(e)), reached, True


def given_outputs(kwargs: dict[str, Any]) -> list[Any]:
    """The open, contiguous output Tensors a call was given (zeroed before each path writes them)."""
    from aclnn_py.tensor import Tensor

    given = kwargs.get("outputs", kwargs.get("x_out"))
    items = given.values() if isinstance(given, dict) else given if isinstance(given, tuple) else [given]
    return [t for t in items if isinstance(t, Tensor) and not t.closed and t.is_contiguous]


def digest(result: Any) -> tuple[Any, ...]:
    """Per returned output (a Tensor, or the fields of DispatchOutputs): its type, shape and dtype and a
    hash of its bytes (numpy() waits for the stream that wrote it), or None."""
    items = list(result._asdict().items()) if hasattr(result, "_asdict") else [("result", result)]
    out = []
    for name, t in items:
        if t is None:
            out.append((name, None))
        else:
            out.append((name, type(t).__name__, t.shape, t.dtype.name, hashlib.sha256(t.numpy().tobytes()).hexdigest()))
    return tuple(out)


_reached = threading.local()  # n: this thread's calls that reached a Python function


def reached_python() -> int:
    return getattr(_reached, "n", 0)


def count_reaching(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, counting its calls in this thread's :func:`reached_python`."""
    def counted(*args: Any, **kwargs: Any) -> Any:
        _reached.n = reached_python() + 1
        return function(*args, **kwargs)
    return counted


def _rank_body(rank: int, world_size: int, root: bytes, cases: list[Case],
               barrier: threading.Barrier) -> list[tuple[tuple[Any, ...], ...]]:
    import aclnn_py as acl
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator
    from aclnn_py.ops import set_compiled_path

    results = []
    with Communicator(world_size, rank, root) as comm, MoeDistributeBuffer(comm) as buf:
        r = Rank(acl, buf, rank)
        for plan in (r.dplan, r.cplan, r.closed_dplan, r.closed_cplan):
            plan._run = count_reaching(plan._run)  # the plans' Python step
        for case in cases:
            call = r.call(case)
            outcomes = []
            for path in PATHS:
                barrier.wait()  # one rank switches the process-wide setting while neither calls
                if rank == 0:
                    set_compiled_path(path == "compiled")
                barrier.wait()
                outcomes.append(r.run(call))
            results.append(tuple(outcomes))
            del call
        barrier.wait()
        if rank == 0:
            set_compiled_path(True)
        for s in (r.stream, r.other):
            s.close()
    return results


def describe(case: Case) -> str:
    return f"case {case.index} (seed {SEED}): {case.target} with {list(case.mutations) or 'no mutation'}"


def test_compiled_and_python_paths_agree(acl, monkeypatch):
    from aclnn_py.launch import run_threads
    from aclnn_py.ops import compiled_path_enabled

    for op in ("dispatch", "combine"):  # the operators' Python step
        module = sys.modules[f"aclnn_py.ops.{op}"]
        monkeypatch.setattr(module, "_convert", count_reaching(module._convert))
    cases = draw_cases(N_CASES, SEED)
    per_rank = run_threads(_rank_body, W, cases, threading.Barrier(W, timeout=120), timeout=1200)
    assert compiled_path_enabled()
    differ, unexpected, untyped, python_missed, steady_in_python = [], [], [], [], []
    for case, *outcomes_of_ranks in zip(cases, *per_rank):
        for rank, ((compiled, c_reached, _), (python, p_reached, typed)) in enumerate(outcomes_of_ranks):
            if compiled != python:
                differ.append(f"{describe(case)}, rank {rank}:\n  compiled {compiled}\n  python   {python}")
            want = case.expectation()
            if want is not None and python[0] != ("ok" if want == "ok" else "raise"):
                unexpected.append(f"{describe(case)}, rank {rank}: expected {want}, got {python}")
            if not typed:
                untyped.append(f"{describe(case)}, rank {rank}: {python}")
            # the switch did its work: with the compiled path off a call that succeeded ran in Python;
            # with it on the steady-state calls did not
            if python[0] == "ok" and p_reached == 0:
                python_missed.append(describe(case))
            if not case.mutations and c_reached:
                steady_in_python.append(describe(case))
    assert not differ, f"{len(differ)} difference(s) between the paths:\n" + "\n".join(differ[:10])
    assert not unexpected, f"{len(unexpected)} outcome(s) not as expected:\n" + "\n".join(unexpected[:10])
    assert not untyped, f"{len(untyped)} refusal(s) by an untyped exception:\n" + "\n".join(untyped[:10])
    assert not python_missed, "with the compiled path off, calls that never reached Python:\n" + "\n".join(
        python_missed[:10])
    assert not steady_in_python, "steady-state calls the compiled path left to Python:\n" + "\n".join(
        steady_in_python[:10])
    assert any(not case.mutations for case in cases)
