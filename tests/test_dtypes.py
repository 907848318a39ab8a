"""aclDataType ↔ numpy / ml_dtypes, and 4-bit packing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from aclnn_py.dtypes import DataType, from_numpy, nbytes, pack_nibbles, to_numpy, unpack_nibbles


@pytest.mark.parametrize("acl_dt,nd", [
    (DataType.FLOAT, np.float32), (DataType.FLOAT16, np.float16), (DataType.INT8, np.int8),
    (DataType.INT32, np.int32), (DataType.UINT8, np.uint8), (DataType.INT16, np.int16),
    (DataType.UINT16, np.uint16), (DataType.UINT32, np.uint32), (DataType.INT64, np.int64),
    (DataType.UINT64, np.uint64), (DataType.DOUBLE, np.float64), (DataType.BOOL, np.bool_),
    (DataType.COMPLEX64, np.complex64), (DataType.COMPLEX128, np.complex128),
    (DataType.BF16, ml_dtypes.bfloat16), (DataType.FLOAT8_E5M2, ml_dtypes.float8_e5m2),
    (DataType.FLOAT8_E4M3FN, ml_dtypes.float8_e4m3fn), (DataType.FLOAT8_E8M0, ml_dtypes.float8_e8m0fnu),
    (DataType.FLOAT4_E2M1, ml_dtypes.float4_e2m1fn), (DataType.INT4, ml_dtypes.int4),
])
def test_round_trip(acl_dt, nd):
    assert to_numpy(acl_dt) == np.dtype(nd)
    assert from_numpy(nd) == acl_dt
    assert from_numpy(int(acl_dt)) == acl_dt


def test_values_match_cann_numbering():
    assert (DataType.BF16, DataType.HIFLOAT8, DataType.FLOAT8_E4M3FN, DataType.FLOAT4_E1M2) == (27, 34, 36, 41)
    assert DataType.DT_UNDEFINED == -1


def test_types_without_numpy_type_are_bytes():
    for dt in (DataType.HIFLOAT8, DataType.FLOAT4_E1M2, DataType.FLOAT6_E3M2):
        assert to_numpy(dt) == np.dtype(np.uint8)
    assert from_numpy(np.uint8) == DataType.UINT8


def test_bits_and_nbytes():
    assert DataType.FLOAT4_E2M1.bits == 4 and DataType.FLOAT4_E2M1.packed
    assert not DataType.BF16.packed
    assert nbytes(DataType.FLOAT4_E2M1, 7) == 4
    assert nbytes(DataType.BF16, 7) == 14
    assert nbytes(np.float32, 3) == 12


def test_pack_unpack_fp4_all_codes():
    codes = np.arange(16, dtype=np.uint8)
    values = codes.view(ml_dtypes.float4_e2m1fn)
    packed = pack_nibbles(values)
    assert packed.tolist() == [(codes[i] | (codes[i + 1] << 4)) for i in range(0, 16, 2)]
    back = unpack_nibbles(packed, ml_dtypes.float4_e2m1fn)
    assert back.view(np.uint8).tolist() == codes.tolist()


def test_pack_unpack_int4_sign():
    v = np.array([[-8, 7, -1, 0]], dtype=ml_dtypes.int4)
    back = unpack_nibbles(pack_nibbles(v), ml_dtypes.int4)
    assert back.astype(np.int8).tolist() == [[-8, 7, -1, 0]]


def test_pack_odd_refused():
    with pytest.raises(ValueError, match="even"):
        pack_nibbles(np.zeros(3, np.uint8))


def test_unknown_numpy_dtype():
    with pytest.raises(TypeError, match="no aclDataType"):
        from_numpy(np.dtype("U4"))


def test_str_print_and_format_give_the_name(capsys):
    """On Python 3.11+ IntEnum prints its number; a DataType prints its name on every version."""
    assert str(DataType.BF16) == "BF16" and f"{DataType.FLOAT8_E4M3FN}" == "FLOAT8_E4M3FN"
    print(DataType.BF16)
    assert capsys.readouterr().out == "BF16\n"
    assert f"{DataType.INT8:>6}" == "  INT8" and format(DataType.FLOAT) == "FLOAT"
    assert f"{DataType.BF16:d}" == "27" and f"{DataType.BF16:#x}" == "0x1b" and int(DataType.BF16) == 27
