"""Environment values that cannot be read are refused by name with what the variable accepts: one line
and exit 2 from the command line, EnvironmentValueError from init(), a status and aclGetRecentErrMsg
from the mock's C API. None is replaced by a default in silence."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.root_copies import run_cli, run_python
from helpers.toolchain import c_compiler

import aclnn_py
from aclnn_py import env_values

BAD = [
    ("HCCL_BUFFSIZE", "abc", "a whole number in [1, 1048576]"),
    ("HCCL_BUFFSIZE", "-5", "a whole number in [1, 1048576]"),
    ("HCCL_BUFFSIZE", "0", "a whole number in [1, 1048576]"),
    ("HCCL_BUFFSIZE", "1.5", "a whole number in [1, 1048576]"),
    ("HCCL_EXEC_TIMEOUT", "abc", "a number of seconds >= 0 (0: no limit)"),
    ("HCCL_EXEC_TIMEOUT", "-5", "a number of seconds >= 0 (0: no limit)"),
    ("HCCL_EXEC_TIMEOUT", "inf", "a number of seconds >= 0 (0: no limit)"),
    ("HCCL_CONNECT_TIMEOUT", "0", "a number of seconds > 0"),
    ("ACLNN_MOCK_DEVICE_COUNT", "abc", "a whole number in [1, 1024]"),
    ("ACLNN_MOCK_DEVICE_COUNT", "0", "a whole number in [1, 1024]"),
    ("ACLNN_MOCK_DEVICE_COUNT", "1.5", "a whole number in [1, 1024]"),
    ("ACLNN_MOCK_DEVICE_COUNT", "-5", "a whole number in [1, 1024]"),
    ("ACLNN_MOCK_POISON", "maybe", "0, 1, on, off, true, false, yes, no or stripe"),
    ("ACLNN_PY_POOL", "2", "0 or 1"),
    ("ACLNN_PY_POOL", "off", "0 or 1"),
    ("ACLNN_PY_SKIP_ABI_CHECK", "yes", "0 or 1"),
    ("ACLNN_PY_ABI_CHECK", "loud", "warn or strict"),
]
GOOD = [("HCCL_BUFFSIZE", " 8 "), ("HCCL_EXEC_TIMEOUT", "0.5"), ("HCCL_EXEC_TIMEOUT", "0"),
        ("HCCL_CONNECT_TIMEOUT", "30"), ("ACLNN_MOCK_DEVICE_COUNT", "1024"), ("ACLNN_MOCK_POISON", "Stripe"),
        ("ACLNN_PY_POOL", "0"), ("ACLNN_MOCK_SOC", "Ascend910B2"), ("HCCL_BUFFSIZE", "")]


@pytest.mark.parametrize(("name", "value", "accepted"), BAD)
def test_rules_refuse(name, value, accepted):
    assert env_values.problem(name, {name: value}) == f"{name}={value!r} cannot be read: give {accepted}"
    with pytest.raises(aclnn_py.EnvironmentValueError) as info:
        env_values.check({name: value})
    assert info.value.variable == name


@pytest.mark.parametrize(("name", "value"), GOOD)
def test_rules_accept(name, value):
    assert env_values.problem(name, {name: value}) is None


@pytest.mark.parametrize(("name", "value", "accepted"), BAD[::3] + [BAD[-4]])
def test_init_raises_a_typed_error(name, value, accepted):
    code = ("import aclnn_py as acl\n"
            "try:\n    acl.init('mock')\n"
            "except acl.EnvironmentValueError as e:\n    print('refused', e.variable, '|', e)\n")
    done = run_python(code, **{name: value})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"refused {name} | {name}={value!r} cannot be read: give {accepted}"


@pytest.mark.parametrize(("name", "value", "accepted"), BAD[1::3])
def test_cli_gives_one_line_and_exit_2(name, value, accepted):
    for argv in (("doctor",), ("demo", "--world-size", "2", "--experts", "4", "--topk", "2")):
        done = run_cli(*argv, **{name: value})
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr == f"aclnn-py {argv[0]}: error: {name}={value!r} cannot be read: give {accepted}\n"


C_PROBE = r"""
#include <stdio.h>
#include "acl/acl.h"
#include "hccl/hccl.h"
int main(int argc, char **argv) {
    aclError a = aclInit(NULL);
    printf("aclInit %d %s\n", (int)a, a ? aclGetRecentErrMsg() : "");
    if (a) return 0;
    int32_t devices[2] = {0, 1};
    HcclComm comms[2];
    HcclResult h = HcclCommInitAll(2, devices, comms);
    printf("HcclCommInitAll %d %s\n", (int)h, h ? aclGetRecentErrMsg() : "");
    if (!h) { HcclCommDestroy(comms[0]); HcclCommDestroy(comms[1]); }
    (void)argc; (void)argv;
    return 0;
}
"""


@pytest.mark.parametrize(("name", "value", "line"), [
    ("ACLNN_MOCK_DEVICE_COUNT", "abc", "aclInit 100000 aclInit: ACLNN_MOCK_DEVICE_COUNT='abc' cannot be read: give a "
                                       "whole number in [1, 1024]"),
    ("ACLNN_MOCK_POISON", "maybe", "aclInit 100000 aclInit: ACLNN_MOCK_POISON='maybe' cannot be read: give 0, 1, on, "
                                   "off, true, false, yes, no or stripe"),
    ("HCCL_BUFFSIZE", "1.5", "HcclCommInitAll 1 HcclCommInitAll: HCCL_BUFFSIZE='1.5' cannot be read: give a whole "
                             "number in [1, 1048576]"),
    ("HCCL_EXEC_TIMEOUT", "-5", "HcclCommInitAll 1 HcclCommInitAll: HCCL_EXEC_TIMEOUT='-5' cannot be read: give a "
                                "number of seconds >= 0 (0: no limit)"),
    ("HCCL_BUFFSIZE", "2", "HcclCommInitAll 0 "),
])
def test_mock_c_api_refuses_with_status_and_message(tmp_path: Path, name, value, line):
    cc = c_compiler()
    root = Path(aclnn_py.mock_root()).resolve()
    src = tmp_path / "probe.c"
    src.write_text(C_PROBE)
    exe = tmp_path / "probe"
    built = subprocess.run([cc, str(src), f"-I{root}/include", f"-L{root}/lib64", "-lhccl", "-lascendcl", "-o", str(exe)],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACLNN_MOCK_", "HCCL_"))}
    env.update(LD_LIBRARY_PATH=f"{root}/lib64", **{name: value})
    done = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert line in done.stdout.splitlines(), done.stdout
