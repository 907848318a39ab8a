"""The launchers of each generation's operators: the compiled core's :class:`~aclnn_py._core.Launcher`
of a C function, with its run helper and phase 2 by address and the place of each of its tensors in the
operator functions' lists (the newest generation's order, which has them all). Made once per
generation, at its first call."""

from __future__ import annotations

import threading
from typing import Protocol

from .._core import Launcher
from ..runtime import initialized
from . import generations
from ._layout import Signature


class HasGeneration(Protocol):
    @property
    def generation(self) -> int: ...


_lock = threading.Lock()
_made: dict[int, tuple[Launcher, Launcher]] = {}
#: Each operator's signature: its tensor names in the newest generation's order (its module registers it).
_signatures: dict[str, Signature] = {}


def register_signature(op: str, signature: Signature) -> None:
    """The operator function's signature of `op` ("dispatch" or "combine"): the newest generation's
    C function and the input and output names in its order."""
    _signatures[op] = signature


def for_config(config: HasGeneration) -> tuple[Launcher, Launcher]:
    """(dispatch, combine) of the generation `config`'s calls use."""
    return for_generation(config.generation)


def for_generation(number: int) -> tuple[Launcher, Launcher]:
    found = _made.get(number)
    if found is None:
        with _lock:
            found = _made.get(number)
            if found is None:
                found = _made[number] = (_launcher(number, "dispatch", _signatures["dispatch"]),
                                         _launcher(number, "combine", _signatures["combine"]))
    return found


def _launcher(number: int, op: str, signature: Signature) -> Launcher:
    inputs, outputs = signature.inputs, signature.outputs
    if number == generations.NEWEST:  # the functions' own order, checked against the prototype by name
        layout = signature.layout
        in_at, out_at = tuple(range(len(inputs))), tuple(range(len(outputs)))
    else:
        layout = generations.layout(number, op)
        ins, outs = generations.argument_names(number, op, inputs, outputs)
        in_at, out_at = tuple(inputs.index(n) for n in ins), tuple(outputs.index(n) for n in outs)
    b = initialized()

    def address(name: str) -> int:
        return int(b.ffi.cast("uintptr_t", b.function_pointer(name)))

    return Launcher(layout, address(layout.helper), address(layout.phase2), in_at, out_at, inputs, outputs, number)
