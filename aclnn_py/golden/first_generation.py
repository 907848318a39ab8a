"""The first generation (``aclnnMoeDistributeDispatch`` / ``…Combine``, docs/operators.md,
"Group-string generations"): dispatch returns ``expand_idx`` (BS·K,) instead of
assist_info_for_combine, and combine finds each (token, k) pair's expert row through it.

``expand_idx[t*K + k]`` is the pair's position in its expert's receive block, i.e. how many earlier
pairs (in flattened ``t*K + k`` order) of the same source rank chose the same expert.  The rows,
their order and every other output are those of :func:`aclnn_py.golden.dispatch`; combine's result
is that of :func:`aclnn_py.golden.combine` once each expert rank's rows are matched to the pairs
they answer (:func:`assist_from_expand_idx`), shared-expert ranks included.
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
                           moe_expert_num: int, shared_expert_num: int = 1,
                           shared_expert_rank_num: int = 0) -> list[np.ndarray]:
    """For every rank, the (src_rank, token, k) triple of each row it holds, in its row order: the
    triples a later generation's dispatch returns, rebuilt from the sources' expert_ids and expand_idx.
    A MoE rank holds receive slot ``j*W + src``, then position; a shared-expert rank (the first
    `shared_expert_rank_num` ranks) holds every token of the sources it serves (``src % P`` is its index
    among the replicas of its shared expert, P = R / S), slot ``src``, token order, as ``(src, t, K + s)``:
    the first generation has no mask, so the position of token t in its block is t."""
    w = len(expert_ids)
    r = int(shared_expert_rank_num)
    s_num = 0 if (r == 0 and shared_expert_num == 1) else int(shared_expert_num)
    if moe_expert_num % (w - r):
        raise ValueError(f"moe_expert_num: must be divisible by the {w - r} MoE ranks (got {moe_expert_num})")
    local = moe_expert_num // (w - r)
    out: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(w)]
    for src, (ids, pos) in enumerate(zip(expert_ids, expand_idx, strict=True)):
        ids = np.asarray(ids)
        k_num = ids.shape[1]
        for i, (e, p) in enumerate(zip(ids.reshape(-1), np.asarray(pos).reshape(-1), strict=True)):
            rank, j = divmod(int(e), local)
            out[rank + r].append((j * w + src, int(p), src, i // k_num, i % k_num))
        if r:
            per = r // s_num
            for s in range(s_num):
                for t in range(ids.shape[0]):
                    out[src % per + s * per].append((src, t, src, t, k_num + s))
    return [np.array([v for row in sorted(rows) for v in row[2:]], np.int32) for rows in out]


__all__ = ["expand_idx", "assist_from_expand_idx"]
