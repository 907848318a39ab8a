"""The initialised backend: ``init()`` loads one (see :mod:`aclnn_py._binding.loader`) and calls ``aclInit`` /
``aclnnInit`` once per process; every runtime call goes through :func:`initialized`."""

from __future__ import annotations

import os
import threading

from .._binding import loader as _loader
from ..errors import check_acl, check_aclnn

ACL_ERROR_REPEAT_INITIALIZE = 100002

_lock = threading.Lock()
_initialized = False
_ready: _loader.Backend | None = None  # the backend once initialised: the fast path of initialized()


def init(backend: str | os.PathLike[str] | None = None) -> _loader.Backend:
    """Load a backend — ``"mock"``, ``"cann"``, a CANN root path, or None for ``$ACLNN_PY_BACKEND`` /
    real CANN when found / the mock — and initialise ACL and aclnn once per process. Idempotent;
    ``aclInit``'s ACL_ERROR_REPEAT_INITIALIZE (another component of the process initialised ACL
    first) is expected and ignored."""
    b = _loader.load(backend)
    if not _initialized:
        _init_once(b)
    return b


def _init_once(b: _loader.Backend) -> None:
    global _initialized, _ready
    with _lock:
        if _initialized:
            return
        ret = b.lib.aclInit(b.ffi.NULL)
        if ret != ACL_ERROR_REPEAT_INITIALIZE:
            check_acl(ret, "aclInit")
        ret = b.lib.aclnnInit(b.ffi.NULL)
        if ret != ACL_ERROR_REPEAT_INITIALIZE:
            check_aclnn(ret, "aclnnInit")
        _initialized = True
        _ready = b


def initialized() -> _loader.Backend:
    """The loaded backend, initialising the default one on first use."""
    if _ready is not None:  # every call after the first
        return _ready
    b = _loader.backend()
    if not _initialized:
        _init_once(b)
    return b


_soc_names: dict[int, str] = {}  # decoded names by the address aclrtGetSocName returned


def soc_name() -> str:
    """``aclrtGetSocName``: the SoC of the running device (the mock reports ``ACLNN_MOCK_SOC``)."""
    b = initialized()
    p = b.lib.aclrtGetSocName()
    # the runtime hands out names that live as long as the process, so decoding once per address suffices
    key = int(b.ffi.cast("uintptr_t", p))
    name = _soc_names.get(key)
    if name is None:
        name = _soc_names[key] = "" if not key else str(b.ffi.string(p).decode())
    return name


def version() -> tuple[int, int, int]:
    """``aclrtGetVersion``: (major, minor, patch) of the runtime."""
    b = initialized()
    cells = b.ffi.new("int32_t[3]")
    check_acl(b.lib.aclrtGetVersion(cells, cells + 1, cells + 2), "aclrtGetVersion")
    return int(cells[0]), int(cells[1]), int(cells[2])
