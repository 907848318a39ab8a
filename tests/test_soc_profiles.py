"""SoC names by family on the mock: ACLNN_MOCK_SOC and _mock.set_soc take the names real parts report
(Ascend910_9391, Ascend950..., any case), choose the profile by family prefix, and aclrtGetSocName reports
the name exactly as given; a name of no known family is refused where it is configured."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import package_pythonpath
from helpers.moe_calls import DispatchCall, RawDesc, World2, expect

INVALID = 161002
E4M3 = 36


@pytest.fixture(scope="module")
def world(acl):
    w = World2()
    yield w
    w.close()


@pytest.fixture
def restore_soc(mock):
    yield
    mock.set_soc("Ascend910_93")


def _mx_call(world):
    """A dispatch with quant mode 4 (MX, Ascend950 only)."""
    c = DispatchCall(world, quant=4)
    c.tensors["expand_x"] = RawDesc((16, 1024), E4M3)
    c.tensors["dynamic_scales"] = np.zeros((16, 32), np.uint8)
    return c


@pytest.mark.parametrize("name", ["Ascend910_93", "Ascend910_9391", "Ascend910_9392", "ascend910_9391"])
def test_a3_family(acl, mock, world, restore_soc, name):
    mock.set_soc(name)
    assert acl.soc_name() == name                 # reported exactly as given
    assert mock.soc() == "Ascend910_93"           # the profile
    expect(_mx_call(world), INVALID, "quant_mode: must be 0 or 2 on Ascend910_93 (got 4)")
    expect(DispatchCall(world, W=769, E=769), INVALID, "ep_world_size: must be in [2, 768] on Ascend910_93")


@pytest.mark.parametrize("name", ["Ascend950", "Ascend950PR_9599", "ASCEND950DT"])
def test_950_family(acl, mock, world, restore_soc, name):
    mock.set_soc(name)
    assert acl.soc_name() == name
    assert mock.soc() == "Ascend950"
    ret, msg = _mx_call(world).run()
    assert ret == 0, msg
    expect(DispatchCall(world, W=1025, E=1025), INVALID, "ep_world_size: must be in [2, 1024] on Ascend950 (got 1025)")


@pytest.mark.parametrize("name", ["Ascend910B4", "Ascend910_9", "Ascend310P3", "Ascend95", "", "Ascend 950"])
def test_unknown_name_refused_by_set_soc(acl, mock, restore_soc, name):
    mock.set_soc("Ascend910_9392")
    with pytest.raises(ValueError, match=f"set_soc: '{name}' names no SoC the mock simulates; the profile is chosen "
                                         "by family: a name beginning Ascend910_93 .* or Ascend950"):
        mock.set_soc(name)
    assert acl.soc_name() == "Ascend910_9392" and mock.soc() == "Ascend910_93"   # unchanged


def _child(soc: str) -> subprocess.CompletedProcess:
    code = ("import aclnn_py as a\n"
            "try:\n"
            "    a.init('mock')\n"
            "except a.AclError as e:\n"
            "    print('REFUSED', e.code, e.message)\n"
            "else:\n"
            "    from aclnn_py import _mock\n"
            "    print('OK', a.soc_name(), _mock.soc())\n")
    env = dict(os.environ, ACLNN_MOCK_SOC=soc)
    env["PYTHONPATH"] = package_pythonpath(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("soc,profile", [("Ascend910_9391", "Ascend910_93"), ("Ascend950PR_9599", "Ascend950")])
def test_environment_variable_by_family(acl, soc, profile):
    res = _child(soc)
    assert res.stdout.split() == ["OK", soc, profile], res.stdout + res.stderr


def test_environment_variable_of_no_known_family_fails_acl_init(acl):
    res = _child("Ascend910B4")
    out = res.stdout.strip()
    assert out.startswith("REFUSED 100000 aclInit: ACLNN_MOCK_SOC='Ascend910B4' is refused: 'Ascend910B4' names "
                          "no SoC the mock simulates"), out + res.stderr
