"""Argument conversion for the operator wrappers, done once per call: Tensors pass through, host
arrays are uploaded on the call's stream (integer ids converted to int32 when their values fit,
float64 weights to float32 when every value converts exactly), and anything else is refused with a
TypeError naming the parameter."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..dtypes import DataType, DTypeLike, as_datatype
from ..errors import param_invalid
from ..runtime import Stream
from ..tensor import Tensor
from .host_inputs import HostInputs

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

def host_array(value: object, param: str) -> np.ndarray:
    """`value` as a numpy array of a type the device can hold, or a TypeError naming `param`."""
    try:
        arr = np.asarray(value)
    except Exception as exc:
        raise TypeError(f"{param}: expected a Tensor or an array, got {type(value).__name__}") from exc
    try:
        as_datatype(arr.dtype)
    except (TypeError, ValueError):
        raise TypeError(f"{param}: expected a Tensor or a numeric array, got {type(value).__name__} of dtype "
                        f"{arr.dtype}") from None
    return arr


def as_int32(arr: np.ndarray, param: str, func: str) -> np.ndarray:
    """Integer ids of any integer dtype as int32 (numpy's default int64, DeepEP's type, included);
    values outside int32 are refused with the operator's status."""
    if arr.dtype == np.int32:
        return arr
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{param}: expected an integer array, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < INT32_MIN or int(arr.max()) > INT32_MAX):
        raise param_invalid(func, f"{param}: values must fit in int32 (got [{int(arr.min())}, {int(arr.max())}])")
    return arr.astype(np.int32)


def host_weights(value: object, param: str, func: str) -> Tensor | np.ndarray | None:
    """Weights given on the host in float64 (numpy's default float, a Python list of floats) as
    float32 when every value converts exactly (NaN stays NaN), else refused with the operator's status
    naming `param`; any other value as given (the operator names a wrong dtype)."""
    if value is None or isinstance(value, Tensor):
        return value
    arr = host_array(value, param)
    if arr.dtype != np.float64:
        return arr
    with np.errstate(over="ignore"):  # a value beyond float32's range becomes inf: refused below
        narrowed = arr.astype(np.float32)
    inexact = narrowed.astype(np.float64) != arr
    inexact &= ~np.isnan(arr)
    if inexact.any():
        where = tuple(int(i) for i in np.argwhere(inexact)[0])
        raise param_invalid(func, f"{param}: float64 values must convert to float32 exactly; pass float32 "
                            f"(got {float(arr[where])!r} at index {where})")
    return narrowed


def upload(arr: np.ndarray, param: str, stream: Stream, dtype: DTypeLike | None = None,
           kept: HostInputs | None = None) -> Tensor:
    """Host data of input `param` on the device, queued on `stream`: in the Tensor a buffer's result set
    keeps for it (`kept`, that set's copies on `stream`), else in a new one."""
    if kept is not None:
        return kept.upload(arr, param, dtype)
    return Tensor.from_numpy(arr, stream=stream, dtype=dtype)


def input_tensor(value: object, param: str, stream: Stream, dtype: DTypeLike | None = None,
                 kept: HostInputs | None = None) -> Tensor | None:
    """None, a Tensor as given, or host data uploaded on `stream` (recording `dtype`, e.g. HIFLOAT8
    for uint8 codes; see :func:`upload` for `kept`)."""
    if value is None or value.__class__ is Tensor:
        return value
    return required_tensor(value, param, stream, dtype, kept)


def required_tensor(value: object, param: str, stream: Stream, dtype: DTypeLike | None = None,
                    kept: HostInputs | None = None) -> Tensor:
    """A required input: a Tensor as given or host data uploaded, as :func:`input_tensor`; None is
    refused with a TypeError naming `param`."""
    if isinstance(value, Tensor):
        return value
    if value is None:
        raise TypeError(f"{param}: expected a Tensor or an array, got None")
    return upload(host_array(value, param), param, stream, dtype, kept)


def ids_tensor(value: object, param: str, stream: Stream, func: str, kept: HostInputs | None = None) -> Tensor:
    """Expert ids: a Tensor as given, or a host integer array converted to int32 and uploaded."""
    if isinstance(value, Tensor):
        return value
    if value is None:
        raise TypeError(f"{param}: expected a Tensor or an integer array, got None")
    return upload(as_int32(host_array(value, param), param, func), param, stream, None, kept)


def output_tensor(given: object, param: str, shape: Sequence[int], dtype: DTypeLike) -> Tensor:
    """A caller-provided output Tensor as given, or a new one of `shape` and `dtype`."""
    if given is None:
        return Tensor.empty(shape, dtype)
    return given_output(given, param)


def given_output(given: object, param: str) -> Tensor:
    """A caller-provided output: a Tensor, else a TypeError naming `param`."""
    if not isinstance(given, Tensor):
        raise TypeError(f"{param}: outputs must be Tensors (device memory the operator writes into), got "
                        f"{type(given).__name__}")
    return given


def check_given_outputs(in_names: Sequence[str], inputs: Sequence[object], out_names: Sequence[str],
                        outputs: Sequence[object], stream: Stream) -> None:
    """ValueError naming both when outputs the caller gave (Tensors; None or anything else: allocated
    here) overlap each other or an input (Tensors; anything else is host data) in memory, or lie on
    another device than `stream`."""
    from .._core import check_placement

    check_placement(tuple(in_names), inputs, tuple(out_names), outputs, stream)


#: an output entry the wrapper allocates (the caller gave none)
ALLOCATED = object()


def unread_output() -> Tensor:
    """An empty output for a call that phase 1 refuses before it reads its outputs (sizing the real
    one from refused attributes could ask for any amount of memory)."""
    return Tensor.empty((0,), DataType.INT8)


def wrong_dtype(param: str, expected: DataType, got: object) -> str:
    """The rule text for a host array of the wrong type (the C side's wording)."""
    return f"{param}: dtype must be {expected.name} (got {got})"
