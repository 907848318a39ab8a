"""The window and buffer arithmetic of MoE dispatch/combine, in one place for the product: rows a
rank can receive, local experts, the bytes the kernels need in each rank's HCCL window, and the
``HCCL_BUFFSIZE`` to set (docs/operators.md, "Buffer sizing"). The golden keeps its own, independent
copy to check this one."""

from __future__ import annotations

import math

from .profiles import A2_LIMITS, profile_of

MIB = 1 << 20
#: per token: a 32-byte scale slot and three int32 index entries beside the row
TOKEN_EXTRA_BYTES = 44
UB_ALIGN = 32
WINDOW_ALIGN = 512
FULLMESH_V2_CHUNK = 480


def align(value: int, block: int) -> int:
    return -(-value // block) * block


def normalized_shared(shared_expert_num: int, shared_expert_rank_num: int) -> int:
    """S as the kernels see it: (S, R) = (1, 0) is the default "no shared expert" pair, i.e. 0."""
    return 0 if shared_expert_rank_num == 0 and shared_expert_num == 1 else shared_expert_num


def moe_local_experts(world_size: int, moe_expert_num: int, shared_expert_rank_num: int) -> int:
    """L, the MoE experts on each MoE rank: E / (W − R)."""
    moe_ranks = world_size - shared_expert_rank_num
    return moe_expert_num // moe_ranks if moe_ranks > 0 else 0


def rows_capacity(world_size: int, rank: int, moe_expert_num: int, shared_expert_num: int,
                  shared_expert_rank_num: int, global_bs: int, bs: int, topk: int) -> int:
    """A, the expand_x rows rank `rank` can receive: maxBs × ceil(W / (R/S)) on a shared rank,
    G × min(L, K) on a MoE rank (G = global_bs, or BS × W when 0)."""
    g = global_bs if global_bs else bs * world_size
    if rank < shared_expert_rank_num:
        s = normalized_shared(shared_expert_num, shared_expert_rank_num)
        ranks_per_shared = shared_expert_rank_num // s if s else 1
        return (g // world_size) * math.ceil(world_size / max(ranks_per_shared, 1))
    return g * min(moe_local_experts(world_size, moe_expert_num, shared_expert_rank_num), topk)


def token_slots(hidden: int, fullmesh_v2: bool) -> tuple[int, int]:
    """(Td, Tc): window bytes per dispatched token and per combined token of `hidden` bf16/fp16 values."""
    with_extra = align(hidden * 2, UB_ALIGN) + TOKEN_EXTRA_BYTES
    td = -(-with_extra // FULLMESH_V2_CHUNK) * WINDOW_ALIGN if fullmesh_v2 else align(with_extra, WINDOW_ALIGN)
    return td, align(hidden * 2, WINDOW_ALIGN)


def window_need(world_size: int, local_experts: int, max_bs: int, hidden: int, topk: int, shared: int,
                fullmesh_v2: bool, bytes_per_rank: int = 0) -> int:
    """Bytes a dispatch/combine pair needs in each window beyond the 1 MiB status area:
    2·(maxBs·Td·W·L + maxBs·Tc·(K+S)) + W·bytes_per_rank."""
    td, tc = token_slots(hidden, fullmesh_v2)
    return 2 * (max_bs * td * world_size * local_experts + max_bs * tc * (topk + shared)) + \
        world_size * bytes_per_rank


def a2_window_need(world_size: int, max_bs: int, hidden: int, moe_expert_num: int, topk: int,
                   comm_alg: str) -> tuple[int, str]:
    """Bytes the window must hold on the Atlas A2 by the formula CANN documents for `comm_alg`
    (docs/operators.md, "Atlas A2"), and the arithmetic spelled out."""
    w, e, k = world_size, moe_expert_num, topk
    if comm_alg == "hierarchy":
        k8 = align(k, 8)
        need = e * max_bs * (hidden * 2 + 4 * k8 * 4) + A2_LIMITS.hierarchy_reserve
        return need, (f"moe_expert_num*maxBs*(H*2 + 4*align8(K)*4) + 104 MiB = {e}*{max_bs}*({hidden}*2 + 4*{k8}*4) + "
                      f"{A2_LIMITS.hierarchy_reserve}")
    rows = min(e // w, k)
    need = 2 * (max_bs * w * rows * hidden * 2 + A2_LIMITS.fullmesh_reserve)
    return need, (f"2*(maxBs*W*min(L,K)*H*2 + 2 MiB) = 2*({max_bs}*{w}*{rows}*{hidden}*2 + "
                  f"{A2_LIMITS.fullmesh_reserve})")


def window_requirement(world_size: int, max_bs: int, hidden: int, moe_expert_num: int, topk: int,
                       shared_expert_num: int = 0, shared_expert_rank_num: int = 0, comm_alg: str = "",
                       soc: str = "Ascend910_93") -> tuple[int, str]:
    """Bytes a dispatch/combine pair needs in each rank's window on SoC `soc` (the kernel's window
    check, docs/operators.md "The window check"), and the arithmetic spelled out:
    ``2*(maxBs*Td*W*L + maxBs*Tc*(K+S)) (+ W*1024 on the 950) + 1 MiB``. On the Atlas A2 also the
    formula of its comm_alg ("Atlas A2"): the larger of the two."""
    if profile_of(soc).atlas_a2:
        a2_need, a2_how = a2_window_need(world_size, max_bs, hidden, moe_expert_num, topk, comm_alg)
        mock_need, mock_how = window_requirement(world_size, max_bs, hidden, moe_expert_num, topk, shared_expert_num,
                                                 shared_expert_rank_num, "")
        return (a2_need, a2_how) if a2_need >= mock_need else (mock_need, mock_how)
    local = moe_local_experts(world_size, moe_expert_num, shared_expert_rank_num)
    shared = normalized_shared(shared_expert_num, shared_expert_rank_num)
    per_rank = profile_of(soc).window_bytes_per_rank
    td, tc = token_slots(hidden, comm_alg == "fullmesh_v2")
    need = window_need(world_size, local, max_bs, hidden, topk, shared, comm_alg == "fullmesh_v2", per_rank) + MIB
    extra = world_size * per_rank
    how = (f"2*(maxBs*Td*W*L + maxBs*Tc*(K+S)){' + W*' + str(per_rank) if per_rank else ''} + 1 MiB = "
           f"2*({max_bs}*{td}*{world_size}*{local} + {max_bs}*{tc}*({topk}+{shared}))"
           f"{f' + {extra}' if extra else ''} + {MIB} = {need} bytes")
    return need, how


def ccl_buffer_size_mb(world_size: int, num_max_dispatch_tokens_per_rank: int, hidden: int, num_moe_expert: int,
                       topk: int, num_shared_expert: int = 0, num_shared_expert_ranks: int = 0,
                       comm_alg: str = "") -> int:
    """The ``HCCL_BUFFSIZE`` (MiB) a model needs: HCCL gives each rank a window of twice that, which
    must hold the dispatch/combine need plus 1 MiB. Raises ValueError naming an argument out of range."""
    limits = (("world_size", world_size, 2, 768), ("num_max_dispatch_tokens_per_rank",
              num_max_dispatch_tokens_per_rank, 1, 512), ("hidden", hidden, 1024, 8192),
              ("num_moe_expert", num_moe_expert, 1, 1024), ("topk", topk, 1, 16),
              ("num_shared_expert", num_shared_expert, 0, 4))
    for name, value, lo, hi in limits:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
        if not lo <= value <= hi:
            raise ValueError(f"{name}: must be in [{lo}, {hi}] (got {value})")
    if world_size - num_shared_expert_ranks <= 0:
        raise ValueError("num_shared_expert_ranks: world_size - num_shared_expert_ranks must be > 0 "
                         f"(got {world_size} - {num_shared_expert_ranks})")
    local = moe_local_experts(world_size, num_moe_expert, num_shared_expert_ranks)
    if not 0 < local * world_size <= 2048:
        raise ValueError("num_moe_expert: L * world_size must be in (0, 2048] with L = num_moe_expert // "
                         f"(world_size - num_shared_expert_ranks) (got L={local}, L*W={local * world_size})")
    if comm_alg not in ("", "fullmesh_v1", "fullmesh_v2"):
        raise ValueError(f'comm_alg: must be "", "fullmesh_v1" or "fullmesh_v2" (got {comm_alg!r})')
    need = window_need(world_size, local, num_max_dispatch_tokens_per_rank, hidden, topk, num_shared_expert,
                       comm_alg == "fullmesh_v2") + MIB
    return align(-(-need // MIB), 2) // 2
