"""Combine (docs/operators.md, "Combine"), in every generation the backend exports.

:func:`moe_distribute_combine` runs both phases (its one body is the compiled core's, which calls what
this module holds only for what is rare), :func:`prepare_combine` phase 1, :class:`CombinePlan` launches
one repeatable executor many times; attributes, inputs and streams as for dispatch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from operator import is_not

import numpy as np

from .._core import CombinePlan, Launcher, Operator, moe_distribute_combine, register_operator
from ..dtypes import DataType, DTypeLike, as_datatype
from ..errors import AclnnParamInvalid
from ..runtime import Stream, StreamArg, resolve_stream
from ..tensor import Tensor, TensorArg
from . import generations, launchers, prechecks
from ._args import (
    check_given_outputs,
    given_output,
    host_array,
    host_weights,
    ids_tensor,
    input_tensor,
    required_tensor,
    unread_output,
)
from ._layout import Signature
from .config import MoeConfig, resolve_config
from .executor import Prepared, phase1
from .host_inputs import HostInputs

PHASE1 = "aclnnMoeDistributeCombineV5GetWorkspaceSize"
PHASE2 = "aclnnMoeDistributeCombineV5"

#: Input order of the C function (aclSetInputTensorAddr indices).
INPUTS = ("context", "expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts", "expert_scales",
          "tp_send_counts", "x_active_mask", "activation_scale", "weight_scale", "group_list",
          "expand_scales", "shared_expert_x", "elastic_info", "ori_x", "const_expert_alpha_1",
          "const_expert_alpha_2", "const_expert_v", "performance_info")
OUTPUTS = ("x_out",)
#: The C function's tensors in this order, checked against its prototype at the first call.
SIGNATURE = Signature(PHASE2, INPUTS, OUTPUTS)
_NONES = (None,) * (len(INPUTS) - 6)  # the optional inputs after expert_scales, all absent
_EXPERT_SCALES = INPUTS.index("expert_scales")  # None here means unweighted: an empty tensor is passed
_INTEGER_INPUTS = frozenset(INPUTS.index(n) for n in ("assist_info_for_combine", "ep_send_counts"))

_tls = threading.local()


def empty_weights() -> Tensor:
    """A (0,) float32 tensor: combine's "no expert_scales" (an unweighted sum). One per thread, made
    once; its memory is never read."""
    t: Tensor | None = getattr(_tls, "empty_weights", None)
    if t is None:
        t = _tls.empty_weights = Tensor.empty((0,), DataType.FLOAT)
    return t


def _convert(values: Sequence[object], dtypes: Sequence[DTypeLike | None], s: Stream,
             kept: HostInputs | None = None) -> list[Tensor | None]:
    """The nineteen inputs (`values`, C order) as Tensors (host arrays uploaded on `s`, into the Tensors
    `kept`, a buffer result set's copies, when given; an optional one None stays None, NULL, but
    expert_scales None is the empty tensor of an unweighted combine). Combine takes no dtype overrides
    (`dtypes` is all None)."""
    context, tensors = values[0], values[1:]
    if context is not None and not isinstance(context, Tensor):
        raise TypeError(f"context: expected a Tensor (build_context) or None, got {type(context).__name__}")
    ex_arg, ids_arg = tensors[0], tensors[1]
    assist, counts, weights = tensors[2], tensors[3], tensors[4]
    ex_t = ex_arg if ex_arg.__class__ is Tensor else _expand_x_tensor(ex_arg, assist, s, kept)
    ids = ids_arg if ids_arg.__class__ is Tensor else ids_tensor(ids_arg, "expert_ids", s, PHASE1, kept)
    ins: list[Tensor | None] = [context, ex_t, ids]
    if assist.__class__ is Tensor and counts.__class__ is Tensor \
            and (weights is None or weights.__class__ is Tensor) and not any(map(is_not, tensors[5:], _NONES)):
        # the usual call: dispatch's outputs (and the weights) as device Tensors, no optional input
        ins += (assist, counts, weights if weights is not None else empty_weights())
        ins += _NONES
        return ins
    for i, value in enumerate(tensors[2:], 3):
        if value is None:
            ins.append(empty_weights() if i == _EXPERT_SCALES else None)
        elif value.__class__ is Tensor:
            ins.append(value)
        elif i in _INTEGER_INPUTS:
            ins.append(ids_tensor(value, INPUTS[i], s, PHASE1, kept))
        elif i == _EXPERT_SCALES:
            ins.append(input_tensor(host_weights(value, INPUTS[i], PHASE1), INPUTS[i], s, None, kept))
        else:
            ins.append(input_tensor(value, INPUTS[i], s, None, kept))
    return ins


def _expand_x_tensor(value: object, assist: object, s: Stream, kept: HostInputs | None) -> Tensor:
    """expand_x given as host data, uploaded: whole, or only the rows its dispatch received when a
    download of that dispatch's buffer result has read how many (combine reads no other row)."""
    rows = assist._rows_received() if isinstance(assist, Tensor) else -1
    if rows < 0 or value is None or isinstance(value, Tensor):
        return required_tensor(value, "expand_x", s, None, kept)
    arr = np.asarray(host_array(value, "expand_x"), order="C")
    if arr.ndim != 2 or rows > arr.shape[0] or as_datatype(arr.dtype).packed:
        return required_tensor(arr, "expand_x", s, None, kept)
    if kept is not None:
        return kept.upload(arr, "expand_x", None, rows)
    return Tensor._from_leading_rows(arr, rows, s)


def _x_out(cfg: MoeConfig, ins: list[Tensor | None], given: Tensor | None, dtypes: Sequence[DTypeLike | None],
           precheck: bool, s: Stream) -> Tensor:
    """x_out, after the pre-checks (which raise only with `precheck`): (BS, H) in expand_x's dtype
    (bf16 for an int32 expand_x) unless given; empty when phase 1 will refuse the call before it reads
    x_out."""
    if given is not None:
        given_output(given, "x_out")
        check_given_outputs(INPUTS, ins, OUTPUTS, (given,), s)
    found = prechecks.verdict(cfg, "combine", ins, None if given is None else (given,))
    if precheck and isinstance(found, AclnnParamInvalid):
        raise found
    if given is not None:
        return given
    if found is not None:
        return unread_output()
    ex_t, ids = ins[1], ins[2]
    assert ex_t is not None and ids is not None  # phase 1 refuses NULL ones: the verdict was C_DECIDES
    return Tensor.empty(*x_out_layout(ex_t, ids))


def x_out_layout(expand_x: Tensor, expert_ids: Tensor) -> tuple[tuple[int, int], DataType]:
    """(shape, dtype) of x_out: (BS, H) in expand_x's dtype, bf16 for an int32 expand_x."""
    return (expert_ids.shape[0], expand_x.shape[1]), DataType.BF16 if expand_x.dtype == DataType.INT32 else expand_x.dtype


def prepare_combine(
    context: Tensor | None, expand_x: TensorArg, expert_ids: TensorArg, assist_info_for_combine: TensorArg,
    ep_send_counts: TensorArg, expert_scales: TensorArg | None = None, *, config: MoeConfig | None = None,
    tp_send_counts: TensorArg | None = None, x_active_mask: TensorArg | None = None,
    activation_scale: TensorArg | None = None, weight_scale: TensorArg | None = None,
    group_list: TensorArg | None = None, expand_scales: TensorArg | None = None,
    shared_expert_x: TensorArg | None = None, elastic_info: TensorArg | None = None, ori_x: TensorArg | None = None,
    const_expert_alpha_1: TensorArg | None = None, const_expert_alpha_2: TensorArg | None = None,
    const_expert_v: TensorArg | None = None, performance_info: TensorArg | None = None, x_out: Tensor | None = None,
    stream: StreamArg = None, repeatable: bool = False, precheck: bool = True, **attrs: int | str,
) -> PreparedCombine:
    """Phase 1 (``aclnnMoeDistributeCombineV5GetWorkspaceSize``). `expert_scales` None becomes an empty
    (0,) float32 tensor: combine is then unweighted. x_out is (BS, H) in expand_x's dtype (bf16 when
    expand_x is int32) unless given. Other arguments as :func:`~aclnn_py.ops.prepare_dispatch`."""
    cfg = resolve_config(config, attrs)
    s = resolve_stream(stream)
    ins = _convert((context, expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                    tp_send_counts, x_active_mask, activation_scale, weight_scale, group_list, expand_scales,
                    shared_expert_x, elastic_info, ori_x, const_expert_alpha_1, const_expert_alpha_2,
                    const_expert_v, performance_info), _NO_DTYPES, s)
    if cfg.generation != generations.NEWEST:
        generations.refuse_unsupported(cfg, "combine", generations.given_inputs(INPUTS, ins))
    out = _x_out(cfg, ins, x_out, _NO_DTYPES, precheck, s)
    launcher = launchers.for_config(cfg)[1]
    ws_size, executor, ins, viewed = phase1(launcher, cfg, ins, [out], repeatable)
    return PreparedCombine(launcher, executor, ws_size, ins, viewed[0], repeatable)  # type: ignore[arg-type]


_NO_DTYPES = (None,)


class PreparedCombine(Prepared):
    """Phase 1 of combine done; :attr:`result` is the x_out its launch writes."""

    __slots__ = ("result",)

    def __init__(self, launcher: Launcher, executor: int, workspace_size: int, inputs: list[Tensor | None],
                 x_out: Tensor, repeatable: bool):
        super().__init__(launcher, executor, workspace_size, inputs, [x_out], repeatable)
        self.result = x_out


launchers.register_signature("combine", SIGNATURE)
register_operator(Operator(
    name="combine", input_names=INPUTS, output_names=OUTPUTS, required_inputs=3,
    key=((2, 0), (1, 1), (2, 1)),  # the pre-check key (BS, H, K): expert_ids' dim 0, expand_x's dim 1, expert_ids' dim 1
    launcher_at=1, outputs_type=None, convert=_convert, make_outputs=_x_out, verdict=prechecks.verdict,
    refuse_unsupported=generations.refuse_unsupported, launchers_for=launchers.for_config,
    resolve_config=resolve_config, resolve_stream=resolve_stream, missing=(_EXPERT_SCALES, empty_weights),
    param_invalid_type=AclnnParamInvalid))

__all__ = ["CombinePlan", "PreparedCombine", "empty_weights", "moe_distribute_combine", "prepare_combine",
           "x_out_layout"]
