"""The ctypes baseline of the host-overhead section: the same C calls bound the way ctypes users
write them (descriptors created and destroyed around every call), run in the same process."""

from __future__ import annotations

import ctypes
from typing import Any


class CtypesBinding:
    """A minimal ctypes binding of aclCreateTensor/aclDestroyTensor and the two op pairs."""

    def __init__(self, libraries: dict[str, list[str]]):
        g = ctypes.RTLD_GLOBAL
        self.meta = ctypes.CDLL(libraries["meta"][0], mode=g)
        self.ops = ctypes.CDLL(libraries["ops"][0], mode=g)
        vp, i64, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64
        p_i64 = ctypes.POINTER(ctypes.c_int64)
        self.meta.aclCreateTensor.restype = vp
        self.meta.aclCreateTensor.argtypes = [p_i64, u64, ctypes.c_int, p_i64, i64, ctypes.c_int, p_i64, u64, vp]
        self.meta.aclDestroyTensor.argtypes = [vp]
        self.meta.aclDestroyTensor.restype = ctypes.c_int32
        d = self.ops.aclnnMoeDistributeDispatchV5GetWorkspaceSize
        d.argtypes = [vp] * 8 + [i64] * 12 + [ctypes.c_char_p] + [i64] * 3 + [vp] * 7 + [ctypes.POINTER(u64),
                                                                                      ctypes.POINTER(vp)]
        d.restype = ctypes.c_int32
        c = self.ops.aclnnMoeDistributeCombineV5GetWorkspaceSize
        c.argtypes = [vp] * 19 + [i64] * 13 + [ctypes.c_char_p] + [i64] * 3 + [vp, ctypes.POINTER(u64),
                                                                                ctypes.POINTER(vp)]
        c.restype = ctypes.c_int32
        for name in ("aclnnMoeDistributeDispatchV5", "aclnnMoeDistributeCombineV5"):
            f = getattr(self.ops, name)
            f.argtypes = [vp, u64, vp, vp]
            f.restype = ctypes.c_int32

    def tensor(self, t: Any) -> int:
        """aclCreateTensor for an aclnn_py Tensor's layout (a new descriptor, as ctypes code does)."""
        n = len(t.shape)
        dims = (ctypes.c_int64 * n)(*t.shape)
        strides = (ctypes.c_int64 * n)(*t.strides)
        storage = (ctypes.c_int64 * 1)(t.size)
        return int(self.meta.aclCreateTensor(dims, n, int(t.dtype), strides, 0, 2, storage, 1, t.ptr))

    def _two_phase(self, op: str, ins: list[Any], outs: list[Any], attrs: list[int], alg: bytes,
                   special: list[int], stream: int, ws: int) -> None:
        """Descriptors created per call, phase 1, phase 2, descriptors destroyed."""
        descs_in = [self.tensor(t) if t is not None else None for t in ins]
        descs_out = [self.tensor(t) for t in outs]
        wsize = ctypes.c_uint64()
        ex = ctypes.c_void_p()
        ret = getattr(self.ops, f"aclnn{op}GetWorkspaceSize")(
            *descs_in, *attrs, alg, *special, *descs_out, ctypes.byref(wsize), ctypes.byref(ex))
        if ret:
            raise RuntimeError(f"ctypes {op} phase 1 failed: {ret}")
        ret = getattr(self.ops, f"aclnn{op}")(ws, wsize.value, ex, stream)
        if ret:
            raise RuntimeError(f"ctypes {op} phase 2 failed: {ret}")
        for dsc in descs_in + descs_out:
            if dsc:
                self.meta.aclDestroyTensor(dsc)

    def dispatch(self, ins: list[Any], outs: list[Any], attrs: list[int], alg: bytes, special: list[int],
                 stream: int, ws: int) -> None:
        self._two_phase("MoeDistributeDispatchV5", ins, outs, attrs, alg, special, stream, ws)

    def combine(self, ins: list[Any], outs: list[Any], attrs: list[int], alg: bytes, special: list[int],
                stream: int, ws: int) -> None:
        self._two_phase("MoeDistributeCombineV5", ins, outs, attrs, alg, special, stream, ws)
