"""C consumers of the fake CANN root: tests/c is configured and built with CMake against the mock
root's include/ and lib64/ (nothing of Python is linked), then run.

* test_runtime (plain C99): init/refcount, error messages, devices, memory, streams, events, tensors.
* test_internal (C++17, against mock/'s internal headers): the two-phase executor rules through the
  MockCopy test op, failures reported by streams, the memory registry and exact statistics.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.toolchain import c_compiler, cmake

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "tests" / "c"


def _mock_root() -> Path:
    import aclnn_py

    return Path(aclnn_py.mock_root())


@pytest.fixture(scope="module")
def c_build(tmp_path_factory) -> Path:
    cmake()
    c_compiler()
    root = _mock_root()
    assert (root / "lib64" / "libascendcl.so").is_file(), root
    assert (root / "lib64" / "libnnopbase.so").is_file(), root
    assert (root / "include" / "acl" / "acl_rt.h").is_file(), root
    build = tmp_path_factory.mktemp("c_runtime")
    cmd = ["cmake", "-S", str(SRC), "-B", str(build), f"-DMOCK_ROOT={root}",
           "-DCMAKE_BUILD_TYPE=RelWithDebInfo"]
    if (REPO / "mock" / "aclnn" / "executor.h").is_file():
        cmd.append(f"-DMOCK_SOURCE_DIR={REPO / 'mock'}")
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    res = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return build


def _run(exe: Path) -> None:
    env = dict(os.environ)
    # the program checks the documented defaults unless these are set
    for var in ("ACLNN_MOCK_DEVICE_COUNT", "ACLNN_MOCK_SOC", "ACLNN_MOCK_POISON"):
        env.pop(var, None)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    lines = res.stdout.strip().splitlines()
    assert lines, f"{exe.name} printed nothing\n{res.stderr}"
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", lines[-1])
    assert m, f"unexpected last line {lines[-1]!r}\n{res.stderr}"
    assert res.returncode == 0 and m.group(2) == "0", f"{lines[-1]}\n{res.stderr}"
    assert int(m.group(1)) > 50


def test_c_runtime(c_build):
    _run(c_build / "test_runtime")


def test_c_internal(c_build):
    exe = c_build / "test_internal"
    if not exe.exists():
        pytest.skip("mock/ sources are not next to the tests (internal C++ test not built)")
    _run(exe)


def test_c_runtime_env_config(c_build):
    """The same program honours ACLNN_MOCK_DEVICE_COUNT / ACLNN_MOCK_SOC / ACLNN_MOCK_POISON=0."""
    env = dict(os.environ, ACLNN_MOCK_DEVICE_COUNT="4", ACLNN_MOCK_SOC="Ascend950", ACLNN_MOCK_POISON="0")
    res = subprocess.run([str(c_build / "test_runtime")], capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1].endswith(" 0 failed")
