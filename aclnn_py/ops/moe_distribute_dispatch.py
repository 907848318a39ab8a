"""Two-phase wrapper of ``aclnnMoeDistributeDispatchV5GetWorkspaceSize`` /
``aclnnMoeDistributeDispatchV5`` (SPEC §1.1, outputs sized by SPEC §2).

``prepare_dispatch`` runs phase 1 and returns a :class:`PreparedDispatch` whose ``launch`` runs
phase 2; ``moe_distribute_dispatch`` does both. Inputs may be Tensors or host arrays (uploaded);
outputs are allocated by SPEC §2 unless given.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..dtypes import DataType, as_datatype
from ..errors import check_aclnn
from ..runtime import _b, soc_name
from ..tensor import Tensor
from ._checks import check_common
from ._common import (
    Plan,
    Prepared,
    desc,
    executor_cells,
    local_expert_num,
    out_tensor,
    rows_capacity,
    tensor_arg,
)

# Input order of the C function (aclSetInputTensorAddr indices).
INPUTS = ("context", "x", "expert_ids", "scales", "x_active_mask", "expert_scales", "elastic_info",
          "performance_info")
OUTPUTS = ("expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
           "tp_recv_counts", "expand_scales")


class DispatchOutputs(NamedTuple):
    """The seven outputs of dispatch, as device Tensors (SPEC §4.4)."""

    expand_x: Tensor
    dynamic_scales: Tensor
    assist_info_for_combine: Tensor
    expert_token_nums: Tensor
    ep_recv_counts: Tensor
    tp_recv_counts: Tensor
    expand_scales: Tensor


def expand_x_dtype(x_dtype: DataType, quant_mode: int, y_dtype: Any = None) -> DataType:
    """expand_x's type: x's for quant 0, int8 otherwise; y_dtype overrides (SPEC §10.4, §1.1: the
    operator reads y_dtype from expand_x's dtype). ``y_dtype`` is an :class:`~aclnn_py.DataType`
    (or its aclDataType int), a numpy / ml_dtypes dtype, or a DataType name ("HIFLOAT8",
    "float4_e2m1", ...): HiFloat8 and the fp4 types have no numpy dtype of their own (SPEC §0)."""
    if y_dtype is not None:
        if isinstance(y_dtype, str) and y_dtype.upper() in DataType.__members__:
            return DataType[y_dtype.upper()]
        return as_datatype(y_dtype)
    return x_dtype if quant_mode == 0 else DataType.INT8


_LOW_PRECISION_X = (DataType.HIFLOAT8, DataType.FLOAT8_E4M3FN, DataType.FLOAT8_E5M2, DataType.FLOAT4_E2M1,
                    DataType.FLOAT4_E1M2)


def dynamic_scales_layout(a: int, h: int, quant_mode: int, x_dtype: DataType,
                          scales: Tensor | None) -> tuple[tuple[int, ...], DataType]:
    """(shape, dtype) of dynamic_scales (SPEC §2, §4.6, §10.4): (A,) float32 for modes 0-2, (A, ceil(H/128))
    float32 for mode 3, (A, align2(ceil(H/32))) e8m0 bytes for the MX modes 4 / 5, and (A, dim1) in
    the scales' dtype for quant 0 with a low-precision x (its per-token scales are forwarded)."""
    if quant_mode == 3:
        return (a, -(-h // 128)), DataType.FLOAT
    if quant_mode in (4, 5):
        nb = -(-h // 32)
        return (a, nb + (nb & 1)), DataType.FLOAT8_E8M0
    if quant_mode == 0 and x_dtype in _LOW_PRECISION_X and scales is not None and scales.ndim == 2:
        return (a, scales.shape[1]), scales.dtype
    return (a,), DataType.FLOAT


class PreparedDispatch(Prepared):
    op = "MoeDistributeDispatchV5"
    _launch_name = "aclnnMoeDistributeDispatchV5"

    def __init__(self, executor: Any, workspace_size: int, inputs: list[Tensor | None],
                 outputs: DispatchOutputs, repeatable: bool):
        super().__init__(executor, workspace_size, inputs, list(outputs), repeatable)
        self.result = outputs


def prepare_dispatch(
    context: Tensor, x: Any, expert_ids: Any, *,
    ep_world_size: int, ep_rank_id: int, moe_expert_num: int, ccl_buffer_size: int,
    scales: Any = None, x_active_mask: Any = None, expert_scales: Any = None,
    elastic_info: Any = None, performance_info: Any = None,
    tp_world_size: int = 0, tp_rank_id: int = 0, expert_shard_type: int = 0,
    shared_expert_num: int = 1, shared_expert_rank_num: int = 0, quant_mode: int = 0,
    global_bs: int = 0, expert_token_nums_type: int = 1, comm_alg: str = "",
    zero_expert_num: int = 0, copy_expert_num: int = 0, const_expert_num: int = 0,
    y_dtype: Any = None, outputs: DispatchOutputs | dict[str, Tensor] | None = None,
    stream: Any = None, repeatable: bool = False, precheck: bool = True,
) -> PreparedDispatch:
    """Phase 1 (``aclnnMoeDistributeDispatchV5GetWorkspaceSize``): convert inputs, allocate the
    outputs of SPEC §2 (or take `outputs`), size the workspace and create the executor. With
    `repeatable`, the executor is made repeatable (``aclSetAclOpExecutorRepeatable``). With
    `precheck` the attribute, size and window rules (SPEC §3.2, §9.3) are checked in Python first,
    with the C side's wording."""
    b = _b()
    ffi, lib = b.ffi, b.lib
    xt = tensor_arg(x, stream)
    ids = tensor_arg(expert_ids, stream)
    assert xt is not None and ids is not None
    if precheck and xt.ndim == 2 and ids.ndim == 2:
        check_common("aclnnMoeDistributeDispatchV5GetWorkspaceSize", soc_name(), w=ep_world_size, r=ep_rank_id,
                     e=moe_expert_num, ccl=ccl_buffer_size, tp_world=tp_world_size, shard=expert_shard_type,
                     s_attr=shared_expert_num, shared_ranks=shared_expert_rank_num, global_bs=global_bs,
                     z=zero_expert_num, c=copy_expert_num, q=const_expert_num, comm_alg=comm_alg, bs=xt.shape[0],
                     h=xt.shape[1], k=ids.shape[1], bs_param="x", h_param="x")
    es = tensor_arg(expert_scales, stream)
    sc = tensor_arg(scales, stream)
    el = tensor_arg(elastic_info, stream)
    if isinstance(outputs, DispatchOutputs):
        outs = outputs  # the caller's buffers as they are: nothing to size or allocate
    else:
        outs = _allocate_outputs(xt, ids, es, outputs or {}, ep_world_size, ep_rank_id, moe_expert_num,
                                 shared_expert_num, shared_expert_rank_num, global_bs, quant_mode, tp_world_size,
                                 y_dtype, sc, el is not None)
    ins = [context, xt, ids, sc, tensor_arg(x_active_mask, stream, np.bool_), es, el,
           tensor_arg(performance_info, stream)]
    ws, ex = executor_cells()
    ret = lib.aclnnMoeDistributeDispatchV5GetWorkspaceSize(
        *[desc(t) for t in ins],
        ep_world_size, ep_rank_id, moe_expert_num, ccl_buffer_size, tp_world_size, tp_rank_id,
        expert_shard_type, shared_expert_num, shared_expert_rank_num, quant_mode, global_bs,
        expert_token_nums_type, comm_alg.encode() if comm_alg is not None else ffi.NULL,
        zero_expert_num, copy_expert_num, const_expert_num,
        *[desc(t) for t in outs], ws, ex)
    check_aclnn(ret, "aclnnMoeDistributeDispatchV5GetWorkspaceSize")
    executor = ex[0]
    if repeatable:
        check_aclnn(lib.aclSetAclOpExecutorRepeatable(executor), "aclSetAclOpExecutorRepeatable")
    return PreparedDispatch(executor, int(ws[0]), ins, outs, repeatable)


def _allocate_outputs(xt: Tensor, ids: Tensor, es: Tensor | None, given: dict[str, Tensor], ep_world_size: int,
                      ep_rank_id: int, moe_expert_num: int, shared_expert_num: int, shared_expert_rank_num: int,
                      global_bs: int, quant_mode: int, tp_world_size: int, y_dtype: Any,
                      scales: Tensor | None = None, elastic: bool = False) -> DispatchOutputs:
    """The outputs of SPEC §2 (caller-provided ones in `given` are used as they are). expand_x is
    (A, H) elements of its type (a packed fp4 expand_x is (A, H/2) bytes on the device, SPEC §0);
    dynamic_scales as :func:`dynamic_scales_layout`. With elastic_info (Ascend950, SPEC §2, §4.7)
    every rank may serve either role: A = max(shared, MoE formula), L entries of expert_token_nums,
    W*L of ep_recv_counts."""
    bs = xt.shape[0] if xt.ndim >= 1 else 0
    h = xt.shape[1] if xt.ndim >= 2 else 0
    k = ids.shape[1] if ids.ndim >= 2 else 0
    w, r = ep_world_size, shared_expert_rank_num
    if elastic and 0 <= r < w:
        moe_a = rows_capacity(w, w - 1, moe_expert_num, shared_expert_num, r, global_bs, bs, k)
        shared_a = (rows_capacity(w, 0, moe_expert_num, shared_expert_num, r, global_bs, bs, k)
                    if r > 0 else 0)
        a = max(moe_a, shared_a)
        lnum = local_expert_num(w, w - 1, moe_expert_num, r)
    else:
        a = rows_capacity(w, ep_rank_id, moe_expert_num, shared_expert_num, r, global_bs, bs, k)
        lnum = local_expert_num(w, ep_rank_id, moe_expert_num, r)
    has_es = es is not None and all(d > 0 for d in es.shape)
    ds_shape, ds_dtype = dynamic_scales_layout(a, h, quant_mode, xt.dtype, scales)
    return DispatchOutputs(
        expand_x=out_tensor(given.get("expand_x"), (a, h), expand_x_dtype(xt.dtype, quant_mode, y_dtype)),
        dynamic_scales=out_tensor(given.get("dynamic_scales"), ds_shape, ds_dtype),
        assist_info_for_combine=out_tensor(given.get("assist_info_for_combine"), (max(bs * k, a * 128),),
                                           DataType.INT32),
        expert_token_nums=out_tensor(given.get("expert_token_nums"), (lnum,), DataType.INT64),
        ep_recv_counts=out_tensor(given.get("ep_recv_counts"), (ep_world_size * lnum,), DataType.INT32),
        tp_recv_counts=out_tensor(given.get("tp_recv_counts"), (tp_world_size,), DataType.INT32),
        expand_scales=out_tensor(given.get("expand_scales"), (a if has_es else 0,), DataType.FLOAT),
    )


def moe_distribute_dispatch(context: Tensor, x: Any, expert_ids: Any, *, stream: Any = None,
                            **kwargs: Any) -> DispatchOutputs:
    """Phase 1 + phase 2 on `stream`; returns the outputs (valid once the stream is synchronised).
    Keyword arguments as :func:`prepare_dispatch`."""
    p = prepare_dispatch(context, x, expert_ids, stream=stream, **kwargs)
    p.launch(stream)
    return p.result


class DispatchPlan(Plan):
    """Dispatch with fixed shapes and attributes, launched many times (repeatable executor).

    Build it with the shapes (``bs``, ``hidden``, ``topk``), the x dtype, which optional inputs
    exist, and the attributes of :func:`prepare_dispatch`; call it with this step's inputs (host
    arrays are copied into the plan's buffers; Tensors are bound by address). The returned outputs
    are the plan's own buffers, overwritten by the next call, unless ``outputs`` are given."""

    input_names = INPUTS
    output_names = OUTPUTS

    def __init__(self, context: Tensor, *, bs: int, hidden: int, topk: int, x_dtype: Any,
                 scales_shape: tuple[int, ...] | None = None, scales_dtype: Any = None,
                 mask_shape: tuple[int, ...] | None = None, with_expert_scales: bool = False, stream: Any = None,
                 **attrs: Any):
        xt = Tensor.zeros((bs, hidden), x_dtype)
        ids = Tensor.zeros((bs, topk), DataType.INT32)
        scales = (Tensor.zeros(scales_shape, scales_dtype if scales_dtype is not None else DataType.FLOAT)
                  if scales_shape is not None else None)
        mask = Tensor.zeros(mask_shape, DataType.BOOL) if mask_shape is not None else None
        es = Tensor.zeros((bs, topk), DataType.FLOAT) if with_expert_scales else None
        prepared = prepare_dispatch(context, xt, ids, scales=scales, x_active_mask=mask, expert_scales=es,
                                    stream=stream, repeatable=True, **attrs)
        super().__init__(prepared)
        self.outputs = prepared.result

    def __call__(self, x: Any, expert_ids: Any, *, scales: Any = None, x_active_mask: Any = None,
                 expert_scales: Any = None, outputs: DispatchOutputs | None = None,
                 stream: Any = None) -> DispatchOutputs:
        """Phase 2 with this step's inputs (``aclnnMoeDistributeDispatchV5``)."""
        self._run(_PLAN_INPUT_SLOTS, (x, expert_ids, scales, x_active_mask, expert_scales), outputs, stream)
        return self.outputs if outputs is None else outputs


_PLAN_INPUT_SLOTS = (1, 2, 3, 4, 5)
