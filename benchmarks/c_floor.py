"""The C floor of the host-overhead section: loops written in C (``benchmarks/c_floor.c``) that call
the functions of the backend this process already loaded, with descriptors, executors and streams
made here on the Python side. The library is not installed with the package: it is compiled from
the checkout on first use (:func:`library_path`), with the C compiler ``$CC`` (default ``cc``).

Two loops per op, each timed in C and returned as µs per call:

* :meth:`CFloor.dispatch_per_call` / :meth:`CFloor.combine_per_call` — phase 1 + phase 2 with every
  descriptor made once (what a C caller that caches its aclTensors pays per call);
* :meth:`CFloor.plan` — ``aclSetInputTensorAddr`` of the rebound inputs + phase 2 on one repeatable
  executor (what a C caller of a prepared executor pays per call).

and, for the worlds sections, :meth:`CFloor.world_rounds`: one rank's rounds of dispatch, combine and
``aclrtSynchronizeStream`` on repeatable executors, looped in C (ctypes lets go of the GIL meanwhile).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().with_name("c_floor.c")
#: The checkout's C headers the loops are compiled against (the declarations the binding uses).
INCLUDE = SOURCE.parents[1] / "include"
#: Where compiled floors are kept, one file per source and compiler; ACLNN_PY_BENCH_BUILD overrides it.
ENV_BUILD = "ACLNN_PY_BENCH_BUILD"
DEFAULT_BUILD = SOURCE.parents[1] / "build" / "benchmarks"

#: The backend functions the loops call (resolved in the libraries the binding loaded).
SYMBOLS = ("aclnnMoeDistributeDispatchV5GetWorkspaceSize", "aclnnMoeDistributeDispatchV5",
           "aclnnMoeDistributeCombineV5GetWorkspaceSize", "aclnnMoeDistributeCombineV5", "aclSetInputTensorAddr",
           "aclrtSynchronizeStream")

DISPATCH, COMBINE = 0, 1
DISPATCH_TENSORS, COMBINE_TENSORS = 15, 20   # inputs + outputs in C parameter order
DISPATCH_ATTRS, COMBINE_ATTRS = 15, 16       # integer attributes before and after commAlg


class FloorError(RuntimeError):
    """The C floor could not be built, found or bound, or one of its calls returned an error status."""


def compile_command(output: Path) -> list[str]:
    """The compiler command that builds the floor library into `output`."""
    cc = shlex.split(os.environ.get("CC") or "cc")
    return [*cc, "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{INCLUDE}",
            str(SOURCE), "-o", str(output), "-ldl"]


def _inputs_digest() -> str:
    """Names the build: the source, the headers it includes and the compiler command change it."""
    h = hashlib.sha256(SOURCE.read_bytes())
    for header in sorted(INCLUDE.rglob("*.h")):
        h.update(header.read_bytes())
    h.update(" ".join(compile_command(Path("out"))).encode())
    return h.hexdigest()[:16]


def library_path() -> Path:
    """The floor library for this checkout's source, compiled now unless an identical build is there."""
    build = Path(os.environ.get(ENV_BUILD) or DEFAULT_BUILD)
    target = build / f"libaclnnpy_floor-{_inputs_digest()}.so"
    if target.is_file():
        return target
    try:
        build.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".floor-", suffix=".so", dir=build)
        os.close(fd)
    except OSError as e:
        raise FloorError(f"cannot write the C floor's build directory {build}: {e.strerror or e} "
                         f"(set {ENV_BUILD} to a writable directory)") from e
    cmd = compile_command(Path(tmp))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        os.unlink(tmp)
        raise FloorError(f"cannot run the C compiler {cmd[0]!r} for the C floor: {e.strerror or e} "
                         "(install one, or name it in CC)") from e
    if done.returncode != 0:
        os.unlink(tmp)
        raise FloorError(f"compiling the C floor failed ({shlex.join(cmd)}):\n{done.stderr.strip()}")
    os.replace(tmp, target)  # whole or absent, when two runs build at once
    return target


def address(cdata: Any) -> int:
    """The integer address of a cffi pointer (descriptor, executor, stream), 0 for None / NULL."""
    if cdata is None:
        return 0
    import aclnn_py

    return int(aclnn_py.backend().ffi.cast("uintptr_t", cdata))


class CFloor:
    """The loaded floor library, bound to the backend's functions."""

    def __init__(self, path: Path | None = None) -> None:
        import aclnn_py

        backend = aclnn_py.backend()
        self._lib = ctypes.CDLL(str(path or library_path()))
        vp, i64, u64, p_i64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int64)
        lib = self._lib
        lib.aclnnpy_floor_error.restype = ctypes.c_char_p
        lib.aclnnpy_floor_bind.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.aclnnpy_floor_address.argtypes = [ctypes.c_char_p]
        lib.aclnnpy_floor_address.restype = ctypes.c_size_t
        for name in ("aclnnpy_floor_dispatch_per_call", "aclnnpy_floor_combine_per_call"):
            f = getattr(lib, name)
            f.argtypes = [ctypes.POINTER(vp), p_i64, ctypes.c_char_p, vp, u64, vp, i64]
            f.restype = i64
        lib.aclnnpy_floor_plan.argtypes = [ctypes.c_int, vp, i64, p_i64, ctypes.POINTER(vp), ctypes.POINTER(vp), i64,
                                           vp, u64, vp, i64]
        lib.aclnnpy_floor_plan.restype = i64
        lib.aclnnpy_floor_world_rounds.argtypes = [vp, vp, u64, vp, vp, u64, vp, i64, p_i64]
        lib.aclnnpy_floor_world_rounds.restype = i64
        for sym in SYMBOLS:
            where = backend.symbols.get(sym)
            if where is None:
                raise FloorError(f"the backend has no {sym}: the C floor cannot run")
            if lib.aclnnpy_floor_bind(sym.encode(), where.encode()) != 0:
                raise FloorError(self._error())

    def _error(self) -> str:
        msg: bytes = self._lib.aclnnpy_floor_error()
        return msg.decode(errors="replace")

    def bound_address(self, symbol: str) -> int:
        """The address the floor calls for `symbol` (0 when it is not one of :data:`SYMBOLS`)."""
        return int(self._lib.aclnnpy_floor_address(symbol.encode()))

    def _checked(self, result: int) -> int:
        """A loop's result, or FloorError with the call that failed (a loop returns -1 then)."""
        if result < 0:
            raise FloorError(f"C floor: {self._error()}")
        return result

    def _checked_us(self, elapsed_ns: int, calls: int) -> float:
        return self._checked(elapsed_ns) / 1e3 / calls

    def dispatch_per_call(self, tensors: Sequence[int], attrs: Sequence[int], comm_alg: bytes, workspace: int,
                          workspace_capacity: int, stream: int, calls: int) -> float:
        """µs per call of `calls` dispatch phase 1 + phase 2 (`tensors`: 8 inputs then 7 outputs)."""
        return self._per_call(self._lib.aclnnpy_floor_dispatch_per_call, DISPATCH_TENSORS, DISPATCH_ATTRS,
                              tensors, attrs, comm_alg, workspace, workspace_capacity, stream, calls)

    def combine_per_call(self, tensors: Sequence[int], attrs: Sequence[int], comm_alg: bytes, workspace: int,
                         workspace_capacity: int, stream: int, calls: int) -> float:
        """µs per call of `calls` combine phase 1 + phase 2 (`tensors`: 19 inputs then x_out)."""
        return self._per_call(self._lib.aclnnpy_floor_combine_per_call, COMBINE_TENSORS, COMBINE_ATTRS,
                              tensors, attrs, comm_alg, workspace, workspace_capacity, stream, calls)

    def _per_call(self, fn: Any, n_tensors: int, n_attrs: int, tensors: Sequence[int], attrs: Sequence[int],
                  comm_alg: bytes, workspace: int, workspace_capacity: int, stream: int, calls: int) -> float:
        if len(tensors) != n_tensors or len(attrs) != n_attrs:
            raise ValueError(f"need {n_tensors} tensors and {n_attrs} attributes (got {len(tensors)}, {len(attrs)})")
        t = (ctypes.c_void_p * n_tensors)(*tensors)
        a = (ctypes.c_int64 * n_attrs)(*attrs)
        return self._checked_us(fn(t, a, comm_alg, workspace, workspace_capacity, stream, calls), calls)

    def plan(self, op: int, executor: int, slots: Sequence[int], descriptors: Sequence[int],
             address_sets: Sequence[Sequence[int]], workspace: int, workspace_size: int, stream: int,
             calls: int) -> float:
        """µs per call of `calls` iterations of: rebind input `slots[j]` (through `descriptors[j]`) to the
        next of `address_sets` (they alternate), then launch phase 2 of `op` on `executor`."""
        n = len(slots)
        if len(descriptors) != n or any(len(s) != n for s in address_sets) or not address_sets:
            raise ValueError("one descriptor and one address per slot in every address set")
        flat = [a for s in address_sets for a in s]
        return self._checked_us(self._lib.aclnnpy_floor_plan(
            op, executor, n, (ctypes.c_int64 * n)(*slots), (ctypes.c_void_p * n)(*descriptors),
            (ctypes.c_void_p * len(flat))(*flat), len(address_sets), workspace, workspace_size, stream, calls),
            calls)

    def world_rounds(self, dispatch: int, dispatch_workspace: int, dispatch_workspace_size: int, combine: int,
                     combine_workspace: int, combine_workspace_size: int, stream: int, rounds: int) -> list[float]:
        """`rounds` rounds of one rank: phase 2 of the repeatable `dispatch` executor, then of the repeatable
        `combine` executor, then ``aclrtSynchronizeStream`` of `stream`; the loop runs in C without the GIL,
        so the other ranks of a thread world run theirs meanwhile. Returns when each round ended, on the
        clock of ``time.perf_counter`` (CLOCK_MONOTONIC)."""
        ends = (ctypes.c_int64 * rounds)()
        self._checked(self._lib.aclnnpy_floor_world_rounds(dispatch, dispatch_workspace, dispatch_workspace_size,
                                                           combine, combine_workspace, combine_workspace_size, stream,
                                                           rounds, ends))
        return [t / 1e9 for t in ends]
