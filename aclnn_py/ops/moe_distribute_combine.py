"""Two-phase wrapper of ``aclnnMoeDistributeCombineV5GetWorkspaceSize`` /
``aclnnMoeDistributeCombineV5`` (SPEC §1.2, §5, §6)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..dtypes import DataType
from ..errors import check_aclnn
from ..runtime import _b, soc_name
from ..tensor import Tensor
from ._checks import check_common
from ._common import Plan, Prepared, desc, empty_weights, executor_cells, out_tensor, tensor_arg

# Input order of the C function (aclSetInputTensorAddr indices).
INPUTS = ("context", "expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts", "expert_scales",
          "tp_send_counts", "x_active_mask", "activation_scale", "weight_scale", "group_list",
          "expand_scales", "shared_expert_x", "elastic_info", "ori_x", "const_expert_alpha_1",
          "const_expert_alpha_2", "const_expert_v", "performance_info")
OUTPUTS = ("x_out",)


class PreparedCombine(Prepared):
    op = "MoeDistributeCombineV5"
    _launch_name = "aclnnMoeDistributeCombineV5"

    def __init__(self, executor: Any, workspace_size: int, inputs: list[Tensor | None], x_out: Tensor,
                 repeatable: bool):
        super().__init__(executor, workspace_size, inputs, [x_out], repeatable)
        self.result = x_out


def prepare_combine(
    context: Tensor, expand_x: Any, expert_ids: Any, assist_info_for_combine: Any, ep_send_counts: Any,
    expert_scales: Any = None, *,
    ep_world_size: int, ep_rank_id: int, moe_expert_num: int, ccl_buffer_size: int,
    tp_send_counts: Any = None, x_active_mask: Any = None, activation_scale: Any = None,
    weight_scale: Any = None, group_list: Any = None, expand_scales: Any = None,
    shared_expert_x: Any = None, elastic_info: Any = None, ori_x: Any = None,
    const_expert_alpha_1: Any = None, const_expert_alpha_2: Any = None, const_expert_v: Any = None,
    performance_info: Any = None, tp_world_size: int = 0, tp_rank_id: int = 0, expert_shard_type: int = 0,
    shared_expert_num: int = 1, shared_expert_rank_num: int = 0, global_bs: int = 0, out_dtype: int = 0,
    comm_quant_mode: int = 0, group_list_type: int = 0, comm_alg: str = "", zero_expert_num: int = 0,
    copy_expert_num: int = 0, const_expert_num: int = 0, x_out: Tensor | None = None,
    stream: Any = None, repeatable: bool = False, precheck: bool = True,
) -> PreparedCombine:
    """Phase 1 (``aclnnMoeDistributeCombineV5GetWorkspaceSize``). `expert_scales` None becomes an
    empty (0,) float32 tensor: combine is then unweighted (SPEC §6.2). x_out is (BS, H) in
    expand_x's dtype (bf16 when expand_x is int32) unless given."""
    b = _b()
    ffi, lib = b.ffi, b.lib
    ex_t = tensor_arg(expand_x, stream)
    ids = tensor_arg(expert_ids, stream)
    assert ex_t is not None and ids is not None
    if precheck and ex_t.ndim == 2 and ids.ndim == 2:
        check_common("aclnnMoeDistributeCombineV5GetWorkspaceSize", soc_name(), w=ep_world_size, r=ep_rank_id,
                     e=moe_expert_num, ccl=ccl_buffer_size, tp_world=tp_world_size, shard=expert_shard_type,
                     s_attr=shared_expert_num, shared_ranks=shared_expert_rank_num, global_bs=global_bs,
                     z=zero_expert_num, c=copy_expert_num, q=const_expert_num, comm_alg=comm_alg, bs=ids.shape[0],
                     h=ex_t.shape[1], k=ids.shape[1], bs_param="expert_ids", h_param="expand_x")
    if expert_scales is None:
        expert_scales = empty_weights()
    bs = ids.shape[0] if ids.ndim >= 1 else 0
    h = ex_t.shape[1] if ex_t.ndim >= 2 else 0
    out_dt = DataType.BF16 if ex_t.dtype == DataType.INT32 else ex_t.dtype
    out = out_tensor(x_out, (bs, h), out_dt)
    ins = [context, ex_t, ids, tensor_arg(assist_info_for_combine, stream), tensor_arg(ep_send_counts, stream),
           tensor_arg(expert_scales, stream), tensor_arg(tp_send_counts, stream),
           tensor_arg(x_active_mask, stream, np.bool_), tensor_arg(activation_scale, stream),
           tensor_arg(weight_scale, stream), tensor_arg(group_list, stream), tensor_arg(expand_scales, stream),
           tensor_arg(shared_expert_x, stream), tensor_arg(elastic_info, stream), tensor_arg(ori_x, stream),
           tensor_arg(const_expert_alpha_1, stream), tensor_arg(const_expert_alpha_2, stream),
           tensor_arg(const_expert_v, stream), tensor_arg(performance_info, stream)]
    ws, ex = executor_cells()
    ret = lib.aclnnMoeDistributeCombineV5GetWorkspaceSize(
        *[desc(t) for t in ins],
        ep_world_size, ep_rank_id, moe_expert_num, ccl_buffer_size, tp_world_size, tp_rank_id,
        expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs, out_dtype, comm_quant_mode,
        group_list_type, comm_alg.encode() if comm_alg is not None else ffi.NULL,
        zero_expert_num, copy_expert_num, const_expert_num, out.descriptor(), ws, ex)
    check_aclnn(ret, "aclnnMoeDistributeCombineV5GetWorkspaceSize")
    executor = ex[0]
    if repeatable:
        check_aclnn(lib.aclSetAclOpExecutorRepeatable(executor), "aclSetAclOpExecutorRepeatable")
    return PreparedCombine(executor, int(ws[0]), ins, out, repeatable)


def moe_distribute_combine(context: Tensor, expand_x: Any, expert_ids: Any, assist_info_for_combine: Any,
                           ep_send_counts: Any, expert_scales: Any = None, *, stream: Any = None,
                           **kwargs: Any) -> Tensor:
    """Phase 1 + phase 2 on `stream`; returns x_out (valid once the stream is synchronised)."""
    p = prepare_combine(context, expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                        stream=stream, **kwargs)
    p.launch(stream)
    return p.result


class CombinePlan(Plan):
    """Combine with fixed shapes and attributes, launched many times (repeatable executor).

    ``a`` is the expand_x row capacity (dispatch's A), ``assist_len`` and ``counts_len`` the lengths
    of dispatch's assist_info_for_combine and ep_recv_counts. Optional inputs present at plan time
    are named by the ``with_*`` flags / shapes."""

    input_names = INPUTS
    output_names = OUTPUTS

    def __init__(self, context: Tensor, *, a: int, bs: int, hidden: int, topk: int, dtype: Any,
                 assist_len: int, counts_len: int, with_expert_scales: bool = False,
                 mask_shape: tuple[int, ...] | None = None, with_shared_expert_x: bool = False,
                 with_ori_x: bool = False, const_experts: int = 0, stream: Any = None, **attrs: Any):
        ex = Tensor.zeros((a, hidden), dtype)
        ids = Tensor.zeros((bs, topk), DataType.INT32)
        assist = Tensor.zeros((assist_len,), DataType.INT32)
        counts = Tensor.zeros((counts_len,), DataType.INT32)
        es = Tensor.zeros((bs, topk) if with_expert_scales else (0,), DataType.FLOAT)
        mask = Tensor.zeros(mask_shape, DataType.BOOL) if mask_shape is not None else None
        sx = Tensor.zeros((bs, hidden), dtype) if with_shared_expert_x else None
        ori = Tensor.zeros((bs, hidden), dtype) if with_ori_x else None
        consts = [Tensor.zeros((const_experts, hidden), dtype) if const_experts else None for _ in range(3)]
        prepared = prepare_combine(context, ex, ids, assist, counts, es, x_active_mask=mask, shared_expert_x=sx,
                                   ori_x=ori, const_expert_alpha_1=consts[0], const_expert_alpha_2=consts[1],
                                   const_expert_v=consts[2], stream=stream, repeatable=True,
                                   const_expert_num=const_experts, **attrs)
        super().__init__(prepared)
        self.x_out = prepared.result
        self._with_es = with_expert_scales

    def __call__(self, expand_x: Any, expert_ids: Any, assist_info_for_combine: Any, ep_send_counts: Any,
                 expert_scales: Any = None, *, x_active_mask: Any = None, shared_expert_x: Any = None,
                 ori_x: Any = None, const_expert_alpha_1: Any = None, const_expert_alpha_2: Any = None,
                 const_expert_v: Any = None, x_out: Tensor | None = None, stream: Any = None) -> Tensor:
        """Phase 2 with this step's inputs (``aclnnMoeDistributeCombineV5``)."""
        if not self._with_es and expert_scales is not None and math.prod(getattr(expert_scales, "shape", (0,))):
            raise self._refuse("expert_scales: this plan was built unweighted; build one with_expert_scales")
        values = (expand_x, expert_ids, assist_info_for_combine, ep_send_counts,
                  expert_scales if self._with_es else None, x_active_mask, shared_expert_x, ori_x,
                  const_expert_alpha_1, const_expert_alpha_2, const_expert_v)
        self._run(_PLAN_INPUT_SLOTS if self._with_es else _PLAN_INPUT_SLOTS_UNWEIGHTED,
                  values if self._with_es else values[:4] + values[5:], None if x_out is None else (x_out,), stream)
        return self.x_out if x_out is None else x_out


_PLAN_INPUT_SLOTS = (1, 2, 3, 4, 5, 7, 12, 14, 15, 16, 17)
_PLAN_INPUT_SLOTS_UNWEIGHTED = (1, 2, 3, 4, 7, 12, 14, 15, 16, 17)
