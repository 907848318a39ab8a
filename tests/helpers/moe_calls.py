"""Raw phase-1 calls of the MoE ops for the negative tests: every argument (tensor, NULL, a destroyed
or FRACTAL_NZ descriptor, an attribute) can be replaced, and unspecified outputs are sized from the
attributes (the output sizes of docs/operators.md, computed here independently of the mock), so one
test breaks exactly one rule."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


class _Null:
    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


@dataclass
class RawDesc:
    """A descriptor made with aclCreateTensor directly (format, or destroyed after creation)."""
    shape: tuple
    dtype: int
    fmt: int = 2            # ACL_FORMAT_ND
    destroyed: bool = False
    strides: tuple | None = None


class World2:
    """Two communicators of one thread world (or `ranks` of them), usable from the test thread
    afterwards."""

    def __init__(self, before_context: Any = None, ranks: int = 2) -> None:
        from aclnn_py import Device
        from aclnn_py.hccl import Communicator, RootInfo, build_context

        root = RootInfo.create()
        self.comms: list[Any] = [None] * ranks
        errs: list[BaseException] = []

        def join(r: int) -> None:
            try:
                Device(r).set_current()
                self.comms[r] = Communicator(ranks, r, root)
            except BaseException as e:  # noqa: BLE001
                errs.append(e)

        ts = [threading.Thread(target=join, args=(r,)) for r in range(ranks)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errs:
            raise errs[0]
        Device(0).set_current()
        if before_context is not None:
            for c in self.comms:
                before_context(c)
        self.ctx = [build_context(c) for c in self.comms]

    def close(self) -> None:
        for c in self.comms:
            c.close()


def _np_of(dt: int) -> np.dtype:
    from aclnn_py.dtypes import DataType, to_numpy

    return to_numpy(DataType(dt))


class Call:
    """One phase-1 call. `attrs` holds the integer/string attributes; `tensors` maps argument names
    to a Tensor, a numpy array, NULL, a RawDesc, or is left unset (→ a valid default)."""

    op = ""
    INPUTS: tuple[str, ...] = ()
    OUTPUTS: tuple[str, ...] = ()

    def __init__(self, world: World2, rank: int = 0, **attrs: Any):
        self.world = world
        self.rank = rank
        self.attrs = self.default_attrs()
        self.attrs.update(attrs)
        self.tensors: dict[str, Any] = {}
        self._keep: list[Any] = []

    # ---- derived sizes (computed here independently of the mock) ----
    def sizes(self) -> dict[str, int]:
        a = self.attrs
        W, R, E, K, BS = a["W"], a["R"], a["E"], a["K"], a["BS"]
        S = 0 if (R == 0 and a["S"] == 1) else a["S"]
        G = a["global_bs"] or BS * W
        max_bs = G // W
        L = E // (W - R) if 0 < W - R and E > 0 else 1
        shared = a["r"] < R
        if shared:
            P = R // S if S else 1
            A = max_bs * math.ceil(W / max(P, 1))
        else:
            A = G * min(max(L, 1), max(K, 1))
        return {"A": max(A, 1), "L": max(L, 1), "local": 1 if shared else max(L, 1),
                "slots": W if shared else W * max(L, 1)}

    def descriptor(self, v: Any) -> Any:
        from aclnn_py import Tensor

        b = __import__("aclnn_py").backend()
        ffi, lib = b.ffi, b.lib
        if v is NULL or v is None:
            return ffi.NULL
        if isinstance(v, np.ndarray):
            v = Tensor.from_numpy(v)
        if isinstance(v, Tensor):
            self._keep.append(v)
            return v.descriptor()
        if isinstance(v, RawDesc):
            n = math.prod(v.shape) if v.shape else 1
            mem = Tensor.empty((max(n, 1) * 8,), np.uint8)
            self._keep.append(mem)
            dims = ffi.new("int64_t[]", list(v.shape) or [1])
            if v.strides is None:
                st, acc = [], 1
                for d in reversed(v.shape):
                    st.insert(0, acc)
                    acc *= d
            else:
                st = list(v.strides)
            strides = ffi.new("int64_t[]", st or [1])
            d = lib.aclCreateTensor(dims, len(v.shape), v.dtype, strides, 0, v.fmt, dims, len(v.shape),
                                    ffi.cast("void *", mem.ptr))
            if v.destroyed:
                self._to_destroy.append(d)     # destroyed once every descriptor exists (no address reuse)
            else:
                self._keep.append(_Destroyer(lib, d))
            return d
        raise TypeError(v)

    def run(self) -> tuple[int, str]:
        from aclnn_py.errors import _recent_message

        b = __import__("aclnn_py").backend()
        ffi, lib = b.ffi, b.lib
        self._to_destroy: list[Any] = []
        args = self.arguments(ffi)
        for d in self._to_destroy:
            lib.aclDestroyTensor(d)
        ret = getattr(lib, self.op + "GetWorkspaceSize")(*args)
        msg = _recent_message() or ""
        ex = args[-1]
        if ret == 0 and ex != ffi.NULL and ex[0] != ffi.NULL:
            # phase 1 passed: release the executor (made repeatable, the documented way to destroy
            # one that is never launched) so the tests leave no live executors behind
            assert lib.aclSetAclOpExecutorRepeatable(ex[0]) == 0
            assert lib.aclDestroyAclOpExecutor(ex[0]) == 0
        self._keep.clear()
        return int(ret), msg

    def ccl(self) -> int:
        return self.attrs["ccl"] if self.attrs.get("ccl") is not None else self.world.ctx[self.rank][1]

    def context(self) -> Any:
        return self.tensors.get("context", self.world.ctx[self.rank][0])


class _Destroyer:
    def __init__(self, lib: Any, d: Any):
        self.lib, self.d = lib, d

    def __del__(self) -> None:
        try:
            self.lib.aclDestroyTensor(self.d)
        except Exception:
            pass


class DispatchCall(Call):
    op = "aclnnMoeDistributeDispatchV5"
    INPUTS = ("context", "x", "expert_ids", "scales", "x_active_mask", "expert_scales", "elastic_info",
              "performance_info")
    OUTPUTS = ("expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
               "tp_recv_counts", "expand_scales")

    @staticmethod
    def default_attrs() -> dict[str, Any]:
        return dict(W=2, r=0, E=4, ccl=None, tp_world=0, tp_rank=0, shard=0, S=1, R=0, quant=0, global_bs=0,
                    ent_type=1, comm_alg="", Z=0, C=0, Q=0, BS=4, H=1024, K=2, dtype=BF16)

    def defaults(self) -> dict[str, Any]:
        a, z = self.attrs, self.sizes()
        dt = a["dtype"]
        es = self.tensors.get("expert_scales")
        has_es = es is not None and es is not NULL and not (isinstance(es, np.ndarray) and 0 in es.shape)
        return {
            "context": self.context(),
            "x": np.zeros((a["BS"], a["H"]), dt),
            "expert_ids": np.zeros((a["BS"], a["K"]), np.int32),
            "scales": None, "x_active_mask": None, "expert_scales": None, "elastic_info": None,
            "performance_info": None,
            "expand_x": np.zeros((z["A"], a["H"]), dt if a["quant"] == 0 else np.int8),
            "dynamic_scales": np.zeros((z["A"],), np.float32),
            "assist_info_for_combine": np.zeros((z["A"] * 128,), np.int32),
            "expert_token_nums": np.zeros((z["local"],), np.int64),
            "ep_recv_counts": np.zeros((z["slots"],), np.int32),
            "tp_recv_counts": np.zeros((0,), np.int32),
            "expand_scales": np.zeros((z["A"] if has_es else 0,), np.float32),
        }

    def arguments(self, ffi: Any) -> list[Any]:
        a = self.attrs
        d = self.defaults()
        d.update(self.tensors)
        ins = [self.descriptor(d[n]) for n in self.INPUTS]
        outs = [self.descriptor(d[n]) for n in self.OUTPUTS]
        ws = self.tensors.get("workspaceSize", ffi.new("uint64_t *"))
        ex = self.tensors.get("executor", ffi.new("aclOpExecutor **"))
        ws = ffi.NULL if ws is NULL else ws
        ex = ffi.NULL if ex is NULL else ex
        alg = ffi.NULL if a["comm_alg"] is None else ffi.new("char[]", a["comm_alg"].encode())
        self._keep.append(alg)
        return [*ins, a["W"], a["r"], a["E"], self.ccl(), a["tp_world"], a["tp_rank"], a["shard"], a["S"], a["R"],
                a["quant"], a["global_bs"], a["ent_type"], alg, a["Z"], a["C"], a["Q"], *outs, ws, ex]


class CombineCall(Call):
    op = "aclnnMoeDistributeCombineV5"
    INPUTS = ("context", "expand_x", "expert_ids", "assist_info_for_combine", "ep_send_counts", "expert_scales",
              "tp_send_counts", "x_active_mask", "activation_scale", "weight_scale", "group_list",
              "expand_scales", "shared_expert_x", "elastic_info", "ori_x", "const_expert_alpha_1",
              "const_expert_alpha_2", "const_expert_v", "performance_info")
    OUTPUTS = ("x_out",)

    @staticmethod
    def default_attrs() -> dict[str, Any]:
        return dict(W=2, r=0, E=4, ccl=None, tp_world=0, tp_rank=0, shard=0, S=1, R=0, global_bs=0, out_dtype=0,
                    comm_quant=0, group_list_type=0, comm_alg="", Z=0, C=0, Q=0, BS=4, H=1024, K=2, dtype=BF16)

    def defaults(self) -> dict[str, Any]:
        a, z = self.attrs, self.sizes()
        dt = a["dtype"]
        d = {n: None for n in self.INPUTS}
        d.update({
            "context": self.context(),
            "expand_x": np.zeros((z["A"], a["H"]), dt),
            "expert_ids": np.zeros((a["BS"], a["K"]), np.int32),
            "assist_info_for_combine": np.zeros((z["A"] * 128,), np.int32),
            "ep_send_counts": np.zeros((z["slots"],), np.int32),
            "expert_scales": np.zeros((0,), np.float32),
            "x_out": np.zeros((a["BS"], a["H"]), dt),
        })
        if a["C"] or a["Q"]:
            d["ori_x"] = np.zeros((a["BS"], a["H"]), dt)
        if a["Q"]:
            for n in ("const_expert_alpha_1", "const_expert_alpha_2", "const_expert_v"):
                d[n] = np.zeros((a["Q"], a["H"]), dt)
        return d

    def arguments(self, ffi: Any) -> list[Any]:
        a = self.attrs
        d = self.defaults()
        d.update(self.tensors)
        ins = [self.descriptor(d[n]) for n in self.INPUTS]
        out = self.descriptor(d["x_out"])
        ws = self.tensors.get("workspaceSize", ffi.new("uint64_t *"))
        ex = self.tensors.get("executor", ffi.new("aclOpExecutor **"))
        ws = ffi.NULL if ws is NULL else ws
        ex = ffi.NULL if ex is NULL else ex
        alg = ffi.NULL if a["comm_alg"] is None else ffi.new("char[]", a["comm_alg"].encode())
        self._keep.append(alg)
        return [*ins, a["W"], a["r"], a["E"], self.ccl(), a["tp_world"], a["tp_rank"], a["shard"], a["S"], a["R"],
                a["global_bs"], a["out_dtype"], a["comm_quant"], a["group_list_type"], alg, a["Z"], a["C"], a["Q"],
                out, ws, ex]


def expect(call: Call, code: int, *texts: str) -> str:
    """Run `call`; assert its status is `code` and its message holds every one of `texts`."""
    ret, msg = call.run()
    assert ret == code, f"status {ret}, message {msg!r}"
    for t in texts:
        assert t in msg, f"{t!r} not in {msg!r}"
    return msg


__all__ = ["NULL", "RawDesc", "World2", "DispatchCall", "CombineCall", "BF16", "field", "expect"]
