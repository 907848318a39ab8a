"""SoC names by family on the mock: ACLNN_MOCK_SOC and _mock.set_soc take the names real parts report
(Ascend910_9391, Ascend950..., any case), choose the profile by family prefix, and aclrtGetSocName reports
the name exactly as given; a name of no known family is refused where it is configured. (The profile the
ops then apply: tests/ops/test_moe_checks.py.)"""

from __future__ import annotations

import subprocess

import pytest
from conftest import run_python
from helpers.moe_cases import A3, on_profile


@on_profile(A3)
@pytest.mark.parametrize("name", ["Ascend910A", "Ascend910_9", "Ascend310P3", "Ascend95", "", "Ascend 950"])
def test_unknown_name_refused_by_set_soc(acl, mock, profile, name):
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
            "except a.EnvironmentValueError as e:\n"
            "    print('REFUSED', e.variable, e)\n"
            "else:\n"
            "    from aclnn_py import _mock\n"
            "    print('OK', a.soc_name(), _mock.soc())\n")
    return run_python(code, ACLNN_MOCK_SOC=soc)


@pytest.mark.parametrize("soc,family", [("Ascend910_9391", "Ascend910_93"), ("Ascend950PR_9599", "Ascend950"),
                                         ("Ascend910B3", "Ascend910B"), ("ascend910b1", "Ascend910B")])
def test_environment_variable_by_family(acl, soc, family):
    res = _child(soc)
    assert res.stdout.split() == ["OK", soc, family], res.stdout + res.stderr


def test_environment_variable_of_no_known_family_is_refused(acl):
    """Python refuses it before loading the mock (EnvironmentValueError); a C program gets the same
    refusal from aclInit (tests/test_env_values.py)."""
    res = _child("Ascend310P3")
    out = res.stdout.strip()
    assert out.startswith("REFUSED ACLNN_MOCK_SOC ACLNN_MOCK_SOC='Ascend310P3' cannot be read: give a name beginning "
                          "with Ascend910_93"), out + res.stderr
