"""Executors of the two-phase operators: a :class:`Prepared` call (phase 1 done, one executor) and a
:class:`Plan` (a repeatable executor with its own buffers, launched many times).

Phase 2 runs on a stream with that stream's workspace; what the queued launch uses is held until the
stream passes it, and every output remembers the stream as its writer (``Tensor.numpy()`` waits for it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..errors import AclnnParamInvalid, ClosedError, check_aclnn, param_invalid
from ..hccl import watch_context
from ..runtime import (
    DeviceMemory,
    Resource,
    Stream,
    StreamArg,
    initialized,
    order_after_writes,
    ordered,
    resolve_stream,
)
from ..tensor import Tensor, destroy_descriptor
from ._args import as_int32, check_given_outputs, host_array, wrong_dtype

F = TypeVar("F", bound=Callable[..., object])
P = TypeVar("P", bound="Plan")

if TYPE_CHECKING:
    from .._core import PlanBase, PlanState
else:
    try:  # compiled: the package imports without it (and then explains what is missing)
        from .._core import PlanBase
    except ImportError:
        PlanBase = object


def compiled_plan_call(result: str) -> Callable[[F], F]:
    """Decorate a plan class's ``__call__`` so that its steady-state calls are parsed and launched by the
    compiled core (``aclnn_py._core.PlanCall``), which then returns the plan's attribute `result` (a
    read-only property: the plan's compiled state holds the object it gives); every other call runs the
    decorated function. Without the compiled parts the function stays as it is."""
    try:
        from .._core import compiled_plan_call as compiled
    except ImportError:
        return lambda function: function
    return compiled(result)


def compiled_plan_class(cls: type[P]) -> type[P]:
    """Decorate a plan class: the class its instances are made from becomes a subclass of `cls` made by
    the compiled core (``aclnn_py._core.compiled_plan_class``), with `cls`'s name and doc and nothing
    added, whose instances are called without packing their arguments (``plan(...)`` in a serving loop).
    Without the compiled parts the class stays as it is."""
    try:
        from .._core import compiled_plan_class as compiled
    except ImportError:
        return cls
    made: type[P] = compiled(cls)
    return made


def launch(fn: Any, name: str, executor: Any, workspace_size: int, stream: Stream, inputs: Sequence[Tensor | None],
           outputs: Sequence[Tensor | None], workspace: int | None = None) -> None:
    """Phase 2 of a one-shot executor on `stream`: the stream's workspace (unless given), the launch,
    then the stream-ordered hold of every tensor it uses and the outputs' writer."""
    held = _anchors(inputs, outputs)
    order_after_writes(stream, inputs)
    if workspace is not None:
        ws = workspace
    else:
        ws_ptr, ws_cap = ordered.workspace_block(stream)
        ws = (ws_ptr if workspace_size else 0) if workspace_size <= ws_cap else ordered.workspace(stream, workspace_size)
    ret = fn(initialized().ffi.cast("void *", ws), workspace_size, executor, stream._cdata)
    ordered.hold(stream, held)  # after queueing: released by a later synchronisation
    if ret:
        check_aclnn(ret, name)
    for t in outputs:
        if t is not None:
            t._writer = stream


def _anchors(inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None]) -> list[object]:
    """What keeps each tensor's memory valid until the stream passes a launch (Tensor._anchor)."""
    return [t._anchor() for group in (inputs, outputs) for t in group if t is not None]


class Prepared(Resource):
    """Phase 1 done: an executor, its workspace size, and the tensors it refers to.

    :meth:`launch` runs phase 2. A normal executor is consumed by its launch; a repeatable one
    (``repeatable=True`` at prepare time) may be launched again, after :meth:`rebind_input` /
    :meth:`rebind_output` moved its tensors to new addresses, and is destroyed by :meth:`close`."""

    __slots__ = ("_open", "_executor", "workspace_size", "inputs", "outputs", "repeatable", "_launch_name",
                 "__weakref__")

    def __init__(self, launch_name: str, executor: Any, workspace_size: int, inputs: Sequence[Tensor | None],
                 outputs: Sequence[Tensor | None], repeatable: bool):
        self._launch_name = launch_name
        self._executor = executor
        self.workspace_size = int(workspace_size)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.repeatable = repeatable
        self._open = True

    def launch(self, stream: StreamArg = None, workspace: DeviceMemory | Tensor | int | None = None) -> None:
        """Phase 2 on `stream` (default: the current stream). Without `workspace` the stream's own is
        used."""
        if not self._open:
            raise ClosedError(self._label(), "launch it (a normal executor is consumed by its first launch; "
                              "prepare with repeatable=True to launch again)")
        s = resolve_stream(stream)
        ws = None if workspace is None else workspace.ptr if isinstance(workspace, (DeviceMemory, Tensor)) \
            else int(workspace)
        if not self.repeatable:
            self._open = False  # consumed by the launch, whatever its outcome
        launch(getattr(initialized().lib, self._launch_name), self._launch_name, self._executor,
               self.workspace_size, s, self.inputs, self.outputs, ws)

    def _rebind(self, api: str, index: int, tensor: Tensor, slots: list[Any]) -> None:
        if not self._open:
            raise self._closed("rebind it")
        if not self.repeatable:
            raise ValueError(f"{self._label()}: only a repeatable executor can be rebound (prepare with repeatable=True)")
        view = slots[index] if 0 <= index < len(slots) else None
        if view is None:
            raise param_invalid(api, f"index {index}: the executor has no tensor in that slot")
        if (tensor.shape, tensor.dtype, tensor.strides, tensor.offset) != (view.shape, view.dtype, view.strides,
                                                                           view.offset):
            raise param_invalid(api, f"index {index}: the new tensor must have the layout of the one it replaces "
                                f"({view!r}, got {tensor!r})")
        b = initialized()
        check_aclnn(getattr(b.lib, api)(self._executor, index, view.descriptor(), b.ffi.cast("void *", tensor.ptr)),
                    api)
        # the executor's private view now addresses `tensor`'s memory, and keeps it allocated
        view._ptr = tensor._ptr
        view._owner = tensor._export()

    def rebind_input(self, index: int, tensor: Tensor) -> None:
        """``aclSetInputTensorAddr``: input `index` (C parameter order) now reads `tensor`'s memory
        (same shape and dtype)."""
        self._rebind("aclSetInputTensorAddr", index, tensor, self.inputs)

    def rebind_output(self, index: int, tensor: Tensor) -> None:
        """``aclSetOutputTensorAddr``: output `index` now writes into `tensor`'s memory."""
        self._rebind("aclSetOutputTensorAddr", index, tensor, self.outputs)

    def _release(self) -> None:
        # reached while open: a repeatable executor, or a one-shot one never launched (a launch consumes
        # it and closes this object), which nothing else would destroy
        check_aclnn(initialized().lib.aclDestroyAclOpExecutor(self._executor), "aclDestroyAclOpExecutor")

    def _label(self) -> str:
        return f"Prepared({self._launch_name}, {'repeatable' if self.repeatable else 'one-shot'})"


def private_views(tensors: Sequence[Tensor | None]) -> list[Tensor | None]:
    """Views with descriptors of their own, for a repeatable executor: rebinding its slots changes the
    addresses of these descriptors, never those of the caller's Tensors."""
    return [None if t is None else Tensor(t.ptr, t.shape, t.dtype, t.strides, t.offset, owner=t, device=t.device)
            for t in tensors]


def _launch_failed(args: Any, op: str, status: int) -> None:
    """Raise for a failed aclnnpy_plan_launch, naming the call that failed (its struct says which)."""
    check_aclnn(status, _PLAN_STEPS.get(args.failed, op))
    raise AssertionError(f"{op}: a failed plan launch returned status 0")  # check_aclnn raised


def _release_plan_parts(prepared: Prepared, descriptors: list[Any], anchors: list[object],
                        workspace: DeviceMemory | None) -> None:
    """The end of a closed plan, once its last launch is done: the executor, then the descriptors its
    slots referred to, then the memory `anchors` keep (the plan's buffers', and that of the caller's
    Tensors last bound, which the caller may have closed)."""
    try:
        prepared.close()
    finally:
        for d in descriptors:
            destroy_descriptor(d)
        anchors.clear()
        if workspace is not None:
            workspace.close()


_UNSET = object()  # a plan slot whose next value must be checked again

#: the call aclnnpy_plan_launch reports as failed, when it is not the launch
_PLAN_STEPS = {1: "aclSetInputTensorAddr", 2: "aclSetOutputTensorAddr"}


class Plan(Resource, PlanBase):
    """A prepared op with fixed shapes, dtypes and attributes, launched many times.

    One phase 1 with a repeatable executor (``aclSetAclOpExecutorRepeatable``); the plan owns a device
    buffer per input and output and its workspace. Each call either copies host arrays into those
    buffers (stream-ordered) or, for Tensors at other addresses, rebinds the executor's slot with
    ``aclSetInputTensorAddr`` / ``aclSetOutputTensorAddr``, then launches. Nothing is allocated per
    call. Inputs that were absent at plan time stay absent; a different shape or dtype is refused
    (AclnnParamInvalid) — build another plan for it."""

    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()

    def __init__(self, prepared: Prepared):
        self._prep = prepared
        self._own_in: list[Tensor | None] = list(prepared.inputs)
        self._own_out: list[Tensor | None] = list(prepared.outputs)
        self._ws = DeviceMemory(prepared.workspace_size) if prepared.workspace_size else None
        b = initialized()
        ffi = b.ffi
        # what aclnnpy_plan_launch reads: per slot the descriptor, the address this step wants and the
        # address the executor holds (absent slots: NULL and 0, never moved); _set writes the wants.
        # The struct points into these arrays, so the plan keeps them.
        self._arrays = (
            ffi.new("aclTensor *[]", [ffi.NULL if t is None else t.descriptor() for t in self._own_in]),
            ffi.new("uintptr_t[]", [0 if t is None else t.data_ptr for t in self._own_in]),
            ffi.new("uintptr_t[]", [0 if t is None else t.data_ptr for t in self._own_in]),
            ffi.new("aclTensor *[]", [ffi.NULL if t is None else t.descriptor() for t in self._own_out]),
            ffi.new("uintptr_t[]", [0 if t is None else t.data_ptr for t in self._own_out]),
            ffi.new("uintptr_t[]", [0 if t is None else t.data_ptr for t in self._own_out]))
        in_desc, self._want_in, bound_in, out_desc, self._want_out, bound_out = self._arrays
        self._ws_size = prepared.workspace_size
        self._op = prepared._launch_name
        self._plan_launch = b.lib.aclnnpy_plan_launch
        self._enter, self._leave = b.lib.aclnnpy_plan_enter, b.lib.aclnnpy_plan_leave
        self._args = ffi.new("struct aclnnpy_plan *", {
            "launch": b.function_pointer(prepared._launch_name), "executor": prepared._executor,
            "n_in": len(self._own_in), "in_desc": in_desc, "in_want": self._want_in, "in_bound": bound_in,
            "n_out": len(self._own_out), "out_desc": out_desc, "out_want": self._want_out, "out_bound": bound_out,
            "workspace": ffi.cast("void *", self._ws.ptr if self._ws is not None else 0),
            "workspace_size": self._ws_size})
        # what each slot was given last call; a present input starts unset so that None is refused
        self._last_in: list[object] = [_UNSET if t is not None else None for t in self._own_in]
        self._last_out: list[object] = [None] * len(self._own_out)
        # per slot, the anchor (Tensor._anchor()) of the caller's Tensor bound there, or None: every later
        # launch reads that memory, and the caller may close the Tensor right after the call
        self._bound_in: list[object] = [None] * len(self._own_in)
        self._bound_out: list[object] = [None] * len(self._own_out)
        self._c_state = None  # set by the subclass (_fast_path); None: every call in Python
        self._stream: Stream | None = None  # of the last launch (the compiled call sets it too)
        self._stale: str | None = None
        self._closed_comm: str | None = None  # the label of the context's communicator once it closed
        self._context: Tensor | None = None
        self._open = True

    def _fast_path(self, in_slots: tuple[int, ...]) -> PlanState | None:
        """The compiled call's state for calls passing inputs `in_slots` (``aclnn_py._core.PlanState``),
        or None when this class's ``__call__`` is not a compiled one (:func:`compiled_plan_call`). The
        compiled ``__call__`` runs the steady state of :meth:`_run` — device Tensors of the plan's layout
        or the same objects as last call, the plan's own outputs, a Stream — and hands every other call
        to the Python ``__call__``. The state holds no reference to the plan."""
        try:
            from .. import _core
        except ImportError:
            return None
        route = getattr(type(self).__call__, "compiled", None)
        if not isinstance(route, _core.PlanCall) or None in self._own_out:  # it marks every own output written
            return None
        b = initialized()
        ffi = b.ffi
        own = self._own_in
        given = {self.input_names[i]: k for k, i in enumerate(in_slots)}
        # per __call__ parameter: the argument it gives, the stream, or one that must be None
        roles = _core.ROLES
        params = tuple(given.get(name, roles["stream"] if name == "stream" else roles["none"]) for name in route.names)

        def address(name: str) -> int:
            return int(ffi.cast("uintptr_t", b.function_pointer(name)))

        return _core.PlanState(
            address("aclnnpy_plan_launch"), address("aclnnpy_plan_enter"), address("aclnnpy_plan_leave"),
            int(ffi.cast("uintptr_t", self._args)), int(ffi.cast("uintptr_t", self._want_in)), in_slots, params,
            self._last_in, tuple(None if t is None else t.shape for t in own),
            tuple(None if t is None else t.dtype for t in own), tuple(self._own_out), self._last_out, self._bound_in,
            Tensor, Stream, functools.partial(_launch_failed, self._args, self._op), ordered.compiled_view(),
            getattr(self, route.result))

    @property
    def workspace_size(self) -> int:
        return self._ws_size

    def invalidate(self, reason: str) -> None:
        """Refuse every later call with `reason` (e.g. the communicator the plan was built for changed)."""
        self._stale = reason
        self._c_state = None

    @property
    def context(self) -> Tensor | None:
        """The context tensor the plan was built with (None: a group-string generation)."""
        return self._context

    def _watch_context(self, context: Tensor | None) -> None:
        self._context = context
        watch_context(self, context)

    def _communicator_closed(self, label: str) -> None:
        """The communicator of the plan's context closed: every later call raises ClosedError naming it."""
        self._closed_comm = label
        self._c_state = None

    def _refuse(self, message: str) -> AclnnParamInvalid:
        return param_invalid(self._op, message)

    def _host_value(self, own: Tensor, name: str, value: object) -> np.ndarray:
        arr = host_array(value, name)
        if arr.shape != own.shape[:-1] + (own.shape[-1] // 2,) and own.dtype.packed and arr.dtype == np.uint8:
            raise self._refuse(f"{name}: the plan is fixed to shape {own.shape} (got {arr.shape} packed bytes)")
        if not own.dtype.packed and arr.shape != own.shape:
            raise self._refuse(f"{name}: the plan is fixed to shape {own.shape} (got {arr.shape})")
        want = own.dtype.numpy_dtype
        if arr.dtype != want:
            if want == np.int32 and arr.dtype.kind in "iu":
                return as_int32(arr, name, self._op)
            if not (own.dtype.packed and arr.dtype == np.uint8):
                raise self._refuse(wrong_dtype(name, own.dtype, arr.dtype))
        return arr

    def _set(self, index: int, value: object, stream: Stream, output: bool) -> None:
        """Check this step's `value` for slot `index` and record the address the launch must bind. The
        plan keeps the memory of a caller's Tensor bound to the slot; the memory of one it replaces was
        used by the launches before, and is held until `stream` passes them."""
        own = (self._own_out if output else self._own_in)[index]
        want = self._want_out if output else self._want_in
        last = self._last_out if output else self._last_in
        name = (self.output_names if output else self.input_names)[index]
        if own is None:
            if value is not None:
                raise self._refuse(f"{name}: this plan was built without it; build a plan with {name}")
            return
        remember: object = value
        if value is None:
            if not output:
                raise self._refuse(f"{name}: this plan was built with it; pass it on every call")
            target = own.data_ptr
        elif isinstance(value, Tensor):
            if value.shape != own.shape or value.dtype != own.dtype or not value.is_contiguous:
                raise self._refuse(f"{name}: the plan is fixed to shape {own.shape} {own.dtype.name} contiguous "
                                   f"(got {value.shape} {value.dtype.name}"
                                   f"{'' if value.is_contiguous else ' strided'})")
            target = value.data_ptr
        else:
            own.copy_from(self._host_value(own, name, value), stream)
            target = own.data_ptr
            remember = _UNSET  # host arrays are copied on every call
        want[index] = target
        last[index] = remember
        self._bind_anchor(index, value._anchor() if isinstance(value, Tensor) else None, stream, output)

    def _bind_anchor(self, index: int, anchor: object, stream: Stream, output: bool) -> None:
        """Keep `anchor` for slot `index`; the one it replaces is held until `stream` passes the launches
        queued so far (those that read its memory)."""
        bound = self._bound_out if output else self._bound_in
        unbound = bound[index]
        if unbound is not anchor:  # by anchor, not Tensor: a view rebound since may have a new one
            bound[index] = anchor
            if unbound is not None:
                ordered.hold(stream, unbound)

    def _run(self, in_slots: tuple[int, ...], in_values: tuple[object, ...], out_values: Sequence[object] | None,
             stream: StreamArg) -> list[Tensor | None]:
        """Bind this call's inputs (slot indices `in_slots`) and outputs, launch phase 2, and return
        the output tensors the launch writes."""
        if not self._open:
            raise self._closed("launch it")
        if self._closed_comm is not None:
            raise ClosedError(self._closed_comm, f"launch {self._label()}, made with a context of it")
        if self._stale is not None:
            raise self._refuse(self._stale)
        if self._enter(self._args):
            raise RuntimeError(f"{self._label()}: called while another thread's call of it is running; a plan runs "
                               "one call at a time (give each thread its own plan)")
        try:
            return self._bind_and_launch(in_slots, in_values, out_values, stream)
        finally:
            self._leave(self._args)

    def _bind_and_launch(self, in_slots: tuple[int, ...], in_values: tuple[object, ...],
                         out_values: Sequence[object] | None, stream: StreamArg) -> list[Tensor | None]:
        s = resolve_stream(stream)
        if out_values is not None:  # checked before anything is bound
            check_given_outputs([self.input_names[i] for i in in_slots], in_values, self.output_names, out_values, s)
        for i, v in zip(in_slots, in_values):
            if v is self._last_in[i]:
                if v is None:
                    continue
                if not v._open:  # type: ignore[attr-defined]
                    raise ClosedError(v._label(), "pass it to an operator")  # type: ignore[attr-defined]
                if v.data_ptr == self._want_in[i]:  # type: ignore[attr-defined]  # a view may have moved
                    continue
            self._set(i, v, s, False)
        if out_values is not None:
            for j, v in enumerate(out_values):
                self._set(j, v, s, True)
            outs = [v if isinstance(v, Tensor) else self._own_out[j] for j, v in enumerate(out_values)]
        else:
            if any(v is not None for v in self._last_out):  # a caller's output is bound: the plan's own again
                for j in range(len(self._own_out)):
                    self._set(j, None, s, True)
            outs = self._own_out
        order_after_writes(s, in_values)
        ret = self._plan_launch(self._args, s._cdata)
        if ret:
            _launch_failed(self._args, self._op, ret)
        self._stream = s
        for t in outs:
            if t is not None:
                t._writer = s
        return outs

    def _release(self) -> None:
        """Destroy the executor and free the plan's buffers — and let go of the caller's Tensors last
        bound — once the stream of the last launch has passed it (a launch may still be queued;
        launches on other streams are ordered before it by the caller, as they share these buffers).
        The plan's Tensors are closed at once."""
        self._c_state = None
        own = [t for t in self._own_in[1:] + self._own_out if t is not None]  # input 0: the caller's context
        anchors = [t._anchor() for t in own]
        anchors += [a for a in self._bound_in + self._bound_out if a is not None]  # the caller's, bound
        self._bound_in[:] = [None] * len(self._bound_in)  # the list the compiled call shares
        self._bound_out[:] = [None] * len(self._bound_out)
        descriptors = [t.detach_descriptor() for t in own]
        for t in own:
            t.close()  # refused from now on; the executor keeps using the descriptors until the release
        ordered.release_after(self._stream, functools.partial(_release_plan_parts, self._prep, descriptors, anchors,
                                                              self._ws))

    def _label(self) -> str:
        return f"{type(self).__name__}({self._op})"
