"""C-level tests of the mock libhccl.so: tests/c/hccl_selftest.cpp is compiled against the mock CANN
root and run scenario by scenario (threads, forked processes, timeouts, argument errors, the
arrive/wait_all kernel contract of mock/hccl/hccl_core.h, peers that die or leave, host waits in
slices, process exit while a thread is blocked)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.toolchain import cxx_compiler

REPO = Path(__file__).resolve().parents[2]


def _mock_root() -> Path:
    env = os.environ.get("ACLNN_PY_MOCK_ROOT")
    if env:
        return Path(env)
    try:
        from aclnn_py._binding import loader as _loader

        return Path(_loader.mock_root())
    except Exception:  # noqa: BLE001 - fall back to a build tree next to the sources
        for cand in sorted(REPO.glob("build/*/aclnn_py/mock_root")):
            if (cand / "lib64" / "libhccl.so").exists():
                return cand
    pytest.skip("no mock CANN root found (install the package or set ACLNN_PY_MOCK_ROOT)")


@pytest.fixture(scope="module")
def selftest(tmp_path_factory) -> Path:
    cxx = cxx_compiler()
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


# The liveness scenarios run with the mock's default timeouts (120 s) and assert, inside the C code,
# that the survivors give up in seconds.
LONG = {"HCCL_EXEC_TIMEOUT": "120", "HCCL_CONNECT_TIMEOUT": "120"}


def test_process_killed_after_join(selftest):
    assert "ok procs 4 kill" in _run(selftest, "procs_kill", "4", **LONG)


def test_peer_destroyed_while_waited_for(selftest):
    assert "ok peer_destroyed" in _run(selftest, "peer_destroyed", **LONG)


def test_rank_process_dies_while_the_world_forms(selftest):
    assert "ok join_dies" in _run(selftest, "join_dies", **LONG)


def test_sliced_host_waits_then_abandoned(selftest):
    assert "ok sliced_waits" in _run(selftest, "sliced_waits", **LONG)


def test_sliced_host_waits_see_the_kernel_timeout(selftest):
    assert "ok sliced_timeout" in _run(selftest, "sliced_timeout", HCCL_EXEC_TIMEOUT="1")


@pytest.mark.parametrize("where", ["join", "wait"])
def test_exit_while_a_thread_is_blocked(selftest, where):
    """main() returns while a thread waits in HcclCommInitRootInfo or a barrier waits on a stream:
    the process ends at once and /dev/shm holds nothing of its world."""
    t0 = time.monotonic()
    out = _run(selftest, f"exit_{where}", timeout=30, **LONG)
    assert time.monotonic() - t0 < 10
    assert f"ok exit_while_blocked {where}" in out
    world = out.split("world ", 1)[1].split()[0]
    assert [n for n in os.listdir("/dev/shm") if world in n] == []
