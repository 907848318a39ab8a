"""The golden of MoeDistributeCombineV5 over all ranks (docs/operators.md, "combine"): every expert
row goes back to the slot of the token it came from, and each token's slots are reduced in float32 in
a fixed order."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import (
    F32,
    SOC_950,
    SOC_A2,
    Cfg,
    check_ids,
    check_soc,
    elastic_table,
    make_cfg,
    masks,
    per_rank,
    row_dtype,
)
from .quant import comm_quant_int8_round_trip, comm_quant_mx_round_trip
from .results import CombineResult


def combine(
    expand_x: list[np.ndarray],
    expert_ids: list[np.ndarray],
    assist_info_for_combine: list[np.ndarray],
    ep_send_counts: list[np.ndarray],
    *,
    moe_expert_num: int,
    expert_scales: list[np.ndarray] | None = None,
    x_active_mask: list[np.ndarray] | None = None,
    shared_expert_x: list[np.ndarray] | None = None,
    ori_x: list[np.ndarray] | None = None,
    const_expert_alpha_1: np.ndarray | list[np.ndarray] | None = None,
    const_expert_alpha_2: np.ndarray | list[np.ndarray] | None = None,
    const_expert_v: np.ndarray | list[np.ndarray] | None = None,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    global_bs: int = 0,
    comm_quant_mode: int = 0,
    comm_alg: str = "",
    zero_expert_num: int = 0,
    copy_expert_num: int = 0,
    const_expert_num: int = 0,
    elastic_info: np.ndarray | list[np.ndarray] | None = None,
    soc: str = "Ascend910_93",
) -> list[CombineResult]:
    """Reference MoeDistributeCombineV5 over all ranks (A3 by default, ``soc="Ascend950"``,
    ``soc="Ascend910B"`` for Atlas A2, whose outputs are the A3 ones).

    Send: rank e sends ``expand_x[e][i]`` for ``i < N`` (``N`` = last prefix count of
    ``ep_send_counts[e]``) to rank ``src`` slot ``t*(K+S) + k`` from the triple in assist_info;
    with comm_quant_mode 2 the row travels int8-quantised.

    Reduce, per processed token, fp32 ``acc = 0`` then in order: k = 0..K-1 (pairs with a false
    2-D mask flag skipped): MoE row, zero expert (nothing), copy expert (ori_x), const expert — each
    ``× w`` when expert_scales is non-empty, one rounded multiply then one rounded add; then the S
    shared rows unweighted; then shared_expert_x; finally ``x_out = cast(acc)`` with
    round-half-to-even.  Unprocessed rows are zero and ``written`` False.

    Arrays of the const-expert parameters may be given once for all ranks or one per rank.

    Ascend950 (package docstring, choices 8–10): comm_quant_mode 3 (MXFP8 e5m2) and 4 (MXFP8
    e4m3fn); ``elastic_info`` tells each physical rank's role (shared / MoE) when it re-maps ranks.
    """
    soc = check_soc(soc)
    ex = [np.asarray(a) for a in expand_x]
    expert_ids = [np.asarray(a) for a in expert_ids]
    w = len(ex)
    if len(expert_ids) != w:
        raise ValueError(f"expert_ids: expected {w} arrays (one per rank), got {len(expert_ids)}")
    for name, lst in (("assist_info_for_combine", assist_info_for_combine), ("ep_send_counts", ep_send_counts)):
        if len(lst) != w:
            raise ValueError(f"{name}: expected {w} arrays (one per rank), got {len(lst)}")
    h = _row_width(ex, soc)
    # the token shapes come from expert_ids (BS_r, K); H from expand_x
    cfg = make_cfg([(ids.shape[0] if ids.ndim == 2 else -1, h) for ids in expert_ids], expert_ids,
                   moe_expert_num=moe_expert_num, shared_expert_num=shared_expert_num,
                   shared_expert_rank_num=shared_expert_rank_num, global_bs=global_bs, comm_alg=comm_alg,
                   zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
                   const_expert_num=const_expert_num, x_name="expert_ids", soc=soc)
    if comm_quant_mode not in ((0, 2, 3, 4) if soc == SOC_950 else (0, 2)):
        allowed = "0, 2, 3 or 4" if soc == SOC_950 else "0 or 2"
        raise ValueError(f"comm_quant_mode: must be {allowed} on {soc} (got {comm_quant_mode})")
    if soc == SOC_A2 and comm_quant_mode == 2 and comm_alg != "hierarchy":
        raise ValueError(f"comm_quant_mode: 2 needs comm_alg 'hierarchy' on {SOC_A2} (got {comm_alg!r})")
    if soc == SOC_A2 and shared_expert_x is not None:
        raise ValueError(f"shared_expert_x: reserved on {SOC_A2}, must be None")
    _, table = elastic_table(elastic_info, cfg.w, cfg.r, cfg.e, soc)
    logical_of = np.argsort(table)  # physical rank → the logical rank it serves
    opts = _options(cfg, ex[0].dtype, expert_scales, shared_expert_x, ori_x,
                    (const_expert_alpha_1, const_expert_alpha_2, const_expert_v))
    received = _send(cfg, ex, assist_info_for_combine, ep_send_counts, logical_of, comm_quant_mode)
    valid = masks(cfg, x_active_mask, soc)
    return [_reduce(rank, cfg, expert_ids[rank], valid[rank], received, opts, ex[0].dtype) for rank in range(w)]


def _row_width(ex: list[np.ndarray], soc: str) -> int:
    """H of expand_x, fp16 / bf16 and the same on every rank."""
    dt = row_dtype("expand_x[0]", ex[0], soc)
    h: int | None = None
    for rank, a in enumerate(ex):
        if a.dtype != dt:
            raise ValueError(f"expand_x[{rank}]: dtype differs across ranks ({a.dtype} vs {dt})")
        if a.ndim != 2:
            raise ValueError(f"expand_x[{rank}]: must be 2-D (got shape {a.shape})")
        if h is None:
            h = int(a.shape[1])
        elif a.shape[1] != h:
            raise ValueError(f"expand_x[{rank}]: H differs across ranks ({a.shape[1]} vs {h})")
    assert h is not None
    return h


# ---------------------------------------------------------------------------------------------------
# Optional inputs
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Options:
    """Per rank: the top-k weights (None: unweighted), shared_expert_x, ori_x; the const-expert
    tensors (alpha_1, alpha_2, v) per rank when const experts exist."""

    weights: list[np.ndarray | None]
    shared_x: list[Any]
    ori: list[Any]
    const: list[list[np.ndarray]]


def _options(cfg: Cfg, dt: np.dtype, expert_scales: Any, shared_expert_x: Any, ori_x: Any,
             const: tuple[Any, Any, Any]) -> _Options:
    w, h = cfg.w, cfg.h
    weights: list[np.ndarray | None] = [None] * w
    if expert_scales is not None:
        for rank, a in enumerate(per_rank("expert_scales", expert_scales, w)):
            if a is None:
                continue
            a = np.asarray(a)
            if a.size == 0:
                continue  # empty → unweighted
            if a.dtype != F32 or a.shape != (cfg.bss[rank], cfg.k):
                raise ValueError(f"expert_scales[{rank}]: must be float32 (BS, K) = ({cfg.bss[rank]}, {cfg.k}) or "
                                 f"empty (got {a.dtype} {a.shape})")
            weights[rank] = a
    sx_list: list[Any] = [None] * w
    if shared_expert_x is not None:
        if cfg.r:
            raise ValueError("shared_expert_x: only allowed when shared_expert_rank_num == 0")
        for rank, a in enumerate(per_rank("shared_expert_x", shared_expert_x, w)):
            a = np.asarray(a)
            bs = cfg.bss[rank]
            if a.ndim == 3 and a.shape[0] * a.shape[1] == bs and a.shape[2] == h:
                a = a.reshape(bs, h)
            if a.dtype != dt or a.shape != (bs, h):
                raise ValueError(f"shared_expert_x[{rank}]: must be {dt} of shape ({bs}, {h}) or 3-D with "
                                 f"dim0*dim1 == BS (got {a.dtype} {a.shape})")
            sx_list[rank] = a
    ori_list: list[Any] = [None] * w
    if cfg.c or cfg.q:
        if ori_x is None:
            raise ValueError("ori_x: required when copy_expert_num > 0 or const_expert_num > 0")
        for rank, a in enumerate(per_rank("ori_x", ori_x, w)):
            a = np.asarray(a)
            if a.dtype != dt or a.shape != (cfg.bss[rank], h):
                raise ValueError(f"ori_x[{rank}]: must be {dt} of shape ({cfg.bss[rank]}, {h}) (got {a.dtype} {a.shape})")
            ori_list[rank] = a
    const_lists = []
    if cfg.q:
        for name, val in zip(("const_expert_alpha_1", "const_expert_alpha_2", "const_expert_v"), const):
            if val is None:
                raise ValueError(f"{name}: required when const_expert_num > 0")
            per = [np.asarray(a) for a in per_rank(name, val, w)]
            for rank, a in enumerate(per):
                if a.dtype != dt or a.shape != (cfg.q, h):
                    raise ValueError(f"{name}[{rank}]: must be {dt} of shape (Q, H) = ({cfg.q}, {h}) (got {a.dtype} "
                                     f"{a.shape})")
            const_lists.append(per)
    return _Options(weights=weights, shared_x=sx_list, ori=ori_list, const=const_lists)


# ---------------------------------------------------------------------------------------------------
# Send
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Received:
    """The float32 values of every transmitted row (as the receiver accumulates them), and per
    receiving rank the index of the row in each (token, slot), -1 when none arrived."""

    values: np.ndarray
    slot_row: list[np.ndarray]


def _send(cfg: Cfg, ex: list[np.ndarray], assist_info: list[np.ndarray], ep_send_counts: list[np.ndarray],
          logical_of: np.ndarray, comm_quant_mode: int) -> _Received:
    w, ks, h = cfg.w, cfg.k + cfg.s, cfg.h
    vals = []
    slot_row = [np.full((bs, ks), -1, np.int64) for bs in cfg.bss]
    bs_of = np.array(cfg.bss, np.int64)
    base = 0
    for e_rank in range(w):
        n = _rows_sent(cfg, e_rank, ep_send_counts[e_rank], logical_of[e_rank] < cfg.r, ex[e_rank].shape[0])
        info = np.asarray(assist_info[e_rank]).reshape(-1)
        if info.size < 3 * n:
            raise ValueError(f"assist_info_for_combine[{e_rank}]: needs >= {3 * n} entries (got {info.size})")
        trip = info[: 3 * n].astype(np.int64).reshape(n, 3)
        vals.append(_transported(ex[e_rank][:n], comm_quant_mode))
        src, t, kk = trip[:, 0], trip[:, 1], trip[:, 2]
        ok = (src >= 0) & (src < w) & (kk >= 0) & (kk < ks) & (t >= 0)
        ok[ok] &= t[ok] < bs_of[src[ok]]
        if not ok.all():
            i = int(np.argmin(ok))
            raise ValueError(
                f"assist_info_for_combine[{e_rank}]: row {i} triple {tuple(int(v) for v in trip[i])} out of range")
        for sr in np.unique(src):
            m = np.nonzero(src == sr)[0]
            dst = slot_row[sr]
            flat = t[m] * ks + kk[m]
            if np.unique(flat).size != flat.size or (dst.reshape(-1)[flat] >= 0).any():
                raise ValueError(f"assist_info_for_combine[{e_rank}]: a slot of rank {sr} is received twice")
            dst.reshape(-1)[flat] = base + m
        base += n
    values = np.concatenate(vals, axis=0) if vals else np.zeros((0, h), F32)
    return _Received(values=values, slot_row=slot_row)


def _rows_sent(cfg: Cfg, e_rank: int, counts: Any, shared_rank: bool, capacity: int) -> int:
    """N: the last inclusive prefix count of this rank's role (W slots shared, W*L MoE)."""
    cnts = np.asarray(counts).reshape(-1)
    need = cfg.w if shared_rank else cfg.l * cfg.w
    if cnts.size < need:
        raise ValueError(f"ep_send_counts[{e_rank}]: needs >= {need} elements (got {cnts.size})")
    n = int(cnts[need - 1])
    if n < 0 or n > capacity:
        raise ValueError(f"ep_send_counts[{e_rank}]: row count {n} outside [0, expand_x rows {capacity}]")
    return n


def _transported(rows: np.ndarray, comm_quant_mode: int) -> np.ndarray:
    """The float32 values a receiver accumulates for `rows` after the transport."""
    if comm_quant_mode == 2:
        return comm_quant_int8_round_trip(rows)  # same values on A3 and 950 (choice 9)
    if comm_quant_mode in (3, 4):
        return comm_quant_mx_round_trip(rows, comm_quant_mode)
    out: np.ndarray = rows.astype(F32)
    return out


# ---------------------------------------------------------------------------------------------------
# Reduce
# ---------------------------------------------------------------------------------------------------


def _reduce(rank: int, cfg: Cfg, expert_ids: np.ndarray, valid: tuple[np.ndarray, np.ndarray], rx: _Received,
            opts: _Options, dt: np.dtype) -> CombineResult:
    h, k, e_num = cfg.h, cfg.k, cfg.e
    ids = expert_ids.astype(np.int64)
    tok_valid, pair_valid = valid
    check_ids(cfg, rank, ids, pair_valid & tok_valid[:, None])
    proc = np.nonzero(tok_valid)[0]
    acc = np.zeros((proc.size, h), F32)
    wt = opts.weights[rank]
    ori_f: Any = opts.ori[rank][proc].astype(F32) if opts.ori[rank] is not None else None
    sr = rx.slot_row[rank]
    for kk in range(k):
        idk = ids[proc, kk]
        use = pair_valid[proc, kk]
        is_moe = use & (idk < e_num)
        is_copy = use & (idk >= e_num + cfg.z) & (idk < e_num + cfg.z + cfg.c)
        is_const = use & (idk >= e_num + cfg.z + cfg.c)
        if not (is_moe.any() or is_copy.any() or is_const.any()):
            continue
        v = np.zeros((proc.size, h), F32)
        if is_moe.any():
            rr = sr[proc[is_moe], kk]
            if (rr < 0).any():
                t_bad = int(proc[is_moe][np.argmax(rr < 0)])
                raise ValueError(f"rank {rank}: no row was received for token {t_bad}, k {kk} (MoE expert)")
            v[is_moe] = rx.values[rr]
        if is_copy.any():
            v[is_copy] = ori_f[is_copy]
        if is_const.any():
            c = opts.const
            v[is_const] = _const_expert_rows(ori_f[is_const], idk[is_const] - (e_num + cfg.z + cfg.c),
                                             c[0][rank], c[1][rank], c[2][rank])
        contrib = is_moe | is_copy | is_const
        term = v * wt[proc, kk][:, None] if wt is not None else v  # float32 multiply, rounded
        # adding +0.0 to an accumulator that starts at +0.0 is the identity (acc is never -0.0),
        # so selecting zero for skipped tokens equals skipping them
        term = np.where(contrib[:, None], term, F32(0)).astype(F32)
        acc = acc + term  # float32 add, rounded
    for s in range(cfg.s):
        rr = sr[proc, k + s]
        if (rr < 0).any():
            t_bad = int(proc[np.argmax(rr < 0)])
            raise ValueError(f"rank {rank}: no shared-expert row was received for token {t_bad}, slot {k + s}")
        acc = acc + rx.values[rr]  # unweighted
    if opts.shared_x[rank] is not None:
        acc = acc + opts.shared_x[rank][proc].astype(F32)
    x_out = np.zeros((cfg.bss[rank], h), dt)
    x_out[proc] = acc.astype(dt)  # RNE cast
    return CombineResult(x_out=x_out, written=tok_valid.copy())


def _const_expert_rows(ori_f: np.ndarray, c: np.ndarray, alpha1: np.ndarray, alpha2: np.ndarray,
                       const_v: np.ndarray) -> np.ndarray:
    """Const-expert value rows (docs/operators.md, "const experts").

    ``a1 = sum_h float32(alpha_1[c,h]) * float32(ori_x[t,h])`` in ascending h with one rounding per
    product and per addition (``np.cumsum(..., dtype=float32)[-1]``), ``a2`` likewise; the two-way
    softmax in float64 from those float32 values; ``p1``, ``p2`` rounded to float32; then
    ``v = p1*ori_x + p2*const_v`` in float32 (two rounded multiplies, one rounded add).
    """
    a1f = alpha1.astype(F32)[c]
    a2f = alpha2.astype(F32)[c]
    cvf = const_v.astype(F32)[c]
    d1 = np.cumsum(a1f * ori_f, axis=1, dtype=F32)[:, -1]
    d2 = np.cumsum(a2f * ori_f, axis=1, dtype=F32)[:, -1]
    # two-way softmax in float64 (Python floats are IEEE doubles); math.exp is the C library's exp,
    # the same function a C++ implementation calls, whereas numpy's SIMD exp may differ by an ulp
    p1 = np.empty(d1.size, F32)
    p2 = np.empty(d1.size, F32)
    for i, (v1, v2) in enumerate(zip(d1.tolist(), d2.tolist())):
        m = max(v1, v2)
        e1 = math.exp(v1 - m)
        e2 = math.exp(v2 - m)
        den = e1 + e2
        p1[i] = e1 / den  # rounded to float32 on assignment (RNE)
        p2[i] = e2 / den
    result: np.ndarray = (p1[:, None] * ori_f) + (p2[:, None] * cvf)  # float32 throughout
    return result


__all__ = ["combine"]
