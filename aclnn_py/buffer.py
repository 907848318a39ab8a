"""MoeDistributeBuffer: CANN's low-latency MoE API (``low_latency_dispatch`` / ``low_latency_combine``
/ ``get_low_latency_ccl_buffer_size``, modelled on DeepEP's), with numpy arrays or device Tensors
instead of torch tensors and an aclnn-py :class:`~aclnn_py.hccl.Communicator` instead of a torch
process group (docs/comparison.md maps every argument).

This layer only translates: CANN's Python names become the operators' attributes (one
:class:`~aclnn_py.MoeConfig` per distinct set, made once and cached), and each call is one call of the
operator's compiled body (``aclnn_py._core``), which writes into the method's ring of result sets. Each
set keeps a repeatable executor of its outputs' layout, so a steady call rebinds the inputs that moved
and runs phase 2 only.

Results: each method keeps a ring of ``result_sets`` sets (two by default). A call writes into the next
set's memory and hands out new Tensors over it; the Tensors a call handed out stay valid until
``result_sets`` more calls of the same method, then reading them raises
:class:`~aclnn_py.RecycledError` (docs/concepts.md, "Buffer results"). ``keep=True`` or ``clone()`` keeps
a result longer.

Errors speak this layer's names. An error of a parameter rule names the parameter as the caller
passed it — ``topk_idx``, ``topk_weights``, ``x_smooth_scale``, combine's ``x``, ``num_experts``,
``num_max_dispatch_tokens_per_rank`` (its rules and values are the operators' ``global_bs``, which is
it × world_size), combine's ``expert_shared_type`` — with the class, status code and rule of the
operator below. The plans made by :meth:`MoeDistributeBuffer.plan_dispatch` / ``plan_combine`` speak the same
names: their calls take ``topk_weights=`` as well as the operators' ``expert_scales=``, their errors
name ``topk_idx`` / ``topk_weights`` / ``x``, and weights given to a plan built without them say to
build it with ``with_weights=True``.

Host weights: ``topk_weights`` given as a float64 array (numpy's default float, or a list of floats)
is converted to float32 when every value converts exactly, and refused (``AclnnParamInvalid`` naming
the parameter, "pass float32") otherwise — as host integer ids of any integer type are converted to
int32 when their values fit. The same rule holds per call, for plans, and for the operators in
:mod:`aclnn_py.ops`.

Streams: every call runs on a stream of the communicator's device. A ``stream=`` of another device
(or, without ``stream=``, a current stream of another device) is refused with a ValueError naming
both devices, per call, when a plan is built, and when a plan's call meets a stream it has not checked
yet. A stream borrowed by handle has no known device and is taken as given.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar, cast

from ._core import BufferBase
from .dtypes import DTypeLike
from .errors import AclnnPyError
from .hccl import Communicator, build_context, rebuild_context
from .ops import generations, sizing
from .ops._caller import Vocabulary, renamed, reraise
from .ops.combine import CombinePlan
from .ops.config import MoeConfig, plain_key
from .ops.dispatch import ROW_ELEMENTS, DispatchPlan, rows_received
from .runtime import StreamArg, current_stream, resolve_stream, soc_name
from .tensor import Tensor


class LowLatencyDispatchResult(NamedTuple):
    """The six outputs of ``low_latency_dispatch`` (tp_recv_counts dropped, as CANN does)."""

    expand_x: Tensor
    dynamic_scales: Tensor
    assist_info_for_combine: Tensor
    expert_token_nums: Tensor
    ep_recv_counts: Tensor
    expand_scales: Tensor


#: The operators' names → the names a caller of this class passes, per operator (errors name these).
_ATTRIBUTE_NAMES = {"moe_expert_num": "num_experts", "global_bs": "num_max_dispatch_tokens_per_rank"}
DISPATCH_NAMES: Mapping[str, str] = {"expert_ids": "topk_idx", "expert_scales": "topk_weights",
                                     "scales": "x_smooth_scale", **_ATTRIBUTE_NAMES}
COMBINE_NAMES: Mapping[str, str] = {"expand_x": "x", "expert_ids": "topk_idx", "expert_scales": "topk_weights",
                                    "expert_shard_type": "expert_shared_type", **_ATTRIBUTE_NAMES}


F = TypeVar("F", bound=Callable[..., Any])

#: What makes a buffer's MoeConfig, in the order of its key in the buffer's config cache; the fields a
#: method fixes take their value from DISPATCH_FIXED / COMBINE_FIXED.
CONFIG_FIELDS = ("num_experts", "comm_alg", "quant_mode", "comm_quant_mode", "zero_expert_num", "copy_expert_num",
                 "const_expert_num", "expert_shard_type", "shared_expert_num", "shared_expert_rank_num",
                 "expert_token_nums_type", "num_max_dispatch_tokens_per_rank")
DISPATCH_FIXED: Mapping[str, object] = {"comm_quant_mode": 0}
COMBINE_FIXED: Mapping[str, object] = {"quant_mode": 0, "expert_token_nums_type": 1}
#: Result sets each operator method keeps: a layer-pipelined loop dispatches layer i+1 before it combines
#: layer i, so dispatch's results must outlive one more call of it.
RESULT_SETS = 2


def _in_callers_words(names: Mapping[str, str]) -> Callable[[F], F]:
    """Make a method's errors name the parameters as its caller passed them (`names`: operator name
    → caller's name)."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except (AclnnPyError, TypeError, ValueError) as exc:
                reraise(exc, names)

        return cast(F, call)

    return decorate


class MoeDistributeBuffer(BufferBase):
    """Low-latency MoE dispatch/combine over one expert-parallel communicator.

    Building it runs CANN's context sequence on `comm` (the int32 context tensor the operators take)
    and reads the window size HCCL reports (``ccl_buffer_size``, bytes). `ccl_buffer_size` and
    `comm_alg` are accepted for signature compatibility and ignored, as in CANN's current version.

    `generation` picks the operators' generation: 0, the default, is the newest the loaded backend
    exports (with `tp_comm`: the newest group-string one); 1 … 4 are the group-string generations
    (docs/operators.md, "Group-string generations"), which the buffer calls with `comm`'s name
    (``HcclGetCommName``) instead of a context tensor. `tp_comm` is the TP domain of two ranks (EP × TP,
    as CANN's V2 sample builds it: rank e of two EP domains pair up); it needs a group-string generation.
    The generation in use is :attr:`generation`.

    Results: the Tensors a call returns stay valid until `result_sets` more calls of the same method
    (two by default); see :meth:`low_latency_dispatch`. :meth:`close` lets the result sets go (Tensors
    still referenced keep their memory)."""

    def __init__(self, comm: Communicator, ccl_buffer_size: int = 0, comm_alg: int = 0, *, generation: int = 0,
                 tp_comm: Communicator | None = None, result_sets: int = RESULT_SETS):
        if isinstance(result_sets, bool) or not isinstance(result_sets, int) or result_sets < 1:
            raise ValueError(f"result_sets: must be an int >= 1 (got {result_sets!r})")
        self.comm = comm
        #: The TP communicator (None: no TP domain).
        self.tp_comm = tp_comm
        self.rank_id = int(comm.rank)
        self.world_size = int(comm.world_size)
        self.group_name = comm.name
        self.soc = soc_name()
        #: The generation of the operators this buffer's calls use (e.g. 5 for ``…DispatchV5``).
        self.generation = _generation_for(generation, tp_comm)
        #: The int32 context tensor of the V5 operators; None with a group-string generation (it uses group_name).
        self.context: Tensor | None = None
        #: The window size HCCL reports for `comm`, in bytes (0 with a group-string generation).
        self.ccl_buffer_size = 0
        if self.generation == generations.NEWEST:  # the group-string generations take the group name instead
            self.context, self.ccl_buffer_size = build_context(comm)
        self._configs: dict[tuple[object, ...], MoeConfig] = {}
        self._plans: weakref.WeakSet[DispatchPlan | CombinePlan] = weakref.WeakSet()
        self._set_up_calls(result_sets, DISPATCH_NAMES, COMBINE_NAMES, LowLatencyDispatchResult, current_stream,
                           tp_comm is not None, rows_received, ROW_ELEMENTS)

    def update_ctx(self, new_comm: Communicator) -> bool:
        """Rebuild the context for a new communicator of the same world size, in place: plans made
        before follow the new communicator (or, when its window size differs, refuse to run with a
        message saying to build new ones). Synchronise work queued with the old context first."""
        if int(new_comm.world_size) != self.world_size:
            raise ValueError(f"update_ctx: the new communicator's world size {new_comm.world_size} differs "
                             f"from {self.world_size}")
        self._forget_calls()  # the configs and streams remembered were checked against the old communicator
        if self.context is None:  # a group-string generation: the configs name the communicator
            self.comm, self.rank_id, self.group_name = new_comm, int(new_comm.rank), new_comm.name
            self._configs.clear()
            return True
        ccl = rebuild_context(new_comm, self.context)
        self.comm = new_comm
        self.rank_id = int(new_comm.rank)
        self.group_name = new_comm.name
        if ccl != self.ccl_buffer_size:
            for plan in list(self._plans):
                plan.invalidate(f"the plan was built for a window of {self.ccl_buffer_size} bytes; update_ctx "
                                f"switched to a communicator whose window is {ccl} bytes: build a new plan")
            self._configs.clear()
        self.ccl_buffer_size = ccl
        return True

    # ---- sizing ---------------------------------------------------------------------------------------
    @staticmethod
    def get_low_latency_ccl_buffer_size(world_size: int, num_max_dispatch_tokens_per_rank: int, hidden: int,
                                        num_moe_expert: int, topk: int, num_shared_expert: int = 0,
                                        num_shared_expert_ranks: int = 0, comm_alg: str = "") -> int:
        """The HCCL_BUFFSIZE (MiB) to set for this model (docs/operators.md, "Buffer sizing"); ValueError
        names an argument out of range."""
        return sizing.ccl_buffer_size_mb(world_size, num_max_dispatch_tokens_per_rank, hidden, num_moe_expert, topk,
                                         num_shared_expert, num_shared_expert_ranks, comm_alg)

    # ---- attributes -------------------------------------------------------------------------------------
    def _config(self, method: str, **given: object) -> MoeConfig:
        """The config of a call's attributes, `given` by `method`'s parameter names (made once per
        distinct set; the cache is looked up with plain ints and strs only)."""
        combine = method in ("low_latency_combine", "plan_combine")
        if combine and "expert_shared_type" in given:
            given["expert_shard_type"] = given.pop("expert_shared_type")
        fixed = COMBINE_FIXED if combine else DISPATCH_FIXED
        key = tuple(fixed[f] if f in fixed else given[f] for f in CONFIG_FIELDS)
        cfg = self._configs.get(key) if plain_key(key) else None
        self.comm.require_open(f"run {method}")
        if cfg is not None:
            return cfg
        fields: dict[str, Any] = dict(zip(CONFIG_FIELDS, key))
        max_tokens = fields.pop("num_max_dispatch_tokens_per_rank")
        global_bs = max_tokens * self.world_size if type(max_tokens) is int else max_tokens
        tp: dict[str, Any] = {}
        if self.tp_comm is not None:
            tp = dict(tp_world_size=int(self.tp_comm.world_size), tp_rank_id=int(self.tp_comm.rank),
                      group_tp=self.tp_comm.name)
        try:
            cfg = MoeConfig(ep_world_size=self.world_size, ep_rank_id=self.rank_id,
                            moe_expert_num=fields.pop("num_experts"), ccl_buffer_size=self.ccl_buffer_size,
                            global_bs=global_bs, soc=self.soc, generation=self.generation,
                            group_ep=self.group_name if self.context is None else "", **tp, **fields)
        except TypeError as exc:
            names = COMBINE_NAMES if combine else DISPATCH_NAMES
            raise TypeError(f"{method}(): {renamed(exc, names)}") from None
        if plain_key(key):
            if len(self._configs) > 64:
                self._configs.clear()
            self._configs[key] = cfg
        return cfg

    def _stream_for(self, stream: StreamArg) -> object:
        """The call's stream, of the device of the communicator the buffer has now (a plan made before
        update_ctx checks against the new one)."""
        return self.comm.stream_for(stream)

    def _name_for_callers(self, plan: DispatchPlan | CombinePlan, names: Mapping[str, str]) -> None:
        """`plan` names this class's parameters, says ``with_weights`` and checks its streams' device."""
        plan._vocabulary = Vocabulary(names, "with_weights", self._stream_for)
        self._plans.add(plan)

    # ---- plans (repeated calls with fixed shapes) ------------------------------------------------------------
    @_in_callers_words(DISPATCH_NAMES)
    def plan_dispatch(self, num_tokens: int, hidden: int, num_experts: int, topk: int, *, x_dtype: DTypeLike,
                      quant_mode: int = 0, comm_alg: str = "", with_weights: bool = False,
                      mask_shape: tuple[int, ...] | None = None, smooth_scales_shape: tuple[int, ...] | None = None,
                      x_smooth_scales_dtype: DTypeLike | None = None, zero_expert_num: int = 0,
                      copy_expert_num: int = 0, const_expert_num: int = 0, shared_expert_num: int = 1,
                      shared_expert_rank_num: int = 0, expert_token_nums_type: int = 1,
                      num_max_dispatch_tokens_per_rank: int = 0, y_dtype: DTypeLike | None = None,
                      stream: StreamArg = None) -> DispatchPlan:
        """A :class:`~aclnn_py.ops.DispatchPlan` on this communicator: one phase 1, then each call
        ``plan(x, topk_idx, topk_weights=..., x_active_mask=..., scales=...)`` is a launch
        (``expert_scales=`` is the same input as ``topk_weights=``; its errors use this class's names)."""
        cfg = self._config(
            "plan_dispatch", num_experts=num_experts, comm_alg=comm_alg,
            quant_mode=quant_mode, zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
            const_expert_num=const_expert_num, expert_shard_type=0, shared_expert_num=shared_expert_num,
            shared_expert_rank_num=shared_expert_rank_num, expert_token_nums_type=expert_token_nums_type,
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank)
        plan = DispatchPlan(self.context, bs=num_tokens, hidden=hidden, topk=topk, x_dtype=x_dtype, config=cfg,
                            scales_shape=smooth_scales_shape, scales_dtype=x_smooth_scales_dtype,
                            mask_shape=mask_shape, with_expert_scales=with_weights, y_dtype=y_dtype,
                            stream=self.comm.stream_for(stream))
        self._name_for_callers(plan, DISPATCH_NAMES)
        return plan

    @_in_callers_words(COMBINE_NAMES)
    def plan_combine(self, dispatch_plan: DispatchPlan, *, with_weights: bool = False, comm_quant_mode: int = 0,
                     comm_alg: str = "", mask_shape: tuple[int, ...] | None = None,
                     with_shared_expert_x: bool = False, with_ori_x: bool = False, const_expert_num: int = 0,
                     zero_expert_num: int = 0, copy_expert_num: int = 0, shared_expert_num: int = 1,
                     shared_expert_rank_num: int = 0, num_experts: int = 0,
                     num_max_dispatch_tokens_per_rank: int = 0, dtype: DTypeLike | None = None,
                     stream: StreamArg = None) -> CombinePlan:
        """A :class:`~aclnn_py.ops.CombinePlan` sized from a dispatch plan's outputs: each call is
        ``plan(expert_out, topk_idx, assist_info, ep_send_counts, topk_weights, ...)`` (its errors use
        this class's names); with a TP domain each call also takes ``tp_send_counts=``, the dispatch plan's
        ``tp_recv_counts`` output."""
        cfg = self._config(
            "plan_combine", num_experts=num_experts, comm_alg=comm_alg,
            comm_quant_mode=comm_quant_mode, zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
            const_expert_num=const_expert_num, expert_shared_type=0, shared_expert_num=shared_expert_num,
            shared_expert_rank_num=shared_expert_rank_num,
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank)
        d = dispatch_plan.outputs
        plan = CombinePlan(
            self.context, a=d.expand_x.shape[0], bs=dispatch_plan.bs, hidden=dispatch_plan.hidden,
            topk=dispatch_plan.topk, dtype=dtype if dtype is not None else dispatch_plan.x_dtype,
            assist_len=d.assist_info_for_combine.shape[0], counts_len=d.ep_recv_counts.shape[0], config=cfg,
            with_expert_scales=with_weights, mask_shape=mask_shape, with_shared_expert_x=with_shared_expert_x,
            with_ori_x=with_ori_x, stream=self.comm.stream_for(stream))
        self._name_for_callers(plan, COMBINE_NAMES)
        return plan

    def synchronize(self, stream: StreamArg = None) -> None:
        """Wait for `stream` (default: the current stream) and raise the failure of a kernel on it,
        e.g. a timeout naming the peers that never arrived. Interruptible (Ctrl-C)."""
        resolve_stream(stream).synchronize()

    def close(self) -> None:
        """Close the plans made by this buffer and free its context tensor (the communicator is the
        caller's). Idempotent."""
        for plan in list(self._plans):
            plan.close()
        self._forget_calls()  # the kept outputs go back to the pool once no stream uses them
        if self.context is not None:
            self.context.close()

    def __del__(self) -> None:
        # Dropped without close(): the result sets live on in a cycle with the Tensors they handed out
        # until the collector runs; their executors are let go of now.
        try:
            self._close_result_plans()
        except Exception:  # noqa: BLE001 - at interpreter exit the backend may be gone
            pass

    def __enter__(self) -> MoeDistributeBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"MoeDistributeBuffer(rank {self.rank_id}/{self.world_size}, {self.soc}, window "
                f"{self.ccl_buffer_size} bytes)")


def _generation_for(requested: int, tp_comm: Communicator | None) -> int:
    """The generation a buffer uses: `requested` (0: the newest exported; with a TP domain, the newest
    exported group-string generation)."""
    if tp_comm is None or requested:
        number = generations.resolve(requested)
        if tp_comm is not None and number == generations.NEWEST:
            raise generations.GenerationError(
                f"tp_comm: {generations.GENERATIONS[0]} has no TP domain; a TP domain needs generation 1-4")
        return number
    present = [g.number for g in generations.exported() if g.group_strings]
    if not present:
        raise generations.GenerationError("tp_comm: the backend exports no group-string generation (1-4), which "
                                          "a TP domain needs")
    return present[0]
