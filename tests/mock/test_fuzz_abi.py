"""Fuzzing the C ABI of both MoE ops through the raw cffi layer (docs/reliability.md).

A real 2-rank world (communicators formed by :func:`aclnn_py.launch.run_threads`, one context
tensor per rank from :func:`aclnn_py.hccl.build_context`) stays up for the module. Each example
draws one op (dispatch or combine), a configuration that is valid by the constraints of docs/operators.md, and up to four
mutations — NULL arguments, dtypes, formats, shapes, strides, view offsets, attributes, comm_alg
strings, window sizes, bad data addresses (host memory, freed memory, past the end of a block),
destroyed tensors — applied to both ranks or to one. Both ranks run phase 1 from this thread
(phase 1 is host-only); when both succeed, both launch on their own streams (workspace and stream
sometimes bad, executors sometimes repeatable and rebound), and both streams are synchronised.

Checked for every call: the status is 0 or 161001/161002 (launch: 0/161002/561103; a kernel that
rejects its data fails the stream with 507015, never with a timeout) and a failure leaves a
non-empty aclGetRecentErrMsg; nothing crashes or hangs; tensors and executors are back to their
start values after every example, allocations, streams and communicators after the module.

Settings (environment): ACLNN_FUZZ_EXAMPLES (default 5000: CI), ACLNN_FUZZ_SEED (derandomised by
default, so CI always runs the same cases). The long run of docs/reliability.md::

    ACLNN_FUZZ_EXAMPLES=100000 python -m pytest tests/mock/test_fuzz_abi.py -q
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from aclnn_py.ops.sizing import moe_local_experts, rows_capacity  # noqa: E402

EXAMPLES = int(os.environ.get("ACLNN_FUZZ_EXAMPLES", "5000"))
SEED = os.environ.get("ACLNN_FUZZ_SEED")
W = 2
SLOT_BYTES = 1 << 20          # one device buffer per tensor argument and rank
HCCL_BUFFSIZE_MIB = 4         # windows of 8 MiB: large enough for every base config, small enough to refuse some

# aclDataType values (CANN's aclDataType enum) plus two that do not exist
DTYPES = [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 27, 29, 30, 33, 34, 35, 36, 37, 38, 39, 40, 41, -1,
          5, 99]
FORMATS = [-1, 0, 1, 2, 3, 4, 12, 16, 27, 29, 30, 32, 35, 47, 50, 54, 7, 1000]
INTERESTING = [-(2 ** 63), -(2 ** 31), -1, 0, 1, 2, 3, 4, 7, 8, 16, 17, 64, 255, 512, 768, 1024, 1025, 2048,
               2 ** 31 - 1, 2 ** 31, 2 ** 62, 2 ** 63 - 1]
FLOAT16, BF16, FLOAT, INT8, INT32, INT64, BOOL = 1, 27, 0, 2, 3, 9, 12
ND = 2
OK_CODES = {0, 161001, 161002}
LAUNCH_CODES = {0, 161002, 561103}
KERNEL_FAIL = 507015
BITS = {0: 32, 1: 16, 2: 8, 3: 32, 4: 8, 6: 16, 7: 16, 8: 32, 9: 64, 10: 64, 11: 64, 12: 8, 13: 8, 16: 64,
        17: 128, 27: 16, 29: 4, 30: 1, 33: 32, 34: 8, 35: 8, 36: 8, 37: 8, 38: 8, 39: 8, 40: 4, 41: 4}

DISPATCH_IN = ["context", "x", "expert_ids", "scales", "x_active_mask", "expert_scales", "elastic_info",
               "performance_info"]
DISPATCH_OUT = ["expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
                "tp_recv_counts", "expand_scales"]
DISPATCH_ATTRS = ["ep_world_size", "ep_rank_id", "moe_expert_num", "ccl_buffer_size", "tp_world_size",
                  "tp_rank_id", "expert_shard_type", "shared_expert_num", "shared_expert_rank_num",
                  "quant_mode", "global_bs", "expert_token_nums_type", "comm_alg", "zero_expert_num",
                  "copy_expert_num", "const_expert_num"]
COMBINE_IN = ["context", "expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts", "expert_scales",
              "tp_send_counts", "x_active_mask", "activation_scale", "weight_scale", "group_list",
              "expand_scales", "shared_expert_x", "elastic_info", "ori_x", "const_expert_alpha_1",
              "const_expert_alpha_2", "const_expert_v", "performance_info"]
COMBINE_OUT = ["x_out"]
COMBINE_ATTRS = ["ep_world_size", "ep_rank_id", "moe_expert_num", "ccl_buffer_size", "tp_world_size",
                 "tp_rank_id", "expert_shard_type", "shared_expert_num", "shared_expert_rank_num", "global_bs",
                 "out_dtype", "comm_quant_mode", "group_list_type", "comm_alg", "zero_expert_num",
                 "copy_expert_num", "const_expert_num"]


# ---- the world -----------------------------------------------------------------------------------
@dataclass
class World:
    comms: list[Any]
    contexts: list[Any]
    ccl: int
    streams: list[Any]
    slots: list[list[Any]]          # per rank: device buffers, one per argument position
    stats0: dict[str, int]
    counts: dict[str, int] = field(default_factory=dict)


def _world_body(rank: int, world_size: int, root: bytes) -> tuple[Any, Any, int]:
    from aclnn_py.hccl import Communicator, build_context

    comm = Communicator(world_size, rank, root)
    ctx, ccl = build_context(comm)
    return comm, ctx, ccl


@pytest.fixture(scope="module")
def world(acl, mock):
    from aclnn_py import launch

    saved = {k: os.environ.get(k) for k in ("HCCL_BUFFSIZE", "HCCL_EXEC_TIMEOUT")}
    os.environ["HCCL_BUFFSIZE"] = str(HCCL_BUFFSIZE_MIB)
    os.environ["HCCL_EXEC_TIMEOUT"] = "10"   # never reached: a timeout fails the test
    import gc

    gc.collect()   # garbage of earlier tests (Tensors in reference cycles) is not this test's either
    acl.get_memory_pool().free_all_blocks()  # cached blocks of earlier tests are not this test's
    stats0 = mock.stats()
    res = launch.run_threads(_world_body, W)
    streams, slots = [], []
    try:
        for r in range(W):
            dev = acl.Device(r)
            dev.set_current()
            streams.append(dev.create_stream())
            slots.append([acl.runtime.DeviceMemory(SLOT_BYTES) for _ in range(24)])
    finally:
        acl.Device(0).set_current()
    w = World([c for c, _, _ in res], [x for _, x, _ in res], res[0][2], streams, slots, stats0,
              {"examples": 0, "phase1_ok": 0, "launched": 0, "kernel_ok": 0, "kernel_failed": 0})
    del res
    t0 = time.perf_counter()
    yield w
    elapsed = time.perf_counter() - t0
    for r in range(W):
        w.streams[r].synchronize()
    for rank_slots in w.slots:
        for m in rank_slots:
            m.close()
    for s in w.streams:
        s.close()
    contexts = w.contexts
    w.contexts = []
    del contexts
    for c in w.comms:
        c.close()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    import gc

    gc.collect()
    acl.get_memory_pool().free_all_blocks()  # the closed slots' blocks went back to the pool
    after = mock.stats()
    print(f"\nfuzz: {w.counts} in {elapsed:.1f} s")
    for key in ("allocations", "tensors", "executors", "streams", "communicators", "pinned_blocks"):
        assert after[key] == stats0[key], f"{key} leaked: {stats0[key]} -> {after[key]}"


# ---- configurations and mutations --------------------------------------------------------------
@dataclass
class Spec:
    """One tensor argument: shape, dtype, strides (None: contiguous), offset, format, data."""

    shape: list[int]
    dtype: int
    strides: list[int] | None = None
    offset: int = 0
    fmt: int = ND
    data: str = "slot"              # slot | null | host | freed | past_end | unaligned
    state: str = "live"             # live | null | destroyed


class _Picker:
    """Draws the base configuration from one seeded generator: one hypothesis draw per example
    instead of twenty keeps 5,000 examples within the CI budget (hypothesis still chooses, and
    shrinks, the op, the mutations and the launch mode)."""

    def __init__(self, seed_: int):
        self.rng = np.random.default_rng(seed_)

    def one(self, options: list[Any]) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def int(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))


def _base(d: st.DataObject, op: str) -> tuple[dict[str, Spec | None], dict[str, Any], dict[str, Any]]:
    pk = _Picker(d.draw(st.integers(0, 2 ** 32 - 1), label="config seed"))
    S, R = pk.one([(1, 0), (1, 0), (1, 0), (1, 1)])
    moe_ranks = W - R
    L = pk.one([1, 2, 4])
    E = L * moe_ranks
    Z = pk.one([0, 0, 1, 2])
    C = pk.one([0, 0, 1])
    Q = 0 if op == "dispatch" else pk.one([0, 0, 1])
    K = pk.int(1, min(E + Z + C + Q, 8))
    BS = pk.int(1, 8)
    H = pk.one([1024, 1536, 2048])
    gbs = pk.one([0, 0, BS * W, (BS + 1) * W])
    dt = pk.one([BF16, FLOAT16])
    alg = pk.one(["", "", "fullmesh_v1", "fullmesh_v2"])
    mask = pk.one([None, None, 1, 2])
    if gbs > BS * W:
        mask = None
    data = {"ids": pk.one(["valid", "valid", "garbage", "poison"]), "seed": pk.int(0, 2 ** 16)}
    attrs: dict[str, Any] = {"ep_world_size": W, "ep_rank_id": None, "moe_expert_num": E, "ccl_buffer_size": None,
                             "tp_world_size": 0, "tp_rank_id": 0, "expert_shard_type": 0, "shared_expert_num": S,
                             "shared_expert_rank_num": R, "global_bs": gbs, "comm_alg": alg,
                             "zero_expert_num": Z, "copy_expert_num": C, "const_expert_num": Q}
    shape = {"BS": BS, "H": H, "K": K, "E": E, "L": L, "S": S, "R": R, "specials": Z + C + Q}
    data["shape"] = shape
    specs: dict[str, Spec | None] = {"context": Spec([4100], INT32)}
    if op == "dispatch":
        quant = pk.one([0, 2])
        attrs.update(quant_mode=quant, expert_token_nums_type=pk.one([0, 1]))
        smooth = quant == 2 and pk.one([False, True])
        es = pk.one(["none", "full", "empty"])
        specs.update(
            x=Spec([BS, H], dt), expert_ids=Spec([BS, K], INT32),
            scales=Spec([E + S if R else E, H], FLOAT) if smooth else None,
            x_active_mask=Spec([BS] if mask == 1 else [BS, K], BOOL) if mask else None,
            expert_scales=None if es == "none" else Spec([BS, K] if es == "full" else [0], FLOAT),
            elastic_info=None, performance_info=None)
        # outputs per rank are sized in _specs_for_rank (A and L depend on the rank)
        data["quant"], data["es"] = quant, es
    else:
        attrs.update(out_dtype=0, comm_quant_mode=pk.one([0, 2]), group_list_type=0)
        es = pk.one(["full", "full", "empty"])
        specs.update(
            expert_ids=Spec([BS, K], INT32), expert_scales=Spec([BS, K] if es == "full" else [0], FLOAT),
            tp_send_counts=None, x_active_mask=Spec([BS] if mask == 1 else [BS, K], BOOL) if mask else None,
            activation_scale=None, weight_scale=None, group_list=None,
            shared_expert_x=Spec([BS, H], dt) if (R == 0 and pk.one([False, True])) else None,
            elastic_info=None, ori_x=Spec([BS, H], dt) if (C or Q) else None,
            const_expert_alpha_1=Spec([Q, H], dt) if Q else None,
            const_expert_alpha_2=Spec([Q, H], dt) if Q else None,
            const_expert_v=Spec([Q, H], dt) if Q else None, performance_info=None,
            x_out=Spec([BS, H], dt))
        data["es"] = es
    data["dtype"] = dt
    return specs, attrs, data


def _specs_for_rank(op: str, specs: dict[str, Spec | None], attrs: dict[str, Any], data: dict[str, Any],
                    rank: int) -> dict[str, Spec | None]:
    """Copy of the shared specs with the rank-dependent output sizes (docs/operators.md, outputs) filled in."""
    sh = data["shape"]
    out = {k: (None if v is None else Spec(list(v.shape), v.dtype, v.strides, v.offset, v.fmt, v.data, v.state))
           for k, v in specs.items()}
    A = rows_capacity(W, rank, sh["E"], sh["S"], sh["R"], attrs["global_bs"] or 0, sh["BS"], sh["K"])
    lnum = 1 if rank < sh["R"] else moe_local_experts(W, sh["E"], sh["R"])
    A, lnum = max(A, 1), max(lnum, 1)
    if op == "dispatch":
        out.setdefault("expand_x", Spec([A, sh["H"]], data["dtype"] if data["quant"] == 0 else INT8))
        out.setdefault("dynamic_scales", Spec([A], FLOAT))
        out.setdefault("assist_info_for_combine", Spec([A * 128], INT32))
        out.setdefault("expert_token_nums", Spec([lnum], INT64))
        out.setdefault("ep_recv_counts", Spec([W * lnum], INT32))
        out.setdefault("tp_recv_counts", Spec([0], INT32))
        out.setdefault("expand_scales", Spec([A if data["es"] == "full" else 0], FLOAT))
    else:
        out.setdefault("expand_x", Spec([A, sh["H"]], data["dtype"]))
        out.setdefault("assist_info_for_combine", Spec([A * 128], INT32))
        out.setdefault("ep_send_counts", Spec([W * lnum], INT32))
        out.setdefault("expand_scales", None)
    return out


@st.composite
def mutation(draw: Any, names: list[str], attr_names: list[str]) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(["null", "dtype", "format", "shape", "rank", "strides", "offset", "attr", "attr",
                                 "comm_alg", "ccl", "ccl", "data", "destroyed", "present"]))
    target = draw(st.sampled_from(names))
    if kind == "dtype":
        return (kind, target, draw(st.sampled_from(DTYPES)))
    if kind == "format":
        return (kind, target, draw(st.sampled_from(FORMATS)))
    if kind == "shape":
        return (kind, target, draw(st.integers(0, 3)), draw(st.sampled_from([0, 1, -1, "+1", "-1", 3, 2 ** 20,
                                                                             2 ** 40, 2 ** 62])))
    if kind == "rank":
        return (kind, target, draw(st.integers(0, 4)))
    if kind == "strides":
        return (kind, target, draw(st.sampled_from(["swap", "zero", "double", "huge", "negative"])))
    if kind == "offset":
        return (kind, target, draw(st.sampled_from([1, 16, 2 ** 20, 2 ** 40, -1])))
    if kind == "attr":
        return (kind, draw(st.sampled_from(attr_names)), draw(st.sampled_from(INTERESTING)))
    if kind == "comm_alg":
        return (kind, draw(st.one_of(st.none(), st.sampled_from(["hierarchy", "fullmesh_v3", "FULLMESH_V1", "x" * 300]),
                                     st.binary(max_size=40).map(lambda b: b.replace(b"\0", b"")))))
    if kind == "ccl":
        return (kind, draw(st.sampled_from(["zero", "mib", "half", "window+1", "neg", "huge", "window-1"])))
    if kind == "data":
        return (kind, target, draw(st.sampled_from(["null", "host", "freed", "past_end", "unaligned"])))
    return (kind, target)


def _apply(m: tuple[Any, ...], specs: dict[str, Spec | None], attrs: dict[str, Any], window: int) -> None:
    kind = m[0]
    if kind == "attr":
        if m[1] != "comm_alg":
            attrs[m[1]] = m[2]
        return
    if kind == "comm_alg":
        attrs["comm_alg"] = m[1]
        return
    if kind == "ccl":
        attrs["ccl_buffer_size"] = {"zero": 0, "mib": 1 << 20, "half": window // 2, "window+1": window + 1,
                                    "neg": -1, "huge": 2 ** 62, "window-1": window - 1}[m[1]]
        return
    name = m[1]
    s = specs.get(name)
    if kind == "present":   # an optional input the base left out
        if s is None:
            specs[name] = Spec([2, 1024], FLOAT)
        return
    if s is None:
        return
    if kind == "null":
        s.state = "null"
    elif kind == "destroyed":
        s.state = "destroyed"
    elif kind == "dtype":
        s.dtype = m[2]
    elif kind == "format":
        s.fmt = m[2]
    elif kind == "shape":
        if s.shape:
            i = m[2] % len(s.shape)
            v = m[3]
            s.shape[i] = s.shape[i] + 1 if v == "+1" else s.shape[i] - 1 if v == "-1" else v
            s.strides = None
    elif kind == "rank":
        s.shape = (s.shape + [1, 2, 3, 4])[: m[2]] if m[2] > len(s.shape) else s.shape[: m[2]]
        s.strides = None
    elif kind == "strides":
        st_ = _contig(s.shape)
        how = m[2]
        if how == "swap" and len(st_) >= 2:
            st_[0], st_[1] = st_[1], st_[0]
        elif how == "zero" and st_:
            st_[0] = 0
        elif how == "double" and st_:
            st_ = [2 * v for v in st_]
        elif how == "huge" and st_:
            st_[0] = 2 ** 61
        elif how == "negative" and st_:
            st_[-1] = -1
        s.strides = st_
    elif kind == "offset":
        s.offset = m[2]
    elif kind == "data":
        s.data = m[2]


def _contig(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return out[::-1]


# ---- building the C arguments --------------------------------------------------------------------
class Args:
    """The aclTensor descriptors of one rank's call; destroy() releases every one created."""

    def __init__(self, ffi: Any, lib: Any, world: World, rank: int, specs: dict[str, Spec | None]):
        self.ffi, self.lib = ffi, lib
        self.created: list[Any] = []
        self.desc: dict[str, Any] = {}
        self.keep: list[Any] = []
        self.freed: list[int] = []
        slots = world.slots[rank]
        for i, (name, s) in enumerate(specs.items()):
            if s is None or s.state == "null":
                self.desc[name] = ffi.NULL
                continue
            if name == "context" and s.data == "slot":
                addr = world.contexts[rank].data_ptr
            else:
                addr = self._address(s.data, slots[i])
            t = self._tensor(s, addr)
            if t != ffi.NULL:
                self.created.append(t)
            self.desc[name] = t
        for name, s in specs.items():   # destroyed handles last: their memory cannot be reused above
            if s is not None and s.state == "destroyed":
                t = self.desc[name]
                if t != ffi.NULL:
                    self.created.remove(t)
                    assert lib.aclDestroyTensor(t) == 0
                    assert lib.aclDestroyTensor(t) == 161002   # double destroy is an error, not UB
                    _msg(ffi, lib)

    def _address(self, how: str, mem: Any) -> int:
        if how == "slot":
            return mem.ptr
        if how == "null":
            return 0
        if how == "host":
            arr = np.zeros(4096, np.uint8)
            self.keep.append(arr)
            return arr.ctypes.data
        if how == "freed":
            cell = self.ffi.new("void **")
            assert self.lib.aclrtMalloc(cell, 4096, 0) == 0
            p = int(self.ffi.cast("uintptr_t", cell[0]))
            assert self.lib.aclrtFree(cell[0]) == 0
            return p
        if how == "past_end":
            return mem.ptr + SLOT_BYTES - 64
        if how == "unaligned":
            return mem.ptr + 3
        raise AssertionError(how)

    def _tensor(self, s: Spec, addr: int) -> Any:
        ffi, lib = self.ffi, self.lib
        n = len(s.shape)
        dims = ffi.new("int64_t[]", s.shape or [0]) if n else ffi.NULL
        strides = ffi.new("int64_t[]", s.strides) if s.strides is not None and n else ffi.NULL
        t = lib.aclCreateTensor(dims, n, s.dtype, strides, s.offset, s.fmt, dims, n, ffi.cast("void *", addr))
        if t == ffi.NULL:
            assert _msg(ffi, lib), "aclCreateTensor returned NULL without a message"
        return t

    def destroy(self) -> None:
        for t in self.created:
            assert self.lib.aclDestroyTensor(t) == 0
        self.created = []


def _msg(ffi: Any, lib: Any) -> str:
    p = lib.aclGetRecentErrMsg()
    return "" if p == ffi.NULL else ffi.string(p).decode(errors="replace")


def _clamp64(v: Any) -> int:
    return max(-(2 ** 63), min(int(v), 2 ** 63 - 1))


def _phase1(ffi: Any, lib: Any, op: str, a: Args, attrs: dict[str, Any]) -> tuple[int, Any, int, str]:
    ws, ex = ffi.new("uint64_t *"), ffi.new("aclOpExecutor **")
    alg = attrs["comm_alg"]
    alg_c = ffi.NULL if alg is None else ffi.new("char[]", alg.encode() if isinstance(alg, str) else alg)
    if op == "dispatch":
        ins = [a.desc[n] for n in DISPATCH_IN]
        outs = [a.desc[n] for n in DISPATCH_OUT]
        vals = [alg_c if n == "comm_alg" else _clamp64(attrs[n]) for n in DISPATCH_ATTRS]
        ret = lib.aclnnMoeDistributeDispatchV5GetWorkspaceSize(*ins, *vals, *outs, ws, ex)
    else:
        ins = [a.desc[n] for n in COMBINE_IN]
        vals = [alg_c if n == "comm_alg" else _clamp64(attrs[n]) for n in COMBINE_ATTRS]
        ret = lib.aclnnMoeDistributeCombineV5GetWorkspaceSize(*ins, *vals, a.desc["x_out"], ws, ex)
    msg = _msg(ffi, lib) if ret else ""
    return ret, ex[0], int(ws[0]), msg


def _fill(ffi: Any, lib: Any, world: World, rank: int, op: str, specs: dict[str, Spec | None],
          data: dict[str, Any], order: list[str]) -> None:
    """Write this example's expert ids (valid, garbage or left poisoned) into the rank's slot."""
    sh = data["shape"]
    i = order.index("expert_ids")
    s = specs["expert_ids"]
    if s is None or data["ids"] == "poison" or s.data != "slot":
        return
    rng = np.random.default_rng(data["seed"] + rank)
    BS, K, E = sh["BS"], sh["K"], sh["E"]
    if data["ids"] == "valid":
        ids = np.stack([rng.permutation(E + sh["specials"])[:K] for _ in range(BS)]).astype(np.int32)
    else:
        ids = rng.integers(-(2 ** 31), 2 ** 31 - 1, (BS, K), dtype=np.int64).astype(np.int32)
    mem = world.slots[rank][i]
    n = min(ids.nbytes, SLOT_BYTES)
    assert lib.aclrtMemcpy(ffi.cast("void *", mem.ptr), SLOT_BYTES, ffi.from_buffer(ids), n, 1) == 0
    if op == "combine":   # assist_info / counts: zero (nothing received) or random (must be bound-checked)
        for name in ("assist_info_for_combine", "ep_send_counts"):
            j = order.index(name)
            junk = (np.zeros(4096, np.int32) if data["ids"] == "valid"
                    else rng.integers(-4, 64, 4096, dtype=np.int32))
            assert lib.aclrtMemcpy(ffi.cast("void *", world.slots[rank][j].ptr), SLOT_BYTES,
                                   ffi.from_buffer(junk), junk.nbytes, 1) == 0


# ---- the test ------------------------------------------------------------------------------------
_settings = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
                     suppress_health_check=list(HealthCheck), print_blob=True)


def _seeded(f: Any) -> Any:
    return seed(int(SEED))(f) if SEED is not None else f


# pytest-timeout: ~20 ms per case at worst (a sanitizer build on a busy machine), at least 300 s
@pytest.mark.timeout(max(300, EXAMPLES // 50))
@_seeded
@_settings
@given(d=st.data())
def test_fuzz_both_ops(world: World, acl: Any, mock: Any, d: st.DataObject) -> None:
    b = acl.backend()
    ffi, lib = b.ffi, b.lib
    op = d.draw(st.sampled_from(["dispatch", "combine"]), label="op")
    specs, attrs, data = _base(d, op)
    in_names = DISPATCH_IN if op == "dispatch" else COMBINE_IN
    out_names = DISPATCH_OUT if op == "dispatch" else COMBINE_OUT
    attr_names = DISPATCH_ATTRS if op == "dispatch" else COMBINE_ATTRS
    muts = d.draw(st.lists(mutation(in_names + out_names, attr_names), max_size=4), label="mutations")
    asym = d.draw(st.sampled_from([None, None, None, 0, 1]), label="asymmetric rank")
    launch = d.draw(st.sampled_from(["ok", "ok", "ok", "ok", "ws_null", "ws_small", "ws_host", "ws_freed",
                                     "stream_bad", "repeat"]), label="launch")
    base = mock.stats()

    per_rank = []
    for r in range(W):
        sp = _specs_for_rank(op, specs, attrs, data, r)
        sp = {n: sp.get(n) for n in in_names + out_names}   # C argument order
        at = dict(attrs, ep_rank_id=r, ccl_buffer_size=world.ccl)
        for m in muts:
            if asym is None or asym == r:
                _apply(m, sp, at, world.ccl)
        per_rank.append((sp, at))

    args: list[Args] = []
    execs: list[Any] = [None] * W
    try:
        results = []
        for r, (sp, at) in enumerate(per_rank):
            a = Args(ffi, lib, world, r, sp)
            args.append(a)
            _fill(ffi, lib, world, r, op, sp, data, list(sp))
            ret, ex, ws, msg = _phase1(ffi, lib, op, a, at)
            assert ret in OK_CODES, f"phase 1 of {op} on rank {r} returned {ret}: {msg}"
            if ret:
                assert msg, f"phase 1 of {op} on rank {r} returned {ret} without a message"
            else:
                execs[r] = ex
            results.append((ret, ws))
        world.counts["examples"] += 1
        if all(e is not None for e in execs):
            world.counts["phase1_ok"] += 1
            _launch_both(ffi, lib, world, op, execs, [w for _, w in results], launch)
            execs = [None] * W
    finally:
        for e in execs:
            if e is not None:
                assert lib.aclDestroyAclOpExecutor(e) == 0   # a never-launched executor may be destroyed
        for a in args:
            a.destroy()
    now = mock.stats()
    assert now["tensors"] == base["tensors"] and now["executors"] == base["executors"], (base, now)
    assert now["allocations"] == base["allocations"], (base, now)


def _launch_both(ffi: Any, lib: Any, world: World, op: str, execs: list[Any], ws_sizes: list[int],
                 how: str) -> None:
    fn = lib.aclnnMoeDistributeDispatchV5 if op == "dispatch" else lib.aclnnMoeDistributeCombineV5
    repeat = how == "repeat"
    if repeat:
        for e in execs:
            assert lib.aclSetAclOpExecutorRepeatable(e) == 0
    rounds = 2 if repeat else 1
    try:
        for _ in range(rounds):
            launched = []
            for r, e in enumerate(execs):
                ws_ptr, ws_size = ffi.cast("void *", world.slots[r][23].ptr), ws_sizes[r]
                assert ws_size <= SLOT_BYTES
                stream = ffi.cast("void *", world.streams[r].handle)
                if how == "ws_null":
                    ws_ptr = ffi.NULL
                elif how == "ws_small":
                    ws_size = max(ws_size - 1, 0)
                elif how == "ws_host":
                    host = np.zeros(max(ws_size, 64), np.uint8)
                    ws_ptr = ffi.cast("void *", host.ctypes.data)
                elif how == "ws_freed":
                    cell = ffi.new("void **")
                    assert lib.aclrtMalloc(cell, max(ws_size, 64), 0) == 0
                    assert lib.aclrtFree(cell[0]) == 0
                    ws_ptr = cell[0]
                elif how == "stream_bad":
                    stream = ffi.cast("aclrtStream", 0x5A7E00000000DEA0)
                ret = fn(ws_ptr, ws_size, e, stream)
                if ret:
                    msg = _msg(ffi, lib)
                    assert ret in LAUNCH_CODES, f"launch of {op} on rank {r} returned {ret}: {msg}"
                    assert msg, f"launch of {op} on rank {r} returned {ret} without a message"
                else:
                    launched.append(r)
            if len(launched) == 1:
                # The peer's launch was refused: give the launched rank a mismatching collective call so
                # that it fails at once (call-order mismatch) instead of waiting for the timeout.
                other = 1 - launched[0]
                assert lib.HcclBarrier(ffi.cast("void *", world.comms[other].handle), ffi.cast("void *", world.streams[other].handle)) == 0
            world.counts["launched"] += len(launched)
            for r in range(W):
                ret = lib.aclrtSynchronizeStream(ffi.cast("void *", world.streams[r].handle))
                msg = _msg(ffi, lib) if ret else ""
                assert ret in (0, KERNEL_FAIL), f"stream of rank {r} after {op}: {ret}: {msg}"
                if ret:
                    assert msg
                    world.counts["kernel_failed"] += 1
                    if os.environ.get("ACLNN_FUZZ_VERBOSE"):
                        print(f"kernel {op} rank {r}: {msg[:200]}")
                elif r in launched:
                    world.counts["kernel_ok"] += 1
        if repeat:
            # rebinding: in and out of range, unaligned; 0 or 161002, never UB
            for r, e in enumerate(execs):
                one = ffi.new("int64_t[]", [1])
                t = lib.aclCreateTensor(one, 1, FLOAT, ffi.NULL, 0, ND, one, 1, ffi.NULL)
                for idx, addr in ((1, world.slots[r][1].ptr), (99, world.slots[r][1].ptr),
                                  (0, world.slots[r][0].ptr + 8)):
                    ret = lib.aclSetInputTensorAddr(e, idx, t, ffi.cast("void *", addr))
                    assert ret in (0, 161002), ret
                    if ret:
                        assert _msg(ffi, lib)
                assert lib.aclDestroyTensor(t) == 0
    finally:
        if repeat:
            for e in execs:
                assert lib.aclDestroyAclOpExecutor(e) == 0
