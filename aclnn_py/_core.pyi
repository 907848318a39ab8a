"""Stubs of the compiled core (csrc/_core.pyx); the typed fields are declared in csrc/_core.pxd."""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .dtypes import DataType
from .hccl import Communicator
from .runtime._memory import DeviceMemory
from .runtime._stream import Stream
from .tensor import Tensor

ROLES: dict[str, int]

_F = TypeVar("_F", bound=Callable[..., object])
_P = TypeVar("_P", bound="PlanBase")

def set_enabled(flag: bool) -> bool: ...
def enabled() -> bool: ...

class TensorBase:
    shape: tuple[int, ...]
    dtype: DataType
    _mem: DeviceMemory | None
    _owner: object
    _writer: Stream | None
    _ptr: int
    _offset_nbytes: int
    _open: bool
    _contiguous: bool
    _shared: bool
    _desc_addr: int | None
    device: int | None
    _span: int

class StreamBase:
    _open: bool
    _key: int
    _handle: int
    _device: int | None

class StreamStateBase:
    current: list[object]
    workspace: DeviceMemory | None

class ConfigBase:
    _passed: set[tuple[str, int, int, int]]
    _packed: dict[str, Any]

class PackedBase:
    layout: Any
    ints_address: int
    strings_address: int

class OpCore:
    layout: Any
    def __init__(self, layout: Any, run: int, phase2: int, destroy: int, states: dict[int, Any],
                 state_of: Callable[[Any], Any], checkpoint: Callable[[Any], None], every: int,
                 grow: Callable[[Any, int], int], order_after_writes: Callable[[Any, Any], None],
                 raise_status: Callable[[int, str], None]) -> None: ...
    def run(self, inputs: Sequence[object], outputs: Sequence[object], config: ConfigBase,
            stream: StreamBase) -> None: ...
    def phase1(self, inputs: Sequence[object], outputs: Sequence[object], config: ConfigBase) -> tuple[int, int]: ...

class OpSpec:
    def __init__(self, core: OpCore, names: tuple[str, ...], n_positional: int, roles: tuple[int, ...],
                 none_as: tuple[object, ...], outputs_type: type | None, key: tuple[object, ...], tensor_type: type,
                 stream_type: type, config_type: type, in_names: tuple[str, ...], out_names: tuple[str, ...]) -> None: ...

def check_placement(in_names: tuple[str, ...], inputs: Sequence[object], out_names: tuple[str, ...],
                    outputs: Sequence[object], stream: StreamBase) -> None: ...

class OpCall:
    function: Callable[..., Any]
    names: tuple[str, ...]
    n_positional: int
    def __init__(self, function: Callable[..., Any], setup: Callable[[tuple[str, ...], int], OpSpec | None]) -> None: ...

def compiled_operator(function: Callable[..., Any],
                      setup: Callable[[tuple[str, ...], int], OpSpec | None]) -> Callable[..., Any]: ...

class PlanState:
    """A plan's fixed part, what its compiled ``__call__`` reads."""

    def __init__(self, launch: int, enter: int, leave: int, plan: int, want_in: int, slots: tuple[int, ...],
                 params: tuple[int, ...], last_in: list[object], own_shape: tuple[tuple[int, ...] | None, ...],
                 own_dtype: tuple[DataType | None, ...], outputs: tuple[object, ...], last_out: list[object],
                 bound_in: list[object], tensor_type: type, stream_type: type, on_failure: Callable[[int], None],
                 ordered: tuple[Any, ...], result: object) -> None: ...

class PlanBase:
    """The base of plan classes."""

    _c_state: PlanState | None
    _stream: Stream | None  # the stream of the last launch

class PlanCall:
    function: Callable[..., Any]
    names: tuple[str, ...]
    result: str
    def __init__(self, function: Callable[..., Any], result: str) -> None: ...

class CompiledPlanCall:
    compiled: PlanCall
    def __call__(self, *args: object, **kwargs: object) -> object: ...
    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., object]: ...

def compiled_plan_call(result: str) -> Callable[[_F], _F]: ...
def compiled_plan_class(cls: type[_P]) -> type[_P]: ...

def set_poison_refill(address: int) -> None: ...
def set_descriptor_functions(create: int, destroy: int, fmt: int) -> None: ...

class BufferBase:
    context: Tensor | None
    comm: Communicator
    _configs: dict[tuple[object, ...], Any]
    _route_states: list[Any] | None
    @property
    def kept_outputs(self) -> tuple[int, ...]: ...
    def _forget_calls(self) -> None: ...

class BufferCall:
    function: Callable[..., Any]
    def remember(self, buf: BufferBase, attrs: tuple[object, ...], config: object, stream: object,
                 tensors: tuple[object, ...], outputs: object, result: object, keep: int) -> None: ...
    def attrs_of(self, **kwargs: object) -> tuple[object, ...]: ...

def compiled_buffer_method(which: int, tensor_params: tuple[tuple[str, str, bool], ...],
                           attr_params: tuple[tuple[str | None, int | None], ...], op: Callable[..., Any],
                           current_stream: Callable[[], Any], reraise: Callable[..., Any],
                           caller_names: Any) -> Callable[[_F], _F]: ...
