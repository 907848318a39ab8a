"""Running configurations of tests/helpers/moe_cases.py on the mock (many per world, threads or
processes) and comparing every rank with aclnn_py.golden, bit for bit (const-expert rows within 1
ulp): dispatch outputs, the unwritten regions, performance_info, and combine's x_out."""

from __future__ import annotations

from typing import Any

import numpy as np

from .moe_cases import A2, A3, A950, DTYPES, F32, NP_FP8, Case, Inputs, datatype, make_inputs, roles

POISON = 0xA5
_VIEWABLE = {"FLOAT16", "BF16", "INT8", "FLOAT", "INT32"}   # DataType names numpy_view keeps


# ---------------------------------------------------------------------------------------------------
# golden
# ---------------------------------------------------------------------------------------------------

def golden_dispatch(c: Case, inp: Inputs) -> Any:
    from aclnn_py import golden

    kw: dict[str, Any] = {}
    if c.soc == A950:
        x_dtype = c.xfmt if c.xfmt is not None and c.xfmt not in NP_FP8 else None
        kw = dict(y_dtype=c.yfmt, x_dtype=x_dtype, elastic_info=inp.elastic, soc=A950)
    elif c.soc == A2:
        kw = dict(soc=A2)
    return golden.dispatch(inp.x, inp.ids, scales=inp.scales, x_active_mask=inp.mask, expert_scales=inp.escales,
                           quant_mode=c.quant, expert_token_nums_type=c.ent_type, **kw, **c.kwargs())


def golden_combine(c: Case, inp: Inputs, disp: Any, ys: list[np.ndarray]) -> Any:
    from aclnn_py import golden

    kw: dict[str, Any] = dict(elastic_info=inp.elastic, soc=A950) if c.soc == A950 else {}
    if c.soc == A2:
        kw = dict(soc=A2)
    return golden.combine(ys, inp.ids, [d.assist_info_for_combine for d in disp], [d.ep_recv_counts for d in disp],
                          expert_scales=inp.weights, x_active_mask=inp.mask, shared_expert_x=inp.shared_x,
                          ori_x=inp.ori_x if (c.C or c.Q) else None, const_expert_alpha_1=inp.alpha1,
                          const_expert_alpha_2=inp.alpha2, const_expert_v=inp.const_v,
                          comm_quant_mode=c.comm_quant, **kw, **c.kwargs())


def expert_fn(c: Case, expand_x: np.ndarray, dynamic_scales: np.ndarray | None) -> np.ndarray:
    """A deterministic "expert", scaling each row by a row-dependent factor and casting it to the
    row dtype. A3 and A2: int8 rows dequantised with their scales (quant 2). 950: 16-bit rows as values,
    every other format as its raw codes (one per element)."""
    dt = DTYPES[c.dtype]
    n = expand_x.shape[0]
    raw = np.ascontiguousarray(expand_x)
    if c.soc in (A3, A2):
        xf = raw.astype(F32) * dynamic_scales.astype(F32)[:, None] if c.quant == 2 else raw.astype(F32)
    elif raw.dtype in (np.dtype(np.float16), DTYPES["bf16"]):
        xf = raw.astype(F32)
    else:
        codes = raw.view(np.uint8)
        if codes.shape[1] * 2 == c.H:       # packed fp4
            from aclnn_py.golden.casts import unpack_fp4

            codes = unpack_fp4(codes)
        xf = (codes.astype(F32) - F32(100)) / F32(16)
    f = (1.0 + (np.arange(n) % 7).astype(F32) / 8).astype(F32)[:, None]
    return (xf * f).astype(dt)


def golden_expert_outputs(c: Case, g: Any) -> list[np.ndarray]:
    return [expert_fn(c, d.expand_x[:d.num_rows], d.dynamic_scales if c.quant == 2 else None) for d in g]


# ---------------------------------------------------------------------------------------------------
# mock, one rank
# ---------------------------------------------------------------------------------------------------

def _poisoned(a: np.ndarray) -> bool:
    return bool(np.all(np.ascontiguousarray(a).view(np.uint8) == POISON))


def _host(t: Any) -> np.ndarray:
    """The tensor's bytes on the host: a zero-copy view for plain numpy types, else a copy
    (numpy_view cannot keep ml_dtypes fp8 / e8m0 element types)."""
    return t.numpy_view() if t.dtype.name in _VIEWABLE else t.numpy()


def _written(t: Any) -> tuple[int, int] | None:
    """The bytes of `t`'s block the mock recorded as written, relative to `t`'s address ((0, 0): none),
    or None when the block does not track its poison (the fill was off)."""
    from aclnn_py import _mock

    w = _mock.written_extent(t.ptr)
    if w is None or not w["poison_outside"]:
        return None
    if w["lo"] >= w["hi"]:
        return (0, 0)
    start = t.ptr - w["base"]
    return (w["lo"] - start, w["hi"] - start)


def _row_bytes(t: Any) -> int:
    return int(t.nbytes // t.shape[0]) if t.shape[0] else 0


def _x_tensor(v: Any, stream: Any) -> Any:
    """x as the mock takes it: an array, or (uint8 codes, DataType) for HiFloat8 / packed fp4."""
    from aclnn_py import Tensor

    if isinstance(v, tuple):
        return Tensor.from_numpy(v[0], stream=stream, dtype=v[1])
    return v


def mock_dispatch(c: Case, inp: Inputs, rank: int, ctx: Any, ccl: int, stream: Any, perf: Any = None) -> dict[str, Any]:
    """One dispatch on this rank. Returns the written parts of the outputs (copies) and, for the
    unwritten regions, whether they still hold the allocation's poison bytes."""
    from aclnn_py.ops import prepare_dispatch

    kw: dict[str, Any] = {}
    sc = inp.scales[rank] if isinstance(inp.scales, list) else inp.scales
    if c.soc == A950:
        if c.tok_e8m0:
            from aclnn_py import DataType, Tensor

            sc = Tensor.from_numpy(sc, stream=stream, dtype=DataType.FLOAT8_E8M0)
        kw = dict(y_dtype=datatype(c.yfmt) if c.yfmt else None, elastic_info=inp.elastic,
                  performance_info=perf if c.perf else None)
    elif c.soc == A2 and c.perf:
        kw = dict(performance_info=perf)
    x = _x_tensor(inp.x_mock[rank], stream) if inp.x_mock is not None else inp.x[rank]
    p = prepare_dispatch(ctx, x, inp.ids[rank], ep_world_size=c.W, ep_rank_id=rank, ccl_buffer_size=ccl, scales=sc,
                         x_active_mask=inp.mask[rank] if inp.mask else None,
                         expert_scales=inp.escales[rank] if inp.escales else None, quant_mode=c.quant,
                         expert_token_nums_type=c.ent_type, stream=stream, **kw, **c.kwargs())
    p.launch(stream)
    stream.synchronize()
    o = p.result
    _, slots, nloc = roles(c, inp)[rank]
    recv = o.ep_recv_counts.numpy()[:slots]
    n = int(recv[-1])
    # read before the host views below, whose release counts every byte they could reach as written
    written = {"expand_x": (_written(o.expand_x), _row_bytes(o.expand_x)),
               "dynamic_scales": (_written(o.dynamic_scales), _row_bytes(o.dynamic_scales)),
               "assist": (_written(o.assist_info_for_combine), 12),
               "expand_scales": (_written(o.expand_scales), 4)}
    ex, ds, ai, es = _host(o.expand_x), _host(o.dynamic_scales), _host(o.assist_info_for_combine), _host(o.expand_scales)
    return {"n": n, "recv": recv, "recv_len": o.ep_recv_counts.shape[0], "tok_nums": o.expert_token_nums.numpy()[:nloc], "expand_x": ex[:n].copy(),
            "dynamic_scales": ds[:n].copy(), "assist": ai[:3 * n].copy(), "expand_scales": es[:n].copy(),
            "poison": {"expand_x": _poisoned(ex[n:]), "dynamic_scales": _poisoned(ds[n:]),
                       "dynamic_scales_all": _poisoned(ds), "assist": _poisoned(ai[3 * n:]),
                       "expand_scales": _poisoned(es[n:]), "expand_scales_all": _poisoned(es)},
            "written": written, "perf": perf.numpy().copy() if c.perf else None, "_tensors": o}


def mock_combine(c: Case, inp: Inputs, rank: int, ctx: Any, ccl: int, stream: Any, d: dict[str, Any],
                 perf: Any = None) -> np.ndarray:
    from aclnn_py.ops import prepare_combine

    n = d["n"]
    t = d["_tensors"]
    y = np.zeros((t.expand_x.shape[0], c.H), DTYPES[c.dtype])
    y[:n] = expert_fn(c, d["expand_x"], d["dynamic_scales"] if c.quant == 2 else None)
    kw: dict[str, Any] = {}
    if c.soc == A950:
        kw = dict(elastic_info=inp.elastic, performance_info=perf if c.perf else None)
    elif c.soc == A2 and c.perf:
        kw = dict(performance_info=perf)
    p = prepare_combine(ctx, y, inp.ids[rank], t.assist_info_for_combine, t.ep_recv_counts,
                        inp.weights[rank] if inp.weights else None, ep_world_size=c.W, ep_rank_id=rank,
                        ccl_buffer_size=ccl, x_active_mask=inp.mask[rank] if inp.mask else None,
                        shared_expert_x=inp.shared_x[rank] if inp.shared_x else None,
                        ori_x=inp.ori_x[rank] if (c.C or c.Q) else None, const_expert_alpha_1=inp.alpha1,
                        const_expert_alpha_2=inp.alpha2, const_expert_v=inp.const_v,
                        comm_quant_mode=c.comm_quant, stream=stream, **kw, **c.kwargs())
    p.launch(stream)
    stream.synchronize()
    return p.result.numpy()  # (BS, H): small


def world_body(rank: int, world_size: int, root: bytes, cases: list[Case], inputs: list[Inputs] | None,
               combine: bool) -> list[dict[str, Any]]:
    """Runs every case (of one profile) on this rank of one world; returns per case the raw outputs.
    A process rank sets the profile itself; inputs are rebuilt from the seeds when not given."""
    from aclnn_py import Device, Tensor, _mock
    from aclnn_py.hccl import Communicator, build_context

    if _mock.soc() != cases[0].soc:
        _mock.set_soc(cases[0].soc)
    if inputs is None:
        inputs = [make_inputs(c) for c in cases]
    out = []
    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        stream = Device.current().create_stream()
        perf = Tensor.zeros((world_size,), np.int64) if any(c.perf for c in cases) else None
        try:
            for c, inp in zip(cases, inputs):
                d = mock_dispatch(c, inp, rank, ctx, ccl, stream, perf)
                res = {k: v for k, v in d.items() if k != "_tensors"}
                if combine:
                    res["x_out"] = mock_combine(c, inp, rank, ctx, ccl, stream, d, perf)
                    res["perf_after_combine"] = perf.numpy().copy() if c.perf else None
                out.append(res)
        finally:
            stream.synchronize()
            stream.close()
    return out


# ---------------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------------

def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def check_dispatch(c: Case, rank: int, m: dict[str, Any], g: Any) -> None:
    where = f"{c} rank {rank}"
    n = g.num_rows
    assert m["n"] == n, f"N differs ({m['n']} != {n}): {where}"
    assert np.array_equal(m["recv"], g.ep_recv_counts), f"ep_recv_counts differ: {where}"
    assert np.array_equal(m["tok_nums"], g.expert_token_nums), f"expert_token_nums differ: {where}"
    assert np.array_equal(_bits(m["expand_x"]), _bits(g.expand_x)), f"expand_x differs: {where}"
    assert m["poison"]["expand_x"], f"expand_x rows >= N were written: {where}"
    assert np.array_equal(m["assist"], g.assist_info_for_combine), f"assist_info differs: {where}"
    assert m["poison"]["assist"], f"assist_info entries >= 3N were written: {where}"
    if g.dynamic_scales is not None:
        assert np.array_equal(_bits(m["dynamic_scales"]), _bits(g.dynamic_scales)), f"scales differ: {where}"
        assert m["poison"]["dynamic_scales"], f"dynamic_scales >= N written: {where}"
    else:
        assert m["poison"]["dynamic_scales_all"], f"dynamic_scales written: {where}"
    if g.expand_scales is not None:
        assert np.array_equal(_bits(m["expand_scales"]), _bits(g.expand_scales)), f"expand_scales differ: {where}"
        assert m["poison"]["expand_scales"], f"expand_scales >= N written: {where}"
    elif c.escales and c.soc == A3:
        assert m["poison"]["expand_scales_all"], f"expand_scales written on a shared rank: {where}"
    # what the mock recorded as written is exactly the N rows at the front: a refill of the reused outputs
    # restores the poison there and nowhere else
    wanted = {"expand_x": True, "assist": True, "dynamic_scales": g.dynamic_scales is not None,
              "expand_scales": g.expand_scales is not None}
    for name, (extent, row) in m["written"].items():
        if extent is not None and wanted[name]:
            assert extent == (0, n * row) or (n == 0 and extent == (0, 0)), \
                f"{name}: recorded as written {extent}, the kernel wrote (0, {n * row}): {where}"
    if c.escales and c.soc == A3 and g.expand_scales is None and m["written"]["expand_scales"][0] is not None:
        assert m["written"]["expand_scales"][0] == (0, 0), f"expand_scales recorded as written on a shared rank: {where}"
    if m["perf"] is not None:
        p = m["perf"]
        assert p.shape == (c.W,) and p.dtype == np.int64 and (p >= 0).all(), f"performance_info {p}: {where}"


def _ordered(a: np.ndarray) -> np.ndarray:
    """16-bit float bit patterns mapped to integers ordered like the values (for ulp distances)."""
    u = np.ascontiguousarray(a).view(np.uint16).astype(np.int32)
    return np.where(u & 0x8000, -(u & 0x7FFF), u)


def const_rows(c: Case, inp: Inputs, rank: int) -> np.ndarray:
    ids = inp.ids[rank]
    lo = c.E + c.Z + c.C
    return np.any((ids >= lo) & (ids < lo + c.Q), axis=1) if c.Q else np.zeros(ids.shape[0], bool)


def check_combine(c: Case, inp: Inputs, rank: int, x_out: np.ndarray, g: Any) -> None:
    where = f"{c} rank {rank}"
    wr = g.written
    assert _poisoned(x_out[~wr]), f"x_out rows of unprocessed tokens were written: {where}"
    exact = wr & ~const_rows(c, inp, rank)
    assert np.array_equal(_bits(x_out[exact]), _bits(g.x_out[exact])), f"x_out differs: {where}"
    approx = wr & ~exact
    if approx.any():   # const experts: within 1 ulp
        d = np.abs(_ordered(x_out[approx]) - _ordered(g.x_out[approx]))
        assert d.max() <= 1, f"x_out of const-expert rows differs by {d.max()} ulp: {where}"


def check_perf_grows(results: list[list[dict[str, Any]]], W: int) -> None:
    """performance_info only ever grows, on every rank."""
    for r in range(W):
        prev = np.zeros(W, np.int64)
        for res in results[r]:
            for key in ("perf", "perf_after_combine"):
                p = res.get(key)
                if p is not None:
                    assert (p >= prev).all(), f"performance_info decreased on rank {r}: {prev} -> {p}"
                    prev = p


def run_world(cases: list[Case], combine: bool, processes: bool = False, timeout: float = 300.0,
              inputs: list[Inputs] | None = None) -> list[list[dict[str, Any]]]:
    """Run `cases` (same W and profile) in one world and check every rank against the golden."""
    from aclnn_py.worlds import run_threads, spawn

    W = cases[0].W
    assert all(c.W == W and c.soc == cases[0].soc for c in cases)
    inputs = inputs if inputs is not None else [make_inputs(c) for c in cases]
    if processes:
        results = spawn(world_body, W, cases, None, combine, timeout=timeout)
    else:
        results = run_threads(world_body, W, cases, inputs, combine, timeout=timeout)
    for i, (c, inp) in enumerate(zip(cases, inputs)):
        g = golden_dispatch(c, inp)
        for r in range(W):
            check_dispatch(c, r, results[r][i], g[r])
        if combine:
            gc = golden_combine(c, inp, g, golden_expert_outputs(c, g))
            for r in range(W):
                check_combine(c, inp, r, results[r][i]["x_out"], gc[r])
    check_perf_grows(results, W)
    return results


__all__ = ["golden_dispatch", "golden_combine", "expert_fn", "golden_expert_outputs", "mock_dispatch",
           "mock_combine", "world_body", "check_dispatch", "check_combine", "run_world", "POISON"]


# ---------------------------------------------------------------------------------------------------
# a peer that never calls
# ---------------------------------------------------------------------------------------------------

def lonely_launch(rank: int, world_size: int, root: bytes, timeout_s: float, prepare: Any) -> Any:
    """A thread-world rank body: rank 1 joins and never calls (its window stays mapped past the
    timeout); rank 0 launches the plan ``prepare(ctx, ccl_buffer_size, stream, rank, world_size)``
    builds and synchronises. None, or (code, message, seconds until the failure) of its AclError."""
    import time

    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        if rank == 1:
            time.sleep(timeout_s + 1.0)
            return None
        s = Device.current().create_stream()
        p = prepare(ctx, ccl, s, rank, world_size)
        t0 = time.monotonic()
        p.launch(s)
        try:
            s.synchronize()
            return None
        except AclError as e:
            return (e.code, e.message, time.monotonic() - t0)
        finally:
            s.close()

