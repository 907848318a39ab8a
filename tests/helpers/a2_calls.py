"""Phase-1 calls on the Atlas A2 (``Ascend910B``) profile for the A2 tests: rank 0 of a 16-rank
world, a valid base call (W=16, E=32 so L=2, BS=4, H=64, K=2) changed by keywords, and its outcome —
the same with and without aclnn-py's Python pre-checks, which is asserted on every call."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .moe_calls import World2

W, E, BS, H, K = 16, 32, 4, 64, 2
BF16 = np.dtype(ml_dtypes.bfloat16)
INVALID = 161002


def base_attrs(world: World2, **changes: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = dict(ep_world_size=W, ep_rank_id=0, moe_expert_num=E, ccl_buffer_size=world.ctx[0][1])
    attrs.update(changes)
    return attrs


def tokens(bs: int = BS, h: int = H, k: int = K, e: int = E, dtype: Any = BF16) -> tuple[np.ndarray, np.ndarray]:
    x = np.ones((bs, h), dtype)
    ids = (np.arange(bs * k, dtype=np.int32).reshape(bs, k) * 7) % e
    return x, ids


def outcome(call: Any) -> tuple[Any, ...]:
    """(class, code, message) of the refusal, or ("accepted",); asserted equal with and without the
    pre-checks."""
    import aclnn_py as acl

    seen = []
    for pre in (True, False):
        try:
            call(pre).close()
            seen.append(("accepted",))
        except acl.AclnnError as e:
            seen.append((type(e).__name__, e.code, e.message))
    assert seen[0] == seen[1], f"precheck=True: {seen[0]}\nprecheck=False: {seen[1]}"
    return seen[0]


def dispatch(world: World2, *, bs: int = BS, h: int = H, k: int = K, dtype: Any = BF16, **kw: Any) -> tuple[Any, ...]:
    from aclnn_py.ops import prepare_dispatch

    attrs = {n: kw.pop(n) for n in list(kw) if n not in ("scales", "x_active_mask", "expert_scales", "outputs",
                                                         "elastic_info", "performance_info", "y_dtype")}
    x, ids = tokens(bs, h, k, max(attrs.get("moe_expert_num", E), 1), dtype)
    return outcome(lambda pre: prepare_dispatch(world.ctx[0][0], x, ids, precheck=pre, **kw,
                                                 **base_attrs(world, **attrs)))


def combine(world: World2, **kw: Any) -> tuple[Any, ...]:
    from aclnn_py.ops import prepare_combine

    attrs = {n: kw.pop(n) for n in list(kw) if n not in ("shared_expert_x", "x_active_mask", "elastic_info",
                                                         "performance_info")}
    a = BS * W * min(E // W, K)
    x, ids = tokens()
    ex = np.zeros((a, H), BF16)
    assist = np.zeros(a * 128, np.int32)
    counts = np.zeros(W * (E // W), np.int32)
    return outcome(lambda pre: prepare_combine(world.ctx[0][0], ex, ids, assist, counts, precheck=pre, **kw,
                                                **base_attrs(world, **attrs)))


def refused(outcome: tuple[Any, ...], message: str) -> None:
    assert outcome[:2] == ("AclnnParamInvalid", INVALID), outcome
    assert message in outcome[2], outcome


ACCEPTED = ("accepted",)
