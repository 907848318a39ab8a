"""The group-string generations (aclnnMoeDistributeDispatch/Combine and V2, V3, V4) called through the raw
cffi binding, on an EP x TP world of thread ranks: rank (e, t) is rank e of EP communicator t and,
with a TP domain, rank t of TP communicator e. The argument lists follow the generation's header;
the outputs are read back for the comparison with aclnn_py.golden."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32
I32 = np.int32


@dataclass
class GenCase:
    """One seeded configuration: generation, EP world W, TP size tp (1 = no TP domain), quant and
    comm quant modes, sizes, the shared-expert placement, x_active_mask (0 none, 1-D, 2-D) and, from
    the third generation on, `special` zero experts and as many copy experts."""
    gen: int
    W: int
    tp: int = 1
    quant: int = 0
    comm_quant: int = 0
    BS: int = 3
    H: int = 0            # 0: 7168 for the first generation (its only H), else 1024
    K: int = 2
    S: int = 1
    R: int = 0
    dtype: Any = BF16
    weights: bool = True
    ent_type: int = 1
    seed: int = 0
    mask: int = 0
    special: int = 0
    escales: bool = False  # dispatch takes expert_scales (the router weights) and returns expand_scales
    E: int = field(init=False)

    def __post_init__(self) -> None:
        # one local expert per MoE rank: the only layout a TP domain allows
        self.E = self.W - self.R
        self.H = self.H or (7168 if self.gen == 1 else 1024)

    @property
    def op_suffix(self) -> str:
        return "" if self.gen == 1 else f"V{self.gen}"

    @property
    def shared(self) -> int:
        return 0 if (self.R == 0 and self.S == 1) else self.S

    def capacity(self, e: int) -> int:
        """A of EP rank e (docs/operators.md, derived sizes)."""
        if e < self.R:
            return self.BS * -(-self.W // (self.R // self.shared))
        return self.BS * self.W * min(1, self.K)

    def routing_len(self, capacity: int) -> int:
        """Elements of dispatch's routing output: expand_idx (BS*K,) or assist_info (A*128,)."""
        return self.BS * self.K if self.gen == 1 else capacity * 128

    def label(self) -> str:
        extra = (f"-m{self.mask}" if self.mask else "") + (f"-z{self.special}" if self.special else "") + \
            ("-es" if self.escales else "")
        return f"V{self.gen}-W{self.W}-tp{self.tp}-q{self.quant}-cq{self.comm_quant}-R{self.R}{extra}-s{self.seed}"


@dataclass
class Inputs:
    x: list[list[np.ndarray]]        # [t][e]
    ids: list[list[np.ndarray]]
    weights: list[list[np.ndarray]]
    scales: np.ndarray | None
    mask: list[list[np.ndarray]] | None = None


def _mask(c: GenCase, rng: np.random.Generator) -> np.ndarray:
    if c.mask == 1:   # the first n tokens take part
        return np.arange(c.BS) < rng.integers(1, c.BS + 1)
    return rng.random((c.BS, c.K)) < 0.7


def make_inputs(c: GenCase) -> Inputs:
    rng = np.random.default_rng(c.seed)
    x, ids, w = [], [], []
    for _t in range(c.tp):
        x.append([rng.standard_normal((c.BS, c.H)).astype(F32).astype(c.dtype) for _ in range(c.W)])
        ids.append([np.stack([rng.permutation(c.E + 2 * c.special)[:c.K] for _ in range(c.BS)]).astype(I32)
                    for _ in range(c.W)])
        w.append([rng.random((c.BS, c.K)).astype(F32) for _ in range(c.W)])
    scales = None
    if c.quant == 2 and c.seed % 2:
        rows = c.E + c.shared if c.R else c.E
        scales = (0.5 + rng.random((rows, c.H))).astype(F32)
    masks = [[_mask(c, rng) for _ in range(c.W)] for _ in range(c.tp)] if c.mask else None
    return Inputs(x, ids, w, scales, masks)


def expert(c: GenCase, t: int, rows: np.ndarray, dyn: np.ndarray | None) -> np.ndarray:
    """TP rank t's partial expert output: the (dequantised) rows scaled by a row- and rank-dependent
    factor, in the row dtype."""
    xf = rows.astype(F32) * dyn.astype(F32)[:, None] if c.quant == 2 else rows.astype(F32)
    f = ((1.0 + (np.arange(rows.shape[0]) % 5).astype(F32) / 8) * F32(0.5 + 0.25 * t)).astype(F32)[:, None]
    return (xf * f).astype(c.dtype)


class World:
    """W * tp thread ranks, each with its EP (and TP) communicator and a stream."""

    def __init__(self, c: GenCase):
        from aclnn_py import Device
        from aclnn_py.hccl import Communicator, RootInfo

        self.c = c
        ep_roots = [RootInfo.create() for _ in range(c.tp)]
        tp_roots = [RootInfo.create() for _ in range(c.W)] if c.tp == 2 else []
        self.ep: dict[tuple[int, int], Any] = {}
        self.tp: dict[tuple[int, int], Any] = {}
        self.streams: dict[tuple[int, int], Any] = {}

        def join(e: int, t: int) -> None:
            dev = e * c.tp + t
            Device(dev).set_current()
            self.ep[e, t] = Communicator(c.W, e, ep_roots[t], device=dev)
            if c.tp == 2:
                self.tp[e, t] = Communicator(2, t, tp_roots[e], device=dev)
            self.streams[e, t] = Device(dev).create_stream()

        run_ranks(c, join)

    def close(self) -> None:
        for d in (self.tp, self.ep):
            for comm in d.values():
                comm.close()


def run_ranks(c: GenCase, fn: Any) -> None:
    """fn(e, t) for every EP rank e and TP rank t, each on a thread of its own."""
    run_each(fn, [(e, t) for t in range(c.tp) for e in range(c.W)])


def run_each(fn: Any, calls: list[tuple[Any, ...]]) -> None:
    """fn(*args) for each args of `calls`, each on a thread of its own (a world's ranks wait for each
    other); the first exception of any of them is raised once all have ended."""
    errs: list[BaseException] = []

    def body(*args: Any) -> None:
        try:
            fn(*args)
        except BaseException as ex:  # noqa: BLE001
            errs.append(ex)

    ts = [threading.Thread(target=body, args=args) for args in calls]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    if errs:
        raise errs[0]


def _launch(lib: Any, ffi: Any, op: str, args: list[Any], stream: Any) -> None:
    from aclnn_py import Tensor
    from aclnn_py.errors import _recent_message

    ws = ffi.new("uint64_t *")
    ex = ffi.new("aclOpExecutor **")
    ret = getattr(lib, op + "GetWorkspaceSize")(*args, ws, ex)
    assert ret == 0, f"{op}GetWorkspaceSize: {ret} {_recent_message()}"
    buf = Tensor.empty((max(int(ws[0]), 1),), np.uint8)
    ret = getattr(lib, op)(ffi.cast("void *", buf.ptr), ws[0], ex[0], ffi.cast("aclrtStream", stream.handle))
    assert ret == 0, f"{op}: {ret} {_recent_message()}"
    stream.synchronize()
    buf.close()


def dispatch_args(gen: int, d: Any, ins: dict[str, Any], attrs: dict[str, Any], outs: dict[str, Any],
                  ffi: Any) -> list[Any]:
    """The argument list of aclnnMoeDistributeDispatchV{gen}GetWorkspaceSize, without the last two."""
    tensors = [d(ins["x"]), d(ins["expert_ids"]), d(ins.get("scales")), d(ins.get("x_active_mask")),
               d(ins.get("expert_scales"))]
    a = attrs
    if gen == 1:   # no comm_alg
        mid = [a["group_ep"], a["W"], a["r"], a["E"], a["group_tp"], a["tp_world"], a["tp_rank"], 0, a["S"], a["R"],
               a["quant"], 0, a["ent_type"]]
        return tensors + mid + [d(outs[k]) for k in ("expand_x", "dynamic_scales", "assist_info", "expert_token_nums",
                                                      "ep_recv_counts", "tp_recv_counts", "expand_scales")]
    if gen >= 3:
        tensors.append(d(ins.get("elastic_info")))
    if gen >= 4:
        tensors.append(d(ins.get("performance_info")))
    mid = [a["group_ep"], a["W"], a["r"], a["E"], a["group_tp"], a["tp_world"], a["tp_rank"], 0, a["S"], a["R"],
           a["quant"], 0, a["ent_type"], ffi.NULL]
    special = [a["Z"], a["C"], 0] if gen >= 3 else []
    out = [d(outs[k]) for k in ("expand_x", "dynamic_scales", "assist_info", "expert_token_nums", "ep_recv_counts",
                                 "tp_recv_counts", "expand_scales")]
    return tensors + mid + special + out


def combine_args(gen: int, d: Any, ins: dict[str, Any], attrs: dict[str, Any], x_out: Any, ffi: Any) -> list[Any]:
    """The argument list of aclnnMoeDistributeCombineV{gen}GetWorkspaceSize, without the last two."""
    tensors = [d(ins["expand_x"]), d(ins["expert_ids"]), d(ins["assist_info"]), d(ins["ep_send_counts"]),
               d(ins["expert_scales"]), d(ins.get("tp_send_counts")), d(ins.get("x_active_mask")), d(None), d(None),
               d(None), d(None)]
    a = attrs
    if gen == 1:   # no shared_expert_x, no comm_alg
        mid = [a["group_ep"], a["W"], a["r"], a["E"], a["group_tp"], a["tp_world"], a["tp_rank"], 0, a["S"], a["R"], 0,
               a.get("out_dtype", 0), a["comm_quant"], a.get("group_list_type", 0)]
        return tensors + mid + [d(x_out)]
    tensors.append(d(None))               # shared_expert_x
    if gen >= 3:
        # elastic_info, ori_x, const_expert_alpha_1 / _2, const_expert_v
        tensors += [d(ins.get("elastic_info")), d(ins.get("ori_x")), d(None), d(None), d(None)]
    if gen >= 4:
        tensors.append(d(ins.get("performance_info")))
    mid = [a["group_ep"], a["W"], a["r"], a["E"], a["group_tp"], a["tp_world"], a["tp_rank"], 0, a["S"], a["R"], 0,
           a.get("out_dtype", 0), a["comm_quant"], a.get("group_list_type", 0), ffi.NULL]
    special = [a["Z"], a["C"], 0] if gen >= 3 else []
    return tensors + mid + special + [d(x_out)]


@dataclass
class RankOut:
    expand_x: np.ndarray
    dynamic_scales: np.ndarray | None
    assist_info: np.ndarray
    expert_token_nums: np.ndarray
    ep_recv_counts: np.ndarray
    tp_recv_counts: np.ndarray | None
    num_rows: int
    x_out: np.ndarray | None = None
    expand_scales: np.ndarray | None = None


def rank_round(c: GenCase, inp: Inputs, e: int, t: int, group_ep: str, group_tp: str, stream: Any,
               tp_send_counts: Any = None, elastic_info: np.ndarray | None = None) -> RankOut:
    """Rank (e, t)'s dispatch, the expert function on what arrived, and its combine (with
    `tp_send_counts(dispatch's tp_recv_counts)` instead of them when given; both with `elastic_info`
    when given: a dynamic shrink, where `e` is the physical rank)."""
    import aclnn_py
    from aclnn_py import Device, Tensor

    b = aclnn_py.backend()
    ffi, lib = b.ffi, b.lib
    Device(e * c.tp + t).set_current()
    keep: list[Any] = []

    def d(v: Any) -> Any:
        if v is None:
            return ffi.NULL
        if isinstance(v, np.ndarray):
            v = Tensor.from_numpy(v)
            keep.append(v)
        return v.descriptor()

    A = c.capacity(e)
    # receive slots written: W (one local expert), W' in a shrunk world
    slots = int(elastic_info[1]) if elastic_info is not None and elastic_info[0] else c.W
    ydt = np.int8 if c.quant == 2 else c.dtype
    outs = {"expand_x": Tensor.empty((A * c.tp, c.H), ydt), "dynamic_scales": Tensor.empty((A * c.tp,), F32),
            "assist_info": Tensor.empty((c.routing_len(A),), I32), "expert_token_nums": Tensor.empty((1,), np.int64),
            "ep_recv_counts": Tensor.empty((c.W * c.tp,), I32),
            "tp_recv_counts": Tensor.empty((2,), I32) if c.tp == 2 else None,
            "expand_scales": Tensor.empty((A * c.tp,), F32) if c.escales else None}
    attrs = dict(group_ep=ffi.new("char[]", group_ep.encode()), group_tp=ffi.new("char[]", group_tp.encode()),
                 W=c.W, r=e, E=c.E, tp_world=c.tp if c.tp == 2 else 0, tp_rank=t, S=c.S, R=c.R, quant=c.quant,
                 ent_type=c.ent_type, comm_quant=c.comm_quant, Z=c.special, C=c.special)
    mask = inp.mask[t][e] if inp.mask else None
    ins = {"x": inp.x[t][e], "expert_ids": inp.ids[t][e], "scales": inp.scales, "x_active_mask": mask,
           "expert_scales": inp.weights[t][e] if c.escales else None, "elastic_info": elastic_info}
    _launch(lib, ffi, f"aclnnMoeDistributeDispatch{c.op_suffix}", dispatch_args(c.gen, d, ins, attrs, outs, ffi), stream)
    counts = outs["ep_recv_counts"].numpy()
    tp_counts = outs["tp_recv_counts"].numpy() if c.tp == 2 else None
    n_own = int(counts[slots - 1])
    n = n_own + (int(tp_counts[1 - t]) if tp_counts is not None else 0)
    ex = outs["expand_x"].numpy()
    dyn = outs["dynamic_scales"].numpy() if c.quant == 2 else None
    routing = outs["assist_info"].numpy()
    r = RankOut(ex[:n], dyn[:n] if dyn is not None else None, routing if c.gen == 1 else routing[:3 * n_own],
                outs["expert_token_nums"].numpy(), counts, tp_counts, n,
                expand_scales=outs["expand_scales"].numpy()[:n_own] if c.escales else None)
    y = np.zeros((A * c.tp, c.H), c.dtype)
    y[:n] = expert(c, t, r.expand_x, r.dynamic_scales)
    x_out = Tensor.empty((c.BS, c.H), c.dtype)
    cin = {"expand_x": y, "expert_ids": inp.ids[t][e], "assist_info": outs["assist_info"],
           "ep_send_counts": outs["ep_recv_counts"], "expert_scales": inp.weights[t][e] if c.weights
           else np.zeros((0,), F32), "tp_send_counts": outs["tp_recv_counts"], "x_active_mask": mask,
           "ori_x": inp.x[t][e] if c.special else None, "elastic_info": elastic_info}
    if tp_send_counts is not None:
        cin["tp_send_counts"] = tp_send_counts(tp_counts)
    _launch(lib, ffi, f"aclnnMoeDistributeCombine{c.op_suffix}", combine_args(c.gen, d, cin, attrs, x_out, ffi), stream)
    r.x_out = x_out.numpy()
    for v in list(outs.values()) + [x_out] + keep:
        if v is not None:
            v.close()
    return r


def run_round(c: GenCase, world: World, inp: Inputs) -> dict[tuple[int, int], RankOut]:
    """rank_round on every rank of a thread world."""
    result: dict[tuple[int, int], RankOut] = {}

    def rank(e: int, t: int) -> None:
        result[e, t] = rank_round(c, inp, e, t, world.ep[e, t].name,
                                  world.tp[e, t].name if c.tp == 2 else "", world.streams[e, t])

    run_ranks(c, rank)
    return result


def process_rank(rank: int, world_size: int, root: bytes, c: GenCase, roots: list[bytes]) -> RankOut:
    """aclnn_py.worlds.spawn target: process `rank` = e * tp + t joins EP world t (roots[t]) and TP
    world e (roots[tp + e]) and runs its round."""
    from aclnn_py import Device
    from aclnn_py.hccl import Communicator, RootInfo

    e, t = divmod(rank, c.tp)
    Device(rank).set_current()
    ep = Communicator(c.W, e, RootInfo.from_bytes(roots[t]))
    tp = Communicator(2, t, RootInfo.from_bytes(roots[c.tp + e])) if c.tp == 2 else None
    try:
        return rank_round(c, make_inputs(c), e, t, ep.name, tp.name if tp else "", Device(rank).create_stream())
    finally:
        if tp:
            tp.close()
        ep.close()


def golden_round(c: GenCase, inp: Inputs) -> tuple[list[list[Any]], list[list[Any]]]:
    """The golden of the same round: [t][e] dispatch results and combine results."""
    from aclnn_py import golden

    kw: dict[str, Any] = dict(moe_expert_num=c.E, shared_expert_num=c.S, shared_expert_rank_num=c.R,
                              zero_expert_num=c.special, copy_expert_num=c.special)
    dkw = dict(kw, scales=inp.scales, quant_mode=c.quant, expert_token_nums_type=c.ent_type)
    if c.tp == 2:
        disp = golden.dispatch_tp(inp.x, inp.ids, x_active_mask_tp=inp.mask,
                                  expert_scales_tp=inp.weights if c.escales else None, **dkw)
    else:
        disp = [golden.dispatch(inp.x[0], inp.ids[0], x_active_mask=inp.mask[0] if inp.mask else None,
                                expert_scales=inp.weights[0] if c.escales else None, **dkw)]
    ys = [[expert(c, t, d.expand_x, d.dynamic_scales) for d in disp[t]] for t in range(c.tp)]
    if c.gen == 1:   # combine reads the rows through expand_idx: the triples it implies
        for t in range(c.tp):
            idx = golden.expand_idx(inp.ids[t])
            for d, tri in zip(disp[t], golden.assist_from_expand_idx(inp.ids[t], idx, moe_expert_num=c.E, shared_expert_num=c.S,
                                                                     shared_expert_rank_num=c.R), strict=True):
                d.assist_info_for_combine = tri
    weights = inp.weights if c.weights else None
    if c.tp == 2:
        comb = golden.combine_tp(ys, inp.ids, [[d.assist_info_for_combine for d in disp[t]] for t in (0, 1)],
                                 [[d.ep_recv_counts for d in disp[t]] for t in (0, 1)],
                                 [[d.tp_recv_counts for d in disp[t]] for t in (0, 1)],
                                 comm_quant_mode=c.comm_quant, expert_scales_tp=weights, x_active_mask_tp=inp.mask,
                                 ori_x_tp=inp.x if c.special else None, **kw)
    else:
        comb = [golden.combine(ys[0], inp.ids[0], [d.assist_info_for_combine for d in disp[0]],
                               [d.ep_recv_counts for d in disp[0]], comm_quant_mode=c.comm_quant,
                               expert_scales=weights[0] if weights else None,
                               x_active_mask=inp.mask[0] if inp.mask else None,
                               ori_x=inp.x[0] if c.special else None, **kw)]
    return disp, comb


def phase1(c: GenCase, world: World, inp: Inputs, op: str = "dispatch", e: int = 0, t: int = 0,
           attrs: dict[str, Any] | None = None, tensors: dict[str, Any] | None = None) -> tuple[int, str]:
    """One phase-1 call of rank (e, t) (on the calling thread) with valid arguments, except those
    in `attrs` (group_ep / group_tp as bytes or None for NULL, integers) and `tensors` (None = NULL);
    the executor of a passing call is released. Returns (status, message)."""
    import aclnn_py
    from aclnn_py import Device, Tensor
    from aclnn_py.errors import _recent_message

    b = aclnn_py.backend()
    ffi, lib = b.ffi, b.lib
    Device(e * c.tp + t).set_current()
    keep: list[Any] = []

    def d(v: Any) -> Any:
        if v is None:
            return ffi.NULL
        if isinstance(v, np.ndarray):
            v = Tensor.from_numpy(v)
        keep.append(v)
        return v.descriptor()

    A = c.capacity(e)
    ydt = np.int8 if c.quant == 2 else c.dtype
    a = dict(group_ep=world.ep[e, t].name.encode(), group_tp=world.tp[e, t].name.encode() if c.tp == 2 else b"",
             W=c.W, r=e, E=c.E, tp_world=c.tp if c.tp == 2 else 0, tp_rank=t, S=c.S, R=c.R, quant=c.quant,
             ent_type=c.ent_type, comm_quant=c.comm_quant, Z=c.special, C=c.special)
    a.update(attrs or {})
    for g in ("group_ep", "group_tp"):
        a[g] = ffi.NULL if a[g] is None else ffi.new("char[]", a[g])
    outs: dict[str, Any] = {
        "expand_x": Tensor.empty((A * c.tp, c.H), ydt), "dynamic_scales": Tensor.empty((A * c.tp,), F32),
        "assist_info": Tensor.empty((c.routing_len(A),), I32), "expert_token_nums": Tensor.empty((1,), np.int64),
        "ep_recv_counts": Tensor.empty((c.W * c.tp,), I32),
        "tp_recv_counts": Tensor.empty((2,), I32) if c.tp == 2 else None, "expand_scales": None,
        "expand_x_in": np.zeros((A * c.tp, c.H), c.dtype), "assist_in": np.zeros((c.routing_len(A),), I32),
        "counts_in": np.zeros((c.W * c.tp,), I32), "tp_counts_in": np.zeros((2,), I32) if c.tp == 2 else None}
    outs.update(tensors or {})
    if op == "dispatch":
        ins = {"x": inp.x[t][e], "expert_ids": inp.ids[t][e], "scales": inp.scales,
               "x_active_mask": outs.get("x_active_mask"), "expert_scales": outs.get("expert_scales"),
               "elastic_info": outs.get("elastic_info"), "performance_info": outs.get("performance_info")}
        args = dispatch_args(c.gen, d, ins, a, outs, ffi)
        name = f"aclnnMoeDistributeDispatch{c.op_suffix}"
    else:
        cin = {"expand_x": outs["expand_x_in"], "expert_ids": inp.ids[t][e], "assist_info": outs["assist_in"],
               "ep_send_counts": outs["counts_in"], "expert_scales": inp.weights[t][e],
               "tp_send_counts": outs["tp_counts_in"], "elastic_info": outs.get("elastic_info"),
               "performance_info": outs.get("performance_info")}
        args = combine_args(c.gen, d, cin, a, Tensor.empty((c.BS, c.H), c.dtype), ffi)
        name = f"aclnnMoeDistributeCombine{c.op_suffix}"
    ws = ffi.new("uint64_t *")
    ex = ffi.new("aclOpExecutor **")
    ret = getattr(lib, name + "GetWorkspaceSize")(*args, ws, ex)
    msg = _recent_message() or ""
    if ret == 0:
        assert lib.aclSetAclOpExecutorRepeatable(ex[0]) == 0
        assert lib.aclDestroyAclOpExecutor(ex[0]) == 0
    for v in keep + [o for o in outs.values() if isinstance(o, Tensor)]:
        v.close()
    return int(ret), msg
