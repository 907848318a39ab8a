"""Two-phase wrapper of ``aclnnMoeDistributeCombineV5GetWorkspaceSize`` /
``aclnnMoeDistributeCombineV5`` (docs/operators.md, "Combine").

:func:`moe_distribute_combine` runs both phases, :func:`prepare_combine` phase 1, :class:`CombinePlan`
launches one repeatable executor many times; attributes, inputs and streams as for dispatch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from operator import is_not
from typing import TYPE_CHECKING

from ..dtypes import DataType, DTypeLike
from ..errors import AclnnParamInvalid, AclnnPyError, check_aclnn
from ..runtime import Stream, StreamArg, initialized, resolve_stream
from ..tensor import Tensor, TensorArg
from . import generations, prechecks
from ._args import (
    check_given_outputs,
    given_output,
    host_weights,
    ids_tensor,
    input_tensor,
    required_tensor,
    unread_output,
)
from ._caller import OPERATOR_WORDS, Vocabulary, reraise, weights_argument
from ._compiled import compiled_op, operator_spec
from ._layout import Signature

if TYPE_CHECKING:
    from .._core import OpSpec
from .config import MoeConfig, resolve_config
from .executor import Plan, Prepared, compiled_plan_call, compiled_plan_class, private_views
from .generations import NEWEST

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
#: The inputs a plan call may change, weighted and unweighted (expert_scales is then the empty tensor).
_PLAN_NAMES = ("expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts", "expert_scales",
               "x_active_mask", "shared_expert_x", "ori_x", "const_expert_alpha_1", "const_expert_alpha_2",
               "const_expert_v")
PLAN_INPUTS = tuple(INPUTS.index(n) for n in _PLAN_NAMES)
PLAN_INPUTS_UNWEIGHTED = tuple(INPUTS.index(n) for n in _PLAN_NAMES if n != "expert_scales")
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


def _convert(context: Tensor | None, tensors: Sequence[TensorArg | None], s: Stream) -> list[Tensor | None]:
    """The nineteen inputs (C order) as Tensors (host arrays uploaded on `s`; an optional one None
    stays None, NULL, but expert_scales None is the empty tensor of an unweighted combine)."""
    ex_arg, ids_arg = tensors[0], tensors[1]
    ex_t = ex_arg if ex_arg.__class__ is Tensor else required_tensor(ex_arg, "expand_x", s)
    ids = ids_arg if ids_arg.__class__ is Tensor else ids_tensor(ids_arg, "expert_ids", s, PHASE1)
    ins: list[Tensor | None] = [context, ex_t, ids]
    assist, counts, weights = tensors[2], tensors[3], tensors[4]
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
            ins.append(ids_tensor(value, INPUTS[i], s, PHASE1))
        elif i == _EXPERT_SCALES:
            ins.append(input_tensor(host_weights(value, INPUTS[i], PHASE1), INPUTS[i], s))
        else:
            ins.append(input_tensor(value, INPUTS[i], s))
    return ins


def _x_out(cfg: MoeConfig, ins: list[Tensor | None], given: Tensor | None, precheck: bool, s: Stream) -> Tensor:
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


def _phase1(cfg: MoeConfig, ins: list[Tensor | None], out: Tensor) -> tuple[int, object]:
    size, executor = SIGNATURE.core.phase1(ins, (out,), cfg)
    return size, initialized().ffi.cast("aclOpExecutor *", executor)


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
    generations.require_newest(cfg, "prepare_combine and CombinePlan")
    s = resolve_stream(stream)
    ins = _convert(context, (expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                             tp_send_counts, x_active_mask, activation_scale, weight_scale, group_list,
                             expand_scales, shared_expert_x, elastic_info, ori_x, const_expert_alpha_1,
                             const_expert_alpha_2, const_expert_v, performance_info), s)
    out = _x_out(cfg, ins, x_out, precheck, s)
    if repeatable:
        ins = private_views(ins)
        out = private_views([out])[0]  # type: ignore[assignment]
    ws_size, executor = _phase1(cfg, ins, out)
    if repeatable:
        check_aclnn(initialized().lib.aclSetAclOpExecutorRepeatable(executor), "aclSetAclOpExecutorRepeatable")
    return PreparedCombine(executor, ws_size, ins, out, repeatable)


class PreparedCombine(Prepared):
    """Phase 1 of combine done; :attr:`result` is the x_out its launch writes."""

    __slots__ = ("result",)

    def __init__(self, executor: object, workspace_size: int, inputs: list[Tensor | None], x_out: Tensor,
                 repeatable: bool):
        super().__init__(PHASE2, executor, workspace_size, inputs, [x_out], repeatable)
        self.result = x_out


def _compiled_spec(names: tuple[str, ...], n_positional: int) -> OpSpec:
    return operator_spec(names, n_positional, signature=SIGNATURE, required=5,
                         make_if_none={"expert_scales": empty_weights}, outputs="x_out", outputs_type=None,
                         key=("combine", ("expert_ids", 0), ("expand_x", 1), ("expert_ids", 1)))


@compiled_op(_compiled_spec)
def moe_distribute_combine(
    context: Tensor | None, expand_x: TensorArg, expert_ids: TensorArg, assist_info_for_combine: TensorArg,
    ep_send_counts: TensorArg, expert_scales: TensorArg | None = None, *, config: MoeConfig | None = None,
    tp_send_counts: TensorArg | None = None, x_active_mask: TensorArg | None = None,
    activation_scale: TensorArg | None = None, weight_scale: TensorArg | None = None,
    group_list: TensorArg | None = None, expand_scales: TensorArg | None = None,
    shared_expert_x: TensorArg | None = None, elastic_info: TensorArg | None = None, ori_x: TensorArg | None = None,
    const_expert_alpha_1: TensorArg | None = None, const_expert_alpha_2: TensorArg | None = None,
    const_expert_v: TensorArg | None = None, performance_info: TensorArg | None = None, x_out: Tensor | None = None,
    stream: StreamArg = None, precheck: bool = True, **attrs: int | str,
) -> Tensor:
    """Combine: phase 1 and phase 2 on `stream`; returns x_out (``numpy()`` waits for the stream)."""
    cfg = config if config is not None and not attrs else resolve_config(config, attrs)
    s = stream if stream.__class__ is Stream and stream._open else resolve_stream(stream)
    ins = _convert(context, (expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                             tp_send_counts, x_active_mask, activation_scale, weight_scale, group_list,
                             expand_scales, shared_expert_x, elastic_info, ori_x, const_expert_alpha_1,
                             const_expert_alpha_2, const_expert_v, performance_info), s)
    if cfg.generation != NEWEST:
        generations.refuse_unsupported(cfg, "combine", generations.given_inputs(INPUTS, ins))
    out = _x_out(cfg, ins, x_out, precheck, s)
    if cfg.generation == NEWEST:
        SIGNATURE.core.run(ins, (out,), cfg, s)
    else:
        generations.run("combine", cfg.generation, cfg, INPUTS, ins, OUTPUTS, (out,), s)
    return out


@compiled_plan_class
class CombinePlan(Plan):
    """Combine with fixed shapes and attributes, launched many times (a repeatable executor).

    `a` is the expand_x row capacity (dispatch's A), `assist_len` and `counts_len` the lengths of
    dispatch's assist_info_for_combine and ep_recv_counts. Optional inputs present at plan time are
    named by the ``with_*`` flags / shapes. Host weights follow the per-call rule (float64 converted
    to float32 when exact)."""

    input_names = INPUTS
    output_names = OUTPUTS

    def __init__(self, context: Tensor | None, *, a: int, bs: int, hidden: int, topk: int, dtype: DTypeLike,
                 assist_len: int, counts_len: int, config: MoeConfig | None = None, with_expert_scales: bool = False,
                 mask_shape: tuple[int, ...] | None = None, with_shared_expert_x: bool = False,
                 with_ori_x: bool = False, const_experts: int = 0, stream: StreamArg = None, **attrs: int | str):
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
        consts = [Tensor.zeros((cfg.const_expert_num, hidden), dtype) if cfg.const_expert_num else None
                  for _ in range(3)]
        prepared = prepare_combine(context, ex, ids, assist, counts, es, config=cfg, x_active_mask=mask,
                                   shared_expert_x=sx, ori_x=ori, const_expert_alpha_1=consts[0],
                                   const_expert_alpha_2=consts[1], const_expert_v=consts[2], stream=stream,
                                   repeatable=True)
        super().__init__(prepared)
        self._watch_context(context)
        self.config = cfg
        self._x_out: Tensor = prepared.result
        self._with_es = with_expert_scales
        self._vocabulary: Vocabulary = OPERATOR_WORDS  # MoeDistributeBuffer's plans speak its names
        self._c_state = self._fast_path(PLAN_INPUTS if with_expert_scales else PLAN_INPUTS_UNWEIGHTED)

    @property
    def x_out(self) -> Tensor:
        """The plan's own output: what a call without `x_out` writes and returns."""
        return self._x_out

    @compiled_plan_call("x_out")
    def __call__(self, expand_x: TensorArg, expert_ids: TensorArg, assist_info_for_combine: TensorArg,
                 ep_send_counts: TensorArg, expert_scales: TensorArg | None = None, *,
                 topk_weights: TensorArg | None = None, x_active_mask: TensorArg | None = None,
                 shared_expert_x: TensorArg | None = None, ori_x: TensorArg | None = None,
                 const_expert_alpha_1: TensorArg | None = None,
                 const_expert_alpha_2: TensorArg | None = None, const_expert_v: TensorArg | None = None,
                 x_out: Tensor | None = None, stream: StreamArg = None) -> Tensor:
        """Phase 2 with this step's inputs (``aclnnMoeDistributeCombineV5``). `topk_weights` is
        :class:`~aclnn_py.MoeDistributeBuffer`'s name of `expert_scales`: pass either (an unweighted
        plan takes None or an empty array)."""
        words = self._vocabulary
        try:
            weights = host_weights(weights_argument(expert_scales, topk_weights), "expert_scales", self._op)
            if weights is not None and not self._with_es and weights.size:
                raise self._refuse(words.unweighted())
            if words.check_stream is not None:
                words.check_stream(stream)
            values = (expand_x, expert_ids, assist_info_for_combine, ep_send_counts, weights, x_active_mask,
                      shared_expert_x, ori_x, const_expert_alpha_1, const_expert_alpha_2, const_expert_v)
            outs = None if x_out is None else (x_out,)
            if self._with_es:
                self._run(PLAN_INPUTS, values, outs, stream)
            else:
                self._run(PLAN_INPUTS_UNWEIGHTED, values[:4] + values[5:], outs, stream)
        except (AclnnPyError, TypeError, ValueError) as exc:
            reraise(exc, words.names)
        return self.x_out if x_out is None else x_out
