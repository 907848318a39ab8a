"""What a plan (``aclnn_py._core.DispatchPlan`` / ``CombinePlan``) does rarely, in Python: building it —
its own buffers and the repeatable executor of phase 1 —, copying host data into its buffers,
composing refusals, and deferring its release (``_core.PlanRelease``) until the stream of its last launch
has passed it. The call itself is the compiled core's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .._core import Launcher
from ..dtypes import DataType, DTypeLike, as_datatype
from ..errors import param_invalid
from ..hccl import watch_context
from ..runtime import DeviceMemory, Stream, resolve_stream
from ..runtime.ordered import release_after
from ..tensor import Tensor
from . import combine, dispatch, launchers
from ._args import as_int32, host_array, host_weights, wrong_dtype
from ._caller import OPERATOR_WORDS
from .config import MoeConfig, resolve_config
from .executor import Prepared, phase1

__all__ = ["OPERATOR_WORDS", "build_combine", "build_dispatch", "copy_host_value", "host_weights", "param_invalid",
           "release_after", "resolve_stream", "result_set_executor", "size_of", "watch_context",
           "workspace_memory"]


@dataclass(frozen=True)
class Built:
    """A plan's phase 1, as the plan takes it over."""

    prepared: Prepared
    config: MoeConfig
    launcher: Launcher
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    x_dtype: DataType | None = None
    outputs_type: type | None = None


def build_dispatch(context: Tensor | None, bs: int, hidden: int, topk: int, x_dtype: DTypeLike,
                   config: MoeConfig | None, scales_shape: tuple[int, ...] | None, scales_dtype: DTypeLike | None,
                   mask_shape: tuple[int, ...] | None, with_expert_scales: bool, y_dtype: DTypeLike | None,
                   stream: object, attrs: Mapping[str, int | str]) -> Built:
    """A dispatch plan's buffers (zeros: a plan launched before its inputs were given reads defined
    bytes) and its repeatable executor."""
    cfg = resolve_config(config, attrs)
    xt = Tensor.zeros((bs, hidden), x_dtype)
    ids = Tensor.zeros((bs, topk), DataType.INT32)
    scales = (Tensor.zeros(scales_shape, scales_dtype if scales_dtype is not None else DataType.FLOAT)
              if scales_shape is not None else None)
    mask = Tensor.zeros(mask_shape, DataType.BOOL) if mask_shape is not None else None
    es = Tensor.zeros((bs, topk), DataType.FLOAT) if with_expert_scales else None
    prepared = dispatch.prepare_dispatch(context, xt, ids, config=cfg, scales=scales, x_active_mask=mask,
                                         expert_scales=es, y_dtype=y_dtype, stream=stream,  # type: ignore[arg-type]
                                         repeatable=True)
    return Built(prepared, cfg, launchers.for_config(cfg)[0], dispatch.INPUTS, dispatch.OUTPUTS,
                 as_datatype(x_dtype), dispatch.DispatchOutputs)


def build_combine(context: Tensor | None, a: int, bs: int, hidden: int, topk: int, dtype: DTypeLike,
                  assist_len: int, counts_len: int, config: MoeConfig | None, with_expert_scales: bool,
                  mask_shape: tuple[int, ...] | None, with_shared_expert_x: bool, with_ori_x: bool,
                  const_experts: int, stream: object, attrs: Mapping[str, int | str]) -> Built:
    """A combine plan's buffers and its repeatable executor (unweighted: expert_scales is the (0,) tensor)."""
    cfg = resolve_config(config, attrs)
    if const_experts and const_experts != cfg.const_expert_num:
        cfg = cfg.replace(const_expert_num=const_experts)
    ex = Tensor.zeros((a, hidden), dtype)
    ids = Tensor.zeros((bs, topk), DataType.INT32)
    assist = Tensor.zeros((assist_len,), DataType.INT32)
    counts = Tensor.zeros((counts_len,), DataType.INT32)
    es = Tensor.zeros((bs, topk) if with_expert_scales else (0,), DataType.FLOAT)
    mask = Tensor.zeros(mask_shape, DataType.BOOL) if mask_shape is not None else None
    sx = Tensor.zeros((bs, hidden), dtype) if with_shared_expert_x else None
    ori = Tensor.zeros((bs, hidden), dtype) if with_ori_x else None
    consts = [Tensor.zeros((cfg.const_expert_num, hidden), dtype) if cfg.const_expert_num else None for _ in range(3)]
    tp = Tensor.zeros((2,), DataType.INT32) if cfg.tp_world_size == 2 else None  # the TP domain's per-call counts
    prepared = combine.prepare_combine(context, ex, ids, assist, counts, es, config=cfg, tp_send_counts=tp,
                                       x_active_mask=mask, shared_expert_x=sx, ori_x=ori, const_expert_alpha_1=consts[0],
                                       const_expert_alpha_2=consts[1], const_expert_v=consts[2],
                                       stream=stream, repeatable=True)  # type: ignore[arg-type]
    return Built(prepared, cfg, launchers.for_config(cfg)[1], combine.INPUTS, combine.OUTPUTS)


def result_set_executor(launcher: Launcher, config: MoeConfig, inputs: list[Tensor | None],
                        outputs: list[Tensor | None]) -> Prepared:
    """The repeatable executor a MoeDistributeBuffer result set launches on every call of its layout:
    phase 1 of `launcher`'s operator on the first call's `inputs` and the set's `outputs` (made after
    the pre-checks of the layout passed). Its views of the inputs keep nothing: every launch binds the
    call's inputs first, and a buffer's result passed in stays the buffer's to hand out again. Its views
    of the outputs hold the set's memory without exporting it: no one else sees them."""
    ws_size, executor, ins, outs = phase1(launcher, config, inputs, outputs, True, result_set=True)
    return Prepared(launcher, executor, ws_size, ins, outs, True)


def workspace_memory(size: int) -> DeviceMemory | None:
    """The plan's own workspace (None for 0 bytes)."""
    return DeviceMemory(size) if size else None


def copy_host_value(op: str, own: Tensor, name: str, value: object, stream: Stream) -> None:
    """Copy a host array into the plan's buffer `own` for input `name` (stream-ordered), refusing one of
    another shape or type with the operator's status."""
    own.copy_from(_host_value(op, own, name, value), stream)


def _host_value(op: str, own: Tensor, name: str, value: object) -> np.ndarray:
    arr = host_array(value, name)
    if arr.shape != own.shape[:-1] + (own.shape[-1] // 2,) and own.dtype.packed and arr.dtype == np.uint8:
        raise param_invalid(op, f"{name}: the plan is fixed to shape {own.shape} (got {arr.shape} packed bytes)")
    if not own.dtype.packed and arr.shape != own.shape:
        raise param_invalid(op, f"{name}: the plan is fixed to shape {own.shape} (got {arr.shape})")
    want = own.dtype.numpy_dtype
    if arr.dtype != want:
        if want == np.int32 and arr.dtype.kind in "iu":
            return as_int32(arr, name, op)
        if not (own.dtype.packed and arr.dtype == np.uint8):
            raise param_invalid(op, wrong_dtype(name, own.dtype, arr.dtype))
    return arr


def size_of(value: object) -> int:
    """Elements of a Tensor or an array (weights given to an unweighted combine plan must be empty)."""
    return int(value.size) if isinstance(value, Tensor) else int(np.asarray(value).size)
