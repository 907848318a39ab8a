"""Stream-ordered lifetimes, like a stream-ordered allocator.

A launch or an asynchronous copy queued on a stream may still read or write memory after the call
returns, so what it uses (uploaded host arrays, one-shot inputs and outputs) is *held* here until the
stream has passed that point. Holds are released when the stream is synchronised (any
synchronisation: ``Stream.synchronize``, ``Tensor.numpy``, ``MoeDistributeBuffer.synchronize``), when an
event recorded every few holds has completed, and all at once when the stream is closed. Each stream
also has one workspace block that its consecutive launches share (they are ordered), freed with the
stream, as are the smaller blocks it replaced.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable

from .. import _core
from .._core import StreamStateBase
from ._memory import DeviceMemory
from ._queue import QueuedEvent, QueueingStream

#: A checkpoint event is recorded once this many holds are pending in a stream's current segment, so a
#: stream that is never synchronised still frees. Recording and querying one costs about 10 µs on the
#: mock (it is queued like a launch); every synchronisation releases holds anyway.
CHECKPOINT_EVERY = 256


class _StreamState(StreamStateBase):
    """What one stream holds, in segments (StreamStateBase: the open segment, ``current``, takes the
    holds; a checkpoint or the start of a synchronisation closes it). Appending to the open segment is
    one step under the GIL for the compiled calls; the Python holds take the lock, so that none lands
    in a segment that a boundary already closed. ``current``, ``segments``, ``first``,
    ``checkpoints`` and ``workspace`` are typed fields of StreamStateBase (csrc/_core.pxd), which the
    compiled core reads and changes (a synchronisation: ``_core.synchronize``)."""

    __slots__ = ("retired",)

    def __init__(self) -> None:
        self.current = []
        self.segments = collections.deque([self.current])
        self.first = 0
        self.checkpoints = collections.deque()
        self.workspace = None
        self.retired: list[DeviceMemory] = []  # workspace blocks replaced by a larger one

    def blocks(self) -> list[DeviceMemory]:
        """The workspace blocks kept for the stream: the retired ones and the live one."""
        return self.retired + ([self.workspace] if self.workspace is not None else [])

    def pending(self) -> int:
        return sum(len(s) for s in list(self.segments))


# Held objects are dropped only after the lock is released: dropping one may run a finalizer (a closed
# plan's release, an unclosed object's __del__) that holds again or forgets a stream. The lock is
# reentrant because the garbage collector may run such a finalizer inside it all the same (from CPython
# 3.12 at any call); every step under it stays valid when one does (iterations run over copies).
_lock = threading.RLock()
_states: dict[int, _StreamState] = {}
_spare_events: list[QueuedEvent] = []


def _state(key: int) -> _StreamState:
    st = _states.get(key)
    return st if st is not None else _states.setdefault(key, _StreamState())


def hold(stream: QueueingStream, obj: object) -> None:
    """Keep `obj` alive until `stream` passes the work queued so far (the compiled core's holds, which
    the launches make too)."""
    _core.hold_until_passed(stream, obj)


class _AfterStream:
    """Held on a stream: runs its release when dropped, which is when the stream has passed the work
    queued before it was held (or the stream was destroyed)."""

    __slots__ = ("_release",)

    def __init__(self, release: Callable[[], None]):
        self._release = release

    def __del__(self) -> None:
        # Dropped inside a synchronisation, a checkpoint's reap or a stream's destruction: an exception
        # cannot reach that caller, so Python reports it as unraisable ("Exception ignored in ...",
        # sys.unraisablehook). At interpreter exit the backend may be gone: nothing worth reporting.
        if not sys.is_finalizing():
            self._release()
            return
        try:
            self._release()
        except Exception:
            pass


def release_after(stream: QueueingStream | None, release: Callable[[], None]) -> None:
    """Call `release` once `stream` has passed the launches queued on it so far: at once when there is
    no stream, it is closed (its queued work finished when it was destroyed) or a synchronisation saw
    every launch queued on it complete, else when the stream is next found past this point (a
    synchronisation, a checkpoint, its destruction). For what queued launches use without holding it
    per launch, e.g. a plan's executor and own buffers when the plan is closed: ``aclrtFree`` does not
    wait for the tasks that use the memory."""
    if stream is None or not stream._open or _core.launches_passed(stream):
        release()
    else:
        hold(stream, _AfterStream(release))


def state(stream: QueueingStream) -> _StreamState:
    """`stream`'s state, made when it has none yet (the compiled core's first launch on a stream)."""
    with _lock:
        return _state(stream._key)


def workspace_block(stream: QueueingStream) -> tuple[int, int]:
    """(address, size) of `stream`'s workspace block as it is ((0, 0) before the first) — the
    operators' every-call read; a launch needing more calls :func:`workspace`. Launches hold what they
    use with :func:`hold` *after* queueing, so that a synchronisation that began before the launch
    (from another thread) cannot release it."""
    st = _states.get(stream._key)
    mem = st.workspace if st is not None else None
    return (mem._ptr, mem.size) if mem is not None else (0, 0)


def _checkpoint(stream: QueueingStream) -> None:
    with _lock:
        spare = _spare_events.pop() if _spare_events else None
        closed = _state(stream._key).boundary()  # before the event: what it closed was queued before
    ev = stream.record_event(spare)
    released: list[list[object]] = []
    with _lock:
        st = _state(stream._key)
        st.checkpoints.append((ev, closed))
        _reap(st, released)


def _reap(st: _StreamState, released: list[list[object]]) -> None:
    """Take what completed checkpoints cover into `released` (caller holds the lock)."""
    while st.checkpoints:
        ev, closed = st.checkpoints[0]
        if not ev.query():
            return
        if st.checkpoints and st.checkpoints[0][0] is ev:  # else a finalizer run by query() reaped it
            st.checkpoints.popleft()
            _spare_events.append(ev)
            st.drop_through(closed, released)


def forget(key: int) -> None:
    """The stream with this key was destroyed (its queued work finished): release all it held."""
    with _lock:
        st = _states.pop(key, None)
        if st is None:
            return
        _core.states_forgotten()
        _spare_events.extend(ev for ev, _ in st.checkpoints)
        blocks = st.blocks()
        st.workspace, st.retired = None, []
    st.segments.clear()  # unreachable from the states now: dropped outside the lock
    st.current = []  # (a closed Stream object still refers to its state until it is collected)
    for mem in blocks:
        mem.close()


def workspace(stream: QueueingStream, size: int) -> int:
    """The address of a workspace of at least `size` bytes for launches on `stream` (0 for 0 bytes).

    A larger block replaces the stream's block without waiting for the stream: a launch of another
    thread may have read the old block's address and be queueing with it right now (it launches
    without the GIL), so the old block is retired, not freed, and freed with the stream. Blocks grow
    at least twofold, so what is retired stays below the size of the live block."""
    if size == 0:
        return 0
    with _lock:
        mem = _state(stream._key).workspace
        if mem is not None and mem.size >= size:
            return mem._ptr
    grown = DeviceMemory(max(size, 2 * mem.size) if mem is not None else size)
    with _lock:
        st = _state(stream._key)
        mem = st.workspace
        if mem is not None and mem.size >= size:  # another thread grew it meanwhile
            unused, grown = grown, mem
        else:
            unused = None
            if mem is not None:
                st.retired.append(mem)
            st.workspace = grown
    if unused is not None:
        unused.close()  # never used by a launch
    return grown._ptr


def reap() -> int:
    """Release what completed; returns how many holds are still pending."""
    released: list[list[object]] = []
    with _lock:
        states = list(_states.values())
        for st in states:
            _reap(st, released)
        return sum(st.pending() for st in states)


def held(stream: QueueingStream) -> int:
    """How many holds `stream` still has."""
    with _lock:
        st = _states.get(stream._key)
        return st.pending() if st is not None else 0


def workspace_bytes() -> int:
    """Bytes of workspace blocks currently kept for streams (retired ones included)."""
    with _lock:
        return sum(mem.size for st in list(_states.values()) for mem in st.blocks())


_core.bind_holds(states=_states, make=state, record_checkpoint=_checkpoint, workspace=workspace, every=CHECKPOINT_EVERY,
                 lock=_lock, spare=_spare_events)
