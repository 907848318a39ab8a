"""Dispatch → the user's expert function → combine, with one set of options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .combine import combine
from .dispatch import dispatch
from .results import CombineResult, DispatchResult

_DISPATCH_ONLY = {"scales", "quant_mode", "expert_token_nums_type", "y_dtype", "x_dtype"}
_COMBINE_ONLY = {"shared_expert_x", "ori_x", "const_expert_alpha_1", "const_expert_alpha_2",
                 "const_expert_v", "comm_quant_mode"}
_COMMON = {"moe_expert_num", "x_active_mask", "expert_scales", "shared_expert_num",
           "shared_expert_rank_num", "global_bs", "comm_alg", "zero_expert_num", "copy_expert_num",
           "const_expert_num", "elastic_info", "soc"}


def round_trip(
    x: list[np.ndarray],
    expert_ids: list[np.ndarray],
    expert_fn: Callable[[int, DispatchResult], np.ndarray],
    **kw: Any,
) -> tuple[list[DispatchResult], list[CombineResult]]:
    """Dispatch → ``expert_fn(rank, dispatch_result)`` per rank → combine, with the same options.

    ``expert_fn`` returns that rank's expert output rows, (N, H) (or more rows) in x's dtype.
    Options of either operator may be given; each is routed to the operator(s) that take it.
    ``expert_scales`` serves as dispatch's expert_scales and combine's weights.  When copy or const
    experts exist and ``ori_x`` is not given, ``ori_x`` defaults to ``x``.
    """
    unknown = set(kw) - _DISPATCH_ONLY - _COMBINE_ONLY - _COMMON
    if unknown:
        raise TypeError(f"round_trip: unknown option(s) {sorted(unknown)}")
    dkw = {n: v for n, v in kw.items() if n in _DISPATCH_ONLY | _COMMON}
    ckw = {n: v for n, v in kw.items() if n in _COMBINE_ONLY | _COMMON}
    if (kw.get("copy_expert_num", 0) or kw.get("const_expert_num", 0)) and ckw.get("ori_x") is None:
        ckw["ori_x"] = list(x)
    disp = dispatch(x, expert_ids, **dkw)
    outs = []
    for rank, d in enumerate(disp):
        y = np.asarray(expert_fn(rank, d))
        if y.ndim != 2 or y.shape[0] < d.num_rows:
            raise ValueError(f"expert_fn: rank {rank} returned shape {y.shape}, need ({d.num_rows}, H)")
        outs.append(y)
    comb = combine(outs, expert_ids, [d.assist_info_for_combine for d in disp],
                   [d.ep_recv_counts for d in disp], **ckw)
    return disp, comb


__all__ = ["round_trip"]
