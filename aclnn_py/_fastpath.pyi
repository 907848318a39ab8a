"""Type stub of the plan step (fastpath/): plans' steady-state host path in C."""

from collections.abc import Callable

from .runtime import Stream

# what a compiled call's parameter gives the C path when it is not a tensor input (those give their index)
ROLE_CONFIG: int
ROLE_STREAM: int
ROLE_OUTPUTS: int
ROLE_PRECHECK: int
ROLE_NONE: int

def state(launch: int, plan: int, want_in: int, slots: tuple[int, ...], params: tuple[int, ...], last_in: list[object],
          own_shape: tuple[tuple[int, ...] | None, ...], own_dtype: tuple[object, ...], outputs: tuple[object, ...],
          last_out: list[object], bound_in: list[object], tensor_type: type, stream_type: type, on_failure: Callable[[int], None],
          ordered: tuple[object, type, type, Callable[..., None], Callable[..., None], int], busy: int) -> object: ...

class PlanBase:
    """The base of plan classes: holds the plan's compiled state; an adopted class's instances are
    called without packing their arguments."""

    _c_state: object | None
    _stream: Stream | None  # the stream of the last launch

class PlanCall:
    """A plan class's __call__: the steady state runs in C, every other call in `function`."""

    names: tuple[str, ...]
    result: str
    def __init__(self, function: Callable[..., object], result: str) -> None: ...
    def __call__(self, *args: object, **kwargs: object) -> object: ...
    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., object]: ...

def adopt(cls: type) -> None: ...
def set_enabled(flag: bool) -> bool: ...
def enabled() -> bool: ...
