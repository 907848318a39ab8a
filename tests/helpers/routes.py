"""Which route an operator call took: the compiled call, or the Python function behind it."""

from __future__ import annotations

import sys
import threading
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
