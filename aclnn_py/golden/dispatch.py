"""The golden of MoeDistributeDispatchV5 over all ranks (docs/operators.md, "dispatch"): which
(token, expert) pairs travel, where each row lands, and what the receiver's outputs hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
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
    rows_capacity,
)
from .formats import (
    FMT_BF16,
    FMT_E2M1,
    FMT_F16,
    FMT_HIF8,
    FMT_INT8,
    FP4,
    FP8,
    LOW_PRECISION_X,
    NP_TO_FMT,
    format_name,
)
from .quant import (
    quantize_mx,
    quantize_per_group,
    quantize_per_token,
    quantize_per_token_int8,
    quantize_static,
)
from .results import DispatchResult
from .sizing import align


def dispatch(
    x: list[np.ndarray],
    expert_ids: list[np.ndarray],
    *,
    moe_expert_num: int,
    scales: np.ndarray | list[np.ndarray] | None = None,
    x_active_mask: list[np.ndarray] | None = None,
    expert_scales: list[np.ndarray] | None = None,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    quant_mode: int = 0,
    global_bs: int = 0,
    expert_token_nums_type: int = 1,
    comm_alg: str = "",
    zero_expert_num: int = 0,
    copy_expert_num: int = 0,
    const_expert_num: int = 0,
    y_dtype: Any = None,
    x_dtype: Any = None,
    elastic_info: np.ndarray | list[np.ndarray] | None = None,
    soc: str = "Ascend910_93",
) -> list[DispatchResult]:
    """Reference MoeDistributeDispatchV5 over all ranks (A3 by default, ``soc="Ascend950"``,
    ``soc="Ascend910B"`` for Atlas A2: its limits, comm_alg "", "fullmesh" or "hierarchy", all giving
    the A3 outputs; ep_recv_counts holds the W*L running totals, the entries A2 adds with
    expert_scales being opaque — :func:`aclnn_py.golden.sizing.ep_recv_counts_size`).

    ``x[r]`` is rank r's (BS_r, H) fp16/bf16 tokens and ``expert_ids[r]`` its (BS_r, K) int ids.

    * Placement: MoE expert e → rank ``e // L + R``, local expert ``e % L``; shared expert s of
      sender src → rank ``src % P + s*P`` with ``P = R/S``; ids ≥ E (zero/copy/const) are never sent.
    * Pairs: valid (t, k) pairs with id < E in flattened order; every valid token once per shared
      expert (slot ``K + s``).  1-D mask: only ``sum(mask)`` matters; 2-D mask: per pair.
    * Receiver order: slot ``j*W + src`` (MoE rank) or ``src`` (shared rank), ascending; within a
      slot, the sender's ascending flattened ``t*K + k``.
    * quant_mode 2: per-row dynamic int8 with the SENDER's smooth scales (row ``s`` for shared
      expert s, ``e + S`` for MoE expert e); an all-zero row → scale 0, values 0.
    * comm_alg "", "fullmesh_v1", "fullmesh_v2" give identical outputs.

    Ascend950 (package docstring, choices 1–7, 10): quant modes 1, 3, 4, 5 and fp8 mode 2 with
    ``y_dtype``; quant 0 with a low-precision x (``x_dtype`` for uint8 arrays) and per-token
    ``scales`` forwarded as dynamic_scales; ``elastic_info``.

    ``scales`` is one float32 array for every rank or a list of one per rank (per-token scales of a
    low-precision x: a list).  ``expert_scales`` is a list of (BS_r, K) float32 arrays; an array with
    a zero dim counts as absent.  Returns one :class:`DispatchResult` per rank.
    """
    soc = check_soc(soc)
    xs = [np.asarray(a) for a in x]
    expert_ids = [np.asarray(a) for a in expert_ids]
    if not xs:
        raise ValueError("x: need at least one rank")
    x_fmt, packed = _x_format(xs, x_dtype, soc)
    shapes = [(a.shape[0], a.shape[1] * 2) if packed and a.ndim == 2 else a.shape for a in xs]
    cfg = make_cfg(shapes, expert_ids, moe_expert_num=moe_expert_num, shared_expert_num=shared_expert_num,
                   shared_expert_rank_num=shared_expert_rank_num, global_bs=global_bs, comm_alg=comm_alg,
                   zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
                   const_expert_num=const_expert_num, x_name="x", soc=soc)
    if soc == SOC_A2 and comm_alg == "hierarchy" and scales is not None:
        raise ValueError(f"scales: must be None with comm_alg 'hierarchy' on {SOC_A2}")
    y_fmt = _check_modes(cfg, quant_mode, expert_token_nums_type, x_fmt, y_dtype, soc)
    elastic, table = elastic_table(elastic_info, cfg.w, cfg.r, cfg.e, soc)
    sc = _scales(scales, cfg, quant_mode, x_fmt, y_fmt)
    weights = _weights(expert_scales, cfg)
    sends = _sends(cfg, expert_ids, masks(cfg, x_active_mask, soc))
    results: list[DispatchResult | None] = [None] * cfg.w
    for dest in range(cfg.w):  # logical rank; served by physical rank table[dest]
        results[int(table[dest])] = _receive(dest, cfg, sends, xs, sc, weights, quant_mode, y_fmt,
                                             expert_token_nums_type, shared_expert_num, elastic)
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------


def _x_format(xs: list[np.ndarray], x_dtype: Any, soc: str) -> tuple[str, bool]:
    """(format name of x, packed fp4?) — fp16/bf16 on A3; the 950 adds hif8/fp8/fp4."""
    dt = xs[0].dtype
    for rank, a in enumerate(xs):
        if a.dtype != dt:
            raise ValueError(f"x[{rank}]: dtype differs across ranks ({a.dtype} vs {dt})")
        if a.ndim != 2:
            raise ValueError(f"x[{rank}]: must be 2-D (got shape {a.shape})")
    declared = None if x_dtype is None else format_name(x_dtype)
    if soc != SOC_950:
        if declared is not None and declared not in (FMT_F16, FMT_BF16):
            raise ValueError(f"x_dtype: {declared} inputs need Ascend950 (Ascend910_93 takes float16/bfloat16)")
        row_dtype("x[0]", xs[0])
        fmt = NP_TO_FMT[dt]
        if declared is not None and declared != fmt:
            raise ValueError(f"x_dtype: {declared} does not match x's dtype {dt}")
        return fmt, False
    if dt == np.uint8:
        if declared is None or declared not in LOW_PRECISION_X:
            raise ValueError("x_dtype: a uint8 x needs x_dtype hifloat8 / float8_* / float4_*")
        return declared, declared in FP4
    fmt950 = NP_TO_FMT.get(dt)
    if fmt950 is None or fmt950 == FMT_INT8 or fmt950 == FMT_E2M1:
        raise ValueError(f"x: dtype {dt} is not a dispatch input on Ascend950 (fp4 x is packed uint8 with x_dtype)")
    if declared is not None and declared != fmt950:
        raise ValueError(f"x_dtype: {declared} does not match x's dtype {dt}")
    return fmt950, False


def _y_format(y_dtype: Any, quant_mode: int, x_fmt: str, soc: str) -> str:
    """expand_x's format: x's for quant 0, int8 otherwise, y_dtype overriding."""
    default = x_fmt if quant_mode == 0 else FMT_INT8
    fmt = default if y_dtype is None else format_name(y_dtype)
    if soc != SOC_950:
        if fmt != default:
            raise ValueError(f"y_dtype: {fmt} output needs Ascend950 (quant_mode {quant_mode} on Ascend910_93 "
                             f"outputs {default})")
        return fmt
    allowed = {0: (x_fmt,), 1: (FMT_INT8, FMT_HIF8), 2: (FMT_INT8,) + FP8, 3: FP8, 4: FP8 + FP4,
               5: FP8}[quant_mode]
    if fmt not in allowed:
        raise ValueError(f"y_dtype: quant_mode {quant_mode} outputs {' / '.join(allowed)} (got {fmt})")
    return fmt


def _check_modes(cfg: Cfg, quant_mode: int, expert_token_nums_type: int, x_fmt: str, y_dtype: Any,
                 soc: str) -> str:
    """quant_mode and expert_token_nums_type under the profile; returns expand_x's format."""
    if soc != SOC_950 and quant_mode not in (0, 2):
        raise ValueError(f"quant_mode: must be 0 or 2 on {soc} (got {quant_mode})")
    if quant_mode not in range(6):
        raise ValueError(f"quant_mode: must be in [0, 5] on Ascend950 (got {quant_mode})")
    if expert_token_nums_type not in (0, 1):
        raise ValueError(f"expert_token_nums_type: must be 0 or 1 (got {expert_token_nums_type})")
    if x_fmt in LOW_PRECISION_X and quant_mode != 0:
        raise ValueError(f"x: a {x_fmt} input needs quant_mode 0 (got {quant_mode})")
    y_fmt = _y_format(y_dtype, quant_mode, x_fmt, soc)
    if y_fmt in FP4 and cfg.h % 2:
        raise ValueError(f"x: H must be even for a packed fp4 output (got H={cfg.h})")
    return y_fmt


@dataclass
class _Scales:
    """The scales input, as each quantisation reads it (per rank; None when not used)."""

    rows: list[np.ndarray] | None = None       # smooth (quant 2/3) or per-expert static (quant 1): (E[+S], H)
    static_row: list[np.ndarray] | None = None  # quant 1, (1,) or (H,) as a (1, n) row
    per_token: list[np.ndarray] | None = None   # quant 0 with a low-precision x: (BS, dim1), forwarded


def _scales(scales: Any, cfg: Cfg, quant_mode: int, x_fmt: str, y_fmt: str) -> _Scales:
    low_x = x_fmt in LOW_PRECISION_X
    if scales is None:
        if quant_mode == 1:
            raise ValueError("scales: quant_mode 1 (static) needs scales")
        if quant_mode == 0 and low_x:
            raise ValueError(f"scales: a {x_fmt} x needs per-token scales (BS, dim1 <= H)")
        return _Scales()
    if quant_mode == 0 and not low_x:
        raise ValueError("scales: must be absent when quant_mode is 0")
    if quant_mode in (4, 5):
        raise ValueError(f"scales: must be absent for MX quant_mode {quant_mode}")
    h = cfg.h
    want = (cfg.e + cfg.s, h) if cfg.r else (cfg.e, h)
    if quant_mode == 0:
        if isinstance(scales, np.ndarray):
            raise ValueError("scales: per-token scales of a low-precision x need one array per rank")
        return _Scales(per_token=_token_scales(scales, cfg, x_fmt))
    if quant_mode == 1:
        per = [np.asarray(a) for a in per_rank("scales", scales, cfg.w)]
        allowed = [(1,)] if y_fmt == FMT_HIF8 else [(1,), (h,), want]
        for rank, sa in enumerate(per):
            if sa.dtype != F32 or sa.shape not in allowed:
                raise ValueError(f"scales[{rank}]: quant_mode 1 with {y_fmt} output needs float32 of shape "
                                 f"{' or '.join(map(str, allowed))} (got {sa.dtype} {sa.shape})")
        if per[0].shape == want and tuple(want) not in [(1,), (h,)]:
            return _Scales(rows=per)
        return _Scales(static_row=[sa.reshape(1, -1) for sa in per])
    rows = []
    for rank, sa in enumerate(per_rank("scales", scales, cfg.w)):
        sa = np.asarray(sa)
        if sa.dtype != F32 or sa.shape != want:
            raise ValueError(f"scales[{rank}]: must be float32 of shape {want} (got {sa.dtype} {sa.shape})")
        rows.append(sa)
    return _Scales(rows=rows)


def _token_scales(scales: Any, cfg: Cfg, x_fmt: str) -> list[np.ndarray]:
    """Per-token scales of a low-precision x: (BS_r, dim1), float32 or e8m0 bytes, with 1 <= dim1 <= H
    and one row fitting in the token's window row after its x bytes (package docstring choice 7)."""
    per = [np.asarray(a) for a in per_rank("scales", scales, cfg.w)]
    ok_dt = (np.dtype(F32), np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e8m0fnu))
    d0 = per[0].dtype
    dim1 = per[0].shape[1] if per[0].ndim == 2 else -1
    for rank, a in enumerate(per):
        if a.ndim != 2 or a.shape[0] != cfg.bss[rank] or not 1 <= a.shape[1] <= cfg.h or a.dtype not in ok_dt:
            raise ValueError(f"scales[{rank}]: must be float32 or e8m0 (BS, dim1) with 1 <= dim1 <= H = {cfg.h} "
                             f"and BS = {cfg.bss[rank]} (got {a.dtype} {a.shape})")
        if a.dtype != d0 or a.shape[1] != dim1:
            raise ValueError(f"scales[{rank}]: dtype/dim1 differ across ranks")
    x_bytes = cfg.h // 2 if x_fmt in FP4 else cfg.h
    room = align(2 * cfg.h, 32) - x_bytes
    if dim1 * d0.itemsize > room:
        raise ValueError(f"scales: one row of per-token scales must fit in the token's window row: dim1 * "
                         f"{d0.itemsize} bytes <= align(2H, 32) - {x_bytes} bytes of x = {room} (got dim1 {dim1})")
    return per


def _weights(expert_scales: Any, cfg: Cfg) -> list[np.ndarray] | None:
    """expert_scales, present iff given with no zero dim, and then on every rank alike."""
    if expert_scales is None:
        return None
    es = [None if a is None else np.asarray(a) for a in per_rank("expert_scales", expert_scales, cfg.w)]
    present = [a is not None and a.size > 0 for a in es]
    if any(present) and not all(present):
        raise ValueError("expert_scales: given on some ranks but absent/empty on others")
    if not all(present):
        return None
    out = []
    for rank, a in enumerate(es):
        assert a is not None  # all present
        if a.dtype != F32 or a.shape != (cfg.bss[rank], cfg.k):
            raise ValueError(f"expert_scales[{rank}]: must be float32 (BS, K) = ({cfg.bss[rank]}, {cfg.k}) "
                             f"(got {a.dtype} {a.shape})")
        out.append(a)
    return out


# ---------------------------------------------------------------------------------------------------
# Send: every transmitted row as a record
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Sends:
    """One entry per transmitted row: its sender, token, k slot, destination (a logical rank), the
    receive slot, the order within the slot, and the scale row it is smoothed with."""

    src: np.ndarray
    t: np.ndarray
    k: np.ndarray
    dest: np.ndarray
    slot: np.ndarray
    order: np.ndarray
    srow: np.ndarray


def _sends(cfg: Cfg, expert_ids: list[np.ndarray], valid: list[tuple[np.ndarray, np.ndarray]]) -> _Sends:
    parts: dict[str, list[np.ndarray]] = {f: [] for f in ("src", "t", "k", "dest", "slot", "order", "srow")}

    def add(**cols: np.ndarray) -> None:
        for f, v in cols.items():
            parts[f].append(v)

    w, k = cfg.w, cfg.k
    for src in range(w):
        ids = expert_ids[src].astype(np.int64)
        tok_valid, pair_valid = valid[src]
        check_ids(cfg, src, ids, pair_valid)
        tt, kk = np.nonzero(pair_valid & (ids < cfg.e))  # row-major → ascending flattened t*K + k
        ee = ids[tt, kk]
        add(src=np.full(tt.size, src, np.int64), t=tt, k=kk, dest=cfg.dest_of_moe(ee), slot=(ee % cfg.l) * w + src,
            order=tt * k + kk, srow=ee + cfg.s)
        if cfg.r:
            vt = np.nonzero(tok_valid)[0]
            for s in range(cfg.s):
                add(src=np.full(vt.size, src, np.int64), t=vt, k=np.full(vt.size, k + s, np.int64),
                    dest=np.full(vt.size, cfg.dest_of_shared(src, s), np.int64),
                    slot=np.full(vt.size, src, np.int64), order=vt, srow=np.full(vt.size, s, np.int64))
    return _Sends(**{f: np.concatenate(v).astype(np.int64) for f, v in parts.items()})


# ---------------------------------------------------------------------------------------------------
# Receive: one logical rank's outputs
# ---------------------------------------------------------------------------------------------------


def _gather(per_rank_rows: list[np.ndarray], src: np.ndarray, idx: np.ndarray, width: int, dtype: Any) -> np.ndarray:
    """Row idx[i] of rank src[i]'s array, for every i."""
    out = np.empty((src.size, width), dtype)
    for sr in np.unique(src):
        m = src == sr
        out[m] = per_rank_rows[sr][idx[m]]
    return out


def _receive(dest: int, cfg: Cfg, sends: _Sends, xs: list[np.ndarray], sc: _Scales,
             weights: list[np.ndarray] | None, quant_mode: int, y_fmt: str, expert_token_nums_type: int,
             shared_expert_num: int, elastic: bool) -> DispatchResult:
    w, k = cfg.w, cfg.k
    shared_rank = dest < cfg.r
    n_slots = w if shared_rank else cfg.l * w
    sel = np.nonzero(sends.dest == dest)[0]
    sel = sel[np.lexsort((sends.order[sel], sends.slot[sel]))]  # slot ascending, then sender order
    src, t, kk, srow = sends.src[sel], sends.t[sel], sends.k[sel], sends.srow[sel]
    n = int(sel.size)
    cnt = np.bincount(sends.slot[sel], minlength=n_slots)
    cap = rows_capacity(w, dest, cfg.e, shared_expert_num, cfg.r, cfg.g, cfg.bss[0], k, elastic=elastic)
    if n > cap:
        raise ValueError(f"rank {dest}: receives {n} rows, more than its capacity A={cap} (duplicate expert ids "
                         "in a row?)")
    ep_recv = np.cumsum(cnt).astype(np.int32)
    if shared_rank:
        etn = np.array([n], np.int64)
    else:
        per_expert = cnt.reshape(cfg.l, w).sum(axis=1).astype(np.int64)
        etn = per_expert if expert_token_nums_type == 1 else np.cumsum(per_expert).astype(np.int64)
    assist = np.stack([src, t, kk], axis=1).reshape(-1).astype(np.int32)
    expand_x, dyn = _payload(cfg, xs, sc, src, t, srow, quant_mode, y_fmt)
    exp_scales = None
    if weights is not None and not shared_rank:
        exp_scales = np.empty(n, F32)
        for sr in np.unique(src):
            m = src == sr
            exp_scales[m] = weights[sr][t[m], kk[m]]
    return DispatchResult(expand_x=expand_x, dynamic_scales=dyn, assist_info_for_combine=assist,
                          expert_token_nums=etn, ep_recv_counts=ep_recv, expand_scales=exp_scales, num_rows=n,
                          capacity=cap, local_expert_num=1 if shared_rank else cfg.l, y_dtype=y_fmt,
                          logical_rank=dest)


def _payload(cfg: Cfg, xs: list[np.ndarray], sc: _Scales, src: np.ndarray, t: np.ndarray, srow: np.ndarray,
             quant_mode: int, y_fmt: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(expand_x, dynamic_scales) of the received rows: copied (quant 0, with any forwarded per-token
    scales) or quantised by the sender's rule."""
    rows = _gather(xs, src, t, xs[0].shape[1], xs[0].dtype)
    if quant_mode == 0:
        if sc.per_token is None:
            return rows, None
        return rows, _gather(sc.per_token, src, t, sc.per_token[0].shape[1], sc.per_token[0].dtype)
    h = cfg.h
    xf = rows.astype(F32)
    if quant_mode in (2, 3) and sc.rows is not None:
        xf = xf * _gather(sc.rows, src, srow, h, F32)  # float32 multiply (smoothing)
    if quant_mode == 1:
        if sc.rows is not None:
            scale = _gather(sc.rows, src, srow, h, F32)
        else:
            assert sc.static_row is not None
            scale = _gather(sc.static_row, src, np.zeros_like(src), sc.static_row[0].shape[1], F32)
        return quantize_static(xf, scale, y_fmt), None
    if quant_mode == 2 and y_fmt == FMT_INT8:
        return quantize_per_token_int8(xf)  # the A3 path
    if quant_mode == 2:
        return quantize_per_token(xf, y_fmt)
    if quant_mode == 3:
        return quantize_per_group(xf, y_fmt)
    return quantize_mx(rows, y_fmt, clip=quant_mode == 5)


__all__ = ["dispatch"]
