"""SoC profiles: what each Ascend product line supports for MoE dispatch/combine, and the one table
that maps the name ``aclrtGetSocName`` reports to its profile (used by the pre-checks and sizing).

Real SoC names carry product suffixes (the Atlas A3 line reports ``Ascend910_93…``, e.g.
``Ascend910_9391``; the Atlas A2 line ``Ascend910B…``, e.g. ``Ascend910B3``; the 950 line
``Ascend950…``), so profiles are chosen by family (aclnn_py.socs). An unknown name gets a warning and the A3
rules (docs/operators.md, "SoC profiles"; the A2 limits: "Atlas A2").
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from .. import socs


@dataclass(frozen=True)
class SocProfile:
    """The limits and features of one product line."""

    name: str                          # the family, as CANN's docs name it
    max_world_size: int                # ep_world_size upper bound
    window_bytes_per_rank: int         # extra window bytes per rank the kernel reserves (W * this)
    fullmesh_v2_max_bs: int            # BS limit with comm_alg "fullmesh_v2"
    fullmesh_v2_max_topk: int | None   # K limit with "fullmesh_v2" (None: the general limit)
    quant_modes: frozenset[int]        # dispatch quant_mode values
    comm_quant_modes: frozenset[int]   # combine comm_quant_mode values
    low_precision: bool                # fp8 / hifloat8 / fp4 inputs and outputs, MX scales
    elastic: bool                      # elastic_info and performance_info (reserved otherwise)
    atlas_a2: bool = False             # the Atlas A2 rules (A2_LIMITS, ops/prechecks_a2.py)

    def y_dtypes(self, quant_mode: int) -> tuple[str, ...]:
        """The expand_x element types dispatch's `quant_mode` can produce on this line, the default
        first: none for mode 0 (expand_x keeps x's type) or for a mode the line does not support;
        int8 everywhere, the low-precision types only where the line has them."""
        if quant_mode not in self.quant_modes:
            return ()
        return tuple(t for t in QUANT_MODE_Y_DTYPES.get(quant_mode, ()) if t == "int8" or self.low_precision)


@dataclass(frozen=True)
class A2Limits:
    """What CANN documents for Atlas A2 (aclnnMoeDistributeDispatchV2.md / V3.md, the Combine
    counterparts), in the units of docs/operators.md."""

    #: ep_world_size with "" / "fullmesh" under the newest rules (ops.releases has each release's)
    world_sizes: frozenset[int] = frozenset({2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 192, 256, 384})
    hierarchy_world_sizes: frozenset[int] = frozenset({16, 32, 64})
    comm_algs: tuple[str, ...] = ("", "fullmesh", "hierarchy")
    #: moe_expert_num bound with "hierarchy" (ops.releases has each release's "fullmesh" bounds)
    max_experts: int = 512
    max_bs: int = 256
    h_align: int = 32
    max_h_fullmesh: int = 7168
    max_h_hierarchy: int = 10 * 1024
    server_ranks: int = 8                  # serverNum = W / 8
    fullmesh_reserve: int = 2 << 20        # the "+ 2MB" of the fullmesh window formula
    hierarchy_reserve: int = 104 << 20     # the "+ 4MB + 100MB" of the hierarchy one


A2_LIMITS = A2Limits()


#: Per dispatch quant mode, the expand_x element types it can write (the first is its default), by
#: their DataType names in lower case (docs/operators.md, "Quantisation in dispatch").
QUANT_MODE_Y_DTYPES: Mapping[int, tuple[str, ...]] = {
    0: (),
    1: ("int8", "hifloat8"),
    2: ("int8", "float8_e4m3fn", "float8_e5m2"),
    3: ("float8_e4m3fn", "float8_e5m2"),
    4: ("float8_e4m3fn", "float8_e5m2", "float4_e2m1", "float4_e1m2"),
    5: ("float8_e4m3fn", "float8_e5m2"),
}

A3 = SocProfile("Ascend910_93", 768, 0, 256, 12, frozenset({0, 2}), frozenset({0, 2}), False, False)
A2 = SocProfile("Ascend910B", 256, 0, 256, None, frozenset({0, 2}), frozenset({0, 2}), False, False, atlas_a2=True)
ASCEND950 = SocProfile("Ascend950", 1024, 1024, 512, None, frozenset({0, 1, 2, 3, 4, 5}),
                       frozenset({0, 2, 3, 4}), True, True)

#: (family name, profile), in the order of the family table (aclnn_py.socs).
FAMILIES: tuple[tuple[str, SocProfile], ...] = tuple(
    (f.name, {p.name: p for p in (A3, A2, ASCEND950)}[f.name]) for f in socs.FAMILIES)
_BY_FAMILY: Mapping[str, SocProfile] = dict(FAMILIES)

_warned: set[str] = set()


def profile_of(soc_name: str) -> SocProfile:
    """The profile for a SoC name (any member of a family, aclnn_py.socs); an unknown name warns once
    and gets the A3 rules."""
    fam = socs.family_of(soc_name)
    if fam is not None:
        return _BY_FAMILY[fam]
    if soc_name not in _warned:
        _warned.add(soc_name)
        warnings.warn(f"SoC {soc_name!r} is not a known MoE dispatch/combine profile "
                      f"({socs.accepted()}); applying the {A3.name} rules",
                      RuntimeWarning, stacklevel=3)
    return A3
