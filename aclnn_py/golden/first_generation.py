"""The first generation (``aclnnMoeDistributeDispatch`` / ``…Combine``, docs/operators.md,
"Group-string generations"): dispatch returns ``expand_idx`` (BS·K,) instead of
assist_info_for_combine, and combine finds each (token, k) pair's expert row through it.

``expand_idx[t*K + k]`` is the pair's position in its expert's receive block, i.e. how many earlier
pairs (in flattened ``t*K + k`` order) of the same source rank chose the same expert.  The rows,
their order and every other output are those of :func:`aclnn_py.golden.dispatch`; combine's result
is that of :func:`aclnn_py.golden.combine` once each expert rank's rows are matched to the pairs
they answer (:func:`assist_from_expand_idx`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def expand_idx(expert_ids: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Every rank's (BS·K,) int32 expand_idx."""
    out = []
    for ids in expert_ids:
        flat = np.asarray(ids).reshape(-1).astype(np.int64)
        seen: dict[int, int] = {}
        pos = np.empty(flat.size, np.int32)
        for i, e in enumerate(flat):
            pos[i] = seen.get(int(e), 0)
            seen[int(e)] = int(pos[i]) + 1
        out.append(pos)
    return out


def assist_from_expand_idx(expert_ids: Sequence[np.ndarray], expand_idx: Sequence[np.ndarray], *,
                           moe_expert_num: int) -> list[np.ndarray]:
    """For every expert rank, the (src_rank, token, k) triple of each row it holds, in its row order
    (receive slot ``j*W + src``, then position): the triples a later generation's dispatch returns,
    rebuilt from the sources' expert_ids and expand_idx.  No shared-expert ranks (the first
    generation's shared-expert split is not modelled)."""
    w = len(expert_ids)
    if moe_expert_num % w:
        raise ValueError(f"moe_expert_num: must be divisible by the {w} ranks (got {moe_expert_num})")
    local = moe_expert_num // w
    out: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(w)]
    for src, (ids, pos) in enumerate(zip(expert_ids, expand_idx, strict=True)):
        ids = np.asarray(ids)
        k_num = ids.shape[1]
        for i, (e, p) in enumerate(zip(ids.reshape(-1), np.asarray(pos).reshape(-1), strict=True)):
            rank, j = divmod(int(e), local)
            out[rank].append((j * w + src, int(p), src, i // k_num, i % k_num))
    return [np.array([v for row in sorted(rows) for v in row[2:]], np.int32) for rows in out]


__all__ = ["expand_idx", "assist_from_expand_idx"]
