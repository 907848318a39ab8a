"""aclnn-py: Python binding of CANN's MoE dispatch/combine aclnn operators, with a CPU mock.

Quick start::

    import numpy as np
    import aclnn_py as acl

    acl.init()                      # real CANN when found, else the mock off an NPU host ("mock" / "cann" / a path)
    acl.Device(0).set_current()
    t = acl.Tensor.from_numpy(np.arange(8, dtype=np.float32))
    print(t.numpy())

The operators: :class:`MoeDistributeBuffer` (CANN's Python API) or :mod:`aclnn_py.ops` (the two-phase C
calls); multi-rank worlds: :mod:`aclnn_py.hccl` and :mod:`aclnn_py.worlds`; the numpy reference:
:mod:`aclnn_py.golden`. Documentation: docs/ in the repository.
"""

from __future__ import annotations

from ._binding.package import origin as _origin
from ._version import __version__

# In a source checkout the compiled parts live elsewhere (the installed build of this version, or a
# CMake build tree): make them importable as submodules of this package.
if _origin().compiled_dir is not None and _origin().compiled_dir != _origin().package_dir:
    __path__.append(str(_origin().compiled_dir))
if _origin().compiled_dir is None:  # the library is its compiled core: say where it was looked for
    from .errors import BackendError as _BackendError

    raise _BackendError(f"the compiled parts of aclnn_py were not found: {_origin().problem}")

from . import dtypes, errors, golden, hccl, ops, worlds  # noqa: E402
from ._binding.loader import Backend, backend, mock_root  # noqa: E402
from .buffer import LowLatencyDispatchResult, MoeDistributeBuffer  # noqa: E402
from .dtypes import DataType  # noqa: E402
from .errors import (  # noqa: E402
    AclError,
    AclnnError,
    AclnnInnerError,
    AclnnParamInvalid,
    AclnnParamNullptr,
    AclnnPyError,
    AclnnRuntimeError,
    AclTimeoutError,
    BackendError,
    ClosedError,
    EnvironmentValueError,
    HcclError,
    HcclTimeoutError,
    MissingSymbolError,
    RecycledError,
)
from .ops import MoeConfig  # noqa: E402
from .runtime import (  # noqa: E402
    Device,
    DeviceMemory,
    Event,
    MemoryPool,
    Stream,
    StreamLike,
    current_stream,
    get_memory_pool,
    init,
    set_allocator,
    soc_name,
)
from .tensor import Tensor  # noqa: E402

__all__ = [
    "AclError", "AclTimeoutError", "AclnnError", "AclnnInnerError", "AclnnParamInvalid", "AclnnParamNullptr",
    "AclnnPyError", "AclnnRuntimeError", "Backend", "BackendError", "ClosedError", "DataType", "Device",
    "DeviceMemory", "EnvironmentValueError", "Event", "HcclError", "HcclTimeoutError", "LowLatencyDispatchResult", "MissingSymbolError",
    "MemoryPool", "MoeConfig", "MoeDistributeBuffer", "RecycledError", "Stream", "StreamLike", "Tensor", "__version__", "backend",
    "current_stream", "dtypes", "errors", "get_memory_pool", "golden", "hccl", "init", "mock_root", "ops",
    "set_allocator", "soc_name", "worlds",
]


def __getattr__(name: str) -> object:
    # aclnn_py.launch was the name of aclnn_py.worlds until 0.x; "launch" now means phase 2 only
    if name == "launch":
        import warnings

        warnings.warn("aclnn_py.launch is now aclnn_py.worlds", DeprecationWarning, stacklevel=2)
        return worlds
    raise AttributeError(f"module 'aclnn_py' has no attribute {name!r}")
