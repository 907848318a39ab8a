"""Data formats of the golden's inputs and outputs: names, the aclDataType values and numpy /
ml_dtypes dtypes that denote them, and the expand_x arrays each format is returned as (docs/operators.md;
the bit layouts are those of ``aclnn_py.golden.casts``)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from . import casts
from .config import BF16, F32, FP16

FMT_INT8 = "int8"
FMT_HIF8 = "hifloat8"
FMT_E4M3 = "float8_e4m3fn"
FMT_E5M2 = "float8_e5m2"
FMT_E2M1 = "float4_e2m1"
FMT_E1M2 = "float4_e1m2"
FMT_F16 = "float16"
FMT_BF16 = "bfloat16"
FP8 = (FMT_E4M3, FMT_E5M2)
FP4 = (FMT_E2M1, FMT_E1M2)
LOW_PRECISION_X = (FMT_HIF8,) + FP8 + FP4

# aclDataType values (aclnn_py.DataType is an IntEnum of them)
ACL_TO_FMT = {2: FMT_INT8, 34: FMT_HIF8, 35: FMT_E5M2, 36: FMT_E4M3, 40: FMT_E2M1, 41: FMT_E1M2,
               1: FMT_F16, 27: FMT_BF16}
NP_TO_FMT = {np.dtype(np.int8): FMT_INT8, np.dtype(ml_dtypes.float8_e4m3fn): FMT_E4M3,
              np.dtype(ml_dtypes.float8_e5m2): FMT_E5M2, np.dtype(ml_dtypes.float4_e2m1fn): FMT_E2M1,
              FP16: FMT_F16, BF16: FMT_BF16}
NAME_ALIASES = {"hif8": FMT_HIF8, "float8_e4m3": FMT_E4M3, "fp8_e4m3fn": FMT_E4M3, "fp8_e5m2": FMT_E5M2,
                 "float4_e2m1fn": FMT_E2M1, "fp4_e2m1": FMT_E2M1, "fp4_e1m2": FMT_E1M2, "fp16": FMT_F16,
                 "half": FMT_F16, "bf16": FMT_BF16}
FMT_NAMES = set(ACL_TO_FMT.values())


def format_name(dtype: Any) -> str:
    """Normalise a y_dtype / x_dtype argument to a format name (see the module docstring)."""
    if isinstance(dtype, str):
        n = NAME_ALIASES.get(dtype.lower(), dtype.lower())
        if n in FMT_NAMES:
            return n
        raise ValueError(f"unknown data type name {dtype!r}")
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        try:
            return ACL_TO_FMT[int(dtype)]
        except KeyError:
            raise ValueError(f"aclDataType {int(dtype)} is not a dispatch input/output type") from None
    try:
        return NP_TO_FMT[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise ValueError(f"data type {dtype!r} is not a dispatch input/output type") from None


def minifloat(fmt: str) -> Any:
    return casts.MINIFLOATS[fmt]


def as_output(codes: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 codes (n, H) → the expand_x array of format ``fmt`` (module docstring)."""
    if fmt in FP8:
        return codes.astype(np.uint8).view(NP_FMT[fmt])
    if fmt in FP4:
        return casts.pack_fp4(codes)
    return codes.astype(np.uint8)


NP_FMT = {FMT_E4M3: np.dtype(ml_dtypes.float8_e4m3fn), FMT_E5M2: np.dtype(ml_dtypes.float8_e5m2)}


def fp8_max(fmt: str) -> np.float32:
    result: np.float32 = F32(448.0) if fmt == FMT_E4M3 else F32(57344.0)
    return result


__all__ = ["FMT_INT8", "FMT_HIF8", "FMT_E4M3", "FMT_E5M2", "FMT_E2M1", "FMT_E1M2", "FMT_F16", "FMT_BF16", "FP8",
           "FP4", "LOW_PRECISION_X", "ACL_TO_FMT", "NP_TO_FMT", "NP_FMT", "format_name", "minifloat", "as_output",
           "fp8_max"]
