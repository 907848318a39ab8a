"""Stubs of the compiled core (csrc/_core.pyx and csrc/core/*.pxi); the fields of the bases are stated in
csrc/_core.pxd, and tests/test_stubs.py holds these stubs to it and to the compiled module."""

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from typing_extensions import CapsuleType

from ._binding.prototypes import RunLayout
from .buffer import LowLatencyDispatchResult
from .dtypes import DataType, DTypeLike
from .errors import AclnnParamInvalid
from .hccl import Communicator
from .ops.config import MoeConfig
from .ops.dispatch import DispatchOutputs
from .runtime import StreamArg
from .runtime._memory import DeviceMemory
from .runtime._stream import Stream
from .tensor import Tensor, TensorArg

#: How many layouts (outputs and executor) a MoeDistributeBuffer result set keeps.
RESULT_SET_LAYOUTS: int

def bind_backend(*, create_tensor_address: int, destroy_tensor_address: int, set_input_addr_address: int,
                 set_output_addr_address: int, destroy_executor_address: int, format_nd_value: int,
                 refill_poison_address: int = 0, hccl_barrier_address: int = 0, get_device_address: int = 0,
                 launch_may_block: bool = True) -> None: ...
def bind_copies(*, memcpy_async_address: int, memcpy_address: int, host_to_device: int,
                device_to_host: int) -> None: ...
def download(out: object, src: int, count: int) -> None: ...
class ZeroPages:
    def __init__(self, nbytes: int) -> None: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

def zero_pages_held() -> tuple[int, int]: ...
def private_view(t: Tensor, hold: Literal["export", "memory", "nothing"]) -> Tensor: ...
def copy_host_to_device(dst: int, room: int, arr: object, stream: object = None) -> None: ...
def upload(dst: TensorBase, arr: object, stream: StreamBase) -> None: ...
def current_device() -> tuple[int, int]: ...
def hccl_barrier(comm: int, stream: int) -> int: ...
def destroy_executor_at(executor: int) -> int: ...
def bind_holds(*, states: dict[int, Any], make: Callable[[Any], Any], record_checkpoint: Callable[[Any], None],
               workspace: Callable[[Any, int], int], every: int, lock: Any, spare: list[Any]) -> None: ...
def launches_passed(stream: object) -> bool: ...
def _mark_synchronisation(stream: StreamBase) -> tuple[int, int]: ...
def _synchronisation_passed(stream: StreamBase, closed: int, launches: int) -> None: ...
ROOT_INFO_BYTES: int
def bind_waits(*, sync_with_timeout_address: int, comm_init_root_info_address: int) -> None: ...
def synchronize(stream: StreamBase, timeout_ms: int | None,
                failed: Callable[[int, bool, int | None], BaseException | None]) -> None: ...
def comm_init_root_info(world_size: int, root: bytes, rank: int) -> tuple[int, int]: ...
def _turnstile_enter() -> None: ...
def _turnstile_leave() -> None: ...
def hold_until_passed(stream: object, obj: object) -> None: ...
def states_forgotten() -> None: ...
def destroy_descriptor(address: int) -> None: ...
def check_placement(in_names: tuple[str, ...], inputs: Sequence[object], out_names: tuple[str, ...],
                    outputs: Sequence[object], stream: StreamBase) -> None: ...

class TensorBase:
    shape: tuple[int, ...]
    dtype: DataType
    strides: tuple[int, ...]
    offset: int
    _mem: DeviceMemory | None
    _owner: object
    _writer: Stream | None
    _open: bool
    _contiguous: bool
    _shared: bool
    _rewritten: bool
    _ptr: int
    _offset_nbytes: int
    @property
    def _desc_addr(self) -> int | None: ...
    device: int | None
    _span: int
    @property
    def recycled(self) -> bool: ...
    def _describe(self) -> None: ...
    def close(self) -> None: ...
    def _drop_descriptor(self) -> None: ...
    def _take_descriptor(self) -> int: ...
    def _written_nbytes(self) -> int: ...
    def _rows_received(self) -> int: ...
    def _check_readable(self, operation: str) -> None: ...

class StreamBase:
    _open: bool
    _key: int
    _handle: int
    _device: int | None

class StreamStateBase:
    current: list[object]
    segments: deque[list[object]]
    first: int
    checkpoints: deque[tuple[Any, int]]
    workspace: DeviceMemory | None
    launches: int
    launches_passed: int
    def boundary(self) -> int: ...
    def drop_through(self, number: int, released: list[list[object]]) -> None: ...

class ConfigBase:
    _passed: set[tuple[object, ...]]
    _packed: dict[str, PackedBase]
    _operators: tuple[str, str]

class PackedBase:
    layout: RunLayout
    ints_address: int
    strings_address: int

class Launcher:
    layout: RunLayout
    phase1_name: str
    phase2_name: str
    n_in: int
    n_out: int
    generation: int
    def __init__(self, layout: RunLayout, run: int, phase2: int, in_at: tuple[int, ...], out_at: tuple[int, ...],
                 input_names: tuple[str, ...], output_names: tuple[str, ...], generation: int) -> None: ...
    @property
    def input_positions(self) -> tuple[int, ...]: ...
    @property
    def output_positions(self) -> tuple[int, ...]: ...
    def run(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None], config: ConfigBase,
            stream: StreamBase) -> None: ...
    def phase1(self, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor | None],
               config: ConfigBase) -> tuple[int, int]: ...
    def launch_executor(self, executor: int, size: int, stream: StreamBase, inputs: Sequence[Tensor | None],
                        outputs: Sequence[Tensor | None], workspace: int | None = None) -> None: ...

class Operator:
    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    def __init__(self, name: str, input_names: tuple[str, ...], output_names: tuple[str, ...],
                 required_inputs: int, key: tuple[tuple[int, int], ...], launcher_at: int, outputs_type: type | None,
                 convert: Callable[..., list[Tensor | None]], make_outputs: Callable[..., object],
                 verdict: Callable[..., object], refuse_unsupported: Callable[..., None],
                 launchers_for: Callable[[Any], tuple[Launcher, Launcher]], resolve_config: Callable[..., MoeConfig],
                 resolve_stream: Callable[[StreamArg], Stream], missing: tuple[int, Callable[[], Tensor]] | None,
                 param_invalid_type: type[AclnnParamInvalid]) -> None: ...

def register_operator(operator: Operator) -> None: ...

def moe_distribute_dispatch(
    context: Tensor | None, x: TensorArg, expert_ids: TensorArg, *, config: MoeConfig | None = None,
    scales: TensorArg | None = None, x_active_mask: TensorArg | None = None, expert_scales: TensorArg | None = None,
    elastic_info: TensorArg | None = None, performance_info: TensorArg | None = None,
    x_dtype: DTypeLike | None = None, scales_dtype: DTypeLike | None = None, y_dtype: DTypeLike | None = None,
    outputs: DispatchOutputs | Mapping[str, Tensor | None] | None = None, stream: StreamArg = None,
    precheck: bool = True, **attrs: int | str,
) -> DispatchOutputs: ...

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
) -> Tensor: ...

class Layout: ...

class ResultSet:
    issue: int

class ResultRing:
    method: str
    size: int
    def __init__(self, method: str, size: int) -> None: ...
    @property
    def held(self) -> int: ...

class BufferBase:
    context: Tensor | None
    comm: Communicator
    _configs: dict[tuple[object, ...], MoeConfig]
    def _set_up_calls(self, result_sets: int, dispatch_names: Mapping[str, str], combine_names: Mapping[str, str],
                      result_type: type[LowLatencyDispatchResult], current_stream: Callable[[], Stream],
                      tp_domain: bool, read_rows: Callable[[DispatchOutputs, MoeConfig, int], int] | None = None,
                      row_elements: tuple[int, ...] | None = None) -> None: ...
    def _forget_calls(self) -> None: ...
    def _close_result_plans(self) -> None: ...
    @property
    def result_sets(self) -> int: ...
    @property
    def held_result_sets(self) -> tuple[int, int]: ...
    def low_latency_dispatch(
        self, x: TensorArg, topk_idx: TensorArg, num_experts: int, *, quant_mode: int = 0, comm_alg: str = "",
        x_smooth_scale: TensorArg | None = None, x_active_mask: TensorArg | None = None,
        topk_weights: TensorArg | None = None, zero_expert_num: int = 0, copy_expert_num: int = 0,
        const_expert_num: int = 0, elastic_info: TensorArg | None = None, expert_shard_type: int = 0,
        shared_expert_num: int = 1, shared_expert_rank_num: int = 0, expert_token_nums_type: int = 1,
        num_max_dispatch_tokens_per_rank: int = 0, y_dtype: DTypeLike | None = None, x_dtype: DTypeLike | None = None,
        x_smooth_scales_dtype: DTypeLike | None = None, stream: StreamArg = None, keep: bool = False,
    ) -> LowLatencyDispatchResult: ...
    def low_latency_combine(
        self, x: TensorArg, topk_idx: TensorArg, topk_weights: TensorArg | None,
        assist_info_for_combine: TensorArg, ep_send_counts: TensorArg, *, num_experts: int = 0,
        comm_alg: str = "", comm_quant_mode: int = 0, x_active_mask: TensorArg | None = None,
        expand_scales: TensorArg | None = None, shared_expert_x: TensorArg | None = None,
        elastic_info: TensorArg | None = None, ori_x: TensorArg | None = None,
        const_expert_alpha_1: TensorArg | None = None, const_expert_alpha_2: TensorArg | None = None,
        const_expert_v: TensorArg | None = None, zero_expert_num: int = 0, copy_expert_num: int = 0,
        const_expert_num: int = 0, expert_shared_type: int = 0, shared_expert_num: int = 1,
        shared_expert_rank_num: int = 0, num_max_dispatch_tokens_per_rank: int = 0,
        tp_send_counts: TensorArg | None = None, stream: StreamArg = None, keep: bool = False,
    ) -> Tensor: ...

class PlanRelease:
    def __call__(self) -> None: ...

class Plan:
    _open: bool
    config: MoeConfig
    prepared: Any
    op: str
    workspace_memory: DeviceMemory | None
    _stream: Stream | None
    _vocabulary: Any
    @property
    def closed(self) -> bool: ...
    @property
    def workspace_size(self) -> int: ...
    @property
    def context(self) -> Tensor | None: ...
    def invalidate(self, reason: str) -> None: ...
    def _communicator_closed(self, label: str) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Plan: ...
    def __exit__(self, *exc: object) -> None: ...

class DispatchPlan(Plan):
    bs: int
    hidden: int
    topk: int
    x_dtype: DataType
    def __init__(self, context: Tensor | None, *, bs: int, hidden: int, topk: int, x_dtype: DTypeLike,
                 config: MoeConfig | None = None, scales_shape: tuple[int, ...] | None = None,
                 scales_dtype: DTypeLike | None = None, mask_shape: tuple[int, ...] | None = None,
                 with_expert_scales: bool = False, y_dtype: DTypeLike | None = None, stream: StreamArg = None,
                 **attrs: int | str) -> None: ...
    @property
    def outputs(self) -> DispatchOutputs: ...
    def launch(self, x: TensorArg, expert_ids: TensorArg, *, scales: TensorArg | None = None,
               x_active_mask: TensorArg | None = None, expert_scales: TensorArg | None = None,
               topk_weights: TensorArg | None = None, outputs: DispatchOutputs | None = None,
               stream: StreamArg = None) -> DispatchOutputs: ...
    def __call__(self, x: TensorArg, expert_ids: TensorArg, *, scales: TensorArg | None = None,
                 x_active_mask: TensorArg | None = None, expert_scales: TensorArg | None = None,
                 topk_weights: TensorArg | None = None, outputs: DispatchOutputs | None = None,
                 stream: StreamArg = None) -> DispatchOutputs: ...

class CombinePlan(Plan):
    def __init__(self, context: Tensor | None, *, a: int, bs: int, hidden: int, topk: int, dtype: DTypeLike,
                 assist_len: int, counts_len: int, config: MoeConfig | None = None, with_expert_scales: bool = False,
                 mask_shape: tuple[int, ...] | None = None, with_shared_expert_x: bool = False,
                 with_ori_x: bool = False, const_experts: int = 0, stream: StreamArg = None,
                 **attrs: int | str) -> None: ...
    @property
    def x_out(self) -> Tensor: ...
    def launch(self, expand_x: TensorArg, expert_ids: TensorArg, assist_info_for_combine: TensorArg,
               ep_send_counts: TensorArg, expert_scales: TensorArg | None = None, *,
               topk_weights: TensorArg | None = None, x_active_mask: TensorArg | None = None,
               shared_expert_x: TensorArg | None = None, ori_x: TensorArg | None = None,
               const_expert_alpha_1: TensorArg | None = None, const_expert_alpha_2: TensorArg | None = None,
               const_expert_v: TensorArg | None = None, tp_send_counts: TensorArg | None = None,
               x_out: Tensor | None = None, stream: StreamArg = None) -> Tensor: ...
    def __call__(self, expand_x: TensorArg, expert_ids: TensorArg, assist_info_for_combine: TensorArg,
                 ep_send_counts: TensorArg, expert_scales: TensorArg | None = None, *,
                 topk_weights: TensorArg | None = None, x_active_mask: TensorArg | None = None,
                 shared_expert_x: TensorArg | None = None, ori_x: TensorArg | None = None,
                 const_expert_alpha_1: TensorArg | None = None, const_expert_alpha_2: TensorArg | None = None,
                 const_expert_v: TensorArg | None = None, tp_send_counts: TensorArg | None = None,
                 x_out: Tensor | None = None, stream: StreamArg = None) -> Tensor: ...

def dlpack_export(ptr: int, shape: tuple[int, ...], code: int, bits: int, strides: tuple[int, ...],
                  byte_offset: int, keep: object, versioned: bool, copied: bool) -> CapsuleType: ...
def dlpack_import(capsule: object, producer: object) -> tuple[int, tuple[int, ...], tuple[int, int],
                                                               tuple[int, ...] | None, int, ImportedMemory]: ...
def live_exports() -> int: ...

class ImportedMemory:
    def release(self) -> None: ...

class HostView:
    def __init__(self, ptr: int, nbytes: int, owner: object, writable: bool = True) -> None: ...
    def __buffer__(self, flags: int) -> memoryview: ...
