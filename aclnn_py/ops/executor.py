"""Phase 1 done: a :class:`Prepared` call — an executor, its workspace size and the tensors it refers
to — whose :meth:`~Prepared.launch` runs phase 2 through the operator's launcher (the compiled core's),
holding what the queued launch uses until the stream passes it and marking the outputs' writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from .._core import Launcher, destroy_executor_at, private_view
from ..errors import ClosedError, check_aclnn, param_invalid
from ..runtime import DeviceMemory, Resource, StreamArg, initialized, resolve_stream
from ..tensor import Tensor


class Prepared(Resource):
    """Phase 1 done: an executor, its workspace size, and the tensors it refers to.

    :meth:`launch` runs phase 2. A normal executor is consumed by its launch; a repeatable one
    (``repeatable=True`` at prepare time) may be launched again, after :meth:`rebind_input` /
    :meth:`rebind_output` moved its tensors to new addresses, and is destroyed by :meth:`close`."""

    __slots__ = ("_open", "_launcher", "_executor_address", "workspace_size", "inputs", "outputs", "repeatable",
                 "__weakref__")

    def __init__(self, launcher: Launcher, executor: int, workspace_size: int, inputs: Sequence[Tensor | None],
                 outputs: Sequence[Tensor | None], repeatable: bool):
        self._launcher = launcher
        self._executor_address = int(executor)
        #: Bytes of workspace phase 2 needs.
        self.workspace_size = int(workspace_size)
        #: The tensors the executor reads, in the operator function's order (None: absent).
        self.inputs = list(inputs)
        #: The tensors it writes.
        self.outputs = list(outputs)
        #: Whether it may be launched again (``aclSetAclOpExecutorRepeatable``).
        self.repeatable = repeatable
        self._open = True

    @property
    def executor(self) -> Any:
        """The ``aclOpExecutor *``."""
        return initialized().ffi.cast("aclOpExecutor *", self._executor_address)

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
        self._launcher.launch_executor(self._executor_address, self.workspace_size, s, self.inputs, self.outputs, ws)

    def _rebind(self, api: str, index: int, tensor: Tensor, slots: list[Tensor | None]) -> None:
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
        positions = self._launcher.input_positions if slots is self.inputs else self._launcher.output_positions
        if index not in positions:
            raise param_invalid(api, f"index {index}: {self._launcher.phase2_name} has no such tensor")
        b = initialized()
        check_aclnn(getattr(b.lib, api)(self.executor, positions.index(index), view.descriptor(),
                                        b.ffi.cast("void *", tensor.ptr)), api)
        # the executor's private view now addresses `tensor`'s memory, and keeps it allocated
        view._ptr = tensor._ptr
        view._owner = tensor._export()

    def rebind_input(self, index: int, tensor: Tensor) -> None:
        """``aclSetInputTensorAddr``: input `index` (the operator function's order) now reads `tensor`'s
        memory (same shape and dtype)."""
        self._rebind("aclSetInputTensorAddr", index, tensor, self.inputs)

    def rebind_output(self, index: int, tensor: Tensor) -> None:
        """``aclSetOutputTensorAddr``: output `index` now writes into `tensor`'s memory."""
        self._rebind("aclSetOutputTensorAddr", index, tensor, self.outputs)

    def _release(self) -> None:
        # reached while open: a repeatable executor, or a one-shot one never launched (a launch consumes
        # it and closes this object), which nothing else would destroy
        check_aclnn(destroy_executor_at(self._executor_address), "aclDestroyAclOpExecutor")

    def _label(self) -> str:
        return f"Prepared({self._launcher.phase2_name}, {'repeatable' if self.repeatable else 'one-shot'})"


def phase1(launcher: Launcher, config: Any, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None],
           repeatable: bool, result_set: bool = False) -> tuple[int, int, list[Tensor | None], list[Tensor | None]]:
    """Phase 1 of `launcher`'s operator on `inputs` and `outputs` (the operator function's order): its
    workspace size, executor address, and the tensors the executor refers to — with `repeatable`, private
    views of them (:func:`private_views`), and an executor that may be launched again
    (``aclSetAclOpExecutorRepeatable``). The views export the memory they view, except a
    MoeDistributeBuffer result set's (`result_set`): its every launch binds the call's inputs first, so
    their views keep nothing, and its outputs are the set's own, which their views hold as the set does."""
    if repeatable:
        ins = private_views(inputs, "nothing" if result_set else "export")
        outs = private_views(outputs, "memory" if result_set else "export")
    else:
        ins, outs = list(inputs), list(outputs)
    ws_size, executor = launcher.phase1(ins, outs, config)
    if repeatable:
        b = initialized()
        status = b.lib.aclSetAclOpExecutorRepeatable(b.ffi.cast("aclOpExecutor *", executor))
        if status:
            b.lib.aclDestroyAclOpExecutor(b.ffi.cast("aclOpExecutor *", executor))  # nothing else would
            check_aclnn(status, "aclSetAclOpExecutorRepeatable")
    return ws_size, executor, ins, outs


Hold = Literal["export", "memory", "nothing"]  # what a private view keeps of its Tensor's memory


def private_views(tensors: Sequence[Tensor | None], hold: Hold) -> list[Tensor | None]:
    """Views with descriptors of their own, for a repeatable executor: rebinding its slots changes the
    addresses of these descriptors, never those of the caller's Tensors. What each keeps of its Tensor's
    memory: `hold` (:func:`aclnn_py._core.private_view`)."""
    return [None if t is None else private_view(t, hold) for t in tensors]
