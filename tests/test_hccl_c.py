"""C-level tests of the mock libhccl.so: tests/c/hccl_selftest.cpp is compiled against the mock CANN
root and run scenario by scenario (threads, forked processes, timeouts, argument errors, the
publish/wait_all kernel contract of mock/hccl/hccl_core.h)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _mock_root() -> Path:
    env = os.environ.get("ACLNN_PY_MOCK_ROOT")
    if env:
        return Path(env)
    try:
        from aclnn_py import _loader

        return Path(_loader.mock_root())
    except Exception:  # noqa: BLE001 - fall back to a build tree next to the sources
        for cand in sorted(REPO.glob("build/*/aclnn_py/mock_root")):
            if (cand / "lib64" / "libhccl.so").exists():
                return cand
    pytest.skip("no mock CANN root found (install the package or set ACLNN_PY_MOCK_ROOT)")


@pytest.fixture(scope="module")
def selftest(tmp_path_factory) -> Path:
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    root = _mock_root()
    lib = root / "lib64"
    out = tmp_path_factory.mktemp("hccl_c") / "hccl_selftest"
    cmd = [cxx, "-std=c++17", "-O1", "-g", "-pthread", f"-I{root / 'include'}", f"-I{REPO / 'mock'}",
           str(REPO / "tests" / "c" / "hccl_selftest.cpp"), "-o", str(out), f"-L{lib}", "-lhccl",
           "-lascendcl", f"-Wl,-rpath,{lib}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return out


def _run(exe: Path, *args: str, timeout: float = 60, **env: str) -> str:
    e = dict(os.environ, HCCL_BUFFSIZE="2", **env)
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=e)
    sys.stdout.write(res.stdout)
    assert res.returncode == 0, f"{args}: rc={res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.mark.parametrize("n", [1, 4, 8])
def test_thread_world(selftest, n):
    assert f"ok world_threads {n}" in _run(selftest, "threads", str(n))


def test_argument_errors(selftest):
    assert "ok arg_errors" in _run(selftest, "args")


def test_rank_never_joins(selftest):
    assert "ok never_joins 4" in _run(selftest, "never_joins", "4", HCCL_CONNECT_TIMEOUT="0.5")


def test_exec_timeout_names_missing_rank(selftest):
    assert "ok exec_timeout" in _run(selftest, "exec_timeout", HCCL_EXEC_TIMEOUT="0.5")


def test_process_world(selftest):
    assert "ok procs 4" in _run(selftest, "procs", "4")


def test_process_killed_after_join(selftest):
    assert "ok procs 4 kill" in _run(selftest, "procs_kill", "4", HCCL_EXEC_TIMEOUT="1")
