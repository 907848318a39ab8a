"""Tests of aclnn_py/golden.py, the numpy reference of MoeDistributeDispatchV5 / CombineV5 (A3).

Expected values of the hand-worked examples are derived from SPEC.md by reasoning (section numbers
cited next to each), never by calling the golden.  The property tests check facts that are exactly
provable about random configurations.

The golden is loaded from its directory as a package of its own (tests/helpers/standalone.py), so
these tests also prove it needs nothing of aclnn_py but casts.py.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from helpers.standalone import load_golden

golden = load_golden()

BF16 = ml_dtypes.bfloat16
F16 = np.float16
F32 = np.float32


# ----------------------------------------------------------------------------------------------------
# the package stands alone
# ----------------------------------------------------------------------------------------------------


def _child_modules(code: str) -> list[str]:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != "ACLNN_PY_BUILD_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([root, str(Path(root) / "tests")])
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\n"
                          "print(json.dumps(sorted(m for m in sys.modules if 'aclnn' in m)))"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=root)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_golden_package_imports_none_of_the_product():
    mods = _child_modules("import aclnn_py.golden as g\nassert g.ccl_buffer_size_mb(16, 8, 7168, 32, 8, 1, 1) == 6")
    own = [m for m in mods if not m.startswith("aclnn_py.golden")]
    for product in ("aclnn_py.ops", "aclnn_py.buffer", "aclnn_py.hccl", "aclnn_py.launch", "aclnn_py._aclnn",
                    "aclnn_py._mock"):
        assert not any(m == product or m.startswith(product + ".") for m in own), own
    # what the golden's own modules import (the package __init__ of aclnn_py may import more)
    import ast
    from pathlib import Path

    for f in (Path(__file__).resolve().parents[1] / "aclnn_py" / "golden").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 or node.module is None, (f.name, node.module)
                assert node.level == 1 or [a.name for a in node.names] == ["casts"], (f.name, node.module)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                for n in names:
                    assert n.split(".")[0] in ("numpy", "ml_dtypes", "math", "dataclasses", "typing",
                                               "collections", "__future__", "importlib", "sys", "pathlib"), (f.name, n)


def test_golden_loads_from_its_directory_alone():
    mods = _child_modules("from helpers.standalone import load_golden\ng = load_golden()\n"
                          "d = g.dispatch([__import__('numpy').ones((2, 1024), 'float16')] * 2,"
                          " [__import__('numpy').array([[0], [1]], 'int32')] * 2, moe_expert_num=2)\n"
                          "assert d[0].num_rows == 2")
    assert not [m for m in mods if m == "aclnn_py" or m.startswith("aclnn_py.")], mods


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------


def tagged_x(w, bs, h, dtype=F16):
    """x[r][t] = a row filled with 10*r + t (exact in fp16 and bf16), so rows are recognisable."""
    return [np.stack([np.full(h, 10 * r + t, dtype) for t in range(bs)]) for r in range(w)]


def triples(d):
    return [tuple(int(v) for v in d.assist_info_for_combine[3 * i: 3 * i + 3]) for i in range(d.num_rows)]


def identity_expert(rank, d):
    return d.expand_x


def table_expert(fn, dtype):
    """Expert whose output row i is fn(rank, src, t, k, h) (an array of length H), from the triple."""

    def expert(rank, d):
        h = d.expand_x.shape[1]
        out = np.zeros((d.num_rows, h), dtype)
        for i, (src, t, k) in enumerate(triples(d)):
            out[i] = np.asarray(fn(rank, src, t, k, h), dtype)
        return out

    return expert


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a.view(np.uint32)


# ----------------------------------------------------------------------------------------------------
# §2 derived sizes
# ----------------------------------------------------------------------------------------------------


def test_rows_capacity_and_local_expert_num():
    # MoE rank: A = G * min(L, K); W=16, E=32, R=0 → L=2; G = 8*16
    assert golden.rows_capacity(16, 3, 32, 1, 0, 0, 8, 8) == 128 * 2
    assert golden.rows_capacity(16, 3, 32, 1, 0, 0, 8, 1) == 128 * 1
    # uneven-BS style: G given explicitly
    assert golden.rows_capacity(4, 1, 8, 1, 0, 64, 3, 4) == 64 * 2
    # shared rank: A = maxBs * ceil(W / (R/S)); W=6, S=2, R=4 → P=2 → ceil(6/2)=3
    assert golden.rows_capacity(6, 0, 2, 2, 4, 0, 5, 1) == 5 * 3
    # W=7, S=1, R=2 → P=2 → ceil(7/2)=4
    assert golden.rows_capacity(7, 1, 10, 1, 2, 0, 3, 2) == 3 * 4
    # MoE rank of that setup: L = 10/5 = 2, G = 21
    assert golden.rows_capacity(7, 2, 10, 1, 2, 0, 3, 2) == 21 * 2
    assert golden.local_expert_num(7, 1, 10, 1, 2) == 1
    assert golden.local_expert_num(7, 2, 10, 1, 2) == 2
    assert golden.local_expert_num(4, 0, 8) == 2  # S=1, R=0 → no shared ranks


@pytest.mark.parametrize(
    "s,r,expected",
    [(1, 0, 0), (0, 0, 0), (1, 1, 1), (2, 2, 2), (1, 2, 1), (2, 4, 2)],
)
def test_normalise_shared_expert_num(s, r, expected):
    assert golden.normalized_shared_expert_num(s, r) == expected


@pytest.mark.parametrize("s,r", [(2, 0), (0, 1), (2, 3), (5, 5), (3, 0)])
def test_normalise_shared_expert_num_rejects(s, r):
    with pytest.raises(ValueError):
        golden.normalized_shared_expert_num(s, r)


# ----------------------------------------------------------------------------------------------------
# §4.1 / §4.4 placement and row order
# ----------------------------------------------------------------------------------------------------


def test_dispatch_row_order_two_local_experts():
    # W=2, E=4 → L=2; rank 0 holds experts 0 (j=0), 1 (j=1); rank 1 holds 2, 3.  (§4.1)
    w, bs, h = 2, 3, 4
    x = tagged_x(w, bs, h)
    ids = [np.array([[0, 3], [2, 1], [1, 0]], np.int32), np.array([[3, 2], [0, 1], [2, 3]], np.int32)]
    ws = [np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], F32), np.array([[1.1, 1.2], [1.3, 1.4], [1.5, 1.6]], F32)]
    for etn_type in (0, 1):
        d = golden.dispatch(x, ids, moe_expert_num=4, expert_scales=ws, expert_token_nums_type=etn_type)
        # rank 0: slot j*W+src: (e0,src0) = (0,0,0),(0,2,1); (e0,src1) = (1,1,0);
        #         (e1,src0) = (0,1,1),(0,2,0); (e1,src1) = (1,1,1)
        assert triples(d[0]) == [(0, 0, 0), (0, 2, 1), (1, 1, 0), (0, 1, 1), (0, 2, 0), (1, 1, 1)]
        assert d[0].ep_recv_counts.tolist() == [2, 3, 5, 6]
        assert d[0].ep_recv_counts.dtype == np.int32
        # rank 1: (e2,src0) = (0,1,0); (e2,src1) = (1,0,1),(1,2,0); (e3,src0) = (0,0,1); (e3,src1) = (1,0,0),(1,2,1)
        assert triples(d[1]) == [(0, 1, 0), (1, 0, 1), (1, 2, 0), (0, 0, 1), (1, 0, 0), (1, 2, 1)]
        assert d[1].ep_recv_counts.tolist() == [1, 3, 4, 6]
        for r in range(2):
            assert d[r].num_rows == 6 and d[r].local_expert_num == 2
            assert d[r].capacity == 6 * 2  # G * min(L, K)
            assert d[r].expert_token_nums.dtype == np.int64
            assert d[r].expert_token_nums.tolist() == ([3, 3] if etn_type == 1 else [3, 6])
            assert d[r].dynamic_scales is None
            assert d[r].expand_x.dtype == F16 and d[r].expand_x.shape == (6, h)
            for i, (src, t, kk) in enumerate(triples(d[r])):
                assert (d[r].expand_x[i] == 10 * src + t).all()
                assert d[r].expand_scales[i] == ws[src][t, kk]
            assert d[r].assist_info_for_combine.dtype == np.int32
            assert d[r].expand_scales.dtype == F32


def test_dispatch_expert_scales_absent_or_empty():
    x = tagged_x(2, 2, 4)
    ids = [np.array([[0], [1]], np.int32)] * 2
    for es in (None, [np.zeros((0,), F32)] * 2, [np.zeros((2, 0), F32)] * 2):
        d = golden.dispatch(x, ids, moe_expert_num=2, expert_scales=es)
        assert all(r.expand_scales is None for r in d)


# (S, R, W): explicit receiver tables for the shared ranks: rank → (source ranks, k_slot)   (§4.1, §4.4)
SHARED_CASES = [
    (1, 1, 3, {0: ([0, 1, 2], 1)}, 2 * 3),
    (2, 2, 4, {0: ([0, 1, 2, 3], 1), 1: ([0, 1, 2, 3], 2)}, 2 * 4),
    (1, 2, 4, {0: ([0, 2], 1), 1: ([1, 3], 1)}, 2 * 2),
    (2, 4, 6, {0: ([0, 2, 4], 1), 1: ([1, 3, 5], 1), 2: ([0, 2, 4], 2), 3: ([1, 3, 5], 2)}, 2 * 3),
]


@pytest.mark.parametrize("s,r,w,table,cap", SHARED_CASES)
def test_dispatch_shared_placement(s, r, w, table, cap):
    bs, h, e = 2, 4, 2  # K=1, L = 2 / (W-R) ... W-R == 2 in every case → L = 1
    assert w - r == 2
    x = tagged_x(w, bs, h)
    # token t of rank src goes to MoE expert (src + t) % 2, which lives on rank R + expert
    ids = [np.array([[(src + t) % 2] for t in range(bs)], np.int32) for src in range(w)]
    d = golden.dispatch(x, ids, moe_expert_num=e, shared_expert_num=s, shared_expert_rank_num=r)
    for rank, (srcs, kslot) in table.items():
        exp = [(src, t, kslot) for src in srcs for t in range(bs)]
        assert triples(d[rank]) == exp
        cnt = [bs if src in srcs else 0 for src in range(w)]
        assert d[rank].ep_recv_counts.tolist() == np.cumsum(cnt).tolist()
        assert d[rank].expert_token_nums.tolist() == [len(exp)]
        assert d[rank].local_expert_num == 1 and d[rank].capacity == cap
        assert d[rank].expand_scales is None
        for i, (src, t, _) in enumerate(exp):
            assert (d[rank].expand_x[i] == 10 * src + t).all()
    for ex in range(e):  # MoE ranks: one token of each source, t = (ex - src) % 2
        dr = d[r + ex]
        assert triples(dr) == [(src, (ex - src) % 2, 0) for src in range(w)]
        assert dr.ep_recv_counts.tolist() == list(range(1, w + 1))
        assert dr.capacity == 2 * w * 1
    # conservation: W*BS MoE pairs + W*BS*S shared copies
    assert sum(dd.num_rows for dd in d) == w * bs * (1 + s)


def test_dispatch_1d_mask_uses_only_the_count():
    # mask [T, F, T] on rank 0 → the first sum(mask) = 2 tokens (0 and 1) are valid (§0, §4.2)
    w, bs, h = 2, 3, 4
    x = tagged_x(w, bs, h)
    ids = [np.array([[0, 1], [1, 0], [0, 1]], np.int32)] * 2
    mask = [np.array([True, False, True]), np.array([False, False, False])]
    d = golden.dispatch(x, ids, moe_expert_num=2, x_active_mask=mask)
    # E=2, W=2 → L=1: expert 0 on rank 0, expert 1 on rank 1; rank 1 sends nothing
    assert triples(d[0]) == [(0, 0, 0), (0, 1, 1)]
    assert triples(d[1]) == [(0, 0, 1), (0, 1, 0)]
    assert d[0].ep_recv_counts.tolist() == [2, 2]
    assert d[1].ep_recv_counts.tolist() == [2, 2]


def test_dispatch_2d_mask_with_shared_rank():
    # W=3, S=1, R=1 → rank 0 is the shared rank, E=2 on ranks 1, 2 (L=1)
    w, bs, h, k = 3, 3, 4, 2
    x = tagged_x(w, bs, h)
    ids = [np.array([[0, 1], [1, 0], [0, 1]], np.int32)] * 3
    m = np.array([[True, False], [False, False], [False, True]])
    full = np.ones((bs, k), bool)
    d = golden.dispatch(x, ids, moe_expert_num=2, shared_expert_num=1, shared_expert_rank_num=1,
                        x_active_mask=[m, full, full])
    # rank 0 (shared): tokens with any true flag; from rank 0 only t=0 and t=2; original indices kept
    assert triples(d[0]) == [(0, 0, 2), (0, 2, 2), (1, 0, 2), (1, 1, 2), (1, 2, 2), (2, 0, 2), (2, 1, 2), (2, 2, 2)]
    assert d[0].ep_recv_counts.tolist() == [2, 5, 8]
    # rank 1 (expert 0): from rank 0 only (0,0,0); (1,0,... ) etc.
    assert triples(d[1]) == [(0, 0, 0), (1, 0, 0), (1, 1, 1), (1, 2, 0), (2, 0, 0), (2, 1, 1), (2, 2, 0)]
    assert d[1].ep_recv_counts.tolist() == [1, 4, 7]
    # rank 2 (expert 1): pair (0,2,1) is valid, (0,0,1) and (0,1,0) are masked
    assert triples(d[2]) == [(0, 2, 1), (1, 0, 1), (1, 1, 0), (1, 2, 1), (2, 0, 1), (2, 1, 0), (2, 2, 1)]


def test_dispatch_special_experts_never_sent():
    # E=2, Z=1 (id 2), C=1 (id 3), Q=1 (id 4)
    w, bs, h = 2, 2, 4
    x = tagged_x(w, bs, h)
    ids = [np.array([[2, 0, 3], [4, 1, 2]], np.int32), np.array([[3, 4, 2], [1, 3, 0]], np.int32)]
    d = golden.dispatch(x, ids, moe_expert_num=2, zero_expert_num=1, copy_expert_num=1, const_expert_num=1)
    assert triples(d[0]) == [(0, 0, 1), (1, 1, 2)]
    assert triples(d[1]) == [(0, 1, 1), (1, 1, 0)]
    assert sum(dd.num_rows for dd in d) == 4


def test_dispatch_uneven_bs_with_global_bs():
    h = 4
    x = [tagged_x(1, 3, h)[0], (tagged_x(2, 1, h)[1])]  # BS 3 on rank 0, 1 on rank 1 (values 10..)
    ids = [np.array([[0], [1], [0]], np.int32), np.array([[0]], np.int32)]
    d = golden.dispatch(x, ids, moe_expert_num=2, global_bs=6)
    assert triples(d[0]) == [(0, 0, 0), (0, 2, 0), (1, 0, 0)]
    assert triples(d[1]) == [(0, 1, 0)]
    assert d[0].ep_recv_counts.tolist() == [2, 3]
    assert d[0].capacity == 6 * 1 and d[1].capacity == 6
    assert (d[0].expand_x[2] == 10).all()
    with pytest.raises(ValueError, match="global_bs"):
        golden.dispatch(x, ids, moe_expert_num=2)  # unequal BS without global_bs (§0)
    with pytest.raises(ValueError, match="global_bs"):
        golden.dispatch(x, ids, moe_expert_num=2, global_bs=4)  # < BS*W on rank 0
    with pytest.raises(ValueError, match="x_active_mask"):
        golden.dispatch(x, ids, moe_expert_num=2, global_bs=6,
                        x_active_mask=[np.ones(3, bool), np.ones(1, bool)])
    # combine with the same uneven shapes
    _, c = golden.round_trip(x, ids, identity_expert, moe_expert_num=2, global_bs=6)
    assert (c[0].x_out == x[0]).all() and (c[1].x_out == x[1]).all()


def test_fullmesh_variants_identical():
    rng = np.random.default_rng(5)
    w, bs, h, k, e = 4, 5, 32, 3, 8
    x = [rng.standard_normal((bs, h)).astype(BF16) for _ in range(w)]
    ids = [np.stack([rng.choice(e, k, replace=False) for _ in range(bs)]).astype(np.int32) for _ in range(w)]
    ref = golden.dispatch(x, ids, moe_expert_num=e, quant_mode=2)
    for alg in ("fullmesh_v1", "fullmesh_v2"):
        got = golden.dispatch(x, ids, moe_expert_num=e, quant_mode=2, comm_alg=alg)
        for a, b in zip(ref, got):
            assert (a.expand_x == b.expand_x).all() and (bits(a.dynamic_scales) == bits(b.dynamic_scales)).all()
            assert (a.assist_info_for_combine == b.assist_info_for_combine).all()
            assert (a.ep_recv_counts == b.ep_recv_counts).all()
    with pytest.raises(ValueError, match="comm_alg"):
        golden.dispatch(x, ids, moe_expert_num=e, comm_alg="hierarchy")


# ----------------------------------------------------------------------------------------------------
# §4.6 quant mode 2
# ----------------------------------------------------------------------------------------------------


def test_quant2_values_and_scales():
    h = 4
    rows = np.array([
        [254, 5, 7, -5],     # m=254 → ds=127/254=0.5 → y=[127,2.5,3.5,-2.5] → [127,2,4,-2]; scale 1/0.5=2
        [1, -2, 0.5, 0],     # m=2 → ds=63.5 → y=[63.5,-127,31.75,0] → [64,-127,32,0]; scale 1/63.5
        [0, 0, 0, 0],        # all zero → scale 0.0, values 0 (§0)
        [254, 1, 3, -1],     # y=[127,0.5,1.5,-0.5] → [127,0,2,0]  (half to even)
    ], F16)
    x = [rows, rows]
    ids = [np.zeros((4, 1), np.int32)] * 2  # everything to expert 0 on rank 0 (E=2, L=1)
    d = golden.dispatch(x, ids, moe_expert_num=2, quant_mode=2)
    d0 = d[0]
    assert d0.expand_x.dtype == np.int8 and d0.dynamic_scales.dtype == F32
    exp_q = [[127, 2, 4, -2], [64, -127, 32, 0], [0, 0, 0, 0], [127, 0, 2, 0]]
    exp_s = [F32(2.0), F32(1.0) / F32(63.5), F32(0.0), F32(2.0)]
    for src in range(2):
        assert d0.expand_x[4 * src: 4 * src + 4].tolist() == exp_q
        assert bits(d0.dynamic_scales[4 * src: 4 * src + 4]).tolist() == bits(np.array(exp_s, F32)).tolist()
    assert d[1].num_rows == 0 and d[1].expand_x.shape == (0, h) and d[1].dynamic_scales.shape == (0,)


def test_quant2_smooth_scales_rows_and_sender():
    # W=2, S=1, R=1: rank 0 shared, rank 1 holds MoE expert 0 (E=1).  scales (E+S, H):
    # row 0 → shared expert 0, row e+S = 1 → MoE expert 0 (§4.6 step 2, §7).  The SENDER's scales apply.
    x = [np.array([[254, 5, 7, -5]], BF16), np.array([[254, 5, 7, -5]], BF16)]
    ids = [np.array([[0]], np.int32)] * 2
    sc0 = np.array([[2, 2, 2, 2], [0.5, 0.5, 0.5, 0.5]], F32)
    sc1 = np.array([[1, 1, 1, 1], [0.5, 1, 1, 1]], F32)
    d = golden.dispatch(x, ids, moe_expert_num=1, shared_expert_num=1, shared_expert_rank_num=1,
                        quant_mode=2, scales=[sc0, sc1])
    # shared rank 0: from rank 0: xf*2 = [508,10,14,-10] → ds=0.25 → [127,2.5,3.5,-2.5] → [127,2,4,-2], scale 4
    #                from rank 1: xf*1 → ds=0.5 → [127,2,4,-2], scale 2
    assert triples(d[0]) == [(0, 0, 1), (1, 0, 1)]
    assert d[0].expand_x.tolist() == [[127, 2, 4, -2], [127, 2, 4, -2]]
    assert d[0].dynamic_scales.tolist() == [4.0, 2.0]
    # MoE rank 1: from rank 0: xf*0.5 = [127,2.5,3.5,-2.5] → ds=1 → [127,2,4,-2], scale 1
    #             from rank 1: [127,5,7,-5] → ds=1 → [127,5,7,-5], scale 1
    assert d[1].expand_x.tolist() == [[127, 2, 4, -2], [127, 5, 7, -5]]
    assert d[1].dynamic_scales.tolist() == [1.0, 1.0]
    # one array for all ranks: row e + S with S normalised to 0 when R == 0 (E=2 → rows 0, 1)
    x2 = [np.array([[254, 5, 7, -5]], F16)] * 2
    ids2 = [np.array([[1]], np.int32)] * 2
    sc = np.array([[1, 1, 1, 1], [2, 2, 2, 2]], F32)
    d2 = golden.dispatch(x2, ids2, moe_expert_num=2, quant_mode=2, scales=sc)
    assert d2[1].dynamic_scales.tolist() == [4.0, 4.0]
    with pytest.raises(ValueError, match="scales"):
        golden.dispatch(x2, ids2, moe_expert_num=2, quant_mode=0, scales=sc)
    with pytest.raises(ValueError, match="scales"):
        golden.dispatch(x2, ids2, moe_expert_num=2, quant_mode=2, scales=np.ones((3, 4), F32))


def test_quant2_random_properties():
    rng = np.random.default_rng(11)
    xf = (rng.standard_normal((64, 40)) * 10.0 ** rng.integers(-3, 3, (64, 1))).astype(F32)
    xf[3] = 0
    q, s = golden.quantize_per_token_int8(xf)
    nz = np.abs(xf).max(axis=1) > 0
    assert (np.abs(q[nz]).max(axis=1) == 127).all()
    assert (q[~nz] == 0).all() and (s[~nz] == 0).all()
    deq = q.astype(np.float64) * s[:, None]
    assert (np.abs(deq - xf) <= 0.5 * s[:, None] * (1 + 1e-5) + 1e-30).all()


# ----------------------------------------------------------------------------------------------------
# §6 combine
# ----------------------------------------------------------------------------------------------------


def test_combine_weighted_zero_copy_and_order():
    # W=2, E=2 (L=1), Z=1 (id 2), C=1 (id 3). H=4, fp16, x_out = cast(sum in k order)  (§6.2)
    x = [np.array([[1, 2, 3, 4], [0.5, 0.5, 0.5, 0.5]], F16), np.array([[8, 8, 8, 8], [1, 1, 1, 1]], F16)]
    ids = [np.array([[0, 2, 3], [3, 1, 2]], np.int32), np.array([[1, 3, 0], [2, 2 + 1, 1]], np.int32)]
    ws = [np.array([[0.5, 9.0, 2.0], [0.25, 4.0, 7.0]], F32), np.array([[1.0, 0.5, 0.125], [3.0, 1.0, 2.0]], F32)]
    # expert e multiplies its input by (e + 2)
    fn = table_expert(lambda rank, src, t, k, h: x[src][t].astype(F32) * (rank + 2), F16)
    _, c = golden.round_trip(x, ids, fn, moe_expert_num=2, zero_expert_num=1, copy_expert_num=1, expert_scales=ws)
    # rank0 t0: 0.5*(2x) + 0 + 2*x = 3x      t1: 0.25*x (copy) + 4*(3x) = 12.25x
    # rank1 t0: 1*(3x) + 0.5*x + 0.125*(2x) = 3.75x   t1: zero + 1*x (copy) + 2*(3x) = 7x
    assert c[0].x_out.tolist() == (np.array([[3, 6, 9, 12], [6.125] * 4])).tolist()
    assert c[1].x_out.tolist() == (np.array([[30] * 4, [7] * 4])).tolist()
    assert c[0].x_out.dtype == F16 and c[0].written.tolist() == [True, True]
    # unweighted: expert_scales None or empty
    for es in (None, [np.zeros((0,), F32)] * 2):
        _, c = golden.round_trip(x, ids, fn, moe_expert_num=2, zero_expert_num=1, copy_expert_num=1,
                                 expert_scales=es)
        # rank0 t0: 2x + x = 3x; t1: x + 3x = 4x; rank1 t0: 3x + x + 2x = 6x; t1: x + 3x = 4x
        assert c[0].x_out.tolist() == [[3, 6, 9, 12], [2] * 4]
        assert c[1].x_out.tolist() == [[48] * 4, [4] * 4]


def test_combine_shared_rows_unweighted_and_shared_expert_x():
    # W=3, S=1, R=1: shared expert on rank 0 returns 100; MoE expert e returns 1 + e.  Weights 0.5 on k.
    x = tagged_x(3, 2, 4)
    ids = [np.array([[0], [1]], np.int32)] * 3
    ws = [np.full((2, 1), 0.5, F32)] * 3
    fn = table_expert(lambda rank, src, t, k, h: np.full(h, 100.0 if rank == 0 else rank), F16)
    _, c = golden.round_trip(x, ids, fn, moe_expert_num=2, shared_expert_num=1, shared_expert_rank_num=1,
                             expert_scales=ws)
    # token with expert 0 (rank 1): 0.5*1 + 100 ; expert 1 (rank 2): 0.5*2 + 100
    for r in range(3):
        assert c[r].x_out.tolist() == [[100.5] * 4, [101.0] * 4]
    # R == 0: shared_expert_x added unweighted after the k terms (§6.2 step 3); 3-D accepted
    x = tagged_x(2, 2, 4)
    ids = [np.array([[0], [1]], np.int32)] * 2
    fn = table_expert(lambda rank, src, t, k, h: np.full(h, 1 + rank), F16)
    sx = [np.full((1, 2, 4), 64, F16), np.full((2, 4), 0.25, F16)]
    _, c = golden.round_trip(x, ids, fn, moe_expert_num=2, expert_scales=[np.full((2, 1), 2.0, F32)] * 2,
                             shared_expert_x=sx)
    assert c[0].x_out.tolist() == [[66] * 4, [68] * 4]
    assert c[1].x_out.tolist() == [[2.25] * 4, [4.25] * 4]
    with pytest.raises(ValueError, match="shared_expert_x"):
        golden.round_trip(tagged_x(3, 2, 4), [np.array([[0], [1]], np.int32)] * 3, identity_expert,
                          moe_expert_num=2, shared_expert_num=1, shared_expert_rank_num=1,
                          shared_expert_x=[np.zeros((2, 4), F16)] * 3)


def test_combine_masks_written_rows():
    # rank 0 tokens are rows of 1, 2, 3; rank 1 rows of 11, 12, 13; identity experts, unweighted K=2
    x = [np.stack([np.full(4, 10 * r + t + 1, F16) for t in range(3)]) for r in range(2)]
    ids = [np.array([[0, 1], [1, 0], [0, 1]], np.int32)] * 2
    m1 = [np.array([False, True, False]), np.array([True, True, True])]
    _, c = golden.round_trip(x, ids, identity_expert, moe_expert_num=2, x_active_mask=m1)
    # 1-D: the first sum(mask) = 1 tokens → token 0 only; x_out = 2x; other rows unwritten (zero here)
    assert c[0].written.tolist() == [True, False, False]
    assert c[0].x_out.tolist() == [[2] * 4, [0] * 4, [0] * 4]
    assert c[1].written.tolist() == [True, True, True]
    assert c[1].x_out.tolist() == [[22] * 4, [24] * 4, [26] * 4]
    m2 = [np.array([[True, False], [False, False], [True, True]]), np.ones((3, 2), bool)]
    _, c = golden.round_trip(x, ids, identity_expert, moe_expert_num=2, x_active_mask=m2)
    # 2-D: t0 only k0 → x; t1 not processed; t2 both → 2x
    assert c[0].written.tolist() == [True, False, True]
    assert c[0].x_out.tolist() == [[1] * 4, [0] * 4, [6] * 4]


def test_combine_missing_row_raises():
    x = tagged_x(2, 2, 4)
    ids = [np.array([[0], [1]], np.int32)] * 2
    d = golden.dispatch(x, ids, moe_expert_num=2, x_active_mask=[np.array([True, False])] * 2)
    with pytest.raises(ValueError, match="no row"):
        golden.combine([dd.expand_x for dd in d], ids, [dd.assist_info_for_combine for dd in d],
                       [dd.ep_recv_counts for dd in d], moe_expert_num=2)


def test_combine_const_expert():
    # E=2, Q=2 (ids 2, 3), W=2, K=1, bf16, unweighted.
    h = 4
    x = [np.array([[1, 1, 1, 1], [2, 4, 6, 8]], BF16), np.array([[1, 1, 1, 1], [1, 2, 1, 4]], BF16)]
    ids = [np.array([[2], [3]], np.int32), np.array([[3], [2]], np.int32)]
    # const 0: alpha1 = [2^24, 1, -2^24, 1] → sequential fp32 dot with ori=[1,1,1,1]:
    #   2^24 + 1 = 2^24 (tie → even), - 2^24 = 0, + 1 = 1 → a1 = 1 (float64 would give 2); alpha2 = 0 → a2 = 0
    #   softmax in float64: p1 = 1/(1+e^-1), p2 = e^-1/(1+e^-1), rounded to float32; const_v[0] = 0 → v = p1*ori
    # const 1: alpha1 = alpha2 = 0 → p1 = p2 = 0.5 → v = 0.5*ori + 0.5*const_v[1]
    a1 = np.array([[2.0 ** 24, 1, -(2.0 ** 24), 1], [0, 0, 0, 0]], BF16)
    a2 = np.zeros((2, h), BF16)
    cv = np.array([[0, 0, 0, 0], [10, 20, 30, 40]], BF16)
    _, c = golden.round_trip(x, ids, identity_expert, moe_expert_num=2, const_expert_num=2,
                             const_expert_alpha_1=a1, const_expert_alpha_2=a2, const_expert_v=cv)
    p1 = F32(1.0 / (1.0 + math.exp(-1.0)))
    assert bits(c[0].x_out[0]).tolist() == bits(np.full(h, p1, F32).astype(BF16)).tolist()
    assert c[0].x_out[1].tolist() == [6, 12, 18, 24]       # 0.5*[2,4,6,8] + 0.5*[10,20,30,40]
    assert c[1].x_out[0].tolist() == [5.5, 10.5, 15.5, 20.5]
    # rank1 t1, const 0 with ori=[1,2,1,4]: a1 = fp32 seq: 2^24 + 2 = 16777218, -2^24 = 2, +4 = 6; a2 = 0
    p1b = F32(1.0 / (1.0 + math.exp(-6.0)))
    exp_row = (p1b * np.array([1, 2, 1, 4], F32)).astype(BF16)
    assert bits(c[1].x_out[1]).tolist() == bits(exp_row).tolist()
    # extreme: a2 - a1 = -200 → p2 underflows to 0 in float32, p1 = 1 → v = ori (const_v ignored)
    a2b = np.array([[-50, -50, -50, -50], [0, 0, 0, 0]], BF16)
    a1b = np.zeros((2, h), BF16)
    x1 = [np.array([[1, 1, 1, 1], [1, 1, 1, 1]], BF16)] * 2
    _, c = golden.round_trip(x1, [np.array([[2], [2]], np.int32)] * 2, identity_expert, moe_expert_num=2,
                             const_expert_num=2, const_expert_alpha_1=a1b, const_expert_alpha_2=a2b,
                             const_expert_v=np.full((2, h), 1000, BF16),
                             expert_scales=[np.full((2, 1), 0.5, F32)] * 2)
    assert c[0].x_out.tolist() == [[0.5] * 4] * 2
    with pytest.raises(ValueError, match="const_expert_alpha_1"):
        golden.round_trip(x1, [np.array([[2], [2]], np.int32)] * 2, identity_expert, moe_expert_num=2,
                          const_expert_num=2)


def test_combine_round_half_to_even():
    # K=2 unweighted; k0 returns a, k1 returns b, x_out = cast(float32(a) + float32(b))   (§6.2 step 4)
    ids = [np.array([[0, 1]] * 4, np.int32)] * 2
    x = tagged_x(2, 4, 2)
    # bf16: 1 + 2^-8 is halfway between 1 and 1+2^-7 → 1 (even);  (1+2^-7) + 2^-8 → 1+2^-6;
    #       -(1 + 2^-8) → -1;  3 + 2^-7*... : 256 + 1 halfway between 256 and 258 → 256
    a_bf = [1.0, 1.0 + 2 ** -7, -1.0, 256.0]
    b_bf = [2.0 ** -8, 2.0 ** -8, -(2.0 ** -8), 1.0]
    exp_bf = [1.0, 1.0 + 2 ** -6, -1.0, 256.0]
    # fp16: 1 + 2^-11 → 1; (1+2^-10) + 2^-11 → 1 + 2^-9; 2048 + 1 → 2048; 2050 + 1 → 2052
    a_f16 = [1.0, 1.0 + 2 ** -10, 2048.0, 2050.0]
    b_f16 = [2.0 ** -11, 2.0 ** -11, 1.0, 1.0]
    exp_f16 = [1.0, 1.0 + 2 ** -9, 2048.0, 2052.0]
    for dt, a, b, exp in ((BF16, a_bf, b_bf, exp_bf), (F16, a_f16, b_f16, exp_f16)):
        fn = table_expert(lambda rank, src, t, k, h, a=a, b=b: np.full(h, (a if k == 0 else b)[t]), dt)
        xx = [xi.astype(dt) for xi in x]
        _, c = golden.round_trip(xx, ids, fn, moe_expert_num=2)
        for r in range(2):
            assert c[r].x_out[:, 0].astype(np.float64).tolist() == exp


def test_combine_acc_never_negative_zero():
    # acc starts at +0.0 (§6.2): -0.0 + -0.0 summed onto +0.0 gives +0.0
    ids = [np.array([[0, 1]], np.int32)] * 2
    x = tagged_x(2, 1, 2)
    fn = table_expert(lambda rank, src, t, k, h: np.full(h, -0.0), F16)
    _, c = golden.round_trip(x, ids, fn, moe_expert_num=2)
    assert bits(c[0].x_out).tolist() == [[0, 0]]


def test_comm_quant2_known_row():
    # blocks of 8 (§6.3).  1f/127f * 127 == 1.0 and * 254 == 2.0 in fp32, so those blocks have clean scales.
    c127 = F32(1.0) / F32(127.0)
    assert F32(127.0) * c127 == F32(1.0) and F32(254.0) * c127 == F32(2.0)
    blk0 = [127, 2.5, -3.5, 0.5, 1.5, -127, 64, 0]     # sc=1 → q = rint → [127,2,-4,0,2,-127,64,0]
    blk1 = [0] * 8                                     # all-zero block → 0 (§0)
    blk2 = [254, 5, 7, -5, 3, 1, 0, 100]               # sc=2 → [127,2.5,3.5,-2.5,1.5,.5,0,50] → ×2
    blk3 = [1, 0.5, 0.25, -1, 0, 0, 0, 0]              # sc = c127, transmitted fp16(c127)
    row = np.array(blk0 + blk1 + blk2 + blk3, F16)
    # block 3 by the §6.3 steps: q = rint(xf / sc) with the fp32 sc; deq = float32(q) * float32(fp16(sc))
    sct = F32(F16(c127))
    q3 = [np.rint(F32(v) / c127) for v in blk3]
    assert q3 == [127, 64, 32, -127, 0, 0, 0, 0]      # 0.5/c127 == 63.5 exactly → 64 (even)
    exp3 = [F16(F32(q) * sct) for q in q3]
    exp = [127, 2, -4, 0, 2, -127, 64, 0] + [0] * 8 + [254, 4, 8, -4, 4, 0, 0, 100] + exp3
    got = golden.comm_quant_int8_round_trip(row[None, :])
    assert got.dtype == F32 and got[0].tolist() == [float(v) for v in exp]
    # through combine: W=2, K=1, unweighted, expert returns the row; tail H=28 not a multiple of 8
    for h in (32, 28):
        x = [np.zeros((1, h), F16)] * 2
        ids = [np.array([[0]], np.int32)] * 2
        fn = table_expert(lambda rank, src, t, k, hh: row[:hh], F16)
        _, c = golden.round_trip(x, ids, fn, moe_expert_num=2, comm_quant_mode=2,
                                 expert_scales=[np.full((1, 1), 0.5, F32)] * 2)
        assert c[0].x_out[0].tolist() == [float(F16(F32(v) * F32(0.5))) for v in exp[:h]]
    # shared rows go through the same transport, weight 1
    x = [np.zeros((1, 32), F16)] * 3
    ids = [np.array([[0]], np.int32)] * 3
    fn = table_expert(lambda rank, src, t, k, hh: row if rank == 0 else np.zeros(hh), F16)
    _, c = golden.round_trip(x, ids, fn, moe_expert_num=2, shared_expert_num=1, shared_expert_rank_num=1,
                             comm_quant_mode=2)
    assert c[2].x_out[0].tolist() == [float(v) for v in exp]


def test_comm_quant2_bf16_random_error_bound():
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((16, 64)).astype(BF16)
    got = golden.comm_quant_int8_round_trip(rows)
    xf = rows.astype(np.float64).reshape(16, 8, 8)
    bm = np.abs(xf).max(axis=2, keepdims=True)
    err = np.abs(got.reshape(16, 8, 8) - xf)
    # half a quantisation step of bm/127 plus the bf16 roundings of the scale and of the result
    assert (err <= bm / 127 * 0.5 + bm * 2.0 ** -7).all()


# ----------------------------------------------------------------------------------------------------
# §9 buffer sizing
# ----------------------------------------------------------------------------------------------------


def test_ccl_buffer_size_worked_examples():
    assert golden.ccl_buffer_size_mb(16, 8, 7168, 32, 8, 1, 1, "fullmesh_v1") == 6
    assert golden.ccl_buffer_size_mb(16, 8, 7168, 32, 8, 0, 0, "") == 5
    assert golden.ccl_buffer_size_mb(16, 8, 7168, 32, 8, 0, 0, "fullmesh_v2") == 6
    # §9.3 left-hand side: example 1 gives min - 1 MiB = 10,715,136 - 1,048,576
    assert golden.window_bytes_required(16, 8, 7168, 30, 8, 1, 1, "fullmesh_v1") == 10_715_136 - (1 << 20)
    # S=1, R=0 is normalised to S=0: 2*(8*14848*16*2 + 8*14336*8) = 9,437,184
    assert golden.window_bytes_required(16, 8, 7168, 32, 8) == 9_437_184
    assert golden.window_bytes_required(16, 8, 7168, 32, 8, soc="Ascend950") == 9_437_184 + 16 * 1024


@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(world_size=1), "world_size"),
        (dict(world_size=769), "world_size"),
        (dict(hidden=1023), "hidden"),
        (dict(hidden=8193), "hidden"),
        (dict(num_max_dispatch_tokens_per_rank=0), "num_max_dispatch_tokens_per_rank"),
        (dict(num_max_dispatch_tokens_per_rank=513), "num_max_dispatch_tokens_per_rank"),
        (dict(num_moe_expert=0), "num_moe_expert"),
        (dict(num_moe_expert=1025), "num_moe_expert"),
        (dict(topk=0), "topk"),
        (dict(topk=17), "topk"),
        (dict(num_shared_expert=-1), "num_shared_expert"),
        (dict(num_shared_expert=5), "num_shared_expert"),
        (dict(num_shared_expert_ranks=16), "num_shared_expert_ranks"),
        (dict(num_moe_expert=15), "num_moe_expert"),  # L = 15 // 16 = 0
        (dict(world_size=3, num_moe_expert=1024, num_shared_expert_ranks=2), "num_moe_expert"),  # L*W=3072
        (dict(comm_alg="hierarchy"), "comm_alg"),
    ],
)
def test_ccl_buffer_size_range_checks(kw, name):
    args = dict(world_size=16, num_max_dispatch_tokens_per_rank=8, hidden=7168, num_moe_expert=32, topk=8)
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        golden.ccl_buffer_size_mb(**args)


def test_ccl_buffer_size_boundaries_accepted():
    base = dict(num_max_dispatch_tokens_per_rank=8, hidden=7168, topk=8)
    # L*W == 2048 exactly (W=2, R=1, E=1024 → L=1024); every range at its edges
    assert golden.ccl_buffer_size_mb(2, num_moe_expert=1024, num_shared_expert_ranks=1,
                                     **{k: v for k, v in base.items()}) > 0
    assert golden.ccl_buffer_size_mb(768, 512, 8192, 768, 16, 4, 0, "fullmesh_v2") > 0
    assert golden.ccl_buffer_size_mb(2, 1, 1024, 2, 1) == 1  # tiny: min < 2 MiB → align(ceil, 2)/2 = 1


# ----------------------------------------------------------------------------------------------------
# error handling
# ----------------------------------------------------------------------------------------------------


def test_rejects_uninterpretable_inputs():
    x = tagged_x(2, 2, 4)
    ids = [np.array([[0], [1]], np.int32)] * 2
    with pytest.raises(ValueError, match="moe_expert_num"):
        golden.dispatch(x, ids, moe_expert_num=3)
    with pytest.raises(ValueError, match="expert_ids"):
        golden.dispatch(x, [np.array([[0]], np.int32)] * 2, moe_expert_num=2)
    with pytest.raises(ValueError, match="expert_ids"):
        golden.dispatch(x, [np.array([[0], [5]], np.int32)] * 2, moe_expert_num=2)
    with pytest.raises(ValueError, match="quant_mode"):
        golden.dispatch(x, ids, moe_expert_num=2, quant_mode=1)
    with pytest.raises(ValueError, match="dtype"):
        golden.dispatch([a.astype(F32) for a in x], ids, moe_expert_num=2)
    with pytest.raises(ValueError, match="shared_expert"):
        golden.dispatch(x, ids, moe_expert_num=2, shared_expert_num=2)
    with pytest.raises(ValueError, match="ori_x"):
        golden.combine(x, ids, [np.zeros(0, np.int32)] * 2, [np.zeros(2, np.int32)] * 2, moe_expert_num=2,
                       copy_expert_num=1)
    with pytest.raises(ValueError, match="comm_quant_mode"):
        golden.round_trip(x, ids, identity_expert, moe_expert_num=2, comm_quant_mode=1)
    with pytest.raises(TypeError):
        golden.round_trip(x, ids, identity_expert, moe_expert_num=2, bogus=1)


# ----------------------------------------------------------------------------------------------------
# property tests over seeded random configurations
# ----------------------------------------------------------------------------------------------------


def _random_config(seed):
    rng = np.random.default_rng(seed)
    sr = [(1, 0), (0, 0), (1, 1), (2, 2), (1, 2), (2, 4), (1, 3)][rng.integers(7)]
    s, r = sr
    w = int(rng.integers(max(2, r + 1), r + 5))
    l_ = int(rng.integers(1, 4))
    e = l_ * (w - r)
    k = int(rng.choice([1, 2, 4, 8]))
    z, c = int(rng.integers(0, 3)), int(rng.integers(0, 3))
    while k > e + z + c:
        k //= 2
    dt = [F16, BF16][rng.integers(2)]
    h = int(rng.choice([8, 24, 40]))
    uneven = rng.random() < 0.25
    bss = [int(rng.integers(1, 7)) for _ in range(w)] if uneven else [int(rng.integers(1, 7))] * w
    global_bs = max(bss) * w if (uneven or rng.random() < 0.2) else 0
    x = [rng.standard_normal((b, h)).astype(dt) for b in bss]
    ids = [np.stack([rng.choice(e + z + c, k, replace=False) for _ in range(b)]).astype(np.int32) for b in bss]
    mask_kind = "none" if uneven or global_bs else ["none", "1d", "2d"][rng.integers(3)]
    if mask_kind == "1d":
        mask = [rng.random(b) < 0.7 for b in bss]
    elif mask_kind == "2d":
        mask = [rng.random((b, k)) < 0.7 for b in bss]
    else:
        mask = None
    weighted = bool(rng.integers(2))
    return dict(rng=rng, s=s, r=r, w=w, e=e, k=k, z=z, c=c, dt=dt, h=h, bss=bss, global_bs=global_bs,
                x=x, ids=ids, mask=mask, mask_kind=mask_kind, weighted=weighted)


def _valid(cfg, rank):
    b, k = cfg["bss"][rank], cfg["k"]
    if cfg["mask"] is None:
        return np.ones(b, bool), np.ones((b, k), bool)
    m = cfg["mask"][rank]
    if m.ndim == 1:
        tok = np.arange(b) < m.sum()
        return tok, np.repeat(tok[:, None], k, axis=1)
    return m.any(axis=1), m


@pytest.mark.parametrize("seed", range(60))
def test_property_round_trip_and_conservation(seed):
    cfg = _random_config(seed)
    s_norm = 0 if (cfg["r"] == 0) else cfg["s"]
    w, k, e, dt = cfg["w"], cfg["k"], cfg["e"], cfg["dt"]
    ws = [np.full((b, k), 1.0 / k, F32) for b in cfg["bss"]] if cfg["weighted"] else None
    alg = ["", "fullmesh_v1", "fullmesh_v2"][seed % 3]
    d, c = golden.round_trip(
        cfg["x"], cfg["ids"], identity_expert, moe_expert_num=e, shared_expert_num=cfg["s"],
        shared_expert_rank_num=cfg["r"], global_bs=cfg["global_bs"], x_active_mask=cfg["mask"],
        expert_scales=ws, zero_expert_num=cfg["z"], copy_expert_num=cfg["c"], comm_alg=alg,
        expert_token_nums_type=seed % 2,
    )
    moe_pairs = shared = 0
    l_ = e // (w - cfg["r"])
    for rank in range(w):
        tok, pair = _valid(cfg, rank)
        ids = cfg["ids"][rank]
        moe_pairs += int((pair & (ids < e)).sum())
        shared += int(tok.sum()) * s_norm
    # conservation (§4.4): the last prefix counts add up to every transmitted row
    assert sum(int(dd.ep_recv_counts[-1]) for dd in d) == moe_pairs + shared
    for rank, dd in enumerate(d):
        n = dd.num_rows
        assert dd.ep_recv_counts[-1] == n and n <= dd.capacity
        assert (np.diff(dd.ep_recv_counts) >= 0).all()
        etn = dd.expert_token_nums if seed % 2 == 1 else np.diff(dd.expert_token_nums, prepend=0)
        assert etn.sum() == n
        trip = triples(dd)
        cnt = np.diff(dd.ep_recv_counts, prepend=0)
        # every row: data equals the source token; ids match its slot (§4.4)
        row = 0
        for slot, cn in enumerate(cnt):
            prev = None
            for _ in range(cn):
                src, t, kk = trip[row]
                assert bits(dd.expand_x[row]).tolist() == bits(cfg["x"][src][t]).tolist()
                if rank < cfg["r"]:
                    assert slot == src and kk == k + rank // (cfg["r"] // cfg["s"])
                else:
                    j, s_ = divmod(slot, w)
                    assert s_ == src and cfg["ids"][src][t, kk] == (rank - cfg["r"]) * l_ + j
                    if ws is not None:
                        assert dd.expand_scales[row] == ws[src][t, kk]
                key = t * k + kk if rank >= cfg["r"] else t
                assert prev is None or key > prev
                prev = key
                row += 1
            if rank >= cfg["r"]:
                assert etn[slot // w] >= cn
    # round trip: acc = x * (n/K + S) or x * (n + S) exactly in fp32, n = used MoE/copy pairs (§6.2)
    for rank in range(w):
        tok, pair = _valid(cfg, rank)
        ids = cfg["ids"][rank]
        n = ((pair & ((ids < e) | (ids >= e + cfg["z"]))).sum(axis=1)).astype(np.float64)
        factor = (n / k if ws is not None else n) + s_norm
        # acc starts at +0.0, so a token with factor 0 gives +0.0 even where x < 0
        exp = (F32(0.0) + cfg["x"][rank].astype(F32) * factor.astype(F32)[:, None]).astype(dt)
        exp[~tok] = 0
        assert c[rank].written.tolist() == tok.tolist()
        assert bits(c[rank].x_out).tolist() == bits(exp).tolist()


def test_property_k1_weight1_identity_large_h():
    rng = np.random.default_rng(7)
    w, bs, h, e = 4, 6, 7168, 8
    for dt in (F16, BF16):
        x = [rng.standard_normal((bs, h)).astype(dt) for _ in range(w)]
        ids = [rng.integers(0, e, (bs, 1)).astype(np.int32) for _ in range(w)]
        _, c = golden.round_trip(x, ids, identity_expert, moe_expert_num=e,
                                 expert_scales=[np.ones((bs, 1), F32)] * w)
        for rank in range(w):
            assert bits(c[rank].x_out).tolist() == bits(x[rank]).tolist()


def _scalar_combine_reference(cfg, fn, ws, ori, a1, a2, cv, sx):
    """§6.2 written element by element with float32 scalars (no vectorisation), for cross-checking."""
    w, k, e, z, c, r, s_norm, dt = cfg["w"], cfg["k"], cfg["e"], cfg["z"], cfg["c"], cfg["r"], cfg["s_norm"], cfg["dt"]
    l_ = e // (w - r)
    p = r // s_norm if s_norm else 0
    outs = []
    for rank in range(w):
        tok, pair = _valid(cfg, rank)
        bs, h = cfg["x"][rank].shape
        out = np.zeros((bs, h), dt)
        for t in range(bs):
            if not tok[t]:
                continue
            acc = [F32(0.0)] * h
            for kk in range(k):
                if not pair[t, kk]:
                    continue
                eid = int(cfg["ids"][rank][t, kk])
                of = [F32(v) for v in ori[rank][t].astype(F32)]
                if eid < e:
                    row = np.asarray(fn(eid // l_ + r, rank, t, kk, h), dt).astype(F32)
                    v = [F32(q) for q in row]
                elif eid < e + z:
                    continue
                elif eid < e + z + c:
                    v = of
                else:
                    ci = eid - e - z - c
                    d1 = d2 = F32(0.0)
                    for hh in range(h):
                        d1 = F32(d1 + F32(F32(a1[ci, hh]) * of[hh]))
                        d2 = F32(d2 + F32(F32(a2[ci, hh]) * of[hh]))
                    m = max(float(d1), float(d2))
                    e1, e2 = math.exp(float(d1) - m), math.exp(float(d2) - m)
                    p1, p2 = F32(e1 / (e1 + e2)), F32(e2 / (e1 + e2))
                    v = [F32(F32(p1 * of[hh]) + F32(p2 * F32(cv[ci, hh]))) for hh in range(h)]
                if ws is not None:
                    wk = F32(ws[rank][t, kk])
                    v = [F32(q * wk) for q in v]
                acc = [F32(a + q) for a, q in zip(acc, v)]
            for s in range(s_norm):
                dest = rank % p + s * p
                row = np.asarray(fn(dest, rank, t, k + s, h), dt).astype(F32)
                acc = [F32(a + F32(q)) for a, q in zip(acc, row)]
            if sx is not None:
                acc = [F32(a + F32(q)) for a, q in zip(acc, sx[rank][t].astype(F32))]
            out[t] = np.array(acc, F32).astype(dt)
        outs.append(out)
    return outs


@pytest.mark.parametrize("seed", range(100, 124))
def test_property_combine_matches_scalar_reference(seed):
    """Random experts, weights, masks, zero/copy/const experts, shared ranks or shared_expert_x:
    the golden's vectorised combine equals a scalar float32 transcription of §6.2 bit for bit."""
    cfg = _random_config(seed)
    rng = cfg["rng"]
    cfg["s_norm"] = 0 if cfg["r"] == 0 else cfg["s"]
    q = int(rng.integers(1, 3))
    w, k, e, z, c, dt, h = cfg["w"], cfg["k"], cfg["e"], cfg["z"], cfg["c"], cfg["dt"], cfg["h"]
    # re-draw ids so const experts appear too
    cfg["ids"] = [np.stack([rng.choice(e + z + c + q, min(k, e + z + c + q), replace=False) for _ in range(b)])
                  .astype(np.int32) for b in cfg["bss"]]
    ws = [rng.standard_normal((b, k)).astype(F32) for b in cfg["bss"]] if cfg["weighted"] else None
    ori = [(xi.astype(F32) * F32(0.5)).astype(dt) for xi in cfg["x"]]
    a1 = (rng.standard_normal((q, h)) * 0.3).astype(dt)
    a2 = (rng.standard_normal((q, h)) * 0.3).astype(dt)
    cv = rng.standard_normal((q, h)).astype(dt)
    sx = [rng.standard_normal((b, h)).astype(dt) for b in cfg["bss"]] if cfg["r"] == 0 and seed % 2 else None
    salt = rng.standard_normal(h)

    def fn(rank, src, t, kk, hh):
        return (cfg["x"][src][t].astype(np.float64) * (1.0 + 0.37 * rank) + salt[:hh] * (kk + 1)).astype(dt)

    _, comb = golden.round_trip(
        cfg["x"], cfg["ids"], table_expert(fn, dt), moe_expert_num=e, shared_expert_num=cfg["s"],
        shared_expert_rank_num=cfg["r"], global_bs=cfg["global_bs"], x_active_mask=cfg["mask"],
        expert_scales=ws, zero_expert_num=z, copy_expert_num=c, const_expert_num=q, ori_x=ori,
        const_expert_alpha_1=a1, const_expert_alpha_2=a2, const_expert_v=cv, shared_expert_x=sx,
    )
    ref = _scalar_combine_reference(cfg, fn, ws, ori, a1, a2, cv, sx)
    for rank in range(w):
        assert bits(comb[rank].x_out).tolist() == bits(ref[rank]).tolist()


@pytest.mark.parametrize("dt", [F16, BF16])
def test_comm_quant2_matches_scalar_transcription(dt):
    rng = np.random.default_rng(21)
    rows = (rng.standard_normal((6, 20)) * 10.0 ** rng.integers(-4, 3, (6, 1))).astype(dt)
    rows[0, 8:16] = 0
    rows[1, 16:] = 0
    c127 = F32(1.0) / F32(127.0)
    exp = np.zeros(rows.shape, F32)
    for i in range(rows.shape[0]):
        for b in range(0, rows.shape[1], 8):
            xs = [F32(v) for v in rows[i, b:b + 8].astype(F32)]
            bm = max(abs(v) for v in xs + [F32(0)] * (8 - len(xs)))
            sc = F32(bm * c127)
            sct = F32(np.array(sc, F32).astype(dt))
            for j, v in enumerate(xs):
                if sc == 0:
                    exp[i, b + j] = 0
                    continue
                q = int(np.rint(F32(v / sc)))
                deq = F32(F32(F16(q)) * sct)
                exp[i, b + j] = F32(np.array(deq, F32).astype(dt))
    got = golden.comm_quant_int8_round_trip(rows)
    assert bits(got).tolist() == bits(exp).tolist()


def test_quant2_with_smooth_scales_matches_scalar_transcription():
    rng = np.random.default_rng(22)
    w, bs, h, e, k = 3, 5, 12, 4, 2  # S=1, R=1 → rank 0 shared, L = 2 on ranks 1, 2
    x = [rng.standard_normal((bs, h)).astype(BF16) for _ in range(w)]
    x[1][2] = 0  # an all-zero row
    ids = [np.stack([rng.choice(e, k, replace=False) for _ in range(bs)]).astype(np.int32) for _ in range(w)]
    sc = [rng.uniform(0.5, 2.0, (e + 1, h)).astype(F32) for _ in range(w)]
    d = golden.dispatch(x, ids, moe_expert_num=e, shared_expert_num=1, shared_expert_rank_num=1,
                        quant_mode=2, scales=sc)
    for rank in range(w):
        for i, (src, t, kk) in enumerate(triples(d[rank])):
            srow = 0 if kk >= k else int(ids[src][t, kk]) + 1  # row s, or e + S (§4.6 step 2)
            xf = [F32(F32(v) * F32(s)) for v, s in zip(x[src][t].astype(F32), sc[src][srow])]
            m = max(abs(v) for v in xf)
            if m == 0:
                exp_q, exp_s = [0] * h, F32(0.0)
            else:
                ds = F32(F32(127.0) / m)
                exp_q = [int(np.rint(F32(v * ds))) for v in xf]
                exp_s = F32(F32(1.0) / ds)
            assert d[rank].expand_x[i].tolist() == exp_q
            assert bits(d[rank].dynamic_scales[i]) == bits(exp_s)
