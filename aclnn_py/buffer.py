"""MoeDistributeBuffer: CANN's DeepEP-style Python API (SPEC §10) over numpy arrays and Tensors.

Construction builds the context tensor of SPEC §8 from a :class:`~aclnn_py.hccl.Communicator`
(CANN's KFC sequence) and reads the window size HCCL reports; each call then runs the two-phase
dispatch/combine wrappers of :mod:`aclnn_py.ops` on a stream.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from . import errors
from .ops._common import normalized_shared, tensor_arg
from .ops.moe_distribute_combine import CombinePlan, moe_distribute_combine
from .ops.moe_distribute_dispatch import DispatchPlan, moe_distribute_dispatch
from .runtime import as_stream
from .tensor import Tensor

MIB = 1 << 20


class LowLatencyDispatchResult(NamedTuple):
    """The six outputs of ``low_latency_dispatch`` (tp_recv_counts dropped, as CANN does)."""

    expand_x: Tensor
    dynamic_scales: Tensor
    assist_info_for_combine: Tensor
    expert_token_nums: Tensor
    ep_recv_counts: Tensor
    expand_scales: Tensor


def _align(v: int, b: int) -> int:
    return -(-v // b) * b


def window_requirement(world_size: int, max_bs: int, hidden: int, moe_expert_num: int, topk: int,
                       shared_expert_num: int, shared_expert_rank_num: int, comm_alg: str = "",
                       soc: str = "Ascend910_93") -> tuple[int, str]:
    """Bytes the kernel-side check of SPEC §9.3 needs in the window, with the arithmetic spelled out:
    ``2*(maxBs*Td*W*L + maxBs*Tc*(K+S)) (+ W*1024 on the 950) + 1 MiB``."""
    w = world_size
    moe_ranks = max(w - shared_expert_rank_num, 1)
    l_ = moe_expert_num // moe_ranks
    s = normalized_shared(shared_expert_num, shared_expert_rank_num)
    tal = _align(hidden * 2, 32) + 44
    td = math.ceil(tal / 480) * 512 if comm_alg == "fullmesh_v2" else _align(tal, 512)
    tc = _align(hidden * 2, 512)
    body = 2 * (max_bs * td * w * l_ + max_bs * tc * (topk + s))
    extra = w * 1024 if soc == "Ascend950" else 0
    need = body + extra + MIB
    how = (f"2*(maxBs*Td*W*L + maxBs*Tc*(K+S)){' + W*1024' if extra else ''} + 1 MiB = "
           f"2*({max_bs}*{td}*{w}*{l_} + {max_bs}*{tc}*({topk}+{s})){f' + {extra}' if extra else ''} + {MIB} "
           f"= {need} bytes")
    return need, how


class MoeDistributeBuffer:
    """Low-latency MoE dispatch/combine over one expert-parallel communicator (SPEC §10)."""

    def __init__(self, comm: Any, ccl_buffer_size: int = 0, comm_alg: int = 0):
        """`ccl_buffer_size` and `comm_alg` are accepted for signature compatibility and ignored, as
        in CANN's current version (SPEC §10.1)."""
        self._set_comm(comm)

    def _set_comm(self, comm: Any) -> None:
        from .hccl import build_context

        self.comm = comm
        self.rank_id = int(comm.rank)
        self.world_size = int(comm.world_size)
        self.group_name = comm.name
        self.context, self.ccl_buffer_size = build_context(comm)

    def update_ctx(self, new_comm: Any) -> bool:
        """Rebuild the context for a new communicator of the same world size (SPEC §10.2)."""
        if int(new_comm.world_size) != self.world_size:
            raise ValueError(f"update_ctx: the new communicator's world size {new_comm.world_size} differs "
                             f"from {self.world_size}")
        self._set_comm(new_comm)
        return True

    # ---- sizing ---------------------------------------------------------------------------------
    @staticmethod
    def get_low_latency_ccl_buffer_size(world_size: int, num_max_dispatch_tokens_per_rank: int, hidden: int,
                                        num_moe_expert: int, topk: int, num_shared_expert: int = 0,
                                        num_shared_expert_ranks: int = 0, comm_alg: str = "") -> int:
        """The HCCL_BUFFSIZE (MiB) to set for this model (SPEC §9.2), with its range checks."""
        from .golden import ccl_buffer_size_mb

        return ccl_buffer_size_mb(world_size, num_max_dispatch_tokens_per_rank, hidden, num_moe_expert, topk,
                                  num_shared_expert, num_shared_expert_ranks, comm_alg)

    def check_window(self, max_bs: int, hidden: int, num_experts: int, topk: int, shared_expert_num: int = 1,
                     shared_expert_rank_num: int = 0, comm_alg: str = "") -> None:
        """Raise AclnnParamInvalid, naming the HCCL_BUFFSIZE to set and the arithmetic, when this
        communicator's window cannot hold a dispatch/combine of this size (SPEC §9.3)."""
        from .runtime import soc_name

        need, how = window_requirement(self.world_size, max_bs, hidden, num_experts, topk, shared_expert_num,
                                       shared_expert_rank_num, comm_alg, soc_name())
        if need > self.ccl_buffer_size:
            mb = math.ceil(need / MIB / 2)
            raise errors.param_invalid(
                "MoeDistributeBuffer",
                f"cclBufferSize: the HCCL window is too small for this dispatch: it needs {how}, the "
                f"communicator's window is {self.ccl_buffer_size} bytes (= 2 x HCCL_BUFFSIZE MiB); set "
                f"HCCL_BUFFSIZE >= {mb} before creating the communicator")

    # ---- operators --------------------------------------------------------------------------------
    def low_latency_dispatch(
        self, x: Any, topk_idx: Any, num_experts: int, *, quant_mode: int = 0, comm_alg: str = "",
        x_smooth_scale: Any = None, x_active_mask: Any = None, topk_weights: Any = None,
        zero_expert_num: int = 0, copy_expert_num: int = 0, const_expert_num: int = 0, elastic_info: Any = None,
        expert_shard_type: int = 0, shared_expert_num: int = 1, shared_expert_rank_num: int = 0,
        expert_token_nums_type: int = 1, num_max_dispatch_tokens_per_rank: int = 0, y_dtype: Any = None,
        x_dtype: Any = None, x_smooth_scales_dtype: Any = None, stream: Any = None,
    ) -> LowLatencyDispatchResult:
        """Dispatch this rank's tokens to their experts' ranks (SPEC §4, §10.2). Arrays are uploaded
        on `stream`; the results are device Tensors valid after ``synchronize(stream)``.
        ``global_bs = num_max_dispatch_tokens_per_rank * world_size`` as CANN passes it.

        Ascend 950 (SPEC §0 "dtype arguments", §4.6): ``y_dtype`` selects expand_x's type (int8,
        ``DataType.HIFLOAT8``, ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``, ``DataType.FLOAT4_E2M1`` /
        ``FLOAT4_E1M2`` — a packed fp4 expand_x downloads as (A, H/2) bytes); ``x_dtype`` records the
        element type of a low-precision x given as uint8 codes (HiFloat8, or packed fp4 of shape
        (BS, H/2)); ``x_smooth_scales_dtype`` that of ``x_smooth_scale`` (e.g. ``DataType.FLOAT8_E8M0``
        for per-token e8m0 bytes). Each takes a numpy / ml_dtypes dtype or an ``aclnn_py.DataType``."""
        xt = tensor_arg(x, stream, x_dtype)
        ids = tensor_arg(topk_idx, stream)
        assert xt is not None and ids is not None
        global_bs = num_max_dispatch_tokens_per_rank * self.world_size
        if xt.ndim == 2 and ids.ndim == 2:
            max_bs = num_max_dispatch_tokens_per_rank or xt.shape[0]
            self.check_window(max_bs, xt.shape[1], num_experts, ids.shape[1], shared_expert_num,
                              shared_expert_rank_num, comm_alg)
        out = moe_distribute_dispatch(
            self.context, xt, ids, stream=stream,
            ep_world_size=self.world_size, ep_rank_id=self.rank_id, moe_expert_num=num_experts,
            ccl_buffer_size=self.ccl_buffer_size, scales=tensor_arg(x_smooth_scale, stream, x_smooth_scales_dtype),
            x_active_mask=x_active_mask, expert_scales=topk_weights, elastic_info=elastic_info,
            performance_info=None, tp_world_size=0, tp_rank_id=0, expert_shard_type=expert_shard_type,
            shared_expert_num=shared_expert_num, shared_expert_rank_num=shared_expert_rank_num,
            quant_mode=quant_mode, global_bs=global_bs, expert_token_nums_type=expert_token_nums_type,
            comm_alg=comm_alg, zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
            const_expert_num=const_expert_num, y_dtype=y_dtype)
        return LowLatencyDispatchResult(out.expand_x, out.dynamic_scales, out.assist_info_for_combine,
                                        out.expert_token_nums, out.ep_recv_counts, out.expand_scales)

    def low_latency_combine(
        self, x: Any, topk_idx: Any, topk_weights: Any, assist_info_for_combine: Any, ep_send_counts: Any, *,
        num_experts: int = 0, comm_alg: str = "", comm_quant_mode: int = 0, x_active_mask: Any = None,
        expand_scales: Any = None, shared_expert_x: Any = None, elastic_info: Any = None, ori_x: Any = None,
        const_expert_alpha_1: Any = None, const_expert_alpha_2: Any = None, const_expert_v: Any = None,
        zero_expert_num: int = 0, copy_expert_num: int = 0, const_expert_num: int = 0,
        expert_shared_type: int = 0, shared_expert_num: int = 1, shared_expert_rank_num: int = 0,
        num_max_dispatch_tokens_per_rank: int = 0, stream: Any = None,
    ) -> Tensor:
        """Send expert outputs back and reduce them per token (SPEC §6, §10.2). ``topk_weights=None``
        makes the sum unweighted. Returns x_out (BS, H) as a device Tensor."""
        if assist_info_for_combine is None or ep_send_counts is None:
            raise ValueError("low_latency_combine: assist_info_for_combine and ep_send_counts are required "
                             "(pass the dispatch outputs)")
        return moe_distribute_combine(
            self.context, x, topk_idx, assist_info_for_combine, ep_send_counts, topk_weights, stream=stream,
            ep_world_size=self.world_size, ep_rank_id=self.rank_id, moe_expert_num=num_experts,
            ccl_buffer_size=self.ccl_buffer_size, x_active_mask=x_active_mask, expand_scales=expand_scales,
            shared_expert_x=shared_expert_x, elastic_info=elastic_info, ori_x=ori_x,
            const_expert_alpha_1=const_expert_alpha_1, const_expert_alpha_2=const_expert_alpha_2,
            const_expert_v=const_expert_v, performance_info=None, expert_shard_type=expert_shared_type,
            shared_expert_num=shared_expert_num, shared_expert_rank_num=shared_expert_rank_num,
            global_bs=num_max_dispatch_tokens_per_rank * self.world_size, comm_quant_mode=comm_quant_mode,
            comm_alg=comm_alg, zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
            const_expert_num=const_expert_num)

    # ---- plans (repeated calls with fixed shapes) --------------------------------------------------
    def plan_dispatch(self, num_tokens: int, hidden: int, num_experts: int, topk: int, *, x_dtype: Any,
                      quant_mode: int = 0, comm_alg: str = "", with_weights: bool = False,
                      mask_shape: tuple[int, ...] | None = None, smooth_scales_shape: tuple[int, ...] | None = None,
                      x_smooth_scales_dtype: Any = None,
                      zero_expert_num: int = 0, copy_expert_num: int = 0, const_expert_num: int = 0,
                      shared_expert_num: int = 1, shared_expert_rank_num: int = 0, expert_token_nums_type: int = 1,
                      num_max_dispatch_tokens_per_rank: int = 0, y_dtype: Any = None,
                      stream: Any = None) -> DispatchPlan:
        """A :class:`~aclnn_py.ops.DispatchPlan` on this communicator: one phase 1, then each call
        ``plan(x, topk_idx, expert_scales=topk_weights, x_active_mask=..., scales=...)`` is a
        launch (SPEC §1.1; host overhead measured in benchmarks/)."""
        self.check_window(num_max_dispatch_tokens_per_rank or num_tokens, hidden, num_experts, topk,
                          shared_expert_num, shared_expert_rank_num, comm_alg)
        return DispatchPlan(
            self.context, bs=num_tokens, hidden=hidden, topk=topk, x_dtype=x_dtype,
            scales_shape=smooth_scales_shape, scales_dtype=x_smooth_scales_dtype, mask_shape=mask_shape,
            with_expert_scales=with_weights, stream=stream,
            ep_world_size=self.world_size, ep_rank_id=self.rank_id, moe_expert_num=num_experts,
            ccl_buffer_size=self.ccl_buffer_size, shared_expert_num=shared_expert_num,
            shared_expert_rank_num=shared_expert_rank_num, quant_mode=quant_mode,
            global_bs=num_max_dispatch_tokens_per_rank * self.world_size,
            expert_token_nums_type=expert_token_nums_type, comm_alg=comm_alg, zero_expert_num=zero_expert_num,
            copy_expert_num=copy_expert_num, const_expert_num=const_expert_num, y_dtype=y_dtype)

    def plan_combine(self, dispatch_plan: DispatchPlan, *, with_weights: bool = False, comm_quant_mode: int = 0,
                     comm_alg: str = "", mask_shape: tuple[int, ...] | None = None,
                     with_shared_expert_x: bool = False, with_ori_x: bool = False, const_expert_num: int = 0,
                     zero_expert_num: int = 0, copy_expert_num: int = 0, shared_expert_num: int = 1,
                     shared_expert_rank_num: int = 0, num_experts: int = 0,
                     num_max_dispatch_tokens_per_rank: int = 0, dtype: Any = None, stream: Any = None) -> CombinePlan:
        """A :class:`~aclnn_py.ops.CombinePlan` sized from a dispatch plan's outputs: each call is
        ``plan(expert_out, topk_idx, assist_info, ep_send_counts, topk_weights, ...)``."""
        d = dispatch_plan.outputs
        x_in, ids_in = dispatch_plan._own_in[1], dispatch_plan._own_in[2]
        assert x_in is not None and ids_in is not None  # required inputs of every plan
        bs, hidden = x_in.shape
        topk = ids_in.shape[1]
        return CombinePlan(
            self.context, a=d.expand_x.shape[0], bs=bs, hidden=hidden, topk=topk,
            dtype=dtype if dtype is not None else x_in.dtype, assist_len=d.assist_info_for_combine.shape[0],
            counts_len=d.ep_recv_counts.shape[0], with_expert_scales=with_weights, mask_shape=mask_shape,
            with_shared_expert_x=with_shared_expert_x, with_ori_x=with_ori_x, const_experts=const_expert_num,
            stream=stream, ep_world_size=self.world_size, ep_rank_id=self.rank_id, moe_expert_num=num_experts,
            ccl_buffer_size=self.ccl_buffer_size, shared_expert_num=shared_expert_num,
            shared_expert_rank_num=shared_expert_rank_num, global_bs=num_max_dispatch_tokens_per_rank * self.world_size,
            comm_quant_mode=comm_quant_mode, comm_alg=comm_alg, zero_expert_num=zero_expert_num,
            copy_expert_num=copy_expert_num)

    def synchronize(self, stream: Any = None) -> None:
        """Wait for `stream` (default: the current device's default stream); raises the failure of
        a kernel on it, e.g. a timeout naming the peers that never arrived."""
        from .ops._common import keepalive
        from .runtime import _b

        keepalive.flush(stream)
        errors.check_acl(_b().lib.aclrtSynchronizeStream(as_stream(stream)), "aclrtSynchronizeStream")
        keepalive.reap()
