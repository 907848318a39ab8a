"""The operator functions' steady state in the compiled core: :func:`compiled_op` makes an operator
function a compiled function whose ``compiled`` is an ``aclnn_py._core.OpCall`` (csrc/_core.pyx).

A serving loop calls an operator with device Tensors it made once, one :class:`MoeConfig`, outputs it
allocated once and one stream. The OpCall takes exactly those calls — every tensor a Tensor with a
descriptor, the config's pre-checks already passed for this shape, no attribute keywords — and goes
straight to the operator's launch (``OpCore``). Every other call goes to the Python function with its
arguments as given, before anything ran: it converts them (uploads, output allocation, checks and
their messages) and then calls the same launch, so a call's launch, holds and writer marks are
written once.

:func:`set_compiled_path` (or ``ACLNN_PY_COMPILED=0`` at import) sends every call, plans' included, to
the Python functions: the same results by another route, to compare them or to rule the compiled
parts out (docs/concepts.md, "The compiled steady state").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

from ..runtime import Stream
from ..tensor import Tensor
from .config import MoeConfig

if TYPE_CHECKING:
    from .._core import OpSpec
    from ._layout import Signature

F = TypeVar("F", bound=Callable[..., object])

#: Environment variable read when the package is imported: ``0`` sends every operator and plan call to
#: its Python function (as ``set_compiled_path(False)``); ``1`` or unset, the default.
ENV_COMPILED = "ACLNN_PY_COMPILED"


def set_compiled_path(enabled: bool) -> bool:
    """Let the compiled steady state take the calls it can (True, the default), or send every call of
    the operator functions and of plans to its Python function (False); returns the previous setting.
    Both routes give the same results, errors and messages (they end in the same launch); the Python
    one costs more host time per call. Process-wide, for calls that start after it returns."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_compiled_path(): enabled: expected a bool, got {type(enabled).__name__} {enabled!r}")
    try:
        from .. import _core
    except ImportError:
        if enabled:
            raise
        return False
    return _core.set_enabled(enabled)


def compiled_path_enabled() -> bool:
    """Whether the compiled steady state takes the calls it can (see :func:`set_compiled_path`)."""
    try:
        from .. import _core
    except ImportError:
        return False
    return _core.enabled()


def _apply_environment() -> None:
    value = os.environ.get(ENV_COMPILED, "").strip()
    if value in ("", "1"):
        return
    if value != "0":
        raise ValueError(f"{ENV_COMPILED} must be 0 (every operator and plan call in Python) or 1 (the default), "
                         f"got {os.environ[ENV_COMPILED]!r}")
    set_compiled_path(False)


def compiled_op(setup: Callable[[tuple[str, ...], int], OpSpec | None]) -> Callable[[F], F]:
    """Decorate an operator function so that its calls in the serving shape are parsed and launched by
    the compiled core; `setup(names, n_positional)` gives the :func:`operator_spec` for the function's
    parameter `names` at its first call. Without the compiled parts the function stays as it is (the
    package then explains what is missing)."""

    def decorate(function: F) -> F:
        try:
            from .._core import compiled_operator
        except ImportError:
            return function
        return cast(F, compiled_operator(function, setup))

    return decorate


def operator_spec(names: tuple[str, ...], n_positional: int, *, signature: Signature, required: int,
                  make_if_none: Mapping[str, Callable[[], Tensor]], outputs: str, outputs_type: type | None,
                  key: tuple[str, tuple[str, int], tuple[str, int], tuple[str, int]]) -> OpSpec:
    """How the compiled core reads a call of an operator function with parameters `names` (the first
    `n_positional` positional): the parameters named as the `signature`'s inputs are its tensors (the
    first `required` must be given, the others are NULL when None unless `make_if_none` makes them),
    `outputs` names the outputs parameter (a `outputs_type` tuple, or one Tensor), `key` the pre-check
    key the config remembers (the op, then BS, H and K as (input, dim)). ``config``, ``stream`` and
    ``precheck`` are what their names say; any other parameter must be None."""
    from .._core import ROLES, OpSpec

    inputs = signature.inputs
    named = {"config": ROLES["config"], "stream": ROLES["stream"], "precheck": ROLES["precheck"],
             outputs: ROLES["outputs"]}
    roles = tuple(inputs.index(name) if name in inputs else named.get(name, ROLES["none"]) for name in names)
    none_as = tuple(False if i < required else make_if_none.get(name) for i, name in enumerate(inputs))
    op, *dims = key
    return OpSpec(signature.core, names, n_positional, roles, none_as, outputs_type,
                  (op, *((inputs.index(param), dim) for param, dim in dims)), Tensor, Stream, MoeConfig, inputs,
                  signature.outputs)


_apply_environment()
