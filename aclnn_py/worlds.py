"""Run a function on N ranks: real processes (:func:`spawn`), threads of this process
(:func:`run_threads`), or an MPI job (:func:`mpi_bootstrap`).

Each rank calls ``fn(rank, world_size, root_bytes, *args)`` with the calling thread's device set to
``rank`` (modulo the device count); ``root_bytes`` is the 4108-byte HCCL root info that every rank
passes to :class:`aclnn_py.hccl.Communicator`. As on hardware, the root info is made by rank 0
(whose process must stay alive while the world forms) and handed to the others out of band.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, TypeVar, overload

__all__ = ["spawn", "run_threads", "mpi_bootstrap", "RankError", "RemoteTraceback"]

T = TypeVar("T")

#: What a launcher does when a rank fails: ``"stop"`` the others and raise that rank's exception, or
#: ``"wait"`` for the others to finish and return every rank's outcome (its return value, or its
#: exception instance) in rank order.
OnRankFailure = Literal["stop", "wait"]


def _check_on_rank_failure(value: str) -> bool:
    """True for "wait", False for "stop"; ValueError for anything else."""
    if value not in ("stop", "wait"):
        raise ValueError(f"on_rank_failure must be 'stop' or 'wait' (got {value!r})")
    return value == "wait"


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised on another rank (set as ``__cause__``)."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class RankError(RuntimeError):
    """A rank failed in a way that cannot be re-raised as its own exception (it could not be
    pickled, or the process died without raising)."""

    def __init__(self, rank: int, message: str, tb: str = ""):
        super().__init__(f"rank {rank}: {message}" + (f"\n\n{tb}" if tb else ""))
        self.rank = rank
        self.tb = tb


def _set_device(rank: int) -> None:
    from .runtime import Device, init

    init()
    count = Device.count()
    Device(rank % max(count, 1)).set_current()


def _annotate(exc: BaseException, rank: int, world_size: int, tb: str) -> BaseException:
    exc.__cause__ = RemoteTraceback(tb)
    if hasattr(exc, "add_note"):
        exc.add_note(f"(raised on rank {rank} of {world_size}; its traceback is the cause above)")
    exc.rank = rank  # type: ignore[attr-defined]
    return exc


# ---- processes -----------------------------------------------------------------------------------------
#: How a rank process exits when it finds itself calling spawn() while multiprocessing is still
#: importing the launcher's main module in it (a script without the ``__main__`` guard); the launcher
#: turns it into one RuntimeError instead of every rank's traceback.
_UNGUARDED_MAIN_EXIT = 86
_UNGUARDED_MAIN_MESSAGE = (
    "spawn() was called again in the rank processes: they import the launching script (as __mp_main__) "
    "and its top level calls spawn(); put that call under `if __name__ == \"__main__\":`")


def _exit_if_importing_main() -> None:
    """In a rank process still importing the main module (multiprocessing's spawn and forkserver
    start methods re-run the script there as ``__mp_main__``), exit quietly with the code the
    launcher recognises; multiprocessing's own refusal would print a traceback per rank."""
    if getattr(mp.current_process(), "_inheriting", False):
        os._exit(_UNGUARDED_MAIN_EXIT)


def _process_start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux), or None: with the pid it tells a
    process apart from a later one that reuses its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _die_with_launcher(launcher: tuple[int, int | None]) -> None:
    """End this rank the moment the launching process ends, however it ends (SIGKILL, SIGTERM, a crash):
    a thread waits on a pidfd of the launcher (Linux 5.3+; elsewhere it polls the pid every 0.1 s) and
    SIGKILLs this process when it is gone. Under forkserver the rank's parent is the fork server, which
    outlives a killed launcher, so the parent-death signal alone cannot do it; it still covers the
    parent (the launcher under spawn, the fork server under forkserver)."""
    pid, started = launcher
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the pid watch below still ends the rank
        pass
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)  # the launcher is gone already
    except (AttributeError, OSError):  # no pidfd here
        fd = None
    if started is not None and _process_start_time(pid) != started:
        os._exit(1)  # the pid belongs to another process now: the launcher is gone

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the launcher has exited
        else:
            while True:
                time.sleep(0.1)
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="aclnn_py-launcher-watch", daemon=True).start()


def _pack_exception(exc: BaseException) -> tuple[Any, ...]:
    """A picklable description of exc: the exception itself when it survives pickling, the
    constructor arguments of an aclnn-py error, or just its type name and text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return ("pickled", pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        pass
    from .errors import AclnnPyError

    if isinstance(exc, AclnnPyError):
        try:
            data = pickle.dumps((type(exc), exc.func, exc.code, exc.name, exc.message))
            pickle.loads(data)
            return ("aclnnpy", data)
        except Exception:  # noqa: BLE001
            pass
    return ("text", f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc))


def _unpack_exception(packed: tuple[Any, ...], rank: int, tb: str) -> BaseException:
    kind = packed[0]
    try:
        if kind == "pickled":
            exc: BaseException = pickle.loads(packed[1])
            return exc
        if kind == "aclnnpy":
            cls, func, code, name, message = pickle.loads(packed[1])
            made: BaseException = cls(func, code, name, message)
            return made
    except Exception:  # noqa: BLE001 - fall through to a RankError
        pass
    if kind == "text":
        return RankError(rank, f"{packed[1]}: {packed[2]}")
    return RankError(rank, "failed with an exception that could not be transferred")


def _child_main(rank: int, world_size: int, conn: Any, launcher: tuple[int, int | None], fn: Callable[..., Any],
                args: tuple[Any, ...], set_device: bool, environ: dict[str, str]) -> None:
    # What the rank inherits (the fork server's imports: numpy, this package) lives as long as the rank:
    # frozen, it is left out of every collection. Otherwise the rank's first older-generation collection,
    # in its first call, walks those tens of thousands of objects - a millisecond of CPU per rank, which
    # a few hundred ranks sharing two cores pay in their first round - and writes to their pages, which
    # the fork shared (the use gc.freeze is documented for).
    gc.freeze()
    _die_with_launcher(launcher)
    if world_size > len(_usable_cpus()):
        # more ranks than CPUs take turns on them: each runs until it waits for its peers, not until
        # one of them wakes up (W = 256 processes on 2 CPUs, five pairs: a steady round's median
        # 38 -> 36 ms, the fastest 30 -> 26 ms)
        _run_until_waiting()
    # A forkserver child inherits the server's environment, not the launcher's current one.
    for k in set(os.environ) - set(environ):
        del os.environ[k]
    os.environ.update(environ)
    try:
        if set_device:
            _set_device(rank)
        if rank == 0:
            from .hccl import RootInfo

            root = bytes(RootInfo.create())
            conn.send(("root", root))
        else:
            msg = conn.recv()
            if msg[0] == "abort":
                raise RuntimeError(msg[1])
            if msg[0] != "root":
                raise RuntimeError(f"launch protocol: expected the root info, got {msg[0]!r}")
            root = msg[1]
        result = fn(rank, world_size, root, *args)
        conn.send(("ok", result))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        tb = traceback.format_exc()
        try:
            conn.send(("err", _pack_exception(exc), tb))
        except Exception:  # noqa: BLE001 - e.g. the parent is gone
            pass
        conn.close()
        os._exit(1)
    conn.close()


def _stop(procs: Sequence[Any], grace: float = 1.0) -> None:
    """SIGTERM every live rank, SIGKILL what is left after `grace` seconds, and reap them all. A Ctrl-C
    meanwhile cuts the grace short (SIGKILL at once) and is raised after every rank is reaped, so no
    rank is left for interpreter exit to wait on, however often Ctrl-C is pressed."""
    interrupted = False
    try:
        for p in procs:
            if p.is_alive():
                p.terminate()
        end = time.monotonic() + grace
        for p in procs:
            p.join(max(end - time.monotonic(), 0))
    except KeyboardInterrupt:
        interrupted = True
    for p in procs:
        while True:
            try:
                if p.is_alive():
                    p.kill()
                p.join()
                break
            except KeyboardInterrupt:  # a SIGKILLed rank is reaped within milliseconds: keep reaping
                interrupted = True
    if interrupted:
        raise KeyboardInterrupt


@overload
def spawn(fn: Callable[..., T], world_size: int, *args: Any, timeout: float | None = 600.0,
          start_method: str = "forkserver", set_device: bool = True,
          on_rank_failure: Literal["stop"] = "stop", preload: Sequence[str] = ()) -> list[T]: ...


@overload
def spawn(fn: Callable[..., T], world_size: int, *args: Any, timeout: float | None = 600.0,
          start_method: str = "forkserver", set_device: bool = True,
          on_rank_failure: Literal["wait"], preload: Sequence[str] = ()) -> list[T | BaseException]: ...


def spawn(fn: Callable[..., T], world_size: int, *args: Any, timeout: float | None = 600.0,
          start_method: str = "forkserver", set_device: bool = True,
          on_rank_failure: OnRankFailure = "stop", preload: Sequence[str] = ()) -> list[T] | list[T | BaseException]:
    """Run ``fn(rank, world_size, root_bytes, *args)`` in `world_size` new processes and return
    their return values in rank order.

    `fn`, `args` and the return values must be picklable (define `fn` at module level). Every rank
    imports the launching script, so a script calls spawn under ``if __name__ == "__main__":``;
    called from a script's unguarded top level, spawn raises RuntimeError saying so.
    With ``on_rank_failure="stop"`` (default), if a rank raises, the others are killed and its
    exception is re-raised here with the rank's traceback as ``__cause__``; a rank that dies without
    raising (a signal, ``os._exit``) raises :class:`RankError`. With ``on_rank_failure="wait"``
    the other ranks run on, and the list holds, in each failed rank's slot, what would have been
    raised: its exception instance (with ``.rank`` and the remote traceback as ``__cause__``) or a
    :class:`RankError`; if rank 0 fails before it made the root info, every other rank fails with a
    RuntimeError saying so. Either way, when `timeout` seconds pass first, every rank is killed and
    :class:`TimeoutError` names the ranks still running. No rank outlives this call, and on Linux none
    outlives this process however it ends (SIGKILL included: each rank watches it). `start_method` is "forkserver" (default: a server process imports
    the package once and forks each rank from it, so ranks start in milliseconds) or "spawn" (a
    fresh interpreter per rank); "fork" is refused because the launching process may have threads
    (the mock's stream workers). Each rank sees the launcher's environment as of this call.
    `preload` names more modules the fork server imports once, before it forks any rank (e.g. the
    module of `fn`, or what `fn` imports), so that no rank spends its start importing them. The server
    imports them in the working directory, as it does the package (neither when the working directory
    holds another copy of aclnn_py), and only when it starts: multiprocessing keeps one fork server
    per process, so the list of the first forkserver spawn holds.
    When the ranks outnumber the CPUs they may use (Linux), each is a batch process
    (``SCHED_BATCH``): it runs until it waits for its peers instead of until one of them wakes up.
    """
    _exit_if_importing_main()
    world_size = int(world_size)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1 (got {world_size})")
    if start_method not in ("spawn", "forkserver"):
        raise ValueError("start_method must be 'spawn' or 'forkserver' (fork after threads exist is unsafe)")
    keep_going = _check_on_rank_failure(on_rank_failure)
    ctx: Any = mp.get_context(start_method)
    if start_method == "forkserver":
        # The server imports the package once; each rank is then a fork of it (milliseconds instead
        # of a fresh interpreter importing numpy and ml_dtypes), and inherits what the server worked
        # out without a backend (aclnn_py.ops._warm). No backend is loaded in the server.
        # The server is `python -c ...` started in the working directory, which therefore leads its
        # sys.path (CPython before 3.13 ignores the sys.path handed to it): in a source checkout of
        # another copy of this package (an installed package run from its checkout), preloading
        # would give the ranks that other copy. Each rank then imports the package itself, with
        # the launcher's sys.path.
        ctx.set_forkserver_preload([] if _working_directory_shadows_package() else
                                   ["aclnn_py", "aclnn_py.hccl", "aclnn_py.worlds", "aclnn_py.ops._warm",
                                    *preload])
    procs: list[Any] = []
    conns: list[Any] = []
    launcher = (os.getpid(), _process_start_time(os.getpid()))
    try:
        for r in range(world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_child_main, name=f"aclnn_py-rank{r}",
                            args=(r, world_size, child_end, launcher, fn, tuple(args), set_device,
                                  dict(os.environ)),
                            daemon=False)
            p.start()
            child_end.close()
            procs.append(p)
            conns.append(parent_end)
        return _Supervisor(procs, conns, keep_going).run(timeout)
    finally:
        _stop(procs)
        for c in conns:
            c.close()


#: What multiprocessing reports as the exit code of a forkserver child whose status never arrived.
_STATUS_UNKNOWN = 255


def _fork_server_gone(wait: float = 1.0) -> bool:
    """Whether multiprocessing's fork server of this process was started and has ended, or ends within
    `wait` seconds: a rank's status 255 arrives as the dying server closes its socket, which may be a
    moment before the server's exit is complete."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if not pid:
        return False
    try:  # readable once the server has exited; unlike waitpid it leaves it for multiprocessing to reap
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        return False
    try:
        return bool(select.select([fd], [], [], wait)[0])
    finally:
        os.close(fd)


def _working_directory_shadows_package() -> bool:
    """Whether ``import aclnn_py`` in the working directory would find a different package."""
    from pathlib import Path

    candidate = Path.cwd() / "aclnn_py" / "__init__.py"
    return candidate.is_file() and candidate.resolve().parent != Path(__file__).resolve().parent


class _Supervisor:
    """Watches the rank processes of :func:`spawn`: forwards rank 0's root info to the others and
    collects each rank's outcome (a result, an exception it raised, or its death)."""

    def __init__(self, procs: list[Any], conns: list[Any], keep_going: bool):
        self.procs, self.conns, self.keep_going = procs, conns, keep_going
        self.world_size = len(procs)
        self.results: list[Any] = [None] * self.world_size
        self.done = [False] * self.world_size
        self.eof = [False] * self.world_size
        self.root_sent = False

    def run(self, timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while not all(self.done):
            waitables = [c for r, c in enumerate(self.conns) if not self.done[r] and not self.eof[r]]
            waitables += [p.sentinel for r, p in enumerate(self.procs) if not self.done[r]]
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            mpc.wait(waitables, timeout=remaining)
            for r in range(self.world_size):
                if not self.done[r]:
                    self._poll(r)
            if deadline is not None and time.monotonic() >= deadline and not all(self.done):
                running = [r for r in range(self.world_size) if not self.done[r]]
                raise TimeoutError(f"spawn: ranks {running} of {self.world_size} did not finish within "
                                   f"{timeout} s (all ranks were killed)")
        return self.results

    def _poll(self, r: int) -> None:
        self._drain(r)
        if not self.done[r] and not self.procs[r].is_alive():
            self._drain(r)   # anything sent right before it exited
            if not self.done[r]:
                code = self.procs[r].exitcode
                if code == _UNGUARDED_MAIN_EXIT:
                    raise RuntimeError(_UNGUARDED_MAIN_MESSAGE)
                if code == _STATUS_UNKNOWN and _fork_server_gone():
                    how = ("ended when the fork server that started it was killed (its exit status is lost with "
                           "the server)")
                else:
                    how = (f"was killed by signal {-code} ({signal.Signals(-code).name})"
                           if code is not None and code < 0 else f"exited with code {code}")
                self._failed(r, RankError(r, f"the process {how} without returning a result"))

    def _drain(self, r: int) -> None:
        conn = self.conns[r]
        while not self.done[r] and not self.eof[r] and conn.poll():
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self.eof[r] = True
                break
            if msg[0] == "root":
                self._send_all(("root", msg[1]))
                self.root_sent = True
            elif msg[0] == "ok":
                self.results[r] = msg[1]
                self.done[r] = True
            elif msg[0] == "err":
                packed, tb = msg[1], msg[2]
                self._failed(r, _annotate(_unpack_exception(packed, r, tb), r, self.world_size, tb))

    def _failed(self, r: int, exc: BaseException) -> None:
        if not self.keep_going:
            raise exc
        self.results[r] = exc
        self.done[r] = True
        if r == 0 and not self.root_sent:
            # The others wait for a root info that will never come: tell them.
            self._send_all(("abort", "rank 0 failed before it made the HCCL root info"))
            self.root_sent = True

    def _send_all(self, msg: tuple[Any, ...]) -> None:
        for q in range(1, self.world_size):
            try:
                self.conns[q].send(msg)
            except (BrokenPipeError, OSError):
                pass  # that rank died: its sentinel reports it


# ---- threads ---------------------------------------------------------------------------------------------
@overload
def run_threads(fn: Callable[..., T], world_size: int, *args: Any, timeout: float | None = 600.0,
                set_device: bool = True, on_rank_failure: Literal["stop"] = "stop",
                share_one_cpu: bool = False) -> list[T]: ...


@overload
def run_threads(fn: Callable[..., T], world_size: int, *args: Any, timeout: float | None = 600.0,
                set_device: bool = True, on_rank_failure: Literal["wait"],
                share_one_cpu: bool = False) -> list[T | BaseException]: ...


def run_threads(fn: Callable[..., T], world_size: int, *args: Any, timeout: float | None = 600.0,
                set_device: bool = True, on_rank_failure: OnRankFailure = "stop",
                share_one_cpu: bool = False) -> list[T] | list[T | BaseException]:
    """Run ``fn(rank, world_size, root_bytes, *args)`` on `world_size` threads of this process (each
    with its device set to its rank) and return the return values in rank order.

    With ``on_rank_failure="stop"`` (default) the first rank to raise has its exception re-raised
    here (with its traceback as ``__cause__``) without waiting for the others; with ``"wait"`` every
    rank runs to its end and a failed rank's slot holds its exception instance (with ``.rank`` and
    the traceback as ``__cause__``). TimeoutError names the ranks still running after `timeout`
    seconds. Threads cannot be killed: ranks still running when this returns early are daemon
    threads that end on their own (their HCCL waits give up after HCCL_EXEC_TIMEOUT /
    HCCL_CONNECT_TIMEOUT, or within about a second once a peer they wait for is gone).
    The ranks start together once every thread exists, and while the world runs the interpreter's
    switch interval (``sys.setswitchinterval``) is at least `world_size` milliseconds: hundreds of
    rank threads asking for the GIL every 5 ms cost more than their work. The collector's first
    threshold (``gc.set_threshold``) is at least 100 objects per rank: the ranks' objects of one call,
    alive together, would otherwise pass to the oldest generation at every round, and its full
    collections hold the GIL for hundreds of milliseconds in a world of a thousand ranks. Both are
    restored afterwards.
    With `share_one_cpu` (Linux, more than one CPU) the rank threads and the stream workers they
    start run on one CPU. Their Python runs one thread at a time anyway (the GIL); spread over CPUs,
    every hand-over of the GIL and every wake-up of a rank by its peers crosses CPUs. For a large
    world with small messages that costs more than the parallel copies gain: 768 ranks exchanging
    one 2 KiB token each took half the CPU time per round on one CPU. With larger messages (16
    tokens of 8 KiB, top-4) the parallel copies win from 16 ranks up to 128 and more, hence the
    default (each thread keeps the CPUs it was given). The threads sharing the CPU are batch threads
    (``SCHED_BATCH``): a rank woken by its peers waits for the running one to wait instead of
    preempting it, perhaps while it holds the GIL.
    """
    from .hccl import RootInfo
    from .runtime import init

    world_size = int(world_size)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1 (got {world_size})")
    keep_going = _check_on_rank_failure(on_rank_failure)
    init()
    root = bytes(RootInfo.create())
    results: list[Any] = [None] * world_size
    failures: list[tuple[int, BaseException, str]] = []
    cond = threading.Condition()
    finished = [False] * world_size
    unfinished = [world_size]  # counted, not found by scanning `finished`: W ranks each scanning W is W²

    def body(rank: int) -> None:
        # Ranks start together once every thread exists: a rank that ran meanwhile would compete
        # for the GIL with the thread still starting the others.
        started.wait()
        if not all_started:
            return  # the world could not be made whole: nobody would answer this rank
        try:
            if set_device:
                _set_device(rank)
            results[rank] = fn(rank, world_size, root, *args)
        except BaseException as exc:  # noqa: BLE001
            with cond:
                failures.append((rank, exc, traceback.format_exc()))
        finally:
            with cond:
                finished[rank] = True
                unfinished[0] -= 1
                # the waiting thread is woken for what it acts on, a failure or the last rank: woken
                # by every rank, it took the GIL from the ranks still closing hundreds of times
                if failures or not unfinished[0]:
                    cond.notify_all()

    cpu = _shared_cpu() if share_one_cpu and world_size > 1 else None
    started = threading.Event()
    all_started = False
    threads = [threading.Thread(target=body, args=(r,), name=f"aclnn_py-rank{r}", daemon=True)
               for r in range(world_size)]
    with _interpreter_for(world_size):
        try:
            with _on_cpu(cpu):
                for t in threads:
                    t.start()  # RuntimeError when the process may start no more threads
            all_started = True
        finally:
            started.set()
        return _collect(threads, results, failures, cond, finished, unfinished, keep_going, timeout)


def _collect(threads: list[threading.Thread], results: list[Any], failures: list[tuple[int, BaseException, str]],
             cond: threading.Condition, finished: list[bool], unfinished: list[int], keep_going: bool,
             timeout: float | None) -> list[Any]:
    """run_threads' wait for its ranks: their results in rank order, or the first failure raised."""
    world_size = len(threads)
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    with cond:
        while unfinished[0] and (keep_going or not failures):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                running = [r for r in range(world_size) if not finished[r]]
                raise TimeoutError(f"run_threads: ranks {running} of {world_size} did not finish within "
                                   f"{timeout} s")
            cond.wait(remaining)
        if failures and not keep_going:
            rank, exc, tb = failures[0]
            raise _annotate(exc, rank, world_size, tb)
        for rank, exc, tb in failures:
            results[rank] = _annotate(exc, rank, world_size, tb)
    for t in threads:
        t.join()
    return results


@contextmanager
def _on_cpu(cpu: int | None) -> Iterator[None]:
    """The calling thread runs on `cpu` (None: where it may), as a batch thread (_run_until_waiting), until
    the block ends, then as it ran before. run_threads starts a world's ranks from the CPU they share: a
    thread inherits its starter's CPUs and policy, so the ranks and the stream workers they start run
    there, and each start's hand-over between the starter and the new thread (Thread.start waits until
    the thread runs) stays on one CPU instead of crossing to the idle one (1024 starts: 150 -> 73 ms)."""
    if cpu is None:
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    restore = _run_until_waiting()
    try:
        yield
    finally:
        if restore is not None:
            restore()
        os.sched_setaffinity(0, allowed)


def _run_until_waiting() -> Callable[[], None] | None:
    """Make the calling thread, and the threads it starts from now on, batch threads (Linux
    ``SCHED_BATCH``; only from the normal policy): a thread woken by another no longer preempts the one
    running, so ranks that share a CPU take turns where each waits. Woken mid-call, a rank preempted
    the one holding the GIL, then queued for the GIL itself, and every rank woken after it queued
    behind it: an A3 world of 768 thread ranks switched threads ~25 % more often than its exchanges
    need (the round took a few per cent longer: the switches are cheap, the cold caches after them
    are not). Returns what restores the thread's policy, or None where it was left as it was."""
    setter, getter = getattr(os, "sched_setscheduler", None), getattr(os, "sched_getscheduler", None)
    if setter is None or getter is None or not hasattr(os, "SCHED_BATCH"):
        return None
    try:
        if getter(0) != os.SCHED_OTHER:
            return None
        setter(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:  # a sandbox may refuse it: the world runs, with wake-ups preempting
        return None

    def restore() -> None:
        try:
            setter(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass

    return restore


def _usable_cpus() -> set[int]:
    """The CPUs the calling thread may run on (every CPU where the platform cannot say)."""
    getter = getattr(os, "sched_getaffinity", None)
    return getter(0) if getter is not None else set(range(os.cpu_count() or 1))


def _shared_cpu() -> int | None:
    """The CPU a thread world's threads share: the last this process may use, or None where threads
    cannot be bound to CPUs."""
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = _usable_cpus()
    return max(allowed) if len(allowed) > 1 else None


#: A GIL request every this many seconds, in all, from a thread world's waiting ranks (see below).
_GIL_REQUEST_SPACING = 0.001
#: Tracked objects per rank the collector's youngest generation may hold before it collects (see below).
_YOUNG_OBJECTS_PER_RANK = 100
_settings_lock = threading.Lock()
_settings_users = 0
_settings_saved: tuple[float, tuple[int, ...]] = (0.0, ())


@contextmanager
def _interpreter_for(world_size: int) -> Iterator[None]:
    """The interpreter's settings while a thread world of `world_size` ranks runs, restored by the last of
    several concurrent worlds:

    - the switch interval (``sys.setswitchinterval``) raised to ``world_size`` ms. Each thread waiting
      for the GIL asks the holder to give it up once per interval; with hundreds of rank threads waiting
      at once, those requests and the forced hand-overs they cause took more CPU than the ranks' work
      (a 768-thread world started in 2.3-3.7 s instead of 1.0 s). The ranks spend their time in calls
      that release the GIL, so a longer interval delays none of them.
    - the collector's first threshold (``gc.set_threshold``) raised to 100 objects per rank. The W ranks'
      objects of one call (its results, arguments, descriptors) are alive at once; with the default
      700, young collections ran many times per round, each moving every rank's current results to the
      oldest generation, whose full collections then held the GIL for 100-400 ms (the bench's W = 1024
      world: 1.0 s of collections, half of it in full ones; 0.43 s with the raised threshold, none full).
    """
    global _settings_users, _settings_saved
    interval = world_size * _GIL_REQUEST_SPACING
    young = world_size * _YOUNG_OBJECTS_PER_RANK
    with _settings_lock:
        if _settings_users == 0:
            _settings_saved = (sys.getswitchinterval(), gc.get_threshold())
        _settings_users += 1
        if interval > sys.getswitchinterval():
            sys.setswitchinterval(interval)
        thresholds = gc.get_threshold()
        if young > thresholds[0] > 0:  # 0: collection is off, and stays so
            gc.set_threshold(young, *thresholds[1:])
    try:
        yield
    finally:
        with _settings_lock:
            _settings_users -= 1
            if _settings_users == 0:
                sys.setswitchinterval(_settings_saved[0])
                gc.set_threshold(*_settings_saved[1])


# ---- MPI ------------------------------------------------------------------------------------------
def mpi_bootstrap(comm: Any = None, set_device: bool = True) -> tuple[int, int, bytes]:
    """For a job started by ``mpiexec``/``mpirun``: rank 0 makes the HCCL root info and broadcasts
    it over MPI (mpi4py, the optional extra ``aclnn-py[mpi]``). Returns ``(rank, world_size,
    root_bytes)``; with `set_device` the calling thread's device becomes the rank's index among the
    ranks of its host (modulo the device count)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("mpi_bootstrap needs mpi4py: pip install 'aclnn-py[mpi]'") from exc
    from .hccl import RootInfo
    from .runtime import init

    world = comm if comm is not None else MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    init()
    if set_device:
        local = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        try:
            _set_device(local.Get_rank())
        finally:
            local.Free()
    root = bytes(RootInfo.create()) if rank == 0 else None
    root = world.bcast(root, root=0)
    return rank, size, root


if __name__ == "__main__":  # pragma: no cover
    sys.exit("aclnn_py.worlds is a library module")
