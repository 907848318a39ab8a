"""The operator functions' steady state in C: :func:`compiled_op` makes an operator function an
``aclnn_py._fastpath.OpCall`` (built from fastpath/op.c).

A serving loop calls an operator with device Tensors it made once, one :class:`MoeConfig`, outputs it
allocated once and one stream. The OpCall takes exactly those calls — every tensor a Tensor with a
descriptor, the config's pre-checks already passed for this shape, no attribute keywords — and runs
phase 1 and the launch in one call of the extension's run helper, then holds what the launch uses and
marks the outputs' writer, as :func:`~aclnn_py.ops.executor.run_both_phases` does. Every other call goes
to the Python function with its arguments as given, before anything ran, so conversion, checks and
messages live there only. A launch that needs a larger workspace than the stream's block also goes to
the Python function (which grows the block), after its executor is destroyed.

:func:`set_compiled_path` (or ``ACLNN_PY_COMPILED=0`` at import) sends every call, plans' included, to
the Python functions: the same results by another route, to compare them or to rule the compiled
parts out (docs/concepts.md, "The compiled steady state").
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

from ..errors import check_aclnn
from ..runtime import Stream, initialized, ordered
from ..tensor import Tensor
from ._layout import Signature
from .config import MoeConfig

F = TypeVar("F", bound=Callable[..., object])

#: Environment variable read when the package is imported: ``0`` sends every operator and plan call to
#: its Python function (as ``set_compiled_path(False)``); ``1`` or unset, the default.
ENV_COMPILED = "ACLNN_PY_COMPILED"


def set_compiled_path(enabled: bool) -> bool:
    """Let the compiled steady state take the calls it can (True, the default), or send every call of
    the operator functions and of plans to its Python function (False); returns the previous setting.
    Both routes give the same results, errors and messages; the Python one costs more host time per
    call. Process-wide, for calls that start after it returns."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_compiled_path(): enabled: expected a bool, got {type(enabled).__name__} {enabled!r}")
    try:
        from .. import _fastpath
    except ImportError:
        if enabled:
            raise
        return False
    return _fastpath.set_enabled(enabled)


def compiled_path_enabled() -> bool:
    """Whether the compiled steady state takes the calls it can (see :func:`set_compiled_path`)."""
    try:
        from .. import _fastpath
    except ImportError:
        return False
    return _fastpath.enabled()


def _apply_environment() -> None:
    value = os.environ.get(ENV_COMPILED, "").strip()
    if value in ("", "1"):
        return
    if value != "0":
        raise ValueError(f"{ENV_COMPILED} must be 0 (every operator and plan call in Python) or 1 (the default), "
                         f"got {os.environ[ENV_COMPILED]!r}")
    set_compiled_path(False)


def compiled_op(setup: Callable[[tuple[str, ...]], object]) -> Callable[[F], F]:
    """Decorate an operator function so that its steady state runs in C; `setup(names)` gives the
    :func:`operator_spec` for the function's parameter `names` at its first call. Without the
    compiled parts the function stays as it is (the package then explains what is missing)."""

    def decorate(function: F) -> F:
        try:
            from .. import _fastpath
        except ImportError:
            return function
        return cast(F, _fastpath.OpCall(function, setup))

    return decorate


def operator_spec(names: tuple[str, ...], *, inputs: tuple[str, ...], required: int,
                  make_if_none: Mapping[str, Callable[[], Tensor]], outputs: str, outputs_type: type | None,
                  n_outputs: int, key: tuple[str, tuple[str, int], tuple[str, int], tuple[str, int]],
                  signature: Signature) -> object:
    """What the C path of an operator function with parameters `names` needs: `inputs` in the C order
    (parameters of those names are tensors; the first `required` must be given, the others are NULL
    when None unless `make_if_none` makes them), the `outputs` parameter (a `outputs_type` tuple of
    `n_outputs` Tensors, or one Tensor), the pre-check `key` the config remembers (the op, then BS, H
    and K as (parameter, dim)), and the operator's `signature` (its run helper, and the layout of the
    config's attributes for it). Any other parameter must be None."""
    from .. import _fastpath

    # what a parameter that is not a tensor input is to the C path
    named = {"config": _fastpath.ROLE_CONFIG, "stream": _fastpath.ROLE_STREAM, "precheck": _fastpath.ROLE_PRECHECK,
             outputs: _fastpath.ROLE_OUTPUTS}
    roles: list[int] = []
    none_as: list[object] = []
    for name in names:
        if name in inputs:
            index = inputs.index(name)
            roles.append(index)
            none_as.append(False if index < required else make_if_none.get(name))
        else:
            roles.append(named.get(name, _fastpath.ROLE_NONE))
            none_as.append(None)
    op, *dims = key
    layout = signature.layout
    b = initialized()
    ffi = b.ffi
    return _fastpath.op_spec(
        layout=_fastpath.layout(Tensor), stream_type=Stream, config_type=MoeConfig, outputs_type=outputs_type,
        roles=tuple(roles), none_as=tuple(none_as), n_inputs=len(inputs), n_outputs=n_outputs,
        key=(op, *((names.index(param), dim) for param, dim in dims)), run_layout=layout,
        run=int(ffi.cast("uintptr_t", b.function_pointer(layout.helper))),
        destroy=int(ffi.cast("uintptr_t", b.function_pointer("aclDestroyAclOpExecutor"))),
        on_failure=functools.partial(_raise_status, layout.phase2), ordered=ordered.compiled_view())


def _raise_status(func: str, status: int) -> None:
    check_aclnn(status, func)


_apply_environment()
