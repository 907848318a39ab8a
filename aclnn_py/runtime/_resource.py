"""The base of every object that owns something the C side must release (a stream, an event, device
memory, an executor, a communicator): one ``close()`` that runs once, a refusal of any use after it
that names the object, ``with`` closing it, and release at collection for what was never closed."""

from __future__ import annotations

import abc
from typing import TypeVar

from ..errors import ClosedError

R = TypeVar("R", bound="Resource")


class Resource:
    """Owns one C-side resource until :meth:`close`. Subclasses set ``_open`` to True once the
    resource exists and define :meth:`_release` and :meth:`_label`."""

    # `_open` is each subclass's own slot (or __dict__ entry), so that a subclass may also derive from
    # a compiled base with a layout of its own (a plan derives from _core.PlanBase). Not an abc.ABC: the
    # plan classes are made from a type spec (_core.compiled_plan_class), which takes no metaclass with
    # a __new__ of its own; __init_subclass__ refuses a subclass without the abstract methods instead.
    __slots__ = ()
    _open: bool

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        missing = [name for name in ("_release", "_label") if getattr(cls, name) is getattr(Resource, name)]
        if missing:
            raise TypeError(f"{cls.__name__} derives from Resource and must define {', '.join(missing)}")

    @abc.abstractmethod
    def _release(self) -> None:
        """Give the resource back to the C side (called exactly once)."""

    @property
    def closed(self) -> bool:
        return not getattr(self, "_open", False)

    def close(self) -> None:
        """Release the resource now. Idempotent; any later use raises :class:`~aclnn_py.ClosedError`."""
        if getattr(self, "_open", False):
            self._open = False  # type: ignore[misc]  # a subclass's slot (see __slots__)
            self._release()

    @abc.abstractmethod
    def _label(self) -> str:
        """What the object is, e.g. ``Stream(0x55d0…, owned, device 0)`` (its repr while open)."""

    def require_open(self, operation: str) -> None:
        """Raise :class:`~aclnn_py.ClosedError` naming this object and `operation` if it is closed."""
        if not getattr(self, "_open", False):
            raise self._closed(operation)

    def _closed(self, operation: str) -> ClosedError:
        """The error for `operation` on this object once it is closed."""
        return ClosedError(self._label(), operation)

    def __repr__(self) -> str:
        label = self._label()
        return label if not self.closed else f"{label[:-1]}, closed)"

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Collection of an unclosed object; exceptions cannot propagate from here, and at interpreter
        # exit the backend may already be gone.
        if getattr(self, "_open", False):
            try:
                self.close()
            except Exception:
                pass
