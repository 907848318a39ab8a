"""Dispatch (docs/operators.md, "Dispatch"), in every generation the backend exports.

:func:`moe_distribute_dispatch` runs both phases: its one body is the compiled core's
(``aclnn_py._core``), which calls what this module holds only for what is rare — converting host data
(:func:`_convert`), allocating outputs after the pre-checks of a new shape (:func:`_outputs`).
:func:`prepare_dispatch` runs phase 1 and returns a :class:`~aclnn_py.ops.Prepared` whose ``launch``
runs phase 2; :class:`DispatchPlan` launches one repeatable executor many times. Attributes come as one
:class:`~aclnn_py.ops.MoeConfig` (or as its keyword arguments), whose generation picks the C function;
inputs may be Tensors or host arrays (uploaded on the call's stream); outputs are allocated with the
shapes of docs/operators.md unless given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from .._core import DispatchPlan, Launcher, Operator, moe_distribute_dispatch, register_operator
from ..dtypes import DataType, DTypeLike, as_datatype
from ..errors import AclnnParamInvalid
from ..runtime import Stream, StreamArg, resolve_stream
from ..runtime._memory import copy_to_host
from ..tensor import Tensor, TensorArg
from . import generations, launchers, prechecks
from ._args import (
    ALLOCATED,
    check_given_outputs,
    given_output,
    host_weights,
    ids_tensor,
    input_tensor,
    output_tensor,
    required_tensor,
    unread_output,
)
from ._layout import Signature
from .config import MoeConfig, resolve_config
from .executor import Prepared, phase1
from .host_inputs import HostInputs
from .prechecks_a2 import recv_counts_extra

PHASE1 = "aclnnMoeDistributeDispatchV5GetWorkspaceSize"
PHASE2 = "aclnnMoeDistributeDispatchV5"

#: Input order of the C function (aclSetInputTensorAddr indices).
INPUTS = ("context", "x", "expert_ids", "scales", "x_active_mask", "expert_scales", "elastic_info",
          "performance_info")
#: Output order of the C function (aclSetOutputTensorAddr indices).
OUTPUTS = ("expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
           "tp_recv_counts", "expand_scales")
#: The C function's tensors in this order, checked against its prototype at the first call.
SIGNATURE = Signature(PHASE2, INPUTS, OUTPUTS)

_LOW_PRECISION_X = (DataType.HIFLOAT8, DataType.FLOAT8_E4M3FN, DataType.FLOAT8_E5M2, DataType.FLOAT4_E2M1,
                    DataType.FLOAT4_E1M2)


class DispatchOutputs(NamedTuple):
    """The seven outputs of dispatch, as device Tensors (docs/operators.md, "Dispatch outputs").

    The operator allocates all seven unless given. An output a caller passes as None reaches the C
    function as NULL: CANN allows it for `tp_recv_counts`, and for `expand_scales` without
    expert_scales; phase 1 refuses any other NULL (`dynamic_scales` included) with 161001 naming it."""

    expand_x: Tensor
    dynamic_scales: Tensor | None
    assist_info_for_combine: Tensor
    expert_token_nums: Tensor
    ep_recv_counts: Tensor
    tp_recv_counts: Tensor | None
    expand_scales: Tensor | None


def expand_x_dtype(x_dtype: DataType, quant_mode: int, y_dtype: DTypeLike | None = None) -> DataType:
    """expand_x's type: x's for quant 0, int8 otherwise; `y_dtype` overrides (the operator reads its
    y_dtype attribute from expand_x's type). `y_dtype` is a DataType (or its aclDataType int), a numpy /
    ml_dtypes dtype, or a DataType name ("HIFLOAT8", "float4_e2m1", ...): HiFloat8 and the fp4 types
    have no numpy dtype of their own."""
    if y_dtype is not None:
        if isinstance(y_dtype, str) and y_dtype.upper() in DataType.__members__:
            return DataType[y_dtype.upper()]
        return as_datatype(y_dtype)
    return x_dtype if quant_mode == 0 else DataType.INT8


def dynamic_scales_layout(a: int, h: int, quant_mode: int, x_dtype: DataType,
                          scales: Tensor | None) -> tuple[tuple[int, ...], DataType]:
    """(shape, dtype) of dynamic_scales: (A,) float32 for modes 0-2, (A, ceil(H/128)) float32 for mode
    3, (A, align2(ceil(H/32))) e8m0 bytes for the MX modes 4 / 5, and (A, dim1) in the scales' dtype
    for quant 0 with a low-precision x (its per-token scales are forwarded)."""
    if quant_mode == 3:
        return (a, -(-h // 128)), DataType.FLOAT
    if quant_mode in (4, 5):
        nb = -(-h // 32)
        return (a, nb + (nb & 1)), DataType.FLOAT8_E8M0
    if quant_mode == 0 and x_dtype in _LOW_PRECISION_X and scales is not None and scales.ndim == 2:
        return (a, scales.shape[1]), scales.dtype
    return (a,), DataType.FLOAT


#: Per output (OUTPUTS order), the elements one received row takes in it: -1 a row of dim 0, 0 not
#: written row by row. Rows after the received ones are never written (docs/operators.md, "Dispatch
#: outputs"), so a download of a buffer's result may copy the received rows only.
ROW_ELEMENTS = (-1, -1, 3, 0, 0, 0, -1)
_ELASTIC_BIT = 1 << INPUTS.index("elastic_info")


def rows_received(outputs: DispatchOutputs, cfg: MoeConfig, present: int) -> int:
    """N, the rows a finished dispatch wrote, read from its ep_recv_counts where combine reads it (the
    last running total of this rank's role); -1 for layouts this rule does not hold for: the first
    generation, a TP domain, elastic_info (`present`: a bit per input given), the Atlas A2 kernels."""
    counts = outputs.ep_recv_counts
    if cfg.generation == 1 or cfg.tp_world_size > 1 or present & _ELASTIC_BIT or cfg.profile.atlas_a2 \
            or counts is None:
        return -1
    at = cfg.ep_world_size * cfg.local_experts - 1
    if at >= counts.size:
        return -1
    last = np.empty(1, np.int32)
    copy_to_host(last, counts.data_ptr + 4 * at, 4)  # the caller saw the dispatch's stream finish
    n = int(last[0])
    return n if 0 <= n <= outputs.expand_x.shape[0] else -1


def allocate_outputs(cfg: MoeConfig, xt: Tensor, ids: Tensor, es: Tensor | None, scales: Tensor | None,
                     elastic: bool, y_dtype: DTypeLike | None,
                     given: Mapping[str, Tensor | None] | None = None) -> DispatchOutputs:
    """The outputs for these inputs (caller-provided ones in `given` are used as they are, a name
    given None is passed to C as NULL, a name not given is allocated). expand_x
    is (A, H) elements of its type (packed fp4: (A, H/2) bytes on the device); with elastic_info a rank
    may serve either role, so A, expert_token_nums and ep_recv_counts take the larger sizes."""
    given = _given_outputs(given)
    bs = xt.shape[0] if xt.ndim >= 1 else 0
    h = xt.shape[1] if xt.ndim >= 2 else 0
    k = ids.shape[1] if ids.ndim >= 2 else 0
    a = cfg.rows_capacity(bs, k, elastic)
    local = cfg.moe_local_experts if elastic else cfg.local_experts
    has_es = es is not None and all(d > 0 for d in es.shape)
    tp = max(cfg.tp_world_size, 1)  # a TP domain gathers the peer's rows too (group-string generations)
    ds_shape, ds_dtype = dynamic_scales_layout(a * tp, h, cfg.quant_mode, xt.dtype, scales)
    spec = (("expand_x", (a * tp, h), expand_x_dtype(xt.dtype, cfg.quant_mode, y_dtype)),
            ("dynamic_scales", ds_shape, ds_dtype),
            # the first generation's expand_idx (BS * K,) travels in this slot
            ("assist_info_for_combine", ((bs * k,) if cfg.generation == 1 else (max(bs * k, a * 128),)),
             DataType.INT32),
            ("expert_token_nums", (local,), DataType.INT64),
            ("ep_recv_counts", (cfg.ep_world_size * local * tp + recv_counts_extra(cfg, bs, k),),
             DataType.INT32),
            ("tp_recv_counts", (cfg.tp_world_size,), DataType.INT32),
            ("expand_scales", (a if has_es else 0,), DataType.FLOAT))
    # a required output given None goes to C as NULL too: C refuses it, naming it (161001)
    return DispatchOutputs(*(None if name in given and given[name] is None else  # type: ignore[arg-type]
                             output_tensor(given.get(name), name, shape, dt) for name, shape, dt in spec))


def _outputs(cfg: MoeConfig, ins: list[Tensor | None], outputs: DispatchOutputs | Mapping[str, Tensor | None] | None,
             dtypes: Sequence[DTypeLike | None], precheck: bool, s: Stream) -> DispatchOutputs:
    """The outputs of this call, after the pre-checks (which raise only with `precheck`); `dtypes`' last
    is y_dtype. When phase 1 will refuse the call before it reads the outputs, the missing ones are
    empty (:func:`~aclnn_py.ops._args.unread_output`)."""
    y_dtype = dtypes[2]
    if isinstance(outputs, DispatchOutputs):
        check_given_outputs(INPUTS, ins, OUTPUTS, outputs, s)
        found = prechecks.verdict(cfg, "dispatch", ins, outputs)
    else:
        given = _given_outputs(outputs)
        for name, value in given.items():
            if value is not None:
                given_output(value, name)
        if given:
            check_given_outputs(INPUTS, ins, OUTPUTS, [given.get(n) for n in OUTPUTS], s)
        found = prechecks.verdict(cfg, "dispatch", ins, [given.get(n, ALLOCATED) for n in OUTPUTS])
    if precheck and isinstance(found, AclnnParamInvalid):
        raise found
    if isinstance(outputs, DispatchOutputs):
        return outputs
    if found is not None:
        return DispatchOutputs(*(given[n] if n in given else unread_output() for n in OUTPUTS))  # type: ignore[arg-type]
    xt, ids = ins[1], ins[2]
    assert xt is not None and ids is not None  # phase 1 refuses NULL ones: the verdict was C_DECIDES
    return allocate_outputs(cfg, xt, ids, ins[5], ins[3], ins[6] is not None, y_dtype, outputs)


def _given_outputs(given: object) -> Mapping[str, Tensor | None]:
    """The `outputs` mapping of a call (None: allocate all), its names checked: a misspelt name would
    otherwise allocate that output silently."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise TypeError(f"outputs: expected DispatchOutputs or a mapping of output names to Tensors, got "
                        f"{type(given).__name__}")
    unknown = sorted(str(k) for k in given if k not in OUTPUTS)
    if unknown:
        raise TypeError(f"outputs: unknown output name(s) {', '.join(unknown)} (the outputs are {', '.join(OUTPUTS)})")
    return given


def _convert(values: Sequence[object], dtypes: Sequence[DTypeLike | None], s: Stream,
             kept: HostInputs | None = None) -> list[Tensor | None]:
    """The eight inputs (`values`, C order) as Tensors: host arrays uploaded on `s` (into the Tensors
    `kept`, a buffer result set's copies, when given), recording `dtypes`' x_dtype and scales_dtype (a
    Tensor given with x_dtype becomes a view of that type)."""
    context, x, expert_ids, scales, x_active_mask, expert_scales, elastic_info, performance_info = values
    x_dtype, scales_dtype = dtypes[0], dtypes[1]
    if context is not None and not isinstance(context, Tensor):
        raise TypeError(f"context: expected a Tensor (build_context) or None, got {type(context).__name__}")
    xt = x if x.__class__ is Tensor and x_dtype is None else required_tensor(x, "x", s, x_dtype, kept)
    ids = expert_ids if expert_ids.__class__ is Tensor else ids_tensor(expert_ids, "expert_ids", s, PHASE1, kept)
    if scales is None and x_active_mask is None and expert_scales is None and elastic_info is None \
            and performance_info is None:
        return [context, xt, ids, None, None, None, None, None]
    return [context, xt, ids, input_tensor(scales, "scales", s, scales_dtype, kept),
            input_tensor(x_active_mask, "x_active_mask", s, None, kept),
            input_tensor(host_weights(expert_scales, "expert_scales", PHASE1), "expert_scales", s, None, kept),
            input_tensor(elastic_info, "elastic_info", s, None, kept),
            input_tensor(performance_info, "performance_info", s, None, kept)]


def prepare_dispatch(
    context: Tensor | None, x: TensorArg, expert_ids: TensorArg, *, config: MoeConfig | None = None,
    scales: TensorArg | None = None, x_active_mask: TensorArg | None = None, expert_scales: TensorArg | None = None,
    elastic_info: TensorArg | None = None, performance_info: TensorArg | None = None,
    x_dtype: DTypeLike | None = None, scales_dtype: DTypeLike | None = None, y_dtype: DTypeLike | None = None,
    outputs: DispatchOutputs | Mapping[str, Tensor | None] | None = None, stream: StreamArg = None,
    repeatable: bool = False, precheck: bool = True, **attrs: int | str,
) -> PreparedDispatch:
    """Phase 1 (``aclnnMoeDistributeDispatchV5GetWorkspaceSize``): convert the inputs, allocate the
    outputs (or take `outputs`), size the workspace and create the executor. `config` (or its
    attributes as keywords: ``ep_world_size=…, ep_rank_id=…, moe_expert_num=…, ccl_buffer_size=…``, …)
    gives the attributes. `x_dtype` / `scales_dtype` record the element type of host data given as raw
    codes (HiFloat8, packed fp4, e8m0), `y_dtype` selects expand_x's type. With `repeatable`, the
    executor may be launched many times and rebound (``aclSetAclOpExecutorRepeatable``). With
    `precheck`, the attribute, mode, size and window rules are checked in Python first, with the C
    wording, where phase 1 would reach them (docs/operators.md, "Status codes"): the answer is the
    same either way. `x` or `expert_ids` given None is a TypeError; an output given None is passed as
    NULL (see :class:`DispatchOutputs`)."""
    cfg = resolve_config(config, attrs)
    s = resolve_stream(stream)
    dtypes = (x_dtype, scales_dtype, y_dtype)
    ins = _convert((context, x, expert_ids, scales, x_active_mask, expert_scales, elastic_info, performance_info),
                   dtypes, s)
    if cfg.generation != generations.NEWEST:
        generations.refuse_unsupported(cfg, "dispatch", generations.given_inputs(INPUTS, ins))
    outs = _outputs(cfg, ins, outputs, dtypes, precheck, s)
    launcher = launchers.for_config(cfg)[0]
    ws_size, executor, ins, viewed = phase1(launcher, cfg, ins, outs, repeatable)
    return PreparedDispatch(launcher, executor, ws_size, ins, DispatchOutputs(*viewed), repeatable)  # type: ignore[arg-type]


class PreparedDispatch(Prepared):
    """Phase 1 of dispatch done; :attr:`result` holds the outputs its launch writes."""

    __slots__ = ("result",)

    def __init__(self, launcher: Launcher, executor: int, workspace_size: int, inputs: list[Tensor | None],
                 outputs: DispatchOutputs, repeatable: bool):
        super().__init__(launcher, executor, workspace_size, inputs, outputs, repeatable)
        self.result = outputs


launchers.register_signature("dispatch", SIGNATURE)
register_operator(Operator(
    name="dispatch", input_names=INPUTS, output_names=OUTPUTS, required_inputs=3,
    key=((1, 0), (1, 1), (2, 1)),  # the pre-check key (BS, H, K): x's dims 0 and 1, expert_ids' dim 1
    launcher_at=0, outputs_type=DispatchOutputs, convert=_convert, make_outputs=_outputs, verdict=prechecks.verdict,
    refuse_unsupported=generations.refuse_unsupported, launchers_for=launchers.for_config,
    resolve_config=resolve_config, resolve_stream=resolve_stream, missing=None, param_invalid_type=AclnnParamInvalid))

__all__ = ["DispatchOutputs", "DispatchPlan", "PreparedDispatch", "allocate_outputs", "moe_distribute_dispatch",
           "prepare_dispatch"]
