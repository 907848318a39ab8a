"""Shared fixtures. Every test runs on the mock backend, never on a CANN found on the machine.

The folders mirror the package: runtime/ (aclnn_py/runtime), ops/ (aclnn_py/ops), golden/
(aclnn_py/golden), cli/ (the `aclnn-py` commands), mock/ (the mock CANN root itself: its C ABI, casts,
faults; c/ holds the C sources those tests build), bench/ (the checkout's benchmarks/, which the wheel
does not ship); tests of the top-level modules stay here."""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("ACLNN_PY_BACKEND", "mock")
# Fail fast instead of waiting the default 120 s when a test leaves a peer missing.
os.environ.setdefault("HCCL_EXEC_TIMEOUT", "20")
os.environ.setdefault("HCCL_CONNECT_TIMEOUT", "20")

import pytest  # noqa: E402


def package_pythonpath(env: dict[str, str]) -> str:
    """PYTHONPATH for a child interpreter: wherever this test process imported aclnn_py from (the
    installed package, or the source tree in a development checkout), then env's own."""
    from pathlib import Path

    import aclnn_py

    where = str(Path(aclnn_py.__file__).resolve().parents[1])
    return os.pathsep.join(filter(None, [where, env.get("PYTHONPATH")]))


def run_python(code: str, timeout: float = 120, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a child interpreter importing this process's aclnn_py, with this process's
    environment plus `extra_env`; its output captured as text."""
    env = dict(os.environ, **extra_env)
    env["PYTHONPATH"] = package_pythonpath(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def acl():
    """The package, initialised on the mock backend with device 0 current on this thread."""
    import aclnn_py

    aclnn_py.init("mock")
    aclnn_py.Device(0).set_current()
    return aclnn_py


@pytest.fixture(scope="session")
def mock(acl):
    """The mock's control module."""
    from aclnn_py import _mock

    return _mock


@pytest.fixture
def raw(acl):
    """(ffi, lib) of the raw cffi layer, bound to the mock."""
    b = acl.backend()
    return b.ffi, b.lib


@pytest.fixture
def device0(acl):
    acl.Device(0).set_current()
    return acl.Device(0)


@pytest.fixture(params=["Ascend910_93", "Ascend950"])
def profile(request, mock):
    """The mock's SoC profile for the test: every profile, unless the test parametrises `profile`
    itself (indirectly, e.g. with helpers.moe_cases.on_profile); the default is restored after it."""
    mock.set_soc(request.param)
    yield request.param
    mock.set_soc("Ascend910_93")
