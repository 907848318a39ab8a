"""What the lower runtime modules need of a stream, as structural types.

Memory copies (:mod:`._memory`) and stream-ordered lifetimes (:mod:`.ordered`) take a stream, and the
stream module imports :mod:`.ordered` to release holds when it synchronises. Naming the ``Stream``
class in those modules' annotations would close a circle ``_stream → ordered → _memory → _stream``
(at type-checking time), so they name these protocols instead, which :class:`~._stream.Stream` and
:class:`~._stream.Event` satisfy without knowing of them. This module imports nothing of the runtime.
"""

from __future__ import annotations

from typing import Any, Protocol


class QueuedEvent(Protocol):
    """An event recorded on a stream: whether the stream has passed it."""

    def query(self) -> bool: ...


class QueueingStream(Protocol):
    """A stream as copies and holds see it: the handle work is queued on, the key that names it in this
    process, whether it is still open, and recording an event on it."""

    @property
    def _cdata(self) -> Any: ...  # the aclrtStream as cffi cdata (untyped by cffi)

    @property
    def _key(self) -> int: ...

    @property
    def _open(self) -> bool: ...

    # `event`: None, or an event this stream's record_event returned before, recorded again
    def record_event(self, event: Any = None) -> QueuedEvent: ...
