"""What belongs to the calling thread: its current device (``aclrtGetDevice``) and its reusable
out-parameter cells. Below the device and stream modules, which both need them."""

from __future__ import annotations

import threading
from typing import Any

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
    """``aclrtGetDevice``: the calling thread's device."""
    cell = out_cell("int32_t *")
    check_acl(initialized().lib.aclrtGetDevice(cell), "aclrtGetDevice")
    return int(cell[0])
