"""MoeDistributeBuffer: CANN's low-latency MoE API (``low_latency_dispatch`` / ``low_latency_combine``
/ ``get_low_latency_ccl_buffer_size``, modelled on DeepEP's), with numpy arrays or device Tensors
instead of torch tensors and an aclnn-py :class:`~aclnn_py.hccl.Communicator` instead of a torch
process group (docs/comparison.md maps every argument).

This layer only translates: CANN's Python names become the operators' attributes (one
:class:`~aclnn_py.MoeConfig` per distinct set, made once and cached), and every call is delegated to
:mod:`aclnn_py.ops`, where arguments are converted and checked. With device Tensors and a ``Stream``,
a call of a shape the operator already checked gets its outputs from the memory pool here, so that
the operator's compiled call takes it (docs/concepts.md, "The compiled steady state").

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
both devices, per call, when a plan is built, and when a plan's call takes the Python path (a plan
call that the compiled path takes — device Tensors bound as last time, a ``Stream`` — is not checked
again). A stream borrowed by handle has no known device and is taken as given.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar, cast

from ._bases import BufferBase
from .dtypes import DTypeLike
from .errors import AclnnPyError
from .hccl import Communicator, build_context, rebuild_context
from .ops import generations, prechecks, sizing
from .ops._caller import Vocabulary, renamed, reraise
from .ops.combine import CombinePlan, moe_distribute_combine, x_out_layout
from .ops.config import MoeConfig, plain_key
from .ops.dispatch import DispatchOutputs, DispatchPlan, allocate_outputs, moe_distribute_dispatch
from .ops.executor import Plan
from .runtime import Stream, StreamArg, current_stream, initialized, resolve_stream, soc_name
from .tensor import Tensor, TensorArg

F = TypeVar("F", bound=Callable[..., Any])


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


#: Per operator method: its tensor parameters in order, with the operator's name of each and whether it
#: is optional; and the parameters giving the config key of :meth:`MoeDistributeBuffer._config`, in its
#: order ((None, value): a constant of the method). The compiled method reads its calls with these.
DISPATCH_TENSORS = (("x", "x", False), ("topk_idx", "expert_ids", False), ("x_smooth_scale", "scales", True),
                    ("x_active_mask", "x_active_mask", True), ("topk_weights", "expert_scales", True),
                    ("elastic_info", "elastic_info", True))
COMBINE_TENSORS = (("x", "expand_x", False), ("topk_idx", "expert_ids", False),
                   ("assist_info_for_combine", "assist_info_for_combine", False),
                   ("ep_send_counts", "ep_send_counts", False), ("topk_weights", "expert_scales", True),
                   ("x_active_mask", "x_active_mask", True), ("expand_scales", "expand_scales", True),
                   ("shared_expert_x", "shared_expert_x", True), ("elastic_info", "elastic_info", True),
                   ("ori_x", "ori_x", True), ("const_expert_alpha_1", "const_expert_alpha_1", True),
                   ("const_expert_alpha_2", "const_expert_alpha_2", True), ("const_expert_v", "const_expert_v", True))
#: What makes a buffer's MoeConfig, in the order of its key in the buffer's config cache.
CONFIG_FIELDS = ("num_experts", "comm_alg", "quant_mode", "comm_quant_mode", "zero_expert_num", "copy_expert_num",
                 "const_expert_num", "expert_shard_type", "shared_expert_num", "shared_expert_rank_num",
                 "expert_token_nums_type", "num_max_dispatch_tokens_per_rank")


def _key_params(renamed: Mapping[str, str], fixed: Mapping[str, int]) -> tuple[tuple[str | None, int | None], ...]:
    """A method's config key, per CONFIG_FIELDS entry: (the method's parameter that gives it, None) — the
    field's own name unless `renamed` — or (None, its value) when `fixed` by the method."""
    return tuple((None, fixed[f]) if f in fixed else (renamed.get(f, f), None) for f in CONFIG_FIELDS)


DISPATCH_KEY = _key_params({}, {"comm_quant_mode": 0})
COMBINE_KEY = _key_params({"expert_shard_type": "expert_shared_type"}, {"quant_mode": 0, "expert_token_nums_type": 1})
#: Output sets a method keeps for reuse: a loop holding one step's results while it makes the next one's
#: (``r = buf.low_latency_dispatch(...)`` rebinds `r` after the call) needs two; more would keep device
#: memory (expand_x can be large) out of the pool for loops that rarely need it.
KEEP_OUTPUTS = 2


def _compiled_method(which: int, tensors: tuple[tuple[str, str, bool], ...], key: tuple[tuple[str | None, int | None], ...],
                     operator: Callable[..., object], names: Mapping[str, str]) -> Callable[[F], F]:
    """The method's steady-state calls parsed and launched by the compiled core (``aclnn_py._core.
    BufferCall``); without the compiled parts, the method as it is."""
    try:
        from ._core import compiled_buffer_method
    except ImportError:
        return lambda method: method
    return compiled_buffer_method(which, tensors, key, operator, current_stream, reraise, names)


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


def _device_tensors(required: tuple[object, ...], optional: tuple[object, ...]) -> bool:
    """Every `required` argument is a Tensor and every `optional` one a Tensor or None."""
    return all(t.__class__ is Tensor for t in required) and all(t is None or t.__class__ is Tensor for t in optional)


def _with_descriptors(tensors: tuple[object, ...]) -> None:
    """Make the descriptor of each open Tensor of `tensors`, in the operator's input order: the
    compiled call takes Tensors that have theirs, and a Tensor new this step (the experts' output)
    would otherwise send the call to the Python function. One that cannot have one fails here as it
    would there, the shape's rules having passed."""
    for t in tensors:
        if t is not None and not cast(Tensor, t).closed:
            cast(Tensor, t).descriptor()


def _pooled_dispatch_outputs(cfg: MoeConfig, x: object, ids: object, scales: object, mask: object, weights: object,
                             elastic: object) -> DispatchOutputs | None:
    """Dispatch's outputs, taken from the memory pool here so that the operator's compiled call
    takes the call (it takes only calls with outputs), when every input is a device Tensor and the
    config's pre-checks passed this BS, H and K before; None otherwise (host inputs, a first call of
    a shape), and the operator allocates them after its own checks, so its errors stay its own."""
    if not _device_tensors((x, ids), (scales, mask, weights, elastic)):
        return None
    xt, it = cast(Tensor, x), cast(Tensor, ids)
    if xt.ndim != 2 or it.ndim != 2 or not prechecks.shape_passed(cfg, "dispatch", xt.shape[0], xt.shape[1],
                                                                   it.shape[1]):
        return None
    _with_descriptors((x, ids, scales, mask, weights, elastic))
    outs = allocate_outputs(cfg, xt, it, cast("Tensor | None", weights), cast("Tensor | None", scales),
                            elastic is not None, None)
    for t in outs:
        if t is not None:
            t.descriptor()  # the compiled call takes Tensors that have theirs
    return outs


def _pooled_x_out(cfg: MoeConfig, x: object, ids: object, assist: object, counts: object,
                  optional: tuple[object, ...]) -> Tensor | None:
    """Combine's x_out from the memory pool, on the terms of :func:`_pooled_dispatch_outputs`."""
    if not _device_tensors((x, ids, assist, counts), optional):
        return None
    xt, it = cast(Tensor, x), cast(Tensor, ids)
    if xt.ndim != 2 or it.ndim != 2 or not prechecks.shape_passed(cfg, "combine", it.shape[0], xt.shape[1],
                                                                   it.shape[1]):
        return None
    _with_descriptors((x, ids, assist, counts) + optional)
    out = Tensor.empty(*x_out_layout(xt, it))
    out.descriptor()
    return out


def _remember(buffer: MoeDistributeBuffer, method: str, key: tuple[object, ...], cfg: MoeConfig, stream: Stream,
              tensors: tuple[object, ...], outputs: object, result: object) -> None:
    """Tell `method`'s compiled route what the Python method just did (see BufferCall.remember)."""
    route = getattr(getattr(type(buffer), method), "compiled", None)
    if route is not None:
        route.remember(buffer, key, cfg, stream, tensors, outputs, result, KEEP_OUTPUTS)


_refill_ready = False


def _enable_poison_refill() -> None:
    """On the mock: outputs a buffer hands out again get the poison of new memory, as pooled blocks do."""
    global _refill_ready
    if _refill_ready:
        return
    if initialized().is_mock:
        try:
            from . import _core, _mock
        except ImportError:
            pass
        else:
            _core.set_poison_refill(_mock.refill_poison_async_address())
    _refill_ready = True


class MoeDistributeBuffer(BufferBase):
    """Low-latency MoE dispatch/combine over one expert-parallel communicator.

    Building it runs CANN's context sequence on `comm` (the int32 context tensor the operators take)
    and reads the window size HCCL reports (``ccl_buffer_size``, bytes). `ccl_buffer_size` and
    `comm_alg` are accepted for signature compatibility and ignored, as in CANN's current version.

    `generation` picks the operators' generation: 0, the default, is the newest the loaded backend
    exports; 1 … 4 are the group-string generations (docs/operators.md, "Group-string generations"),
    which the buffer calls with `comm`'s name (``HcclGetCommName``) instead of a context tensor. The
    generation in use is :attr:`generation`. Plans need generation 5.

    Outputs: each call returns Tensors of its own. The buffer keeps the outputs of its last few calls
    per method (two) and hands them out again, instead of allocating, to a later call of the same layout on
    the same stream once nothing else refers to them — not while any of them is referenced, viewed or
    exported (numpy view, DLPack), was read on another stream, or closed (docs/concepts.md, "The
    compiled steady state"). On the mock they get the poison of new memory again, as pooled blocks do.
    :meth:`close` lets them go."""

    def __init__(self, comm: Communicator, ccl_buffer_size: int = 0, comm_alg: int = 0, *, generation: int = 0):
        _enable_poison_refill()
        self._forget_calls()
        self.comm = comm
        self.rank_id = int(comm.rank)
        self.world_size = int(comm.world_size)
        self.group_name = comm.name
        self.soc = soc_name()
        #: The generation of the operators this buffer's calls use (e.g. 5 for ``…DispatchV5``).
        self.generation = generations.resolve(generation)
        #: The int32 context tensor of the V5 operators; None with a group-string generation (it uses group_name).
        self.context: Tensor | None = None
        #: The window size HCCL reports for `comm`, in bytes (0 with a group-string generation).
        self.ccl_buffer_size = 0
        if self.generation == generations.NEWEST:  # the group-string generations take the group name instead
            self.context, self.ccl_buffer_size = build_context(comm)
        self._configs: dict[tuple[object, ...], MoeConfig] = {}
        self._plans: weakref.WeakSet[Plan] = weakref.WeakSet()

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
    def _config(self, method: str, names: Mapping[str, str], key_params: tuple[tuple[str | None, int | None], ...],
                **given: object) -> tuple[MoeConfig, tuple[object, ...]]:
        """The config of a call's attributes (made once per distinct set) and its key: `given` by the
        method's parameter names, `key_params` (DISPATCH_KEY / COMBINE_KEY) says which gives each field."""
        key = tuple(given[param] if param is not None else value for param, value in key_params)
        # looked up only with plain ints and strs: 8.0, Decimal(8) or True equal 8 as keys, and a value
        # MoeConfig refuses must be refused whatever ran before
        cfg = self._configs.get(key) if plain_key(key) else None
        self.comm.require_open(f"run {method}")
        if cfg is not None:
            return cfg, key
        fields: dict[str, Any] = dict(zip(CONFIG_FIELDS, key))
        max_tokens = fields.pop("num_max_dispatch_tokens_per_rank")
        global_bs = max_tokens * self.world_size if type(max_tokens) is int else max_tokens
        try:
            cfg = MoeConfig(ep_world_size=self.world_size, ep_rank_id=self.rank_id,
                            moe_expert_num=fields.pop("num_experts"), ccl_buffer_size=self.ccl_buffer_size,
                            global_bs=global_bs, soc=self.soc, generation=self.generation,
                            group_ep=self.group_name if self.context is None else "", **fields)
        except TypeError as exc:
            raise TypeError(f"{method}(): {renamed(exc, names)}") from None
        if plain_key(key):
            if len(self._configs) > 64:
                self._configs.clear()
            self._configs[key] = cfg
        return cfg, key

    def _stream_for(self, stream: StreamArg) -> Stream:
        """The call's stream, of the device of the communicator the buffer has now (a plan made before
        update_ctx checks against the new one)."""
        return self.comm.stream_for(stream)

    def _speak_to_callers(self, plan: DispatchPlan | CombinePlan, names: Mapping[str, str]) -> None:
        """`plan` names this class's parameters, says ``with_weights`` and checks its streams' device."""
        plan._vocabulary = Vocabulary(names, "with_weights", self._stream_for)
        self._plans.add(plan)

    # ---- operators ----------------------------------------------------------------------------------------
    @_compiled_method(0, DISPATCH_TENSORS, DISPATCH_KEY, moe_distribute_dispatch, DISPATCH_NAMES)
    @_in_callers_words(DISPATCH_NAMES)
    def low_latency_dispatch(
        self, x: TensorArg, topk_idx: TensorArg, num_experts: int, *, quant_mode: int = 0, comm_alg: str = "",
        x_smooth_scale: TensorArg | None = None, x_active_mask: TensorArg | None = None,
        topk_weights: TensorArg | None = None, zero_expert_num: int = 0, copy_expert_num: int = 0,
        const_expert_num: int = 0, elastic_info: TensorArg | None = None, expert_shard_type: int = 0,
        shared_expert_num: int = 1, shared_expert_rank_num: int = 0, expert_token_nums_type: int = 1,
        num_max_dispatch_tokens_per_rank: int = 0, y_dtype: DTypeLike | None = None, x_dtype: DTypeLike | None = None,
        x_smooth_scales_dtype: DTypeLike | None = None, stream: StreamArg = None,
    ) -> LowLatencyDispatchResult:
        """Dispatch this rank's tokens to the ranks of their experts. Host arrays are uploaded on
        `stream` (default: the current stream); the results are device Tensors whose ``numpy()``
        waits for the stream. ``global_bs = num_max_dispatch_tokens_per_rank * world_size`` as CANN
        passes it.

        Ascend950 only: ``y_dtype`` selects expand_x's type (int8, ``DataType.HIFLOAT8``,
        ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``, ``DataType.FLOAT4_E2M1`` / ``FLOAT4_E1M2`` — a packed
        fp4 expand_x downloads as (A, H/2) bytes); ``x_dtype`` records the element type of a
        low-precision x given as uint8 codes (HiFloat8, or packed fp4 of shape (BS, H/2));
        ``x_smooth_scales_dtype`` that of ``x_smooth_scale`` (e.g. ``DataType.FLOAT8_E8M0`` for per-token
        e8m0 bytes). Each takes a numpy / ml_dtypes dtype or an ``aclnn_py.DataType``."""
        cfg, key = self._config(
            "low_latency_dispatch", DISPATCH_NAMES, DISPATCH_KEY, num_experts=num_experts, comm_alg=comm_alg,
            quant_mode=quant_mode, zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
            const_expert_num=const_expert_num, expert_shard_type=expert_shard_type, shared_expert_num=shared_expert_num,
            shared_expert_rank_num=shared_expert_rank_num, expert_token_nums_type=expert_token_nums_type,
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank)
        s = self.comm.stream_for(stream)
        outputs = None
        plain = x_dtype is None and x_smooth_scales_dtype is None and y_dtype is None
        if plain:
            outputs = _pooled_dispatch_outputs(cfg, x, topk_idx, x_smooth_scale, x_active_mask, topk_weights,
                                               elastic_info)
        out = moe_distribute_dispatch(self.context, x, topk_idx, config=cfg, scales=x_smooth_scale,
                                      x_active_mask=x_active_mask, expert_scales=topk_weights, elastic_info=elastic_info,
                                      x_dtype=x_dtype, scales_dtype=x_smooth_scales_dtype, y_dtype=y_dtype,
                                      outputs=outputs, stream=s)
        ds, es = out.dynamic_scales, out.expand_scales
        assert ds is not None and es is not None  # the operator, or the pool here, allocates all seven
        result = LowLatencyDispatchResult(out[0], ds, out[2], out[3], out[4], es)
        if plain:
            _remember(self, "low_latency_dispatch", key, cfg, s,
                      (x, topk_idx, x_smooth_scale, x_active_mask, topk_weights, elastic_info), out, result)
        return result

    @_compiled_method(1, COMBINE_TENSORS, COMBINE_KEY, moe_distribute_combine, COMBINE_NAMES)
    @_in_callers_words(COMBINE_NAMES)
    def low_latency_combine(
        self, x: TensorArg, topk_idx: TensorArg, topk_weights: TensorArg | None,
        assist_info_for_combine: TensorArg, ep_send_counts: TensorArg, *, num_experts: int = 0,
        comm_alg: str = "", comm_quant_mode: int = 0, x_active_mask: TensorArg | None = None,
        expand_scales: TensorArg | None = None, shared_expert_x: TensorArg | None = None,
        elastic_info: TensorArg | None = None, ori_x: TensorArg | None = None,
        const_expert_alpha_1: TensorArg | None = None, const_expert_alpha_2: TensorArg | None = None,
        const_expert_v: TensorArg | None = None, zero_expert_num: int = 0, copy_expert_num: int = 0,
        const_expert_num: int = 0, expert_shared_type: int = 0, shared_expert_num: int = 1,
        shared_expert_rank_num: int = 0, num_max_dispatch_tokens_per_rank: int = 0, stream: StreamArg = None,
    ) -> Tensor:
        """Send the expert outputs `x` back to the tokens' ranks and reduce them per token, weighted by
        `topk_weights` (None: an unweighted sum). Returns x_out (BS, H) as a device Tensor.
        `expert_shared_type` is CANN's spelling of the operator's expert_shard_type."""
        if assist_info_for_combine is None or ep_send_counts is None:
            raise ValueError("low_latency_combine: assist_info_for_combine and ep_send_counts are required "
                             "(pass the dispatch outputs)")
        cfg, key = self._config(
            "low_latency_combine", COMBINE_NAMES, COMBINE_KEY, num_experts=num_experts, comm_alg=comm_alg,
            comm_quant_mode=comm_quant_mode, zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
            const_expert_num=const_expert_num, expert_shared_type=expert_shared_type,
            shared_expert_num=shared_expert_num, shared_expert_rank_num=shared_expert_rank_num,
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank)
        s = self.comm.stream_for(stream)
        optional = (topk_weights, x_active_mask, expand_scales, shared_expert_x, elastic_info, ori_x,
                    const_expert_alpha_1, const_expert_alpha_2, const_expert_v)
        x_out = moe_distribute_combine(
            self.context, x, topk_idx, assist_info_for_combine, ep_send_counts, topk_weights, config=cfg,
            x_active_mask=x_active_mask, expand_scales=expand_scales, shared_expert_x=shared_expert_x,
            elastic_info=elastic_info, ori_x=ori_x, const_expert_alpha_1=const_expert_alpha_1,
            const_expert_alpha_2=const_expert_alpha_2, const_expert_v=const_expert_v,
            x_out=_pooled_x_out(cfg, x, topk_idx, assist_info_for_combine, ep_send_counts, optional), stream=s)
        _remember(self, "low_latency_combine", key, cfg, s,
                  (x, topk_idx, assist_info_for_combine, ep_send_counts) + optional, x_out, x_out)
        return x_out

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
        cfg, _ = self._config(
            "plan_dispatch", DISPATCH_NAMES, DISPATCH_KEY, num_experts=num_experts, comm_alg=comm_alg,
            quant_mode=quant_mode, zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
            const_expert_num=const_expert_num, expert_shard_type=0, shared_expert_num=shared_expert_num,
            shared_expert_rank_num=shared_expert_rank_num, expert_token_nums_type=expert_token_nums_type,
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank)
        plan = DispatchPlan(self.context, bs=num_tokens, hidden=hidden, topk=topk, x_dtype=x_dtype, config=cfg,
                            scales_shape=smooth_scales_shape, scales_dtype=x_smooth_scales_dtype,
                            mask_shape=mask_shape, with_expert_scales=with_weights, y_dtype=y_dtype,
                            stream=self.comm.stream_for(stream))
        self._speak_to_callers(plan, DISPATCH_NAMES)
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
        this class's names)."""
        cfg, _ = self._config(
            "plan_combine", COMBINE_NAMES, COMBINE_KEY, num_experts=num_experts, comm_alg=comm_alg,
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
        self._speak_to_callers(plan, COMBINE_NAMES)
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

    def __enter__(self) -> MoeDistributeBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"MoeDistributeBuffer(rank {self.rank_id}/{self.world_size}, {self.soc}, window "
                f"{self.ccl_buffer_size} bytes)")
