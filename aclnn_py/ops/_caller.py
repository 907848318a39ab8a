"""Errors in the caller's words.

A layer above the operators (:class:`~aclnn_py.MoeDistributeBuffer` and the plans it makes) has its
own names for the operators' parameters — ``topk_idx`` for ``expert_ids``, ``x`` for combine's
``expand_x`` — so its errors must name those. Every message of a parameter rule, from the Python
checks and from the C side alike, starts with the parameter (``<param>: <rule> (got ...)``); renaming
that leading name, as a whole identifier, is all a layer does. The exception's class, status code,
function and rule stay.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

from ..errors import AclnnPyError, RecycledError
from ..runtime import StreamArg

T = TypeVar("T")

#: the parameter a message starts with: a whole identifier (``x`` never matches the start of ``x_out``)
_LEADING_NAME = re.compile(r"[A-Za-z_]\w*")


def renamed_message(message: str, names: Mapping[str, str]) -> str | None:
    """`message` with its leading parameter replaced by its entry in `names`, or None when there is
    none."""
    m = _LEADING_NAME.match(message)
    if m is None:
        return None
    new = names.get(m.group())
    if new is None or new == m.group():
        return None
    return new + message[m.end():]


def renamed(exc: BaseException, names: Mapping[str, str]) -> BaseException:
    """`exc` as an exception of the same class naming the caller's parameter, or `exc` itself when
    its message names none of `names` (or its class carries more than a message)."""
    if isinstance(exc, AclnnPyError):
        message = renamed_message(exc.message, names)
        return exc if message is None else exc.with_message(message)
    if type(exc) in (TypeError, ValueError, RecycledError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        message = renamed_message(exc.args[0], names)
        return exc if message is None else type(exc)(message)
    return exc


def reraise(exc: BaseException, names: Mapping[str, str]) -> NoReturn:
    """Raise `exc` (being handled) again, renamed by `names`; its traceback is kept."""
    caller_exc = renamed(exc, names) if names else exc
    if caller_exc is exc:
        raise exc
    raise caller_exc.with_traceback(exc.__traceback__) from None


def weights_argument(expert_scales: T | None, topk_weights: T | None) -> T | None:
    """The weights a plan call gives, under either name: `topk_weights` is the buffer's name of the
    operators' expert_scales."""
    if topk_weights is None:
        return expert_scales
    if expert_scales is not None:
        raise TypeError("topk_weights: the same input as expert_scales (MoeDistributeBuffer's name of it); "
                        "pass one of them, not both")
    return topk_weights


@dataclass(frozen=True)
class Vocabulary:
    """How a plan speaks to whoever made it: the caller's name of each operator parameter its errors
    name, the constructor flag that gives a plan its weights input, and a check of each call's
    stream (None: any stream)."""

    names: Mapping[str, str] = field(default_factory=dict)
    weights_flag: str = "with_expert_scales"
    check_stream: Callable[[StreamArg], object] | None = None

    def unweighted(self) -> str:
        """The refusal of weights passed to a plan built without them (operator names; renamed on
        the way out)."""
        return f"expert_scales: this plan was built without weights; build it with {self.weights_flag}=True"


#: plans built directly: the operators' own names
OPERATOR_WORDS = Vocabulary()
