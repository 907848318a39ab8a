"""SoC profiles (aclnn_py/ops/profiles.py) as the one definition of what a product line supports: the
expand_x types of each dispatch quant mode per line, and the demo choosing and checking its modes
from those same profiles."""

from __future__ import annotations

import pytest

from aclnn_py.ops.profiles import A2, A3, ASCEND950, FAMILIES
from aclnn_py.tools import demo
from aclnn_py.tools.cli_conventions import UsageError


def test_y_dtypes_per_line_and_mode():
    assert [A3.y_dtypes(q) for q in range(6)] == [(), (), ("int8",), (), (), ()]
    assert ASCEND950.y_dtypes(0) == ()
    assert ASCEND950.y_dtypes(1) == ("int8", "hifloat8")
    assert ASCEND950.y_dtypes(2) == ("int8", "float8_e4m3fn", "float8_e5m2")
    assert ASCEND950.y_dtypes(4) == ("float8_e4m3fn", "float8_e5m2", "float4_e2m1", "float4_e1m2")
    assert ASCEND950.y_dtypes(7) == ()


def test_every_y_dtype_is_one_the_demo_can_name():
    for _, profile in FAMILIES:
        for q in profile.quant_modes:
            assert set(profile.y_dtypes(q)) <= set(demo.Y_DTYPES), (profile.name, q)


def test_the_demo_uses_the_ops_profiles():
    assert demo.PROFILES == {"Ascend910_93": A3, "Ascend910B": A2, "Ascend950": ASCEND950}
    assert all(demo.PROFILES[p.name] is p for _, p in FAMILIES)


@pytest.mark.parametrize("soc,quant,expected", [
    ("Ascend910_93", 2, "int8"), ("Ascend950", 3, "float8_e4m3fn"), ("Ascend950", 4, "float8_e4m3fn"),
])
def test_demo_default_y_dtype_is_the_profiles_first(soc, quant, expected):
    assert demo.Model(soc=soc, quant_mode=quant).expand_x_format == expected


@pytest.mark.parametrize("soc,kw,message", [
    ("Ascend910_93", dict(quant_mode=2, y_dtype="float8_e4m3fn"),
     "--y-dtype float8_e4m3fn is not an output of quant mode 2 on Ascend910_93 (allowed: int8)"),
    ("Ascend910_93", dict(quant_mode=4),
     "--quant-mode 4 is not supported on Ascend910_93 (it supports 0, 2) (Ascend950 supports it"),
    ("Ascend950", dict(comm_quant_mode=1), "--comm-quant-mode 1 is not supported on Ascend950 (it supports 0, 2, 3, 4)"),
])
def test_demo_refuses_what_the_profile_lacks(soc, kw, message):
    m = demo.Model(soc=soc, **kw)
    with pytest.raises(UsageError) as e:
        demo.validate(m, demo.PROFILES[soc], 8, list(range(m.world_size)))
    assert message in str(e.value)
