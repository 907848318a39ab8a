"""Shared machinery of the two-phase op wrappers: argument conversion, output sizing (SPEC §2),
workspaces kept per stream, and the Prepared object that holds one executor."""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _loader
from ..dtypes import as_datatype
from ..errors import check_aclnn
from ..runtime import DeviceMemory, Stream, _b, as_stream, stream_key
from ..tensor import Tensor


def tensor_arg(value: Any, stream: Any = None, dtype: Any = None) -> Tensor | None:
    """None, a Tensor, or a host array (uploaded on `stream`)."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        return value
    return Tensor.from_numpy(np.asarray(value), stream=stream, dtype=dtype)


def desc(t: Tensor | None) -> Any:
    """The aclTensor* of an optional tensor (NULL for None)."""
    if t is None:
        return _b().ffi.NULL
    d = t._desc
    return d if d is not None else t.descriptor()


def empty_weights() -> Tensor:
    """A (0,) float32 tensor: combine's "no expert_scales" (unweighted sum, SPEC §6.2). One per
    thread, made once; its memory is never read."""
    t = getattr(_cells, "empty_weights", None)
    if t is None:
        t = _cells.empty_weights = Tensor.empty((0,), np.float32)
    return t


def normalized_shared(shared_expert_num: int, shared_expert_rank_num: int) -> int:
    """S as the tiling sees it: R == 0 and S == 1 is the default "no shared expert" pair → 0."""
    return 0 if shared_expert_rank_num == 0 and shared_expert_num == 1 else shared_expert_num


def local_expert_num(ep_world_size: int, ep_rank_id: int, moe_expert_num: int,
                     shared_expert_rank_num: int) -> int:
    """1 on a shared rank, L = E / (W − R) on a MoE rank (SPEC §2)."""
    if ep_rank_id < shared_expert_rank_num:
        return 1
    moe_ranks = ep_world_size - shared_expert_rank_num
    return moe_expert_num // moe_ranks if moe_ranks > 0 else 0


def rows_capacity(ep_world_size: int, ep_rank_id: int, moe_expert_num: int, shared_expert_num: int,
                  shared_expert_rank_num: int, global_bs: int, bs: int, topk: int) -> int:
    """A, the rows this rank can receive (SPEC §2)."""
    w, r = ep_world_size, shared_expert_rank_num
    g = global_bs if global_bs else bs * w
    max_bs = g // w
    if ep_rank_id < r:
        s = normalized_shared(shared_expert_num, r)
        per_shared = r // s if s else 1
        return max_bs * math.ceil(w / max(per_shared, 1))
    moe_ranks = w - r
    l_ = moe_expert_num // moe_ranks if moe_ranks > 0 else 0
    return g * min(l_, topk)


def stream_identity(stream: Any) -> int:
    """A key naming one stream of the process: its handle, or for the default stream (the NULL
    handle, which names each device's own default stream) -1 - the current device."""
    key = stream_key(stream)
    if key == 0:
        from ..runtime import Device

        key = -1 - Device.current().id
    return key


class WorkspacePool:
    """One growing workspace per (thread, stream): consecutive launches on a stream are ordered, so
    they may share it. Growing synchronises the stream before the old block is freed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[int, DeviceMemory] = {}

    def get(self, size: int, stream: Any) -> DeviceMemory | None:
        if size == 0:
            return None
        key = stream_identity(stream)
        with self._lock:
            mem = self._blocks.get(key)
            if mem is not None and mem.size >= size:
                return mem
        if mem is not None:
            Stream.from_handle(key).synchronize() if key > 0 else Stream.default().synchronize()
            mem.close()
        mem = DeviceMemory(size)
        with self._lock:
            self._blocks[key] = mem
        return mem

    def clear(self) -> None:
        with self._lock:
            blocks, self._blocks = self._blocks, {}
        for m in blocks.values():
            m.close()


workspaces = WorkspacePool()


class KeepAlive:
    """Keeps Python objects (uploaded inputs, outputs) alive until the stream has passed the point
    where they were used, like a stream-ordered allocator: memory freed earlier would be read or
    written by a queued kernel.

    Per stream, launches are grouped: every ``batch``-th launch records an event that closes the
    group of objects held since the previous one; groups are released oldest first once their event
    has completed (events on one stream complete in order). An open group is never released early,
    only later; ``flush`` closes it at once (``MoeDistributeBuffer.synchronize`` does)."""

    batch = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, list[Any]] = {}
        self._closed: dict[int, collections.deque[tuple[Any, list[Any]]]] = {}
        self._free_events: list[Any] = []

    def hold(self, stream: Any, objects: Any) -> None:
        key = stream_identity(stream)
        with self._lock:
            group = self._open.setdefault(key, [])
            group.append(objects)
            full = len(group) >= self.batch
        if full:
            self._close(key, stream)

    def flush(self, stream: Any) -> None:
        """Close `stream`'s open group now (release happens once the stream passes this point)."""
        key = stream_identity(stream)
        with self._lock:
            has_open = bool(self._open.get(key))
        if has_open:
            self._close(key, stream)

    def _close(self, key: int, stream: Any) -> None:
        from ..runtime import Event

        with self._lock:
            ev = self._free_events.pop() if self._free_events else None
        if ev is None:
            ev = Event()
        ev.record(stream)
        with self._lock:
            group = self._open.pop(key, [])
            q = self._closed.setdefault(key, collections.deque())
            q.append((ev, group))
            self._release(q)

    def _release(self, q: collections.deque[tuple[Any, list[Any]]]) -> None:
        while q and q[0][0].query():
            ev, _ = q.popleft()
            self._free_events.append(ev)

    def reap(self) -> int:
        """Release the closed groups that completed; returns how many launches are still held."""
        with self._lock:
            for q in self._closed.values():
                self._release(q)
            return sum(len(g) for q in self._closed.values() for _, g in q) + sum(
                len(g) for g in self._open.values())


keepalive = KeepAlive()


class Prepared:
    """Phase 1 done: an executor, its workspace size, and the tensors it refers to.

    ``launch`` runs phase 2. A normal executor is consumed by its launch; a repeatable one
    (``repeatable=True`` at prepare time) may be launched again, after ``rebind_input`` /
    ``rebind_output`` moved its tensors to new addresses, and is destroyed by ``close``."""

    op: str = ""
    _launch_name: str = ""

    def __init__(self, executor: Any, workspace_size: int, inputs: Sequence[Tensor | None],
                 outputs: Sequence[Tensor | None], repeatable: bool):
        self._executor = executor
        self.workspace_size = int(workspace_size)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.repeatable = repeatable
        self._launched = False

    def _launch_fn(self) -> Any:
        return getattr(_b().lib, self._launch_name)

    def launch(self, stream: Any = None, workspace: DeviceMemory | Tensor | int | None = None) -> None:
        """Phase 2 on `stream` (default: the current device's default stream). Without `workspace`
        one is taken from a per-stream pool."""
        b = _b()
        if workspace is None:
            mem = workspaces.get(self.workspace_size, stream)
            ws_ptr = mem.ptr if mem is not None else 0
        elif isinstance(workspace, (DeviceMemory, Tensor)):
            ws_ptr = workspace.ptr
        else:
            ws_ptr = int(workspace)
        ret = self._launch_fn()(b.ffi.cast("void *", ws_ptr), self.workspace_size, self._executor, as_stream(stream))
        if not self.repeatable:
            self._launched = True
        check_aclnn(ret, self._launch_name)
        if not self.repeatable:  # a plan keeps its own tensors; a one-shot call must not free them early
            keepalive.hold(stream, (self.inputs, self.outputs))

    def _rebind(self, api: str, index: int, tensor: Tensor, slots: list[Tensor | None]) -> None:
        b = _b()
        old = slots[index] if 0 <= index < len(slots) else None
        target = old if old is not None else tensor
        ret = getattr(b.lib, api)(self._executor, index, target.descriptor(), b.ffi.cast("void *", tensor.ptr))
        check_aclnn(ret, api)
        if old is not None:
            # The executor now addresses `tensor`'s memory through `old`'s descriptor; keep both alive.
            old.ptr = tensor.ptr
            old._owner = (old._owner, tensor)

    def rebind_input(self, index: int, tensor: Tensor) -> None:
        """``aclSetInputTensorAddr``: input `index` (C parameter order) now reads `tensor`'s memory
        (same shape and dtype)."""
        self._rebind("aclSetInputTensorAddr", index, tensor, self.inputs)

    def rebind_output(self, index: int, tensor: Tensor) -> None:
        """``aclSetOutputTensorAddr``: output `index` now writes into `tensor`'s memory."""
        self._rebind("aclSetOutputTensorAddr", index, tensor, self.outputs)

    def close(self) -> None:
        """Destroy a repeatable executor (a normal one is freed by its launch)."""
        if self.repeatable and self._executor is not None:
            ex, self._executor = self._executor, None
            b = _loader.loaded()
            if b is not None:
                check_aclnn(b.lib.aclDestroyAclOpExecutor(ex), "aclDestroyAclOpExecutor")

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "repeatable", False) and getattr(self, "_executor", None) is not None:
            try:
                self.close()
            except Exception:
                pass


def out_tensor(given: Any, shape: Sequence[int], dtype: Any) -> Tensor:
    """A caller-provided output (Tensor) or a new one of the SPEC §2 shape."""
    if given is not None:
        if not isinstance(given, Tensor):
            raise TypeError("outputs must be Tensors (device memory the op writes into)")
        return given
    return Tensor.empty(shape, as_datatype(dtype))


def executor_cells() -> tuple[Any, Any]:
    """Per-thread reusable (uint64_t *workspaceSize, aclOpExecutor **executor) cells."""
    tls = _cells
    ws = getattr(tls, "ws", None)
    if ws is None:
        ffi = _b().ffi
        tls.ws = ws = ffi.new("uint64_t *")
        tls.ex = ffi.new("aclOpExecutor **")
    return ws, tls.ex


_cells = threading.local()



_NOT_A_TENSOR = object()  # marks a plan slot whose next call must be checked again


class Plan:
    """A prepared op with fixed shapes, dtypes and attributes, launched many times (DESIGN.md §3.2).

    One phase 1 with a repeatable executor (``aclSetAclOpExecutorRepeatable``); the plan owns a
    device buffer per input and output and its workspace. Each call either copies host arrays into
    those buffers (stream-ordered) or, for Tensors at other addresses, rebinds the executor's slot
    with ``aclSetInputTensorAddr`` / ``aclSetOutputTensorAddr``, then launches. Nothing is
    allocated per call. Inputs that were absent at plan time stay absent; a different shape or
    dtype is refused (AclnnParamInvalid) — build another plan for it."""

    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()

    def __init__(self, prepared: Prepared):
        self._prep = prepared
        self._own_in = list(prepared.inputs)
        self._own_out = list(prepared.outputs)
        self._bound_in = [t.data_ptr if t is not None else 0 for t in self._own_in]
        self._bound_out = [t.data_ptr if t is not None else 0 for t in self._own_out]
        self._ws = DeviceMemory(prepared.workspace_size) if prepared.workspace_size else None
        b = _b()
        self._lib = b.lib
        self._ffi = b.ffi
        self._launch = getattr(b.lib, prepared._launch_name)
        self._ws_ptr = b.ffi.cast("void *", self._ws.ptr if self._ws is not None else 0)
        self._ws_size = prepared.workspace_size
        self._executor = prepared._executor
        self._op = prepared._launch_name
        # what each slot was given last call; a present input starts "unset" so None is refused
        self._last_in: list[Any] = [_NOT_A_TENSOR if t is not None else None for t in self._own_in]
        self._last_out: list[Any] = [None] * len(self._own_out)
        self._last_stream: Any = _NOT_A_TENSOR
        self._last_stream_handle: Any = None

    @property
    def workspace_size(self) -> int:
        return self._ws_size

    def _refuse(self, message: str) -> Exception:
        from ..errors import param_invalid

        return param_invalid(self._op, message)

    def _set(self, index: int, value: Any, stream: Any, output: bool) -> None:
        last = self._last_out if output else self._last_in
        if value is last[index]:
            return  # the same Tensor (or None) as last call: already checked and bound
        own = (self._own_out if output else self._own_in)[index]
        bound = self._bound_out if output else self._bound_in
        name = (self.output_names if output else self.input_names)[index]
        if own is None:
            if value is not None:
                raise self._refuse(f"{name}: this plan was built without it; build a plan with {name}")
            return
        remember: Any = value
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
            arr = np.asarray(value)
            if arr.shape != own.shape:
                raise self._refuse(f"{name}: the plan is fixed to shape {own.shape} (got {arr.shape})")
            target = own.data_ptr
            own.copy_from(arr, stream)
            remember = _NOT_A_TENSOR  # host arrays are copied on every call
        if target != bound[index]:
            api = "aclSetOutputTensorAddr" if output else "aclSetInputTensorAddr"
            ret = getattr(self._lib, api)(self._executor, index, own.descriptor(), self._ffi.cast("void *", target))
            check_aclnn(ret, api)
            bound[index] = target
        last[index] = remember

    def _run(self, in_slots: tuple[int, ...], in_values: tuple[Any, ...], out_values: Any, stream: Any) -> None:
        """Bind this call's inputs (slot indices `in_slots`) and outputs, then launch phase 2."""
        last = self._last_in
        for i, v in zip(in_slots, in_values):
            if v is not last[i]:  # unchanged slots cost one identity test, no call
                self._set(i, v, stream, False)
        if out_values is not None:
            for j, v in enumerate(out_values):
                self._set(j, v, stream, True)
        elif self._last_out[0] is not None:
            for j in range(len(self._own_out)):
                self._set(j, None, stream, True)
        if stream is not self._last_stream:
            self._last_stream_handle = as_stream(stream)
            self._last_stream = stream
        ret = self._launch(self._ws_ptr, self._ws_size, self._executor, self._last_stream_handle)
        if ret:
            check_aclnn(ret, self._op)

    def close(self) -> None:
        """Destroy the executor and free the plan's buffers (after the stream finished with them)."""
        self._prep.close()
        for t in self._own_in[1:] + self._own_out:  # input 0 is the caller's context tensor
            if t is not None:
                t.close()
        if self._ws is not None:
            self._ws.close()

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
