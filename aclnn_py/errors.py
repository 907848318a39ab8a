"""Status codes of the C API as Python exceptions (DESIGN.md §3.5, ABI.md §2).

Every exception carries the C function that failed, the numeric code, its symbolic name and the
library's own message (``aclGetRecentErrMsg``, read on the failing thread right after the call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ACL_CODES: dict[int, str] = {
    0: "ACL_SUCCESS",
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100037: "ACL_ERROR_REPEAT_FINALIZE",
    200000: "ACL_ERROR_BAD_ALLOC",
    200001: "ACL_ERROR_API_NOT_SUPPORT",
    200002: "ACL_ERROR_INVALID_DEVICE",
    200003: "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED",
    200004: "ACL_ERROR_RESOURCE_NOT_MATCH",
    200005: "ACL_ERROR_INVALID_RESOURCE_HANDLE",
    200006: "ACL_ERROR_FEATURE_UNSUPPORTED",
    300000: "ACL_ERROR_STORAGE_OVER_LIMIT",
    500000: "ACL_ERROR_INTERNAL_ERROR",
    500001: "ACL_ERROR_FAILURE",
    500003: "ACL_ERROR_RT_FAILURE",
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107001: "ACL_ERROR_RT_INVALID_DEVICEID",
    107002: "ACL_ERROR_RT_CONTEXT_NULL",
    107003: "ACL_ERROR_RT_STREAM_CONTEXT",
    107008: "ACL_ERROR_RT_ADDR_UNALIGNED",
    107016: "ACL_ERROR_RT_INVALID_MEMORY_TYPE",
    107017: "ACL_ERROR_RT_INVALID_HANDLE",
    107019: "ACL_ERROR_RT_WAIT_TIMEOUT",
    107020: "ACL_ERROR_RT_TASK_TIMEOUT",
    207000: "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    207002: "ACL_ERROR_RT_MEMORY_FREE",
    207004: "ACL_ERROR_RT_NO_DEVICE",
    207020: "ACL_ERROR_RT_TIMEOUT",
    507000: "ACL_ERROR_RT_INTERNAL_ERROR",
    507004: "ACL_ERROR_RT_STREAM_NOT_COMPLETE",
    507006: "ACL_ERROR_RT_EVENT_NOT_COMPLETE",
    507014: "ACL_ERROR_RT_AICORE_TIMEOUT",
    507015: "ACL_ERROR_RT_AICORE_EXCEPTION",
    507046: "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
    507047: "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT",
}

ACLNN_CODES: dict[int, str] = {
    0: "ACLNN_SUCCESS",
    161001: "ACLNN_ERR_PARAM_NULLPTR",
    161002: "ACLNN_ERR_PARAM_INVALID",
    361001: "ACLNN_ERR_RUNTIME_ERROR",
    561000: "ACLNN_ERR_INNER",
    561001: "ACLNN_ERR_INNER_INFERSHAPE_ERROR",
    561002: "ACLNN_ERR_INNER_TILING_ERROR",
    561003: "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
    561101: "ACLNN_ERR_INNER_CREATE_EXECUTOR",
    561102: "ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR",
    561103: "ACLNN_ERR_INNER_NULLPTR",
    561104: "ACLNN_ERR_INNER_WRONG_ATTR_INFO_SIZE",
    561105: "ACLNN_ERR_INNER_KEY_CONFLICT",
    561106: "ACLNN_ERR_INNER_INVALID_IMPL_MODE",
    561107: "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
}

HCCL_CODES: dict[int, str] = {
    0: "HCCL_SUCCESS", 1: "HCCL_E_PARA", 2: "HCCL_E_PTR", 3: "HCCL_E_MEMORY", 4: "HCCL_E_INTERNAL",
    5: "HCCL_E_NOT_SUPPORT", 6: "HCCL_E_NOT_FOUND", 7: "HCCL_E_UNAVAIL", 8: "HCCL_E_SYSCALL",
    9: "HCCL_E_TIMEOUT", 10: "HCCL_E_OPEN_FILE_FAILURE", 11: "HCCL_E_TCP_CONNECT",
    12: "HCCL_E_ROCE_CONNECT", 13: "HCCL_E_TCP_TRANSFER", 14: "HCCL_E_ROCE_TRANSFER",
    15: "HCCL_E_RUNTIME", 16: "HCCL_E_DRV", 17: "HCCL_E_PROFILING", 18: "HCCL_E_CCE",
    19: "HCCL_E_NETWORK", 20: "HCCL_E_AGAIN", 21: "HCCL_E_REMOTE", 22: "HCCL_E_SUSPENDING",
    23: "HCCL_E_OPRETRY_FAIL", 24: "HCCL_E_OOM", 1041: "HCCL_E_IN_STATUS",
}

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
        # picklable, so a rank's error crosses process boundaries (aclnn_py.launch) with its type
        return (_rebuild, (type(self), self.func, self.code, self.name, self.message))


def _rebuild(cls: type[AclnnPyError], func: str, code: int, name: str, message: str) -> AclnnPyError:
    obj = cls.__new__(cls)
    AclnnPyError.__init__(obj, func, code, name, message)
    return obj


class BackendError(RuntimeError):
    """No usable backend: CANN not found, a library that cannot be loaded, a backend switch."""


class MissingSymbolError(AclnnPyError):
    """The loaded backend does not export a function of the bound ABI."""

    def __init__(self, symbol: str, searched: str):
        self.symbol = symbol
        self.searched = searched
        super().__init__(symbol, -1, "MISSING_SYMBOL", f"symbol {symbol} not found in: {searched}")


class AclError(AclnnPyError):
    """An ACL runtime call (``aclError``) failed."""

    Timeout: type[AclError]


class AclTimeoutError(AclError):
    """A stream/event wait or a kernel timed out (507014, 507046, 507047, …)."""


AclError.Timeout = AclTimeoutError


class AclnnError(AclnnPyError):
    """An aclnn call (``aclnnStatus``) failed."""

    ParamNullptr: type[AclnnError]
    ParamInvalid: type[AclnnError]
    RuntimeError: type[AclnnError]
    InnerError: type[AclnnError]


class AclnnParamNullptr(AclnnError):
    """161001: a required pointer or tensor is NULL."""


class AclnnParamInvalid(AclnnError, ValueError):
    """161002: an argument breaks a rule of SPEC §3/§5/§9.3 or ABI.md §4."""


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

    Timeout: type[HcclError]


class HcclTimeoutError(HcclError, TimeoutError):
    """HCCL_E_TIMEOUT (9): a peer never arrived."""


HcclError.Timeout = HcclTimeoutError


def _recent_message() -> str | None:
    from ._loader import loaded

    b = loaded()
    if b is None:
        return None
    try:
        p = b.lib.aclGetRecentErrMsg()
    except MissingSymbolError:
        return None
    return None if p == b.ffi.NULL else b.ffi.string(p).decode(errors="replace")


def acl_error(ret: int, func: str, message: str | None = None) -> AclError:
    name = ACL_CODES.get(ret, f"ACL_ERROR_{ret}")
    cls = AclTimeoutError if ret in _TIMEOUT_CODES else AclError
    return cls(func, ret, name, message if message is not None else _recent_message())


def aclnn_error(ret: int, func: str, message: str | None = None) -> AclnnError:
    if ret in ACL_CODES and ret not in ACLNN_CODES:  # an op's phase 2 may forward a runtime code
        return acl_error(ret, func, message)  # type: ignore[return-value]
    name = ACLNN_CODES.get(ret, f"ACLNN_ERR_{ret}")
    cls: type[AclnnError]
    if ret == 161001:
        cls = AclnnParamNullptr
    elif ret == 161002:
        cls = AclnnParamInvalid
    elif ret == 361001:
        cls = AclnnRuntimeError
    elif 561000 <= ret < 562000:
        cls = AclnnInnerError
    else:
        cls = AclnnError
    return cls(func, ret, name, message if message is not None else _recent_message())


def hccl_error(ret: int, func: str, message: str | None = None) -> HcclError:
    name = HCCL_CODES.get(ret, f"HCCL_E_{ret}")
    cls = HcclTimeoutError if ret == 9 else HcclError
    return cls(func, ret, name, message if message is not None else _recent_message())


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
    return AclnnParamInvalid(func, 161002, "ACLNN_ERR_PARAM_INVALID", message)


def param_nullptr(func: str, message: str) -> AclnnParamNullptr:
    return AclnnParamNullptr(func, 161001, "ACLNN_ERR_PARAM_NULLPTR", message)


Checker = Callable[[int, str], None]
__all__: list[Any] = [
    "AclnnPyError", "BackendError", "MissingSymbolError", "AclError", "AclTimeoutError", "AclnnError",
    "AclnnParamNullptr", "AclnnParamInvalid", "AclnnRuntimeError", "AclnnInnerError", "HcclError",
    "HcclTimeoutError", "check_acl", "check_aclnn", "check_hccl", "param_invalid", "param_nullptr",
]
