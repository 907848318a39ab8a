"""HCCL communicators, root info and the MoE context tensor (docs/concepts.md, "Communicators and windows").

A world of ``world_size`` ranks is formed from one :class:`RootInfo` made on one rank (or by a
launcher) and handed to every rank out of band (``bytes(root)``, 4108 bytes)::

    root = RootInfo.create()                       # once, e.g. by aclnn_py.worlds
    comm = Communicator(world_size, rank, root)    # on every rank; returns when all joined
    ctx, ccl_buffer_size = build_context(comm)     # the int32 (4100,) tensor dispatch/combine take

On the mock, ranks may be threads of one process or separate processes; each rank's window is
``2 * HCCL_BUFFSIZE`` MiB of shared memory that every rank maps.
"""

from __future__ import annotations

import struct
import threading
import weakref
from typing import Any, Protocol

import numpy as np

from . import _core
from .dtypes import DataType
from .errors import HcclError, check_hccl, hccl_error, recent_message
from .runtime import Device, Resource, Stream, StreamArg, initialized, resolve_stream
from .tensor import Tensor

ROOT_INFO_BYTES: int = _core.ROOT_INFO_BYTES  # HCCL_ROOT_INFO_BYTES of include/hccl/hccl_types.h
COMM_NAME_MAX_LENGTH = 128
HCCL_COMM_ENGINE_AIV = 4
HCCL_OP_TYPE_ALLTOALL = 8
ALG_CONFIG_ALLTOALL = "AlltoAll=level0:fullmesh;level1:pairwise"

#: Bytes of the context struct CANN's builder fills: epRankId, rankSizePerServer, kfcContextAddr,
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
        b = initialized()
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


def _as_root(root: RootInfo | bytes | bytearray | memoryview) -> RootInfo:
    if isinstance(root, RootInfo):
        return root
    if isinstance(root, (bytes, bytearray, memoryview)):
        return RootInfo(root)
    raise TypeError(f"root: expected a RootInfo or its {ROOT_INFO_BYTES} bytes, got {type(root).__name__}")


def _int_arg(value: object, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{param}: expected an int, got {type(value).__name__} {value!r}")
    return int(value)


#: How often the caller of a blocking join wakes to run Python signal handlers (Ctrl-C).
_JOIN_POLL_S = 0.1


def _join(world_size: int, rank: int, root: RootInfo, device: int | None) -> Any:
    """``HcclCommInitRootInfo``. On the main thread it runs on a helper thread while this thread waits
    interruptibly: Ctrl-C raises KeyboardInterrupt here within about 100 ms, and an abandoned join
    that succeeds later destroys its communicator, so nothing is left behind. Python delivers
    KeyboardInterrupt to the main thread only: any other thread calls directly, as the ranks of a
    thread world do, which saves a helper thread and its polling per rank while the world forms; the
    ranks, which the world's completion wakes together, then take the GIL back one at a time
    (``_core.comm_init_root_info``)."""
    b = initialized()
    ffi, lib = b.ffi, b.lib
    info = bytes(root)
    if threading.current_thread() is not threading.main_thread():
        ret, handle = _core.comm_init_root_info(world_size, info, rank)  # the GIL back in turn
        if ret:
            raise hccl_error(ret, "HcclCommInitRootInfo", recent_message())
        return ffi.cast("HcclComm", handle)
    lock = threading.Lock()
    outcome: dict[str, Any] = {}
    abandoned = False

    def run() -> None:
        if device is not None:
            lib.aclrtSetDevice(device)  # the windows belong to the device current at creation
        ret, address = _core.comm_init_root_info(world_size, info, rank)
        message = recent_message() if ret else None  # error messages are per thread: read it here
        handle = ffi.cast("HcclComm", address)
        with lock:
            if abandoned:
                if ret == 0:
                    lib.HcclCommDestroy(handle)
            else:
                outcome.update(ret=ret, handle=handle, message=message)
        if device is not None:
            lib.aclrtResetDevice(device)

    worker = threading.Thread(target=run, name=f"aclnn_py-join-rank{rank}", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(_JOIN_POLL_S)
    except BaseException:
        with lock:
            abandoned = True
            if outcome.get("ret") == 0:
                lib.HcclCommDestroy(outcome["handle"])
        raise
    if outcome["ret"]:
        raise hccl_error(outcome["ret"], "HcclCommInitRootInfo", outcome["message"])
    return outcome["handle"]


class Communicator(Resource):
    """One rank's HCCL communicator (``HcclCommInitRootInfo`` … ``HcclCommDestroy``).

    ``Communicator(world_size, rank, root)`` returns once every rank of the world has joined, or
    raises :class:`~aclnn_py.HcclError` (:class:`~aclnn_py.HcclTimeoutError` after
    ``HCCL_CONNECT_TIMEOUT`` seconds, naming the ranks that never joined). The wait is interruptible
    (Ctrl-C). `device`, when given, is made the calling thread's current device first; the windows
    belong to the device current at creation. Use it as a context manager or call :meth:`close`.
    """

    __slots__ = ("_open", "_cdata", "rank", "world_size", "name", "device", "window_address", "window_size",
                 "_plans", "__weakref__")

    def __init__(self, world_size: int, rank: int, root: RootInfo | bytes | bytearray | memoryview,
                 device: int | None = None):
        world_size, rank = _int_arg(world_size, "world_size"), _int_arg(rank, "rank")
        if world_size < 1:
            raise ValueError(f"world_size: must be >= 1 (got {world_size})")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: must be in [0, world_size) (got {rank} with world_size {world_size})")
        info = _as_root(root)
        # plans whose context addresses this communicator's windows: closing it makes them refuse calls
        self._plans: weakref.WeakSet[ContextUser] = weakref.WeakSet()
        if device is not None:
            Device(_int_arg(device, "device")).set_current()
        current = Device.current().id
        self._cdata = _join(world_size, rank, info, current)
        self._open = True
        b = initialized()
        ffi, lib = b.ffi, b.lib
        try:
            # the four questions in one call into C: from Python each would hand the GIL over among the
            # ranks of a thread world joining at the same time
            name = ffi.new(f"char[{COMM_NAME_MAX_LENGTH}]")
            ids, words, failed = ffi.new("uint32_t[2]"), ffi.new("uint64_t[2]"), ffi.new("char **")
            ret = lib.aclnnpy_hccl_comm_info(self._cdata, name, ids, ids + 1, words, words + 1, failed)
            if ret:
                raise hccl_error(ret, ffi.string(failed[0]).decode())
            #: The group name HCCL gave the communicator (``HcclGetCommName``).
            self.name = str(ffi.string(name).decode())
            #: This rank's id in the world (``HcclGetRankId``).
            self.rank = int(ids[0])
            #: The number of ranks (``HcclGetRankSize``).
            self.world_size = int(ids[1])
            #: The device address of this rank's window (``HcclGetHcclBuffer``).
            self.window_address = int(words[0])
            #: The window's size in bytes (``HcclGetHcclBuffer``; set by ``HCCL_BUFFSIZE``).
            self.window_size = int(words[1])
            #: The device current when the communicator was created, which its windows belong to.
            self.device = current
        except BaseException:
            self.close()
            raise

    def _live(self, operation: str) -> Any:
        if not self._open:
            raise self._closed(operation)
        return self._cdata

    @property
    def handle(self) -> int:
        """The ``HcclComm`` handle as an integer (for C code that takes one)."""
        return int(initialized().ffi.cast("uintptr_t", self._live("use its handle")))

    def peer_window(self, rank: int) -> tuple[int, int]:
        """(address, bytes) of rank `rank`'s window as mapped in this process
        (``HcclGetRemoteIpcHcclBuf``; the own window for rank == self.rank)."""
        b = initialized()
        comm = self._live("read a peer's window")
        if int(rank) == self.rank:
            return self.window_address, self.window_size
        addr, size = b.ffi.new("void **"), b.ffi.new("uint64_t *")
        check_hccl(b.lib.HcclGetRemoteIpcHcclBuf(comm, int(rank), addr, size), "HcclGetRemoteIpcHcclBuf")
        return int(b.ffi.cast("uintptr_t", addr[0])), int(size[0])

    def barrier(self, stream: StreamArg = None, wait: bool | None = None) -> None:
        """``HcclBarrier`` queued on `stream` (default: the current stream). With `wait` (default:
        True when no stream is given), the stream is then synchronised, so a peer that never arrives
        raises the runtime's timeout error (:class:`~aclnn_py.AclTimeoutError`) naming it."""
        comm = self._live("enter a barrier")
        s = resolve_stream(stream)
        b = initialized()
        status = _core.hccl_barrier(int(b.ffi.cast("uintptr_t", comm)), s._handle)
        if status < 0:  # the backend lacks it: the binding raises MissingSymbolError
            status = b.lib.HcclBarrier(comm, s._cdata)
        check_hccl(status, "HcclBarrier")
        if wait is None:
            wait = stream is None
        if wait:
            s.synchronize()

    def stream_for(self, stream: StreamArg = None) -> Stream:
        """The Stream `stream` names (default: the current stream) for work on this communicator:
        a ValueError naming both devices when it belongs to another device than the communicator's
        (whose windows and peers the kernels use). A borrowed handle's device is unknown, so it is
        taken as given."""
        s = resolve_stream(stream)
        device = s.device
        if device is not None and device != self.device:
            named = s._label() if stream is not None else f"the current stream, {s._label()},"
            raise ValueError(f"stream: {named} belongs to device {device}, but {self._label()} is on device "
                             f"{self.device}; pass a stream of device {self.device}")
        return s

    def async_error(self) -> int:
        """``HcclGetCommAsyncError``: 0, or HCCL_E_REMOTE (21) once a peer's process is found dead."""
        b = initialized()
        cell = b.ffi.new("HcclResult *")
        check_hccl(b.lib.HcclGetCommAsyncError(self._live("query it"), cell), "HcclGetCommAsyncError")
        return int(cell[0])

    def _release(self) -> None:
        """``HcclCommDestroy``: unmap the windows (a kernel still waiting on this communicator fails
        promptly). Synchronise streams with queued work that uses it first. Plans made with a context of
        this communicator refuse every later call (ClosedError) instead of launching onto its windows."""
        for plan in list(self._plans):
            plan._communicator_closed(self._label())
        check_hccl(initialized().lib.HcclCommDestroy(self._cdata), "HcclCommDestroy")

    def _label(self) -> str:
        return f"Communicator(rank {getattr(self, 'rank', '?')}/{getattr(self, 'world_size', '?')})"


def error_string(code: int) -> str:
    """``HcclGetErrorString``."""
    b = initialized()
    p = b.lib.HcclGetErrorString(int(code))
    return "" if p == b.ffi.NULL else b.ffi.string(p).decode(errors="replace")


def context_bytes(comm: Communicator) -> tuple[bytes, int]:
    """The 16,400-byte context struct for `comm` (docs/concepts.md), and the window size in bytes,
    built with CANN's own KFC sequence:

    allocate op args → comm engine 4 (AIV) → alg config ``AlltoAll=level0:fullmesh;level1:pairwise``
    → the communicator by its name → op resource context of op type 8 (all-to-all), stored as
    kfcContextAddr → check rank id and rank size → free op args → every rank's window address
    (own: ``HcclGetHcclBuffer``, which also gives cclBufferSize; others: ``HcclGetRemoteIpcHcclBuf``).

    The sequence runs in one crossing into C (``aclnnpy_hccl_context``): from Python, each of its calls
    would hand the GIL over among the ranks of a thread world while they form it, and the W window
    addresses per rank would cost W**2 interpreter steps.
    """
    b = initialized()
    ffi, lib = b.ffi, b.lib
    comm._live("build a context from it")
    if comm.world_size > MAX_EP_RANKS:
        raise ValueError(f"the context holds at most {MAX_EP_RANKS} ranks (world size {comm.world_size})")
    blob = bytearray(CONTEXT_BYTES)
    wsize, info, failed = ffi.new("uint64_t *"), ffi.new("uint32_t[3]"), ffi.new("char **")
    ret = lib.aclnnpy_hccl_context(comm.name.encode(), HCCL_COMM_ENGINE_AIV, HCCL_OP_TYPE_ALLTOALL,
                                   ALG_CONFIG_ALLTOALL.encode(), comm.rank, comm.world_size,
                                   DEFAULT_RANK_SIZE_PER_SERVER, ffi.from_buffer("uint8_t[]", blob), wsize, info,
                                   failed)
    if ret:
        func = ffi.string(failed[0]).decode()
        if info[0] == 1:  # the name found another rank's communicator
            raise HcclError(func, 4, "HCCL_E_INTERNAL",
                            f"the communicator named {comm.name!r} is rank {info[1]} of {info[2]}, expected rank "
                            f"{comm.rank} of {comm.world_size}")
        raise hccl_error(ret, func)
    return bytes(blob), int(wsize[0])


class ContextUser(Protocol):
    """What keeps a context tensor to launch with (a plan): told when the context's communicator closes."""

    @property
    def context(self) -> Tensor | None: ...

    def _communicator_closed(self, label: str) -> None: ...


#: Each context tensor made by build_context (or rewritten by rebuild_context) -> its communicator.
_context_comms: weakref.WeakKeyDictionary[Tensor, Communicator] = weakref.WeakKeyDictionary()


def communicator_of(context: Tensor | None) -> Communicator | None:
    """The communicator whose windows `context` addresses, when build_context / rebuild_context made it."""
    return None if context is None else _context_comms.get(context)


def watch_context(user: ContextUser, context: Tensor | None) -> None:
    """Tell `user` when the communicator of `context` closes (a context made elsewhere: never)."""
    comm = communicator_of(context)
    if comm is not None:
        comm._plans.add(user)


def build_context(comm: Communicator, stream: StreamArg = None) -> tuple[Tensor, int]:
    """The MoE context tensor for `comm`: an int32 (4100,) device tensor holding the context struct
    (see :func:`context_bytes`), and ``ccl_buffer_size``, the window size in bytes."""
    blob, ccl_buffer_size = context_bytes(comm)
    arr = np.frombuffer(blob, dtype="<i4").copy()
    tensor = Tensor.from_numpy(arr, stream=stream)
    _context_comms[tensor] = comm
    return tensor, ccl_buffer_size


def rebuild_context(comm: Communicator, context: Tensor) -> int:
    """Write `comm`'s context struct into an existing context tensor, in place (executors and plans
    made with that tensor then address `comm`'s windows); returns ``ccl_buffer_size``. Work queued
    with the old context must have finished (synchronise first)."""
    blob, ccl_buffer_size = context_bytes(comm)
    if context.shape != (CONTEXT_INT32,) or context.dtype != DataType.INT32:
        raise ValueError(f"context: expected an int32 ({CONTEXT_INT32},) tensor (got {context!r})")
    context.copy_from(np.frombuffer(blob, dtype="<i4"), stream=None)
    old = _context_comms.get(context)
    _context_comms[context] = comm
    if old is not None and old is not comm:  # the plans made with this context follow it
        for plan in list(old._plans):
            if plan.context is context:
                old._plans.discard(plan)
                comm._plans.add(plan)
    return ccl_buffer_size


def parse_context(data: Tensor | np.ndarray | bytes) -> dict[str, Any]:
    """Decode a context (bytes, an int32 array or a Tensor) into its fields (for tests and
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


__all__ = ["RootInfo", "Communicator", "build_context", "context_bytes", "parse_context", "rebuild_context",
           "error_string",
           "ROOT_INFO_BYTES", "CONTEXT_INT32", "CONTEXT_BYTES"]
