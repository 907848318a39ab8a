"""What belongs to the calling thread: its current device (``aclrtGetDevice``) and its reusable
out-parameter cells. Below the device and stream modules, which both need them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import _core
from ..errors import check_acl
from ._init import initialized

_tls = threading.local()


def out_cell(ctype: str) -> Any:
    """A per-thread reusable out-parameter cell, so queries allocate nothing per call."""
    cells: dict[str, Any] | None = getattr(_tls, "cells", None)
    if cells is None:
        cells = _tls.cells = {}
    cell = cells.get(ctype)
    if cell is None:
        cell = cells[ctype] = initialized().ffi.new(ctype)
    return cell


def current_device_id() -> int:
    """``aclrtGetDevice``: the calling thread's device (asked through the compiled core, which keeps the
    GIL for this thread-local read)."""
    initialized()
    status, device = _core.current_device()
    check_acl(status, "aclrtGetDevice")
    return device


@contextmanager
def on_device(device: int) -> Iterator[None]:
    """The calling thread works on `device` within the block and on its previous context after it, as
    CuPy's ``with Device(i):`` does: making memory on another device leaves the caller where it was. A
    thread that had no context keeps `device`."""
    b = initialized()
    ffi, lib = b.ffi, b.lib
    saved = ffi.new("aclrtContext *")
    had = lib.aclrtGetCurrentContext(saved) == 0
    if had and current_device_id() == device:
        yield
        return
    check_acl(lib.aclrtSetDevice(device), "aclrtSetDevice")
    try:
        yield
    finally:
        if had:
            check_acl(lib.aclrtSetCurrentContext(saved[0]), "aclrtSetCurrentContext")
