"""The README's features tables, Atlas A2 column: every cell is the one this file expects, and every
expected cell's claim holds on the mock (phase 1 of rank 0 in a 16-rank world, with and without the
Python pre-checks; the outputs themselves are compared with the golden in tests/ops/test_a2_rounds.py). A
cell edited in the README without its check here, or a row added, fails the table test."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers.a2_calls import ACCEPTED, BS, E, H, K, W, World2, base_attrs, combine, dispatch, refused, tokens
from helpers.moe_cases import A2, on_profile

README = Path(__file__).resolve().parents[1] / "README.md"
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def a2_cells() -> dict[str, str]:
    """Row key → A2 cell, for every table of the README's Features section with an A2 column. The
    key is the row's first cell, with its third cell after " / " when the first repeats in its table."""
    section = README.read_text(encoding="utf-8").split("## Features", 1)[1].split("\n## ", 1)[0]
    cells: dict[str, str] = {}
    for table in re.findall(r"((?:^\|.*\|\n)+)", section, flags=re.M):
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()]
        header, body = rows[0], rows[2:]
        if "A2" not in header:
            continue
        col = header.index("A2")
        firsts = [r[0] for r in body]
        for r in body:
            key = r[0] if firsts.count(r[0]) == 1 else f"{r[0]} / {r[2]}"
            cells[key] = r[col]
    return cells


@pytest.fixture(scope="module")
def world(acl):
    w = World2(ranks=W)
    yield w
    w.close()


Probe = Callable[[World2], None]
CHECKS: dict[str, tuple[str, Probe]] = {}


def claim(key: str, cell: str) -> Callable[[Probe], Probe]:
    def register(probe: Probe) -> Probe:
        CHECKS[key] = (cell, probe)
        return probe
    return register


# ---- dispatch quant_mode ---------------------------------------------------------------------------------
@claim("0 copy", "✓")
def _copy(world: World2) -> None:
    assert dispatch(world, quant_mode=0) == ACCEPTED


@claim("0 low-precision input", "✗")
def _lowp(world: World2) -> None:
    refused(dispatch(world, dtype=FP8, scales=np.ones((BS, 1), np.float32)), "x: dtype must be")
    refused(dispatch(world, dtype=FP8, scales=np.ones((BS, 1), np.float32)), "on Ascend910B")


@claim("1 static", "✗")
def _static(world: World2) -> None:
    refused(dispatch(world, quant_mode=1, scales=np.ones(1, np.float32)), "quant_mode: must be 0 or 2 on Ascend910B")


@claim("2 dynamic per token / int8", '✓ (smooth scales not with `"hierarchy"`)')
def _dynamic(world: World2) -> None:
    smooth = np.ones((E, H), np.float32)
    assert dispatch(world, quant_mode=2) == ACCEPTED
    assert dispatch(world, quant_mode=2, comm_alg="fullmesh", scales=smooth) == ACCEPTED
    assert dispatch(world, quant_mode=2, comm_alg="hierarchy") == ACCEPTED
    refused(dispatch(world, quant_mode=2, comm_alg="hierarchy", scales=smooth), 'scales: must be NULL with comm_alg '
                                                                                '"hierarchy" on Ascend910B')


@claim("2 dynamic per token / fp8 e4m3fn / e5m2", "✗")
def _dynamic_fp8(world: World2) -> None:
    refused(dispatch(world, quant_mode=2, y_dtype=FP8), "expand_x: dtype must be ACL_INT8 with quant_mode 2")


def _modes_refused(mode: int) -> Probe:
    def probe(world: World2) -> None:
        refused(dispatch(world, quant_mode=mode), f"quant_mode: must be 0 or 2 on Ascend910B (got {mode})")
    return probe


claim("3 per group of 128", "✗")(_modes_refused(3))
claim("4 MX, block 32", "✗")(_modes_refused(4))
claim("5 MX clip", "✗")(_modes_refused(5))


# ---- combine comm_quant_mode -----------------------------------------------------------------------------
@claim("0", "✓")
def _cq0(world: World2) -> None:
    for alg in ("", "fullmesh", "hierarchy"):
        assert combine(world, comm_alg=alg) == ACCEPTED


@claim("2", 'with `"hierarchy"` only')
def _cq2(world: World2) -> None:
    assert combine(world, comm_alg="hierarchy", comm_quant_mode=2) == ACCEPTED
    for alg in ("", "fullmesh"):
        refused(combine(world, comm_alg=alg, comm_quant_mode=2), 'comm_quant_mode: 2 needs comm_alg "hierarchy"')


def _cq_refused(mode: int) -> Probe:
    def probe(world: World2) -> None:
        refused(combine(world, comm_alg="hierarchy", comm_quant_mode=mode),
                f"comm_quant_mode: must be 0 or 2 on Ascend910B (got {mode})")
    return probe


claim("3", "✗")(_cq_refused(3))
claim("4", "✗")(_cq_refused(4))


# ---- other -----------------------------------------------------------------------------------------------
@claim("`elastic_info` (4+2W,) int32: logical → physical rank table ([operators.md](docs/operators.md#soc-profiles))",
       "✗ (reserved)")
def _elastic(world: World2) -> None:
    refused(dispatch(world, elastic_info=np.zeros(4 + 2 * W, np.int32)), "elastic_info: is reserved on Ascend910B")
    refused(combine(world, elastic_info=np.zeros(4 + 2 * W, np.int32)), "elastic_info: is reserved on Ascend910B")


@claim("`performance_info` (W,) int64: µs waited per source rank, accumulated", "✓ (generations 4 and 5)")
def _perf(world: World2) -> None:
    assert dispatch(world, performance_info=np.zeros(W, np.int64)) == ACCEPTED
    assert combine(world, performance_info=np.zeros(W, np.int64)) == ACCEPTED


@claim("`ep_world_size`", '2 … 8, 16, 32, 64, 128, 192, 256, 384; 16 … 256 under CANN 8.3.RC1 '
       '(`"hierarchy"`: 16, 32, 64)')
def _world_sizes(world: World2) -> None:
    from aclnn_py import _mock

    assert dispatch(world) == ACCEPTED
    for w, alg in ((2, ""), (8, "fullmesh"), (32, ""), (64, "hierarchy"), (128, "fullmesh"), (384, "")):
        # the A2 rules accept it; only this 16-rank communicator does not match
        out = dispatch(world, ep_world_size=w, moe_expert_num=w, comm_alg=alg)
        refused(out, "ep_world_size: must equal the rank count of the context's communicator")
    for w in (9, 48, 512):
        refused(dispatch(world, ep_world_size=w, moe_expert_num=w), "ep_world_size: must be 2 ... 8, 16, 32")
    _mock.set_cann_version("8.3.RC1")
    try:
        refused(dispatch(world, ep_world_size=8, moe_expert_num=8), "ep_world_size: must be 16, 32, 64, 128 or 256")
    finally:
        _mock.set_cann_version("")
    refused(dispatch(world, ep_world_size=128, moe_expert_num=128, comm_alg="hierarchy"),
            'ep_world_size: must be 16, 32 or 64 with comm_alg "hierarchy"')


@claim("window check ([operators.md](docs/operators.md#the-window-check))", "A2 formula of the comm_alg")
def _window(world: World2) -> None:
    from aclnn_py import golden

    for alg in ("fullmesh", "hierarchy"):
        need = golden.a2_window_bytes_required(W, BS, H, E, K, comm_alg=alg)
        assert dispatch(world, comm_alg=alg, ccl_buffer_size=need) == ACCEPTED
        refused(dispatch(world, comm_alg=alg, ccl_buffer_size=need - 1), f'window too small for comm_alg "{alg}"')


@claim("comm_alg `\"\"`, `fullmesh_v1`, `fullmesh_v2` (v2: BS ≤ 256, K ≤ 12 on A3; BS ≤ 512 on 950)", '`""` only')
def _a3_algs(world: World2) -> None:
    assert dispatch(world, comm_alg="") == ACCEPTED
    for alg in ("fullmesh_v1", "fullmesh_v2"):
        refused(dispatch(world, comm_alg=alg), 'comm_alg: must be "", "fullmesh" or "hierarchy" on Ascend910B')


@claim('comm_alg `"fullmesh"`, `"hierarchy"`', "✓")
def _a2_algs(world: World2) -> None:
    for alg in ("fullmesh", "hierarchy"):
        assert dispatch(world, comm_alg=alg) == ACCEPTED
        assert combine(world, comm_alg=alg) == ACCEPTED


@claim("shared experts; zero / copy / const experts", "✗")
def _special(world: World2) -> None:
    refused(dispatch(world, shared_expert_num=1, shared_expert_rank_num=1), "shared experts are not supported")
    for name in ("zero_expert_num", "copy_expert_num", "const_expert_num"):
        refused(dispatch(world, **{name: 1}), f"{name}: must be 0 on Ascend910B")
        refused(combine(world, **{name: 1}), f"{name}: must be 0 on Ascend910B")


@claim("2-D (BS, K) `x_active_mask`", "✗")
def _mask(world: World2) -> None:
    assert dispatch(world, x_active_mask=np.ones(BS, bool)) == ACCEPTED
    refused(dispatch(world, x_active_mask=np.ones((BS, K), bool)), "x_active_mask: must be 1-D (BS,) on Ascend910B")


@claim("BS; H", '1 … 256; multiple of 32 up to 7168 (`"hierarchy"`: 10240)')
def _sizes(world: World2) -> None:
    assert dispatch(world, bs=256) == ACCEPTED
    refused(dispatch(world, bs=257), "x: dim 0 (BS) must be in [1, 256] on Ascend910B")
    assert dispatch(world, bs=1, h=7168) == ACCEPTED
    assert dispatch(world, bs=1, h=32) == ACCEPTED
    assert dispatch(world, bs=1, h=10240, comm_alg="hierarchy") == ACCEPTED
    for h, alg in ((7200, ""), (48, "fullmesh"), (10272, "hierarchy")):
        refused(dispatch(world, bs=1, h=h, comm_alg=alg), "x: dim 1 (H) must be a multiple of 32")


@claim("`moe_expert_num`", '1 … 1024 (`"hierarchy"`: 1 … 512), divisible by W')
def _experts(world: World2) -> None:
    assert dispatch(world, moe_expert_num=400) == ACCEPTED
    refused(dispatch(world, moe_expert_num=1040), "moe_expert_num: must be in [1, 1024]")
    assert dispatch(world, moe_expert_num=512, comm_alg="hierarchy") == ACCEPTED
    refused(dispatch(world, moe_expert_num=528, comm_alg="hierarchy"), "moe_expert_num: must be in [1, 512]")


@claim("`expert_scales` → `expand_scales`; ep_recv_counts entries", '✓; W·L (`"hierarchy"`: + 2·G·K·W/8)')
def _expert_scales(world: World2) -> None:
    from aclnn_py.ops import prepare_dispatch

    x, ids = tokens()
    for escales, alg, extra in ((None, "", 0), (np.ones((BS, K), np.float32), "fullmesh", 0),
                                (None, "hierarchy", 2 * BS * W * K * W // 8)):
        p = prepare_dispatch(world.ctx[0][0], x, ids, expert_scales=escales, **base_attrs(world, comm_alg=alg))
        try:
            o = p.result
            assert o.ep_recv_counts.shape == (W * (E // W) + extra,)
            assert o.expand_scales.shape == ((BS * W * min(E // W, K),) if escales is not None else (0,))
        finally:
            p.close()


def test_the_readme_a2_column_is_the_checked_one():
    cells = a2_cells()
    assert cells == {key: cell for key, (cell, _) in CHECKS.items()}


@on_profile(A2)
@pytest.mark.parametrize("key", sorted(CHECKS))
def test_a2_cell_holds_on_the_mock(world, profile, key):
    CHECKS[key][1](world)
