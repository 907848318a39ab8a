"""Configuration shared by the golden's dispatch and combine: the notation and derived sizes of
docs/operators.md (S normalised, L, A, G), the SoC profiles, per-rank inputs and masks, and
elastic_info's rank table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
ROW_DTYPES = (FP16, BF16)
COMM_ALGS = ("", "fullmesh_v1", "fullmesh_v2")
COMM_ALGS_A2 = ("", "fullmesh", "hierarchy")

SOC_A3 = "Ascend910_93"
SOC_950 = "Ascend950"
SOC_A2 = "Ascend910B"
SOCS = (SOC_A3, SOC_950, SOC_A2)
#: A device reports a member of a family (Ascend910_9391, Ascend910B3, Ascend950PR_...): a name belongs
#: to the family it begins with, case aside. The golden keeps its own copy of this rule, as of every
#: other; tests/test_socs.py checks it against the package's table (aclnn_py.socs).
SOC_EXAMPLES = {SOC_A3: "Ascend910_9391", SOC_A2: "Ascend910B3", SOC_950: "Ascend950PR_..."}


def soc_family(soc: str) -> str | None:
    """The family a SoC name belongs to, or None."""
    if not isinstance(soc, str):
        return None
    return next((f for f in SOCS if soc.lower().startswith(f.lower())), None)
#: Atlas A2 (aclnnMoeDistributeDispatchV2.md / V3.md): the EP world sizes per comm_alg
#: Atlas A2 worlds by comm_alg, as the newest published documents list them ("fullmesh" from 2 ranks)
_A2_FULLMESH = (2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 192, 256, 384)
A2_WORLD_SIZES = {"": _A2_FULLMESH, "fullmesh": _A2_FULLMESH, "hierarchy": (16, 32, 64)}


def check_soc(soc: str) -> str:
    """The family of `soc`: a device's own name (``Ascend910B3``, ``Ascend910_9391`` ...) counts as its
    family's (soc_family)."""
    fam = soc_family(soc)
    if fam is None:
        examples = ", ".join(f"{f} (e.g. {e})" for f, e in SOC_EXAMPLES.items())
        raise ValueError(f"soc: must name a SoC of the family {examples} (got {soc!r})")
    return fam


def check_a2(cfg: Cfg, comm_alg: str) -> None:
    """The Atlas A2 limits the golden can see in its inputs: world size per comm_alg, no shared or
    special experts, E <= 1024 (512 with "hierarchy"), BS <= 256, H a multiple of 32 up to 7168
    (10240 with "hierarchy")."""
    if cfg.w not in A2_WORLD_SIZES[comm_alg]:
        raise ValueError(f"ep_world_size: must be one of {A2_WORLD_SIZES[comm_alg]} on {SOC_A2} with comm_alg "
                         f"{comm_alg!r} (got {cfg.w})")
    if cfg.r or cfg.s or cfg.z or cfg.c or cfg.q:
        raise ValueError(f"shared and zero/copy/const experts are not supported on {SOC_A2} (got R={cfg.r}, "
                         f"S={cfg.s}, Z={cfg.z}, C={cfg.c}, Q={cfg.q})")
    e_max = 512 if comm_alg == "hierarchy" else 1024
    if not 0 < cfg.e <= e_max:
        raise ValueError(f"moe_expert_num: must be in [1, {e_max}] with comm_alg {comm_alg!r} on {SOC_A2} "
                         f"(got E={cfg.e}, W={cfg.w})")
    h_max = 10240 if comm_alg == "hierarchy" else 7168
    if max(cfg.bss) > 256 or cfg.h % 32 or not 32 <= cfg.h <= h_max:
        raise ValueError(f"x: BS <= 256 and H a multiple of 32 in [32, {h_max}] on {SOC_A2} "
                         f"(got BS={max(cfg.bss)}, H={cfg.h})")


# ---------------------------------------------------------------------------------------------------
# Derived sizes
# ---------------------------------------------------------------------------------------------------


def normalized_shared_expert_num(shared_expert_num: int, shared_expert_rank_num: int) -> int:
    """Return S after the tiling's normalisation: ``R == 0 and S == 1`` → ``S = 0``.

    Raises ValueError for (S, R) pairs the placement cannot interpret (the attribute rules:
    exactly one of S, R zero after normalisation, or ``R % S != 0``, or S outside [0, 4]).
    """
    s, r = int(shared_expert_num), int(shared_expert_rank_num)
    if r == 0 and s == 1:
        s = 0
    if not 0 <= s <= 4:
        raise ValueError(f"shared_expert_num: must be in [0, 4] (got {s})")
    if r < 0:
        raise ValueError(f"shared_expert_rank_num: must be >= 0 (got {r})")
    if (s == 0) != (r == 0):
        raise ValueError(
            "shared_expert_num/shared_expert_rank_num: exactly one of them is 0 after normalising "
            f"(S={s}, R={r})"
        )
    if s and r % s:
        raise ValueError(
            f"shared_expert_rank_num: must be divisible by shared_expert_num (got {r} % {s})"
        )
    return s


def moe_local_num(ep_world_size: int, moe_expert_num: int, shared_expert_rank_num: int) -> int:
    w, e, r = int(ep_world_size), int(moe_expert_num), int(shared_expert_rank_num)
    if w < 1:
        raise ValueError(f"ep_world_size: must be >= 1 (got {w})")
    if not 0 <= r < w:
        raise ValueError(f"shared_expert_rank_num: must be in [0, ep_world_size) (got {r}, W={w})")
    if e <= 0:
        raise ValueError(f"moe_expert_num: must be > 0 (got {e})")
    if e % (w - r):
        raise ValueError(
            "moe_expert_num: must be divisible by ep_world_size - shared_expert_rank_num "
            f"(got {e} % {w - r})"
        )
    return e // (w - r)


def local_expert_num(
    ep_world_size: int,
    rank: int,
    moe_expert_num: int,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
) -> int:
    """localExpertNum: 1 on a shared rank (``rank < R``), ``L = E / (W - R)`` on a MoE rank."""
    normalized_shared_expert_num(shared_expert_num, shared_expert_rank_num)
    n_local = moe_local_num(ep_world_size, moe_expert_num, shared_expert_rank_num)
    if not 0 <= rank < ep_world_size:
        raise ValueError(f"rank: must be in [0, ep_world_size) (got {rank})")
    return 1 if rank < shared_expert_rank_num else n_local


def rows_capacity(
    ep_world_size: int,
    rank: int,
    moe_expert_num: int,
    shared_expert_num: int,
    shared_expert_rank_num: int,
    global_bs: int,
    bs: int,
    topk: int,
    elastic: bool = False,
) -> int:
    """A, the expand_x row capacity (docs/operators.md).

    * shared rank: ``A = maxBs * ceil(W / (R / S))``
    * MoE rank:    ``A = G * min(L, K)``
    * ``elastic`` (elastic_info present, 950): ``A = max`` of both (the shared one only when R > 0),
      with ``L := max(L, 1)``.

    with ``G = global_bs`` or ``bs * W`` when global_bs is 0, and ``maxBs = G / W``.
    """
    w = int(ep_world_size)
    s = normalized_shared_expert_num(shared_expert_num, shared_expert_rank_num)
    n_local = moe_local_num(w, moe_expert_num, shared_expert_rank_num)
    g = resolve_global_bs(global_bs, w, [bs])
    if not 0 <= rank < w:
        raise ValueError(f"rank: must be in [0, ep_world_size) (got {rank})")
    shared_a = (g // w) * (-(-w // (shared_expert_rank_num // s))) if s else 0
    if elastic:
        return max(shared_a, g * min(max(n_local, 1), int(topk)))
    if rank < shared_expert_rank_num:
        return shared_a
    return g * min(n_local, int(topk))


def resolve_global_bs(global_bs: int, w: int, bss: Sequence[int]) -> int:
    """G, global_bs resolved (BS * W when 0); validates the uneven-BS rule (docs/operators.md)."""
    g = int(global_bs)
    if g == 0:
        if len({int(b) for b in bss}) > 1:
            raise ValueError(
                "global_bs: BS differs across ranks, which needs global_bs = maxBs * W; "
                f"got global_bs=0 with BS={list(bss)}"
            )
        return int(bss[0]) * w
    if g < 0 or g % w:
        raise ValueError(f"global_bs: must be 0 or a multiple of ep_world_size (got {g} % {w})")
    for b in bss:
        if g < int(b) * w:
            raise ValueError(f"global_bs: must be >= BS * ep_world_size (got {g} < {b} * {w})")
    return g


# ---------------------------------------------------------------------------------------------------
# Per-rank inputs
# ---------------------------------------------------------------------------------------------------


@dataclass
class Cfg:
    w: int
    e: int
    r: int  # R
    s: int  # normalised S
    l: int  # L
    p: int  # R / S (0 when there are no shared ranks)
    z: int
    c: int
    q: int
    k: int
    h: int
    bss: list[int]
    g: int

    def dest_of_moe(self, e: np.ndarray) -> np.ndarray:
        return e // self.l + self.r

    def dest_of_shared(self, src: int, s: int) -> int:
        return (src % self.p) + s * self.p


def per_rank(name: str, value: Any, w: int) -> list[Any]:
    if value is None:
        return [None] * w
    if isinstance(value, np.ndarray):
        return [value] * w
    value = list(value)
    if len(value) != w:
        raise ValueError(f"{name}: expected one array per rank ({w}), got {len(value)}")
    result: list[Any] = value
    return result


def make_cfg(
    x_shapes: Sequence[tuple[int, ...]],
    expert_ids: Sequence[np.ndarray],
    *,
    moe_expert_num: int,
    shared_expert_num: int,
    shared_expert_rank_num: int,
    global_bs: int,
    comm_alg: str,
    zero_expert_num: int,
    copy_expert_num: int,
    const_expert_num: int,
    x_name: str,
    soc: str = SOC_A3,
) -> Cfg:
    w = len(x_shapes)
    if w < 1:
        raise ValueError(f"{x_name}: need at least one rank")
    if len(expert_ids) != w:
        raise ValueError(f"expert_ids: expected {w} arrays (one per rank), got {len(expert_ids)}")
    algs = COMM_ALGS_A2 if soc == SOC_A2 else COMM_ALGS
    if comm_alg not in algs:
        raise ValueError(f"comm_alg: must be one of {algs} on {soc} with a context (got {comm_alg!r})")
    s = normalized_shared_expert_num(shared_expert_num, shared_expert_rank_num)
    r = int(shared_expert_rank_num)
    l = moe_local_num(w, moe_expert_num, r)
    z, c, q = int(zero_expert_num), int(copy_expert_num), int(const_expert_num)
    if min(z, c, q) < 0:
        raise ValueError(f"zero/copy/const_expert_num: must be >= 0 (got {z}, {c}, {q})")
    h = None
    k = None
    bss = []
    for rank, (shape, ids) in enumerate(zip(x_shapes, expert_ids)):
        if len(shape) != 2:
            raise ValueError(f"{x_name}[{rank}]: must be 2-D (got shape {tuple(shape)})")
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[0] != shape[0]:
            raise ValueError(
                f"expert_ids[{rank}]: must be (BS, K) with BS == {x_name}.shape[0] "
                f"(got {ids.shape} vs {tuple(shape)})"
            )
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"expert_ids[{rank}]: must be an integer array (got {ids.dtype})")
        if h is None:
            h, k = int(shape[1]), int(ids.shape[1])
        if shape[1] != h:
            raise ValueError(f"{x_name}[{rank}]: H differs across ranks ({shape[1]} vs {h})")
        if ids.shape[1] != k:
            raise ValueError(f"expert_ids[{rank}]: K differs across ranks ({ids.shape[1]} vs {k})")
        if shape[0] < 1:
            raise ValueError(f"{x_name}[{rank}]: BS must be >= 1")
        bss.append(int(shape[0]))
    assert h is not None and k is not None
    if k < 1 or k > moe_expert_num + z + c + q:
        raise ValueError(f"expert_ids: K must be in [1, E+Z+C+Q] (got K={k})")
    g = resolve_global_bs(global_bs, w, bss)
    cfg = Cfg(w=w, e=int(moe_expert_num), r=r, s=s, l=l, p=(r // s if s else 0), z=z, c=c, q=q,
              k=k, h=h, bss=bss, g=g)
    if soc == SOC_A2:
        check_a2(cfg, comm_alg)
    return cfg


def masks(cfg: Cfg, x_active_mask: list[np.ndarray] | None,
          soc: str = SOC_A3) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rank: (token_valid (BS,), pair_valid (BS,K)) (docs/operators.md)."""
    out: list[tuple[Any, Any]] = []
    if isinstance(x_active_mask, np.ndarray):
        raise ValueError("x_active_mask: expected a list with one mask per rank")
    masks = per_rank("x_active_mask", x_active_mask, cfg.w)
    for rank, m in enumerate(masks):
        bs, k = cfg.bss[rank], cfg.k
        if m is None:
            out.append((np.ones(bs, bool), np.ones((bs, k), bool)))
            continue
        m = np.asarray(m)
        if soc == SOC_A2 and m.ndim == 2:
            raise ValueError(f"x_active_mask[{rank}]: must be 1-D (BS,) on {SOC_A2} (got {m.shape})")
        if m.dtype != np.bool_:
            raise ValueError(f"x_active_mask[{rank}]: must be bool (got {m.dtype})")
        if cfg.g > bs * cfg.w:
            raise ValueError(
                f"x_active_mask[{rank}]: not allowed when global_bs > BS * ep_world_size "
                f"(got {cfg.g} > {bs} * {cfg.w})"
            )
        if m.ndim == 1 and m.shape == (bs,):
            n = int(np.count_nonzero(m))  # only the count matters (docs/operators.md, "1-D mask")
            tok = np.arange(bs) < n
            out.append((tok, np.repeat(tok[:, None], k, axis=1)))
        elif m.ndim == 2 and m.shape == (bs, k):
            out.append((m.any(axis=1), m.copy()))
        else:
            raise ValueError(f"x_active_mask[{rank}]: must be (BS,) or (BS, K) = ({bs}, {k}) (got {m.shape})")
    return out


def check_ids(cfg: Cfg, rank: int, ids: np.ndarray, pair_valid: np.ndarray) -> None:
    lim = cfg.e + cfg.z + cfg.c + cfg.q
    bad = pair_valid & ((ids < 0) | (ids >= lim))
    if bad.any():
        t, k = map(int, np.argwhere(bad)[0])
        raise ValueError(
            f"expert_ids[{rank}][{t},{k}]: must be in [0, E+Z+C+Q) = [0, {lim}) (got {int(ids[t, k])})"
        )


def row_dtype(name: str, a: np.ndarray, soc: str = "Ascend910_93") -> np.dtype:
    dt = np.asarray(a).dtype
    if dt not in ROW_DTYPES:
        raise ValueError(f"{name}: dtype must be float16 or bfloat16 on {soc} (got {dt})")
    return dt


def elastic_table(elastic_info: Any, w: int, r: int, e: int, soc: str) -> tuple[bool, np.ndarray]:
    """(present, logical → physical table) from elastic_info (docs/operators.md; package docstring choice 10)."""
    ident = np.arange(w, dtype=np.int64)
    if elastic_info is None:
        return False, ident
    if soc != SOC_950:
        raise ValueError(f"elastic_info: reserved on {soc}, must be None")
    per = [np.asarray(a) for a in per_rank("elastic_info", elastic_info, w)]
    info = per[0]
    for rank, a in enumerate(per):
        if a.dtype != np.int32 or a.shape != (4 + 2 * w,):
            raise ValueError(f"elastic_info[{rank}]: must be int32 of shape (4 + 2W,) = ({4 + 2 * w},) "
                             f"(got {a.dtype} {a.shape})")
        if not np.array_equal(a, info):
            raise ValueError(f"elastic_info[{rank}]: differs from rank 0's")
    if info[0] == 0:
        return True, ident
    if (int(info[1]), int(info[2]), int(info[3])) != (w, r, e):
        raise ValueError(
            "elastic_info: [1], [2], [3] must equal ep_world_size, shared_expert_rank_num, moe_expert_num "
            f"(got {int(info[1])}, {int(info[2])}, {int(info[3])} vs {w}, {r}, {e}; the golden models a "
            "re-mapping of the same world)")
    table = info[4 + w: 4 + 2 * w].astype(np.int64)
    if not np.array_equal(np.sort(table), ident):
        raise ValueError(f"elastic_info: the rank table [4+W:4+2W] must be a permutation of 0..W-1 (got {table.tolist()})")
    return True, table


__all__ = ["F32", "BF16", "FP16", "ROW_DTYPES", "COMM_ALGS", "COMM_ALGS_A2", "SOC_A3", "SOC_950", "SOC_A2", "SOCS",
           "SOC_EXAMPLES", "soc_family", "A2_WORLD_SIZES", "check_soc", "check_a2",
           "normalized_shared_expert_num", "moe_local_num", "local_expert_num", "rows_capacity",
           "resolve_global_bs", "Cfg", "per_rank", "make_cfg", "masks", "check_ids", "row_dtype", "elastic_table"]
