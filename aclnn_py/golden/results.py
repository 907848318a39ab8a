"""What the golden returns: one :class:`DispatchResult` / :class:`CombineResult` per rank
(docs/operators.md names every field)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DispatchResult:
    """One rank's dispatch outputs; rows beyond N are omitted (docs/operators.md: unwritten)."""

    expand_x: np.ndarray
    """(N, H): x's dtype for quant_mode 0, int8 for quant_mode 2; on the 950 as ``y_dtype`` says
    (fp8 ml_dtypes arrays, uint8 HiF8 codes, packed fp4 uint8 (N, H/2))."""
    dynamic_scales: np.ndarray | None
    """(N,) float32 per-row scales ``1/ds`` for quant_mode 2; None for quant_mode 0 and 1.
    950: (N, ceil(H/128)) float32 for mode 3, (N, align2(ceil(H/32))) uint8 e8m0 for modes 4/5,
    (N, dim1) forwarded per-token scales for quant 0 with a low-precision x."""
    assist_info_for_combine: np.ndarray
    """(3*N,) int32 triples (src_rank, src_token_index, k_slot)."""
    expert_token_nums: np.ndarray
    """(localExpertNum,) int64; per-expert counts (type 1) or their inclusive cumsum (type 0)."""
    ep_recv_counts: np.ndarray
    """(W*L,) on a MoE rank or (W,) on a shared rank, int32 inclusive prefix sums of the slot counts."""
    expand_scales: np.ndarray | None
    """(N,) float32 carried topk weights on a MoE rank when expert_scales was given; None otherwise."""
    num_rows: int
    """N, the number of rows received."""
    capacity: int
    """A, the expand_x row capacity."""
    local_expert_num: int
    """1 on a shared rank, L on a MoE rank."""
    y_dtype: str = ""
    """Format name of expand_x ("float16", "bfloat16", "int8", "hifloat8", "float8_e4m3fn", …)."""
    logical_rank: int = -1
    """The logical rank this physical rank serves (itself unless elastic_info re-maps)."""
    tp_recv_counts: np.ndarray | None = None
    """(2,) int32 rows per TP rank after the TP all-gather (:func:`aclnn_py.golden.tp_all_gather`);
    None without a TP domain."""


@dataclass
class CombineResult:
    """One rank's combine output."""

    x_out: np.ndarray
    """(BS, H) in expand_x's dtype; rows of tokens that are not processed are zero here."""
    written: np.ndarray
    """(BS,) bool: which rows the operator writes (processed tokens, docs/operators.md)."""


__all__ = ["DispatchResult", "CombineResult"]
