"""Which route an operator call took: the compiled call, or the Python function behind it."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


class PythonOpCalls:
    """Counts, per thread, the operator calls that reach the Python functions (through their modules'
    _convert, which every Python call runs first and the compiled call never does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.counts: dict[tuple[int, str], int] = {}
        for op in ("dispatch", "combine"):
            module = sys.modules[f"aclnn_py.ops.{op}"]
            monkeypatch.setattr(module, "_convert", self._counting(op, module._convert))
        self._ident = threading.get_ident

    def _counting(self, op: str, convert: Any) -> Any:
        def counting(*args: Any, **kwargs: Any) -> Any:
            key = (self._ident(), op)
            self.counts[key] = self.counts.get(key, 0) + 1
            return convert(*args, **kwargs)
        return counting

    def seen(self) -> tuple[int, int]:
        """(dispatch, combine) calls of this thread so far."""
        me = self._ident()
        return self.counts.get((me, "dispatch"), 0), self.counts.get((me, "combine"), 0)


@contextmanager
def compiled_path(on: bool) -> Iterator[None]:
    """Operator, plan and buffer calls take the compiled route (`on`) or every call its Python code,
    within the block; the previous setting after it."""
    from aclnn_py.ops import set_compiled_path

    previous = set_compiled_path(on)
    try:
        yield
    finally:
        set_compiled_path(previous)
