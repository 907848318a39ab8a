"""aclDataType ↔ numpy / ml_dtypes (CANN's ``aclDataType`` numbering of acl_base.h).

Every aclDataType that numpy can hold maps to a numpy dtype. Sub-byte types (INT4, FLOAT4_E2M1,
FLOAT4_E1M2, UINT1) are *packed* on the device — two 4-bit values per byte, low nibble first — while
ml_dtypes holds them one per byte; :func:`pack_nibbles` / :func:`unpack_nibbles` convert. Types with
no numpy type (HIFLOAT8, FLOAT4_E1M2, FLOAT6_*) travel as uint8 bytes with the element type recorded
on the Tensor.
"""

from __future__ import annotations

import enum
from typing import Any, TypeAlias, cast

import ml_dtypes
import numpy as np
import numpy.typing as npt


class DataType(enum.IntEnum):
    """aclDataType values (CANN's acl_base.h numbering).

    ``str()``, ``print()`` and f-strings give the member's name (``BF16``), as ``repr`` and a
    Tensor's repr do; ``int()`` (or a numeric format such as ``{dt:d}``) gives the aclDataType number.
    """

    DT_UNDEFINED = -1
    FLOAT = 0
    FLOAT16 = 1
    INT8 = 2
    INT32 = 3
    UINT8 = 4
    INT16 = 6
    UINT16 = 7
    UINT32 = 8
    INT64 = 9
    UINT64 = 10
    DOUBLE = 11
    BOOL = 12
    STRING = 13
    COMPLEX64 = 16
    COMPLEX128 = 17
    BF16 = 27
    INT4 = 29
    UINT1 = 30
    COMPLEX32 = 33
    HIFLOAT8 = 34
    FLOAT8_E5M2 = 35
    FLOAT8_E4M3FN = 36
    FLOAT8_E8M0 = 37
    FLOAT6_E3M2 = 38
    FLOAT6_E2M3 = 39
    FLOAT4_E2M1 = 40
    FLOAT4_E1M2 = 41

    # IntEnum prints its number from Python 3.11 on ("27"); a name says which type it is
    def __str__(self) -> str:
        return self.name

    # defined too because from Python 3.12 on IntEnum formats as int even when __str__ is overridden
    def __format__(self, format_spec: str) -> str:
        try:
            return format(self.name, format_spec)
        except ValueError:  # a numeric spec ("d", "x", ...): the aclDataType number
            return format(int(self), format_spec)

    @property
    def bits(self) -> int:
        """Bits per element on the device."""
        return _BITS[self]

    @property
    def packed(self) -> bool:
        """Whether several elements share a byte on the device."""
        return _BITS[self] < 8

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The numpy dtype that holds one element (uint8 for types without a numpy type)."""
        return to_numpy(self)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The same as :attr:`numpy_dtype`, so ``np.dtype(data_type)`` converts."""
        return to_numpy(self)


_BITS: dict[DataType, int] = {
    DataType.DT_UNDEFINED: 0, DataType.STRING: 0,
    DataType.FLOAT: 32, DataType.FLOAT16: 16, DataType.INT8: 8, DataType.INT32: 32, DataType.UINT8: 8,
    DataType.INT16: 16, DataType.UINT16: 16, DataType.UINT32: 32, DataType.INT64: 64,
    DataType.UINT64: 64, DataType.DOUBLE: 64, DataType.BOOL: 8, DataType.COMPLEX64: 64,
    DataType.COMPLEX128: 128, DataType.BF16: 16, DataType.INT4: 4, DataType.UINT1: 1,
    DataType.COMPLEX32: 32, DataType.HIFLOAT8: 8, DataType.FLOAT8_E5M2: 8, DataType.FLOAT8_E4M3FN: 8,
    DataType.FLOAT8_E8M0: 8, DataType.FLOAT6_E3M2: 8, DataType.FLOAT6_E2M3: 8,
    DataType.FLOAT4_E2M1: 4, DataType.FLOAT4_E1M2: 4,
}

# ml_dtypes' scalar types are untyped, so np.dtype() of them is Any to a type checker: annotated here
bfloat16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
float8_e4m3fn: np.dtype[Any] = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2: np.dtype[Any] = np.dtype(ml_dtypes.float8_e5m2)
float8_e8m0fnu: np.dtype[Any] = np.dtype(ml_dtypes.float8_e8m0fnu)
float4_e2m1fn: np.dtype[Any] = np.dtype(ml_dtypes.float4_e2m1fn)
int4: np.dtype[Any] = np.dtype(ml_dtypes.int4)

_TO_NUMPY: dict[DataType, np.dtype[Any]] = {
    DataType.FLOAT: np.dtype(np.float32),
    DataType.FLOAT16: np.dtype(np.float16),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT32: np.dtype(np.int32),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT16: np.dtype(np.int16),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.INT64: np.dtype(np.int64),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.DOUBLE: np.dtype(np.float64),
    DataType.BOOL: np.dtype(np.bool_),
    DataType.COMPLEX64: np.dtype(np.complex64),
    DataType.COMPLEX128: np.dtype(np.complex128),
    DataType.BF16: bfloat16,
    DataType.FLOAT8_E5M2: float8_e5m2,
    DataType.FLOAT8_E4M3FN: float8_e4m3fn,
    DataType.FLOAT8_E8M0: float8_e8m0fnu,
    DataType.FLOAT4_E2M1: float4_e2m1fn,
    DataType.INT4: int4,
    # no numpy type: raw bytes (packed types: one byte per two elements)
    DataType.HIFLOAT8: np.dtype(np.uint8),
    DataType.FLOAT4_E1M2: np.dtype(np.uint8),
    DataType.FLOAT6_E3M2: np.dtype(np.uint8),
    DataType.FLOAT6_E2M3: np.dtype(np.uint8),
    DataType.UINT1: np.dtype(np.uint8),
}

_FROM_NUMPY: dict[np.dtype[Any], DataType] = {
    dt: acl for acl, dt in _TO_NUMPY.items() if dt != np.dtype(np.uint8) or acl == DataType.UINT8
}

#: What dtype parameters accept: a DataType, an aclDataType int, or a numpy / ml_dtypes dtype or name.
DTypeLike: TypeAlias = DataType | int | npt.DTypeLike


def to_numpy(dtype: DTypeLike) -> np.dtype[Any]:
    """The numpy dtype for a DataType (or a numpy-compatible dtype, returned normalised)."""
    if isinstance(dtype, DataType):
        try:
            return _TO_NUMPY[dtype]
        except KeyError:
            raise TypeError(f"aclDataType {dtype.name} has no numpy representation") from None
    return np.dtype(cast("npt.DTypeLike", dtype))


def from_numpy(dtype: DTypeLike) -> DataType:
    """The DataType for a numpy / ml_dtypes dtype (or a DataType, returned as is)."""
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return DataType(dtype)
    nd = np.dtype(cast("npt.DTypeLike", dtype))
    try:
        return _FROM_NUMPY[nd]
    except KeyError:
        raise TypeError(f"numpy dtype {nd} has no aclDataType") from None


def as_datatype(dtype: DTypeLike) -> DataType:
    """Accept a DataType, an aclDataType int, or a numpy/ml_dtypes dtype."""
    return from_numpy(dtype)


def nbytes(dtype: DTypeLike, count: int) -> int:
    """Device bytes of `count` elements (packed types round up to whole bytes)."""
    bits = as_datatype(dtype).bits
    return (bits * count + 7) // 8


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Pack a 4-bit type held one per byte (ml_dtypes int4 / float4_e2m1fn, or uint8 codes 0..15)
    into bytes, two per byte along the last axis, element 2i in the low nibble. The last axis must be
    even."""
    raw = values.view(np.uint8) if values.dtype.itemsize == 1 else values.astype(np.uint8)
    if raw.shape[-1] % 2:
        raise ValueError(f"packing 4-bit values needs an even last dimension (got {raw.shape[-1]})")
    lo = raw[..., 0::2] & 0x0F
    hi = raw[..., 1::2] & 0x0F
    return (lo | (hi << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray, dtype: DTypeLike = np.uint8) -> np.ndarray:
    """Inverse of :func:`pack_nibbles`: (…, n) bytes → (…, 2n) values of `dtype` (a 1-byte ml_dtypes
    4-bit type, or uint8 for the codes). int4 codes are sign-extended."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = p & 0x0F
    out[..., 1::2] = p >> 4
    nd = to_numpy(dtype)
    if nd == int4:
        return ((out.astype(np.int8) << 4) >> 4).astype(int4)
    return out.view(nd) if nd.itemsize == 1 else out.astype(nd)
