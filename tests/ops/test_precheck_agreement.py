"""The Python pre-checks never change the answer: over seeded, generated phase-1 calls of both
operators on every SoC profile — every attribute valid or not, token tensors of any type, rank and
shape, optional inputs absent / present / malformed, outputs allocated / given / left None,
non-contiguous and closed tensors — ``precheck=True`` and ``precheck=False`` accept the same calls
and refuse the others with the same exception class, status code and message (so the same named
parameter). A pre-check only gives the C wording before the C call.

The Atlas A2 profile runs in a 16-rank world (its smallest), with its own valid attribute values.
``ACLNN_PY_DIFF_EXAMPLES`` sets the examples per operator and profile (default 400),
``ACLNN_PY_DIFF_SEED`` the seed (default 0): both in docs/testing_with_the_mock.md."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers.moe_calls import World2
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("ACLNN_PY_DIFF_EXAMPLES", "400"))
SEED = int(os.environ.get("ACLNN_PY_DIFF_SEED", "0"))
W = 2
A2, W_A2 = "Ascend910B", 16
SOCS = ["Ascend910_93", "Ascend950", A2]
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
TOKEN_DTYPES = [BF16, BF16, BF16, F16, F32, np.dtype(np.int8), np.dtype(ml_dtypes.float8_e4m3fn),
                "HIFLOAT8", np.dtype(np.int32)]  # HiFloat8 has no numpy dtype: named by its DataType


@pytest.fixture(scope="module")
def worlds(acl):
    made: dict[int, World2] = {}
    yield made
    for w in made.values():
        w.close()


def _world(worlds: dict[int, World2], soc: str) -> tuple[World2, int]:
    """The world of the profile's test and its size (built on first use)."""
    n = W_A2 if soc == A2 else W
    if n not in worlds:
        worlds[n] = World2(ranks=n)
    return worlds[n], n


def _pick(values: list[Any]) -> st.SearchStrategy[Any]:
    return st.sampled_from(values)


def _fields(table: dict[str, tuple[list[Any], list[Any]]]) -> st.SearchStrategy[dict[str, Any]]:
    """One value per field of `table` (name: (valid values, invalid values)): valid ones, but for up
    to two fields broken on purpose, so that every rule is reached rather than the first few."""

    @st.composite
    def draw(d: st.DrawFn) -> dict[str, Any]:
        broken = d(st.sets(st.sampled_from(sorted(table)), max_size=2))
        return {name: d(_pick(bad if name in broken else good)) for name, (good, bad) in table.items()}

    return draw()


def attributes(ccl: int, op: str, soc: str = "Ascend910_93") -> st.SearchStrategy[dict[str, Any]]:
    """Every attribute: valid values, and the boundaries and invalid ones CANN's own tests use (ranks
    out of range, TP 2, non-zero tp_rank_id, special experts, odd comm_alg, huge global_bs ...); on the
    Atlas A2 its own world sizes, expert counts (E <= 1024, 512 with "hierarchy") and comm_alg values."""
    table: dict[str, tuple[list[Any], list[Any]]] = dict(
        ep_world_size=([2], [1, 0, 3, 769, 1025]),
        ep_rank_id=([0], [1, -1, 2]),     # 1: valid attribute, but not this communicator's rank
        moe_expert_num=([2, 4, 8], [0, 3, 1024, 1025, -2]),
        ccl_buffer_size=([ccl], [0, -1, 1 << 20, (1 << 20) + 4096, ccl * 4]),
        tp_world_size=([0, 1], [2, 3]),
        tp_rank_id=([0], [1, -1]),
        expert_shard_type=([0], [1]),
        shared_expert_num=([1], [0, 2, 5, -1]),
        shared_expert_rank_num=([0], [1, 2]),
        zero_expert_num=([0, 0, 1], [-1]),
        copy_expert_num=([0], [1, -1]),
        const_expert_num=([0], [1, -1]),
        global_bs=([0], [4, 8, 3, -2, 2**40]),
        comm_alg=(["", "fullmesh_v1"], ["fullmesh_v2", "hierarchy", "ring"]),
    )
    if soc == A2:
        table.update(ep_world_size=([W_A2], [2, 8, 24, 128, 512]), moe_expert_num=([16, 32, 48], [0, 8, 1040, 528, -2]),
                     shared_expert_num=([1, 0], [2, -1]), global_bs=([0], [64, 8, 3, -2, 2**40]),
                     comm_alg=(["", "fullmesh", "hierarchy"], ["fullmesh_v1", "fullmesh_v2", "ring"]))
    if op == "dispatch":
        table.update(quant_mode=([0, 2], [1, 3, 4, 5, 6, -1]), expert_token_nums_type=([1, 0], [2, -1]))
    else:
        table.update(comm_quant_mode=([0, 2], [1, 3, 4]), out_dtype=([0], [1]), group_list_type=([0, 1, 5], [0]))
    return _fields(table)


def shapes() -> st.SearchStrategy[dict[str, Any]]:
    """The token tensors: BS, H, K, their types and ranks, and the tensor-level faults."""
    return _fields(dict(
        bs=([1, 2, 4], [0, 3, 257, 513]),
        h=([1024, 2048], [1023, 8193, 7168]),
        k=([1, 2], [0, 3, 17]),
        token_dtype=([BF16, F16], [F32, np.dtype(np.int8), np.dtype(ml_dtypes.float8_e4m3fn), "HIFLOAT8",
                                   np.dtype(np.int32)]),
        token_rank=([2], [1, 3]),
        ids_dtype=([np.int32], [np.int64, np.float32]),
        ids_rows=([0], [1]),                  # extra rows: expert_ids dim 0 != BS
        strided=([None], ["x", "expert_ids", "context"]),
        closed=([None], ["x", "expert_ids"]),
        nulled=([None], ["x", "expert_ids", "context"]),
    ))


class Maker:
    """Device tensors of generated layouts, kept until the case ends."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def tensor(self, shape: tuple[int, ...], dtype: Any) -> Any:
        from aclnn_py import DataType, Tensor

        t = Tensor.empty(shape, DataType[dtype] if isinstance(dtype, str) else dtype)
        self.made.append(t)
        return t

    def strided(self, t: Any) -> Any:
        """A non-contiguous view with t's shape and dtype (every other element of a doubled buffer)."""
        from aclnn_py import Tensor

        if not t.shape or t.shape[-1] < 2:
            return t
        base = self.tensor(t.shape[:-1] + (t.shape[-1] * 2,), t.dtype)
        strides = tuple(s * 2 for s in t.strides[:-1]) + (2,)
        return Tensor.from_address(base.ptr, t.shape, t.dtype, strides=strides, owner=base)

    def close(self) -> None:
        for t in self.made:
            t.close()


def _token_shape(s: dict[str, Any], h: int) -> tuple[int, ...]:
    return {1: (s["bs"] * h,), 2: (s["bs"], h), 3: (s["bs"], h, 1)}[s["token_rank"]]


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    import aclnn_py as acl

    try:
        prepared = call()
    except acl.AclnnError as e:
        return type(e).__name__, e.code, e.message
    except (TypeError, ValueError, acl.ClosedError) as e:
        return type(e).__name__, str(e)
    prepared.close()
    return ("accepted",)


def _agree(call: Callable[[bool], Any], seen: dict[str, int]) -> None:
    """The call gives the same outcome with and without the pre-checks; its kind is counted in `seen`."""
    with_precheck, without = _outcome(lambda: call(True)), _outcome(lambda: call(False))
    assert with_precheck == without, f"\n  precheck=True:  {with_precheck}\n  precheck=False: {without}"
    seen[_kind(with_precheck)] = 1


def _search(mock: Any, check: Callable[[], None], seen: dict[str, int]) -> None:
    """Run the generated search `check` on the profile the test set, then restore the default one."""
    try:
        check()
    finally:
        mock.set_soc("Ascend910_93")
    _assert_broad(seen)


def _common_tensors(m: Maker, world: World2, s: dict[str, Any], x_shape: tuple[int, ...]) -> dict[str, Any]:
    from aclnn_py import Tensor

    ctx = world.ctx[0][0]
    x = m.tensor(x_shape, s["token_dtype"])
    ids = m.tensor((s["bs"] + s["ids_rows"], s["k"]), s["ids_dtype"])
    ids.fill_bytes(0)
    t = {"context": ctx, "x": x, "expert_ids": ids}
    if s["strided"] == "context":
        t["context"] = Tensor.from_address(ctx.ptr, (ctx.shape[0] // 2,), ctx.dtype, strides=(2,), owner=ctx)
    elif s["strided"]:
        t[s["strided"]] = m.strided(t[s["strided"]])
    if s["closed"]:
        t[s["closed"]] = m.tensor(t[s["closed"]].shape, t[s["closed"]].dtype)
        t[s["closed"]].close()
    if s["nulled"]:
        t[s["nulled"]] = None
    return t


@pytest.mark.parametrize("soc", SOCS)
def test_dispatch_precheck_agrees_with_c(worlds, mock, soc):
    from aclnn_py.ops import prepare_dispatch

    world, w = _world(worlds, soc)
    mock.set_soc(soc)
    ccl = world.ctx[0][1]
    seen: dict[str, int] = {}

    @seed(SEED)
    @SETTINGS
    @given(attrs=attributes(ccl, "dispatch", soc), s=shapes(), opt=_fields(dict(
        scales=([None, "smooth"], ["scalar", "per_token"]),
        x_active_mask=([None, (1,), (1, 1)], [(1, 1, 1)]),
        expert_scales=([None, "weights", "empty"], ["wrong"]),
        elastic_info=([None], ["table"]),
        performance_info=([None], ["counts"]),
        outputs=(["allocated", "no_tp"], ["no_dynamic_scales", "no_expand_x", "no_expand_scales"]),
    )))
    def check(attrs: dict[str, Any], s: dict[str, Any], opt: dict[str, Any]) -> None:
        m = Maker()
        try:
            t = _common_tensors(m, world, s, _token_shape(s, s["h"]))
            bs, h, k, e = s["bs"], s["h"], s["k"], max(attrs["moe_expert_num"], 1)
            kw: dict[str, Any] = {}
            if opt["scales"] == "smooth":
                kw["scales"] = m.tensor((e, h), np.float32)
            elif opt["scales"] == "scalar":
                kw["scales"] = m.tensor((1,), np.float32)
            elif opt["scales"] == "per_token":
                kw["scales"] = m.tensor((bs, 4), np.float32)
            if opt["x_active_mask"] is not None:
                kw["x_active_mask"] = m.tensor(tuple((bs, k, 1)[:len(opt["x_active_mask"])]), np.bool_)
            if opt["expert_scales"] == "weights":
                kw["expert_scales"] = m.tensor((bs, k), np.float32)
            elif opt["expert_scales"] == "empty":
                kw["expert_scales"] = m.tensor((0,), np.float32)
            elif opt["expert_scales"] == "wrong":
                kw["expert_scales"] = m.tensor((bs, k + 1), np.float32)
            if opt["elastic_info"]:
                kw["elastic_info"] = m.tensor((4 + 2 * w,), np.int32)
            if opt["performance_info"]:
                kw["performance_info"] = m.tensor((w,), np.int64)
            if opt["outputs"] != "allocated":
                name = opt["outputs"][3:]
                kw["outputs"] = {{"tp": "tp_recv_counts"}.get(name, name): None}
            _agree(lambda pre: prepare_dispatch(t["context"], t["x"], t["expert_ids"], precheck=pre, **kw, **attrs),
                   seen)
        finally:
            m.close()

    _search(mock, check, seen)


@pytest.mark.parametrize("soc", SOCS)
def test_combine_precheck_agrees_with_c(worlds, mock, soc):
    from aclnn_py.ops import prepare_combine

    world, w = _world(worlds, soc)
    mock.set_soc(soc)
    ccl = world.ctx[0][1]
    seen: dict[str, int] = {}

    @seed(SEED + 1)
    @SETTINGS
    @given(attrs=attributes(ccl, "combine", soc), s=shapes(), opt=_fields(dict(
        rows=(["capacity"], ["short"]),
        expert_scales=([None, "weights"], ["wrong"]),
        x_active_mask=([None, (1,), (1, 1)], [(1, 1, 1)]),
        shared_expert_x=([None], ["tokens"]),
        ori_x=([None, "tokens"], ["wrong"]),
        const=([None], ["given"]),
        expand_scales=([None], ["given"]),
        tp_send_counts=([None], ["given"]),
        elastic_info=([None], ["table"]),
        performance_info=([None], ["counts"]),
        x_out=([None, "given"], ["strided", "short"]),
    )))
    def check(attrs: dict[str, Any], s: dict[str, Any], opt: dict[str, Any]) -> None:
        m = Maker()
        try:
            bs, h, k = s["bs"], s["h"], s["k"]
            a = max(bs, 1) * w * max(k, 1) * (1 if opt["rows"] == "capacity" else 0) + 1
            t = _common_tensors(m, world, s, {1: (a * h,), 2: (a, h), 3: (a, h, 1)}[s["token_rank"]])
            dt = t["x"].dtype if t["x"] is not None else BF16
            assist = m.tensor((a * 128,), np.int32)
            counts = m.tensor((w * max(attrs["moe_expert_num"], 1),), np.int32)
            kw: dict[str, Any] = {}
            if opt["expert_scales"] == "weights":
                kw["expert_scales"] = m.tensor((bs, k), np.float32)
            elif opt["expert_scales"] == "wrong":
                kw["expert_scales"] = m.tensor((bs + 1, k), np.float32)
            if opt["x_active_mask"] is not None:
                kw["x_active_mask"] = m.tensor(tuple((bs, k, 1)[:len(opt["x_active_mask"])]), np.bool_)
            for name in ("shared_expert_x", "ori_x"):
                if opt[name]:
                    kw[name] = m.tensor((bs + (opt[name] == "wrong"), h), dt)
            if opt["const"]:
                n = max(attrs["const_expert_num"], 1)
                kw.update(const_expert_alpha_1=m.tensor((n, h), dt), const_expert_alpha_2=m.tensor((n, h), dt),
                          const_expert_v=m.tensor((n, h), dt))
            if opt["expand_scales"]:
                kw["expand_scales"] = m.tensor((a,), np.float32)
            if opt["tp_send_counts"]:
                kw["tp_send_counts"] = m.tensor((2,), np.int32)
            if opt["elastic_info"]:
                kw["elastic_info"] = m.tensor((4 + 2 * w,), np.int32)
            if opt["performance_info"]:
                kw["performance_info"] = m.tensor((w,), np.int64)
            if opt["x_out"] == "given":
                kw["x_out"] = m.tensor((bs, h), dt)
            elif opt["x_out"] == "short":
                kw["x_out"] = m.tensor((max(bs - 1, 0), h), dt)
            elif opt["x_out"] == "strided":
                kw["x_out"] = m.strided(m.tensor((bs, h), dt))
            _agree(lambda pre: prepare_combine(t["context"], t["x"], t["expert_ids"], assist, counts, precheck=pre,
                                               **kw, **attrs), seen)
        finally:
            m.close()

    _search(mock, check, seen)


def _kind(outcome: tuple[Any, ...]) -> str:
    """An outcome's kind: accepted, or the exception class with the parameter an AclnnError names."""
    return f"{outcome[0]}:{outcome[2].split(':')[0]}" if len(outcome) == 3 else outcome[0]


def _assert_broad(seen: dict[str, int]) -> None:
    """The generated calls reached acceptance and many distinct refusals (a generator that only
    ever hit one rule would hold the pre-checks to nothing)."""
    if EXAMPLES < 200:
        return
    assert "accepted" in seen, sorted(seen)
    assert len(seen) >= 15, sorted(seen)
