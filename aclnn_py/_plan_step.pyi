"""Type stub of the compiled plan step (plan_step.c): a plan's steady-state call in C."""

from collections.abc import Callable
from types import NotImplementedType

def state(launch: int, plan: int, want_in: int, slots: tuple[int, ...], last_in: list[object],
          own_shape: tuple[tuple[int, ...] | None, ...], own_dtype: tuple[object, ...], outputs: tuple[object, ...],
          last_out: list[object], tensor_type: type, stream_type: type,
          on_failure: Callable[[int], None]) -> object: ...
def step(state: object, values: tuple[object, ...], stream: object) -> None | NotImplementedType: ...
