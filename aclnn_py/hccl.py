"""HCCL communicators, root info and the MoE context tensor (ABI.md §0 and §3.3, SPEC §8).

A world of ``world_size`` ranks is formed from one :class:`RootInfo` made on one rank (or by a
launcher) and handed to every rank out of band (``bytes(root)``, 4108 bytes)::

    root = RootInfo.create()                       # once, e.g. by aclnn_py.launch
    comm = Communicator(world_size, rank, root)    # on every rank; returns when all joined
    ctx, ccl_buffer_size = build_context(comm)     # the int32 (4100,) tensor dispatch/combine take

On the mock, ranks may be threads of one process or separate processes; each rank's window is
``2 * HCCL_BUFFSIZE`` MiB of shared memory that every rank maps.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import numpy as np

from .errors import HcclError, check_hccl
from .runtime import _b, as_stream
from .tensor import Tensor

ROOT_INFO_BYTES = 4108
COMM_NAME_MAX_LENGTH = 128
HCCL_COMM_ENGINE_AIV = 4
HCCL_OP_TYPE_ALLTOALL = 8
ALG_CONFIG_ALLTOALL = "AlltoAll=level0:fullmesh;level1:pairwise"

#: Bytes of the context struct (SPEC §8): epRankId, rankSizePerServer, kfcContextAddr,
#: epHcclBuffer_[1024], hcommHandle_[1024].
CONTEXT_BYTES = 4 + 4 + 8 + 8 * 1024 + 8 * 1024
CONTEXT_INT32 = CONTEXT_BYTES // 4          # 4100
MAX_EP_RANKS = 1024
#: rankSizePerServer as CANN's Python context manager leaves it in KFC mode (only the 950 channel
#: builder sets another value).
DEFAULT_RANK_SIZE_PER_SERVER = 2


class RootInfo:
    """The 4108-byte ``HcclRootInfo`` blob that identifies one world."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes | bytearray | memoryview):
        data = bytes(data)
        if len(data) != ROOT_INFO_BYTES:
            raise ValueError(f"HcclRootInfo must be {ROOT_INFO_BYTES} bytes (got {len(data)})")
        self._data = data

    @classmethod
    def create(cls) -> RootInfo:
        """``HcclGetRootInfo``: a new world id (call on one rank only, then broadcast the bytes)."""
        b = _b()
        cell = b.ffi.new("HcclRootInfo *")
        check_hccl(b.lib.HcclGetRootInfo(cell), "HcclGetRootInfo")
        return cls(b.ffi.buffer(cell)[:])

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> RootInfo:
        return cls(data)

    def __bytes__(self) -> bytes:
        return self._data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RootInfo) and other._data == self._data

    def __hash__(self) -> int:
        return hash(self._data)

    def __repr__(self) -> str:
        return f"RootInfo({self._data[:32].hex()}…)"


def _as_root(root: Any) -> RootInfo:
    if isinstance(root, RootInfo):
        return root
    if isinstance(root, (bytes, bytearray, memoryview)):
        return RootInfo(root)
    raise TypeError(f"root must be a RootInfo or its {ROOT_INFO_BYTES} bytes, got {type(root)!r}")


class Communicator:
    """One rank's HCCL communicator (``HcclCommInitRootInfo`` … ``HcclCommDestroy``).

    ``Communicator(world_size, rank, root)`` returns once every rank of the world has joined, or
    raises :class:`~aclnn_py.errors.HcclError` (``HcclError.Timeout`` after
    ``HCCL_CONNECT_TIMEOUT`` seconds, naming the ranks that never joined). `device`, when given, is
    made the calling thread's current device first; the windows belong to the device current at
    creation. Use it as a context manager or call :meth:`close`.
    """

    __slots__ = ("handle", "rank", "world_size", "name", "device", "window_address", "window_size",
                 "__weakref__")

    def __init__(self, world_size: int, rank: int, root: Any, device: int | None = None):
        b = _b()
        ffi, lib = b.ffi, b.lib
        world_size, rank = int(world_size), int(rank)
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1 (got {world_size})")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}) (got {rank})")
        info = _as_root(root)
        if device is not None:
            from .runtime import Device

            Device(device).set_current()
        self.handle = None
        cell = ffi.new("HcclRootInfo *")
        ffi.memmove(cell, bytes(info), ROOT_INFO_BYTES)
        out = ffi.new("HcclComm *")
        check_hccl(lib.HcclCommInitRootInfo(world_size, cell, rank, out), "HcclCommInitRootInfo")
        self.handle = out[0]
        try:
            name = ffi.new(f"char[{COMM_NAME_MAX_LENGTH}]")
            check_hccl(lib.HcclGetCommName(self.handle, name), "HcclGetCommName")
            self.name = ffi.string(name).decode()
            self.rank = self._query(lib.HcclGetRankId, "HcclGetRankId")
            self.world_size = self._query(lib.HcclGetRankSize, "HcclGetRankSize")
            addr, size = ffi.new("void **"), ffi.new("uint64_t *")
            check_hccl(lib.HcclGetHcclBuffer(self.handle, addr, size), "HcclGetHcclBuffer")
            self.window_address = int(ffi.cast("uintptr_t", addr[0]))
            self.window_size = int(size[0])
            cur = ffi.new("int32_t *")
            self.device = int(cur[0]) if lib.aclrtGetDevice(cur) == 0 else 0
        except BaseException:
            self.close()
            raise

    def _query(self, fn: Any, what: str) -> int:
        cell = _b().ffi.new("uint32_t *")
        check_hccl(fn(self._live(), cell), what)
        return int(cell[0])

    def _live(self) -> Any:
        if self.handle is None:
            raise ValueError("the communicator is closed")
        return self.handle

    @property
    def closed(self) -> bool:
        return self.handle is None

    @property
    def address(self) -> int:
        """The ``HcclComm`` handle as an integer (for C code that takes one)."""
        return int(_b().ffi.cast("uintptr_t", self._live()))

    def peer_window(self, rank: int) -> tuple[int, int]:
        """(address, bytes) of rank `rank`'s window as mapped in this process
        (``HcclGetRemoteIpcHcclBuf``; the own window for rank == self.rank)."""
        b = _b()
        if int(rank) == self.rank:
            return self.window_address, self.window_size
        addr, size = b.ffi.new("void **"), b.ffi.new("uint64_t *")
        check_hccl(b.lib.HcclGetRemoteIpcHcclBuf(self._live(), int(rank), addr, size),
                   "HcclGetRemoteIpcHcclBuf")
        return int(b.ffi.cast("uintptr_t", addr[0])), int(size[0])

    def barrier(self, stream: Any = None, wait: bool | None = None) -> None:
        """``HcclBarrier`` enqueued on `stream` (default: the current device's default stream).
        With `wait` (default: True when no stream is given), the stream is then synchronised, so a
        peer that never arrives raises the runtime's timeout error (``AclError.Timeout``) naming it."""
        b = _b()
        s = as_stream(stream)
        check_hccl(b.lib.HcclBarrier(self._live(), s), "HcclBarrier")
        if wait is None:
            wait = stream is None
        if wait:
            from .errors import check_acl

            check_acl(b.lib.aclrtSynchronizeStream(s), "aclrtSynchronizeStream")

    def async_error(self) -> int:
        """``HcclGetCommAsyncError``: 0, or HCCL_E_REMOTE (21) once a peer's process is found dead."""
        b = _b()
        cell = b.ffi.new("HcclResult *")
        check_hccl(b.lib.HcclGetCommAsyncError(self._live(), cell), "HcclGetCommAsyncError")
        return int(cell[0])

    def close(self) -> None:
        """``HcclCommDestroy``: unmap the windows. Work queued on streams that uses this
        communicator should be synchronised first. Idempotent."""
        h, self.handle = self.handle, None
        if h is not None:
            check_hccl(_b().lib.HcclCommDestroy(h), "HcclCommDestroy")

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "handle", None) is not None:
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        state = ("closed" if self.handle is None
                 else f"window 0x{self.window_address:x} ({self.window_size} bytes)")
        return f"Communicator(rank {getattr(self, 'rank', '?')}/{getattr(self, 'world_size', '?')}, {state})"


def error_string(code: int) -> str:
    """``HcclGetErrorString``."""
    b = _b()
    p = b.lib.HcclGetErrorString(int(code))
    return "" if p == b.ffi.NULL else b.ffi.string(p).decode(errors="replace")


# Every cffi call releases and retakes the GIL. When hundreds of rank threads of one process build
# their contexts at once, each of the W window queries of each rank would hand the GIL to another
# thread (W**2 thread switches); ranks take turns instead, each querying its W windows in one go.
_WINDOW_QUERIES = threading.Lock()


def context_bytes(comm: Communicator) -> tuple[bytes, int]:
    """The 16,400-byte context struct for `comm` (docs/concepts.md), and the window size in bytes,
    built with CANN's own KFC sequence:

    allocate op args → comm engine 4 (AIV) → alg config ``AlltoAll=level0:fullmesh;level1:pairwise``
    → the communicator by its name → op resource context of op type 8 (all-to-all), stored as
    kfcContextAddr → check rank id and rank size → free op args → every rank's window address
    (own: ``HcclGetHcclBuffer``, which also gives cclBufferSize; others: ``HcclGetRemoteIpcHcclBuf``).
    """
    b = _b()
    ffi, lib = b.ffi, b.lib
    comm._live()
    if comm.world_size > MAX_EP_RANKS:
        raise ValueError(f"the context holds at most {MAX_EP_RANKS} ranks (world size {comm.world_size})")
    args_cell = ffi.new("void **")
    check_hccl(lib.HcclKfcAllocOpArgs(args_cell), "HcclKfcAllocOpArgs")
    op_args = args_cell[0]
    try:
        check_hccl(lib.HcclKfcOpArgsSetCommEngine(op_args, HCCL_COMM_ENGINE_AIV),
                   "HcclKfcOpArgsSetCommEngine")
        alg = ffi.new("char[]", ALG_CONFIG_ALLTOALL.encode())
        check_hccl(lib.HcclKfcOpArgsSetAlgConfig(op_args, alg), "HcclKfcOpArgsSetAlgConfig")
        h = ffi.new("HcclComm *")
        check_hccl(lib.HcclCommGetHandleWithName(comm.name.encode(), h), "HcclCommGetHandleWithName")
        ctx = ffi.new("void **")
        check_hccl(lib.HcclCreateOpResCtx(h[0], HCCL_OP_TYPE_ALLTOALL, op_args, ctx), "HcclCreateOpResCtx")
        kfc_addr = int(ffi.cast("uintptr_t", ctx[0]))
        cell = ffi.new("uint32_t *")
        check_hccl(lib.HcclGetRankId(h[0], cell), "HcclGetRankId")
        rank = int(cell[0])
        check_hccl(lib.HcclGetRankSize(h[0], cell), "HcclGetRankSize")
        size = int(cell[0])
        if rank != comm.rank or size != comm.world_size:
            raise HcclError("HcclCommGetHandleWithName", 4, "HCCL_E_INTERNAL",
                            f"the communicator named {comm.name!r} is rank {rank} of {size}, expected rank "
                            f"{comm.rank} of {comm.world_size}")
    except BaseException:
        lib.HcclKfcFreeOpArgs(op_args)
        raise
    check_hccl(lib.HcclKfcFreeOpArgs(op_args), "HcclKfcFreeOpArgs")

    windows = [0] * MAX_EP_RANKS
    addr, wsize = ffi.new("void **"), ffi.new("uint64_t *")
    check_hccl(lib.HcclGetHcclBuffer(h[0], addr, wsize), "HcclGetHcclBuffer")
    ccl_buffer_size = int(wsize[0])
    windows[rank] = int(ffi.cast("uintptr_t", addr[0]))
    remote = lib.HcclGetRemoteIpcHcclBuf
    with _WINDOW_QUERIES:
        for r in range(size):
            if r != rank:
                rc = remote(h[0], r, addr, wsize)
                if rc:
                    check_hccl(rc, "HcclGetRemoteIpcHcclBuf")
                windows[r] = int(ffi.cast("uintptr_t", addr[0]))
    blob = struct.pack(f"<IIQ{MAX_EP_RANKS}Q{MAX_EP_RANKS}Q", rank, DEFAULT_RANK_SIZE_PER_SERVER, kfc_addr,
                       *windows, *([0] * MAX_EP_RANKS))
    assert len(blob) == CONTEXT_BYTES
    return blob, ccl_buffer_size


def build_context(comm: Communicator, stream: Any = None) -> tuple[Tensor, int]:
    """The MoE context tensor for `comm`: an int32 (4100,) device tensor holding the struct of
    SPEC §8 (see :func:`context_bytes`), and ``ccl_buffer_size``, the window size in bytes."""
    blob, ccl_buffer_size = context_bytes(comm)
    arr = np.frombuffer(blob, dtype="<i4").copy()
    tensor = Tensor.from_numpy(arr, stream=stream)
    return tensor, ccl_buffer_size


def parse_context(data: Any) -> dict[str, Any]:
    """Decode a context (bytes, an int32 array or a Tensor) into its SPEC §8 fields (for tests and
    diagnostics): ep_rank_id, rank_size_per_server, kfc_context_addr, windows (list of 1024)."""
    if isinstance(data, Tensor):
        data = data.numpy()
    raw = bytes(np.ascontiguousarray(data).view(np.uint8)) if isinstance(data, np.ndarray) else bytes(data)
    if len(raw) < 16 + 8 * MAX_EP_RANKS:
        raise ValueError(f"a context has at least {16 + 8 * MAX_EP_RANKS} bytes (got {len(raw)})")
    rank, per_server, kfc = struct.unpack_from("<IIQ", raw, 0)
    windows = list(struct.unpack_from(f"<{MAX_EP_RANKS}Q", raw, 16))
    return {"ep_rank_id": rank, "rank_size_per_server": per_server, "kfc_context_addr": kfc,
            "windows": windows}


__all__ = ["RootInfo", "Communicator", "build_context", "context_bytes", "parse_context", "error_string",
           "ROOT_INFO_BYTES", "CONTEXT_INT32", "CONTEXT_BYTES"]
