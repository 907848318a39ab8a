"""The TP domain of the group-string generations (docs/operators.md, "Group-string generations"):
tp_world_size 2 pairs rank e of two EP domains.  Dispatch runs the EP all-to-all in each domain and
then a TP all-gather between the pair; combine starts with a TP reduce-scatter and then runs the EP
all-to-all in each domain.

Lists are indexed ``[tp_rank][ep_rank]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .combine import combine
from .dispatch import dispatch
from .results import CombineResult, DispatchResult

F32 = np.float32


def _pairs(n_domains: int, what: str) -> None:
    if n_domains != 2:
        raise ValueError(f"{what}: a TP domain has 2 ranks, so 2 EP domains (got {n_domains})")


def _gathered(own: DispatchResult, peer: DispatchResult, tp_rank: int) -> DispatchResult:
    """Rank (e, tp_rank)'s outputs: its own rows first, then its peer's; the peer's prefix counts
    after its own; expert_token_nums[0] counts both (one local expert with TP)."""
    if own.local_expert_num != 1:
        raise ValueError("a TP domain needs one local expert per rank (moe_expert_num / (W - R) == 1)")
    n, n_peer = own.num_rows, peer.num_rows
    dyn = None
    if own.dynamic_scales is not None and peer.dynamic_scales is not None:
        dyn = np.concatenate([own.dynamic_scales, peer.dynamic_scales])
    tp_counts = np.zeros(2, np.int32)
    tp_counts[tp_rank], tp_counts[1 - tp_rank] = n, n_peer
    return replace(
        own,
        expand_x=np.concatenate([own.expand_x, peer.expand_x]),
        dynamic_scales=dyn,
        expert_token_nums=np.array([n + n_peer], np.int64),
        ep_recv_counts=np.concatenate([own.ep_recv_counts, peer.ep_recv_counts]).astype(np.int32),
        num_rows=n + n_peer,
        tp_recv_counts=tp_counts,
    )


def tp_all_gather(results: Sequence[Sequence[DispatchResult]]) -> list[list[DispatchResult]]:
    """The TP all-gather after each EP domain's dispatch: ``results[t][e]`` is rank e's output in the
    EP domain of TP rank t.  assist_info_for_combine and expand_scales stay the rank's own."""
    _pairs(len(results), "results")
    return [[_gathered(results[t][e], results[1 - t][e], t) for e in range(len(results[t]))] for t in (0, 1)]


def tp_reduce_scatter(expand_x: Sequence[Sequence[np.ndarray]],
                      tp_send_counts: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    """Each rank's own ``n = tp_send_counts[tp_rank]`` rows summed with the rows its peer holds for
    them (rows ``[n', n' + n)`` of the peer, ``n' = the peer's own count``): one float32 add of the
    two values, rounded once to the row dtype."""
    _pairs(len(expand_x), "expand_x")
    out: list[list[np.ndarray]] = [[], []]
    for t in (0, 1):
        for e, mine in enumerate(expand_x[t]):
            theirs = np.asarray(expand_x[1 - t][e])
            n = int(np.asarray(tp_send_counts[t][e])[t])
            n_peer = int(np.asarray(tp_send_counts[1 - t][e])[1 - t])
            if int(np.asarray(tp_send_counts[1 - t][e])[t]) != n:
                raise ValueError(f"tp_send_counts: ranks ({e}, 0) and ({e}, 1) disagree on rank ({e}, {t})'s rows")
            mine = np.asarray(mine)
            s = mine[:n].astype(F32) + theirs[n_peer:n_peer + n].astype(F32)
            out[t].append(s.astype(mine.dtype))
    return out


def _per_domain(kwargs: dict[str, Any], t: int) -> dict[str, Any]:
    """The keyword arguments of EP domain t: ``name_tp=[...]`` (indexed by TP rank; None = not
    given) becomes ``name=...[t]``; the others are shared."""
    out = {k: v for k, v in kwargs.items() if not k.endswith("_tp")}
    out.update({k[:-3]: v[t] for k, v in kwargs.items() if k.endswith("_tp") and v is not None})
    return out


def dispatch_tp(x: Sequence[list[np.ndarray]], expert_ids: Sequence[list[np.ndarray]],
                **kwargs: Any) -> list[list[DispatchResult]]:
    """:func:`aclnn_py.golden.dispatch` in both EP domains, then :func:`tp_all_gather`. Per-rank
    keyword lists (x_active_mask, expert_scales, ...) are given as ``[tp_rank][ep_rank]`` under the
    same names with a ``_tp`` suffix: ``x_active_mask_tp=...``."""
    _pairs(len(x), "x")
    return tp_all_gather([dispatch(x[t], expert_ids[t], **_per_domain(kwargs, t)) for t in (0, 1)])


def combine_tp(expand_x: Sequence[Sequence[np.ndarray]], expert_ids: Sequence[list[np.ndarray]],
               assist_info_for_combine: Sequence[list[np.ndarray]], ep_send_counts: Sequence[list[np.ndarray]],
               tp_send_counts: Sequence[Sequence[np.ndarray]], **kwargs: Any) -> list[list[CombineResult]]:
    """:func:`tp_reduce_scatter`, then :func:`aclnn_py.golden.combine` in both EP domains (the own
    prefix counts, the first part of each ep_send_counts, give the rows each rank returns).
    Per-rank keyword lists (expert_scales, x_active_mask, ...) are given as ``[tp_rank][ep_rank]``
    under the same names with a ``_tp`` suffix: ``expert_scales_tp=...``."""
    _pairs(len(expand_x), "expand_x")
    rows = tp_reduce_scatter(expand_x, tp_send_counts)
    return [combine(rows[t], expert_ids[t], assist_info_for_combine[t], ep_send_counts[t], **_per_domain(kwargs, t))
            for t in (0, 1)]


__all__ = ["tp_all_gather", "tp_reduce_scatter", "dispatch_tp", "combine_tp"]
