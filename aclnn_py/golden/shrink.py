"""CANN's dynamic shrink on Atlas A3 (``elasticInfo`` of generations 3 and 4, docs/operators.md,
"Dynamic shrink"): ranks dropped from the EP communicator after it was made do not take part, and the
ranks still in it run the call as a world of their own.

``elastic_info`` (int32, ``4 + 2·W``): ``[0]`` a flag (0: no shrink); ``[1]`` W′, the ranks still taking
part; ``[2]`` R′ of them shared-expert ranks; ``[3]`` E′ = L · (W′ − R′) MoE experts (each MoE rank keeps
its L); ``[4, 4 + W)`` the new (logical) id of each physical rank, −1 for a rank left out;
``[4 + W, 4 + W + W′)`` the physical rank of each logical id. Every rank number in the outputs (the
receive slots, ``assist_info_for_combine``, the choice of shared replica) is a logical id, and expert
ids name the E′ experts of the shrunk world.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .combine import combine
from .dispatch import dispatch
from .results import CombineResult, DispatchResult


def live_ranks(elastic_info: np.ndarray, ep_world_size: int, moe_expert_num: int, shared_expert_num: int = 1,
               shared_expert_rank_num: int = 0) -> tuple[list[int], int, int]:
    """(physical rank of each logical id, R′, E′) of a shrink; ValueError naming the entry that
    breaks a rule. A clear flag gives the identity."""
    w = int(ep_world_size)
    info = np.asarray(elastic_info).reshape(-1)
    if info.dtype != np.int32 or info.size != 4 + 2 * w:
        raise ValueError(f"elastic_info: must be int32 of shape (4 + 2 * ep_world_size,) = ({4 + 2 * w},) "
                         f"(got {info.dtype} {info.shape})")
    s = 0 if (shared_expert_rank_num == 0 and shared_expert_num == 1) else int(shared_expert_num)
    local = int(moe_expert_num) // (w - int(shared_expert_rank_num))
    if info[0] == 0:
        return list(range(w)), int(shared_expert_rank_num), int(moe_expert_num)
    wl, rl, el = int(info[1]), int(info[2]), int(info[3])
    if not 1 <= wl <= w:
        raise ValueError(f"elastic_info[1]: ranks after the shrink must be in [1, {w}] (got {wl})")
    if not 0 <= rl < wl or (s == 0) != (rl == 0) or (rl and rl % s):
        raise ValueError(f"elastic_info[2]: shared-expert ranks after the shrink must be in [0, {wl}), 0 exactly "
                         f"without a shared expert and a multiple of shared_expert_num (got {rl})")
    if el != local * (wl - rl):
        raise ValueError(f"elastic_info[3]: MoE experts after the shrink must be L * (W' - R') = {local * (wl - rl)} "
                         f"(got {el})")
    new_id = [int(v) for v in info[4:4 + w]]
    if any(not -1 <= v < wl for v in new_id) or sum(v >= 0 for v in new_id) != wl:
        raise ValueError(f"elastic_info[4:{4 + w}]: each rank's new id must be -1 or in [0, {wl}), {wl} of them "
                         f"set (got {new_id})")
    phys = [int(v) for v in info[4 + w:4 + w + wl]]
    for logical, ph in enumerate(phys):
        if not 0 <= ph < w or new_id[ph] != logical:
            raise ValueError(f"elastic_info[{4 + w + logical}]: must be the rank whose new id is {logical} (got {ph})")
    return phys, rl, el


def dispatch_shrink(x: Sequence[np.ndarray | None], expert_ids: Sequence[np.ndarray | None], *,
                    elastic_info: np.ndarray, moe_expert_num: int, shared_expert_num: int = 1,
                    shared_expert_rank_num: int = 0, expert_scales: Sequence[np.ndarray | None] | None = None,
                    x_active_mask: Sequence[np.ndarray | None] | None = None,
                    **kwargs: Any) -> list[DispatchResult | None]:
    """Dispatch over the physical ranks of a shrunk world (`x[r]` etc. of a rank left out are not
    read, may be None): one result per physical rank, None for a rank left out. Other keywords as for
    :func:`aclnn_py.golden.dispatch` (no zero / copy / const experts, no elastic re-mapping)."""
    phys, rl, el = live_ranks(elastic_info, len(x), moe_expert_num, shared_expert_num, shared_expert_rank_num)

    def pick(v: Sequence[Any] | None) -> list[Any] | None:
        return None if v is None else [v[p] for p in phys]

    scales = kwargs.pop("scales", None)
    if isinstance(scales, np.ndarray) and scales.ndim == 2:
        # smooth scales keep the shape the call passes, (S + E, H) or (E, H); the shrunk world's
        # experts use the rows of its E' experts (row e + S for expert e)
        s = 0 if rl == 0 else int(shared_expert_num)
        scales = scales[:s + el]
    got = dispatch(pick(x), pick(expert_ids), moe_expert_num=el, shared_expert_num=shared_expert_num,  # type: ignore[arg-type]
                   shared_expert_rank_num=rl, expert_scales=pick(expert_scales), x_active_mask=pick(x_active_mask),
                   scales=scales, **kwargs)
    out: list[DispatchResult | None] = [None] * len(x)
    for logical, ph in enumerate(phys):
        out[ph] = got[logical]
    return out


def combine_shrink(expand_x: Sequence[np.ndarray | None], expert_ids: Sequence[np.ndarray | None],
                   assist_info_for_combine: Sequence[np.ndarray | None], ep_send_counts: Sequence[np.ndarray | None],
                   *, elastic_info: np.ndarray, moe_expert_num: int, shared_expert_num: int = 1,
                   shared_expert_rank_num: int = 0, expert_scales: Sequence[np.ndarray | None] | None = None,
                   x_active_mask: Sequence[np.ndarray | None] | None = None,
                   **kwargs: Any) -> list[CombineResult | None]:
    """Combine over the physical ranks of a shrunk world, the inputs being those of
    :func:`dispatch_shrink` (per physical rank): one result per physical rank, None for a rank left
    out."""
    phys, rl, el = live_ranks(elastic_info, len(expand_x), moe_expert_num, shared_expert_num, shared_expert_rank_num)

    def pick(v: Sequence[Any] | None) -> list[Any] | None:
        return None if v is None else [v[p] for p in phys]

    got = combine(pick(expand_x), pick(expert_ids), pick(assist_info_for_combine), pick(ep_send_counts),  # type: ignore[arg-type]
                  moe_expert_num=el, shared_expert_num=shared_expert_num, shared_expert_rank_num=rl,
                  expert_scales=pick(expert_scales), x_active_mask=pick(x_active_mask), **kwargs)
    out: list[CombineResult | None] = [None] * len(expand_x)
    for logical, ph in enumerate(phys):
        out[ph] = got[logical]
    return out


__all__ = ["live_ranks", "dispatch_shrink", "combine_shrink"]
