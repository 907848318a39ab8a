"""Buffer sizing, computed here independently of the product (docs/operators.md, "buffer sizing"):
``get_low_latency_ccl_buffer_size`` (the HCCL_BUFFSIZE to set) and the kernel-side window
requirement, with the code's +44 bytes per token."""

from __future__ import annotations

from .config import (
    COMM_ALGS,
    COMM_ALGS_A2,
    SOC_950,
    SOC_A2,
    SOCS,
    moe_local_num,
    normalized_shared_expert_num,
    soc_family,
)

MIB = 1 << 20


def align(v: int, b: int) -> int:
    return -(-v // b) * b


def token_sizes(hidden: int, comm_alg: str) -> tuple[int, int]:
    """(Td, Tc) of docs/operators.md: per-token dispatch and combine window bytes."""
    tal = align(hidden * 2, 32) + 44
    td = -(-tal // 480) * 512 if comm_alg == "fullmesh_v2" else align(tal, 512)
    tc = align(hidden * 2, 512)
    return td, tc


def ccl_buffer_size_mb(
    world_size: int,
    num_max_dispatch_tokens_per_rank: int,
    hidden: int,
    num_moe_expert: int,
    topk: int,
    num_shared_expert: int = 0,
    num_shared_expert_ranks: int = 0,
    comm_alg: str = "",
) -> int:
    """``get_low_latency_ccl_buffer_size``: the HCCL_BUFFSIZE value (MiB) to set.

    Range checks raise ValueError naming the argument and the rule.  Formula::

        tal = align(hidden*2, 32) + 44
        Td  = fullmesh_v2 ? ceil(tal/480)*512 : align(tal, 512)
        Tc  = align(hidden*2, 512)
        min = 2*(tokens*Td*W*L + tokens*Tc*(topk + num_shared_expert)) + 1 MiB
        ret = align(ceil(min / 1 MiB), 2) / 2

    with ``L = num_moe_expert // (W - num_shared_expert_ranks)``.
    """
    w, tokens = int(world_size), int(num_max_dispatch_tokens_per_rank)

    def rng(name: str, v: int, lo: int, hi: int) -> None:
        if not lo <= v <= hi:
            raise ValueError(f"{name}: must be in [{lo}, {hi}] (got {v})")

    rng("world_size", w, 2, 768)
    rng("hidden", hidden, 1024, 8192)
    rng("num_max_dispatch_tokens_per_rank", tokens, 1, 512)
    rng("num_moe_expert", num_moe_expert, 1, 1024)
    rng("topk", topk, 1, 16)
    rng("num_shared_expert", num_shared_expert, 0, 4)
    if not w - num_shared_expert_ranks > 0:
        raise ValueError(
            f"num_shared_expert_ranks: world_size - num_shared_expert_ranks must be > 0 "
            f"(got {w} - {num_shared_expert_ranks})"
        )
    n_local = num_moe_expert // (w - num_shared_expert_ranks)
    if not 0 < n_local * w <= 2048:
        raise ValueError(
            "num_moe_expert: L * world_size must be in (0, 2048] with L = num_moe_expert // "
            f"(world_size - num_shared_expert_ranks) (got L={n_local}, L*W={n_local * w})"
        )
    if comm_alg not in COMM_ALGS:
        raise ValueError(f"comm_alg: must be one of {COMM_ALGS} (got {comm_alg!r})")
    td, tc = token_sizes(hidden, comm_alg)
    min_bytes = 2 * (tokens * td * w * n_local + tokens * tc * (topk + num_shared_expert)) + MIB
    return align(-(-min_bytes // MIB), 2) // 2


def window_bytes_required(
    ep_world_size: int,
    max_bs: int,
    hidden: int,
    moe_expert_num: int,
    topk: int,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    comm_alg: str = "",
    soc: str = "Ascend910_93",
) -> int:
    """Left-hand side of the kernel-side window check of docs/operators.md, in bytes::

        2*(maxBs*Td*W*L + maxBs*Tc*(K+S))     (+ W*1024 on Ascend950)

    The operator requires it to be ``<= cclBufferSize - 1 MiB``.  S is the normalised shared expert
    count and ``L = E / (W - R)``; Td and Tc as for :func:`ccl_buffer_size_mb` (the code's +44 constant).
    """
    w = int(ep_world_size)
    s = normalized_shared_expert_num(shared_expert_num, shared_expert_rank_num)
    n_local = moe_local_num(w, moe_expert_num, shared_expert_rank_num)
    if comm_alg not in COMM_ALGS:
        raise ValueError(f"comm_alg: must be one of {COMM_ALGS} (got {comm_alg!r})")
    soc = soc_family(soc) or soc
    if soc not in SOCS or soc == SOC_A2:
        raise ValueError(f"soc: must be 'Ascend910_93' or 'Ascend950' (got {soc!r}; Ascend910B: a2_window_bytes_required)")
    td, tc = token_sizes(int(hidden), comm_alg)
    need = 2 * (max_bs * td * w * n_local + max_bs * tc * (topk + s))
    if soc == SOC_950:
        need += w * 1024
    return need


def a2_window_bytes_required(ep_world_size: int, max_bs: int, hidden: int, moe_expert_num: int, topk: int,
                             comm_alg: str = "") -> int:
    """Bytes the window must hold on Atlas A2, by the formula aclnnMoeDistributeDispatchV2.md gives for
    the comm_alg (x of 2-byte elements); the operator requires it to be ``<= cclBufferSize``::

        "" / "fullmesh":  2*(maxBs*W*min(L,K)*H*2 + 2 MiB)
        "hierarchy":      E*maxBs*(H*2 + 4*align8(K)*4) + 4 MiB + 100 MiB
    """
    if comm_alg not in COMM_ALGS_A2:
        raise ValueError(f"comm_alg: must be one of {COMM_ALGS_A2} on {SOC_A2} (got {comm_alg!r})")
    w, e, k = int(ep_world_size), int(moe_expert_num), int(topk)
    if comm_alg == "hierarchy":
        return e * max_bs * (hidden * 2 + 4 * align(k, 8) * 4) + 104 * MIB
    n_local = moe_local_num(w, e, 0)
    return 2 * (max_bs * w * min(n_local, k) * hidden * 2 + 2 * MIB)


def ep_recv_counts_size(ep_world_size: int, local_expert_num: int, global_bs: int, topk: int,
                        comm_alg: str = "", soc: str = "Ascend910_93") -> int:
    """Entries of dispatch's ep_recv_counts: ``W * localExpertNum``, and on Atlas A2 with comm_alg
    "hierarchy" ``+ 2 * G * K * serverNum`` with ``serverNum = W / 8`` (servers of 8 ranks; G = global_bs
    resolved): the reduce information that algorithm writes after the counts."""
    w = int(ep_world_size)
    extra = 2 * int(global_bs) * int(topk) * (w // 8) if soc_family(soc) == SOC_A2 and comm_alg == "hierarchy" else 0
    return w * int(local_expert_num) + extra


__all__ = ["MIB", "align", "token_sizes", "ccl_buffer_size_mb", "window_bytes_required", "a2_window_bytes_required",
           "ep_recv_counts_size"]
