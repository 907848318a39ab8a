"""Status codes of the C API as Python exceptions.

Every exception for a failed C call carries the C function, the numeric code, its symbolic name and
the library's own message (``aclGetRecentErrMsg``, read on the failing thread right after the call).
The symbolic names come from the constants of the bound headers (``include/``), so they are never
restated here. Errors that are not C statuses — a closed object, no usable backend — have their own
classes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "AclError", "AclTimeoutError", "AclnnError", "AclnnInnerError", "AclnnParamInvalid", "AclnnParamNullptr",
    "AclnnPyError", "AclnnRuntimeError", "BackendError", "ClosedError", "EnvironmentValueError", "HcclError", "HcclTimeoutError",
    "MissingSymbolError", "check_acl", "recent_message", "check_aclnn", "check_hccl", "param_invalid", "param_nullptr",
    "status_name",
]

ACL_SUCCESS = 0
ACLNN_ERR_PARAM_NULLPTR = 161001
ACLNN_ERR_PARAM_INVALID = 161002
ACLNN_ERR_RUNTIME_ERROR = 361001
HCCL_E_TIMEOUT = 9

# Runtime codes that mean "a wait ran out": a kernel waiting for peers, a timed stream/event sync.
_TIMEOUT_CODES = frozenset({107019, 107020, 207020, 507014, 507046, 507047})


class AclnnPyError(Exception):
    """Base of every error aclnn-py raises for a failed C call or a refused argument."""

    def __init__(self, func: str, code: int, name: str, message: str | None):
        self.func = func
        self.code = code
        self.name = name
        self.message = message or ""
        detail = f": {self.message}" if self.message else ""
        super().__init__(f"{func} failed with {name} ({code}){detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        # picklable, so a rank's error crosses process boundaries (aclnn_py.worlds) with its type
        return (_rebuild, (type(self), self.func, self.code, self.name, self.message))

    def with_message(self, message: str) -> AclnnPyError:
        """The same error (class, function, code) with another message, e.g. naming a parameter as the
        caller of a higher layer spells it."""
        return _rebuild(type(self), self.func, self.code, self.name, message)


def _rebuild(cls: type[AclnnPyError], func: str, code: int, name: str, message: str) -> AclnnPyError:
    obj = cls.__new__(cls)
    AclnnPyError.__init__(obj, func, code, name, message)
    return obj


class BackendError(RuntimeError):
    """No usable backend: CANN not found, a library that cannot be loaded, a backend switch, an
    installed CANN whose headers do not match the bound prototypes."""


class EnvironmentValueError(ValueError):
    """An environment variable aclnn-py or the mock reads holds a value that cannot be read
    (aclnn_py.env_values lists them with what they accept); ``variable`` names it."""

    def __init__(self, message: str, variable: str):
        super().__init__(message)
        self.variable = variable

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.variable))


class ClosedError(ValueError):
    """An operation on an object that was closed (a Stream, Event, DeviceMemory, Tensor, Communicator,
    executor or plan). Like I/O on a closed file, it is a ValueError."""

    def __init__(self, obj: str, operation: str):
        self.object = obj
        self.operation = operation
        super().__init__(f"{obj} is closed: cannot {operation}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClosedError, (self.object, self.operation))


class RecycledError(ValueError):
    """A read of a MoeDistributeBuffer result whose memory a later call of the same method took again
    (the buffer keeps a ring of result sets): the message names the method and how long results stay
    valid. Keep a result longer with ``clone()`` or ``keep=True``."""


class MissingSymbolError(AclnnPyError):
    """The loaded backend does not export a function of the bound ABI."""

    def __init__(self, symbol: str, searched: str):
        self.symbol = symbol
        self.searched = searched
        super().__init__(symbol, -1, "MISSING_SYMBOL", f"symbol {symbol} not found in: {searched}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (MissingSymbolError, (self.symbol, self.searched))


class AclError(AclnnPyError):
    """An ACL runtime call (``aclError``) failed."""

    Timeout: type[AclTimeoutError]


class AclTimeoutError(AclError, TimeoutError):
    """A stream/event wait or a kernel timed out (507014, 507046, 507047, …)."""


AclError.Timeout = AclTimeoutError


class AclnnError(AclnnPyError):
    """An aclnn call (``aclnnStatus``) failed."""

    ParamNullptr: type[AclnnParamNullptr]
    ParamInvalid: type[AclnnParamInvalid]
    RuntimeError: type[AclnnRuntimeError]
    InnerError: type[AclnnInnerError]


class AclnnParamNullptr(AclnnError, ValueError):
    """161001: a required pointer or tensor is NULL."""


class AclnnParamInvalid(AclnnError, ValueError):
    """161002: an argument breaks a rule of the operator (docs/operators.md lists them)."""


class AclnnRuntimeError(AclnnError):
    """361001."""


class AclnnInnerError(AclnnError):
    """561xxx: an inner error of the aclnn framework."""


AclnnError.ParamNullptr = AclnnParamNullptr
AclnnError.ParamInvalid = AclnnParamInvalid
AclnnError.RuntimeError = AclnnRuntimeError
AclnnError.InnerError = AclnnInnerError


class HcclError(AclnnPyError):
    """An HCCL call (``HcclResult``) failed."""

    Timeout: type[HcclTimeoutError]


class HcclTimeoutError(HcclError, TimeoutError):
    """HCCL_E_TIMEOUT (9): a peer never arrived."""


HcclError.Timeout = HcclTimeoutError

# ---- symbolic names, read from the bound headers' constants -------------------------------------------

_names: dict[str, dict[int, str]] | None = None


def _load_names() -> dict[str, dict[int, str]]:
    """{"acl": …, "aclnn": …, "hccl": …}: code → name, from the compiled module's constants (the
    #defines and enums of include/). Empty maps when the compiled module cannot be imported."""
    global _names
    if _names is not None:
        return _names
    families: dict[str, dict[int, str]] = {"acl": {}, "aclnn": {}, "hccl": {}}
    try:
        lib = importlib.import_module(f"{__package__}._aclnn").lib
    except ImportError:
        return families  # not cached: a later call may find the compiled parts
    for name in sorted(dir(lib)):
        family = ("aclnn" if name.startswith("ACLNN_") else
                  "acl" if name.startswith(("ACL_ERROR_", "ACL_RT_SUCCESS", "ACL_SUCCESS")) else
                  "hccl" if name.startswith(("HCCL_E_", "HCCL_SUCCESS")) else None)
        if family is None:
            continue
        value = getattr(lib, name)
        if isinstance(value, int):
            families[family].setdefault(value, name)
    families["acl"][0] = "ACL_SUCCESS"
    _names = families
    return families


def status_name(code: int, family: str = "acl") -> str:
    """The symbolic name of a status code of `family` ("acl", "aclnn" or "hccl")."""
    fallback = {"acl": "ACL_ERROR", "aclnn": "ACLNN_ERR", "hccl": "HCCL_E"}[family]
    return _load_names()[family].get(code, f"{fallback}_{code}")


# ---- the library's message ------------------------------------------------------------------------------

#: Reads ``aclGetRecentErrMsg`` of the loaded backend; installed by the loader once a backend is loaded.
_read_message: Callable[[], str | None] = lambda: None


def set_message_reader(reader: Callable[[], str | None]) -> None:
    global _read_message
    _read_message = reader


def recent_message() -> str | None:
    """The loaded backend's ``aclGetRecentErrMsg`` for this thread (clear-on-read), or None."""
    return _read_message()


def acl_error(ret: int, func: str, message: str | None = None) -> AclError:
    cls = AclTimeoutError if ret in _TIMEOUT_CODES else AclError
    return cls(func, ret, status_name(ret, "acl"), message if message is not None else _read_message())


def aclnn_error(ret: int, func: str, message: str | None = None) -> AclError | AclnnError:
    names = _load_names()
    if ret in names["acl"] and ret not in names["aclnn"]:  # an op's phase 2 may forward a runtime code
        return acl_error(ret, func, message)
    cls: type[AclnnError]
    if ret == ACLNN_ERR_PARAM_NULLPTR:
        cls = AclnnParamNullptr
    elif ret == ACLNN_ERR_PARAM_INVALID:
        cls = AclnnParamInvalid
    elif ret == ACLNN_ERR_RUNTIME_ERROR:
        cls = AclnnRuntimeError
    elif 561000 <= ret < 562000:
        cls = AclnnInnerError
    else:
        cls = AclnnError
    return cls(func, ret, status_name(ret, "aclnn"), message if message is not None else _read_message())


def hccl_error(ret: int, func: str, message: str | None = None) -> HcclError:
    cls = HcclTimeoutError if ret == HCCL_E_TIMEOUT else HcclError
    return cls(func, ret, status_name(ret, "hccl"), message if message is not None else _read_message())


def check_acl(ret: int, func: str) -> None:
    """Raise AclError for a non-zero aclError."""
    if ret:
        raise acl_error(ret, func)


def check_aclnn(ret: int, func: str) -> None:
    """Raise AclnnError for a non-zero aclnnStatus."""
    if ret:
        raise aclnn_error(ret, func)


def check_hccl(ret: int, func: str) -> None:
    """Raise HcclError for a non-zero HcclResult."""
    if ret:
        raise hccl_error(ret, func)


def param_invalid(func: str, message: str) -> AclnnParamInvalid:
    """The exception a Python pre-check raises: the same class, code and wording as the C side."""
    return AclnnParamInvalid(func, ACLNN_ERR_PARAM_INVALID, "ACLNN_ERR_PARAM_INVALID", message)


def param_nullptr(func: str, message: str) -> AclnnParamNullptr:
    return AclnnParamNullptr(func, ACLNN_ERR_PARAM_NULLPTR, "ACLNN_ERR_PARAM_NULLPTR", message)


_recent_message = recent_message  # the operator suites' name for it; removed once they are merged
