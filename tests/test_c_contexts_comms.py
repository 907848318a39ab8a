"""Contexts, aclrtResetDevice, HcclCommInitAll and HcclCommInitClusterInfo from a plain C program
(tests/c/test_contexts_comms.c) compiled against the mock root with one compiler line: only -I and
-L flags and CANN's library names, as a user's program would be built against a CANN install."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import aclnn_py

SRC = Path(__file__).resolve().parent / "c"


def _cc() -> str:
    for name in (os.environ.get("CC", "cc"), "gcc", "clang"):
        if shutil.which(name):
            return name
    pytest.skip("no C compiler")


def _cann_env(root: Path) -> dict[str, str]:
    env = dict(os.environ, ASCEND_HOME_PATH=str(root))
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [f"{root}/lib64", env.get("LD_LIBRARY_PATH")]))
    for var in ("ACLNN_MOCK_DEVICE_COUNT", "ACLNN_MOCK_SOC", "ACLNN_MOCK_POISON"):
        env.pop(var, None)
    return env


def test_contexts_and_communicators_from_c(tmp_path: Path) -> None:
    root = Path(aclnn_py.mock_root())
    exe = tmp_path / "test_contexts_comms"
    cmd = [_cc(), "-std=c99", "-O1", "-Wall", "-Werror", f"-I{root}/include", f"-I{SRC}",
           str(SRC / "test_contexts_comms.c"), f"-L{root}/lib64", "-lhccl", "-lascendcl", "-pthread",
           "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, " ".join(cmd) + "\n" + res.stderr
    res = subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env=_cann_env(root), check=False)
    lines = res.stdout.strip().splitlines()
    assert lines, res.stderr
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", lines[-1])
    assert m and m.group(2) == "0" and res.returncode == 0, res.stdout + res.stderr
    assert int(m.group(1)) > 80
