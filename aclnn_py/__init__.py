"""aclnn-py: Python binding of CANN's MoE dispatch/combine aclnn operators, with a CPU mock.

Quick start::

    import aclnn_py as acl
    acl.init()                      # real CANN when found, else the mock (or "mock" / "cann" / a path)
    dev = acl.Device(0); dev.set_current()
    t = acl.Tensor.from_numpy(np.arange(8, dtype=np.float32))
"""

from __future__ import annotations

import os as _os
from typing import Any

# Development hook: run from the source tree against a CMake build directory's compiled parts
# (`ACLNN_PY_BUILD_DIR=<build>/aclnn_py`): its _aclnn/_mock modules and mock_root are found there.
_build_dir = _os.environ.get("ACLNN_PY_BUILD_DIR")
if _build_dir:
    __path__.append(_build_dir)

from . import dtypes, errors  # noqa: E402
from ._loader import Backend, backend, mock_root  # noqa: E402
from .dtypes import DataType  # noqa: E402
from .errors import (  # noqa: E402
    AclError,
    AclnnError,
    AclnnPyError,
    BackendError,
    HcclError,
    MissingSymbolError,
)
from .runtime import Device, DeviceMemory, Event, Stream, init, soc_name  # noqa: E402
from .tensor import Tensor  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AclError", "AclnnError", "AclnnPyError", "Backend", "BackendError", "DataType", "Device",
    "DeviceMemory", "Event", "HcclError", "MissingSymbolError", "Stream", "Tensor", "backend",
    "dtypes", "errors", "init", "mock_root", "soc_name",
]


def __getattr__(name: str) -> Any:  # lazily imported submodules that pull in more of the package
    if name in ("hccl", "launch", "golden", "ops"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name == "MoeDistributeBuffer":
        from .buffer import MoeDistributeBuffer

        return MoeDistributeBuffer
    raise AttributeError(f"module 'aclnn_py' has no attribute {name!r}")
