"""Never the mock by accident on an NPU host: with no backend named and no CANN root found, a host
that shows Ascend device nodes makes init() raise BackendError naming the places searched and how to
choose; without device nodes the mock stays the default. doctor and the demo say which backend runs
and why."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.root_copies import run_cli, run_python

NO_CANN = {"ASCEND_HOME_PATH": "/nonexistent/cann", "ASCEND_TOOLKIT_HOME": "", "ACLNN_PY_BACKEND": ""}

INIT = """
import aclnn_py._binding.loader as loader
loader.DEVICE_NODES = {nodes!r}
import aclnn_py as acl
try:
    b = acl.init({request})
except acl.BackendError as e:
    print("REFUSED", e)
else:
    print("LOADED", b.kind)
"""


def _fake_nodes(tmp_path: Path, n: int) -> str:
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(n):
        (dev / f"davinci{i}").write_text("")
    (dev / "davinci_manager").write_text("")  # the driver's manager node is no device
    return str(dev / "davinci[0-9]*")


def test_npu_host_without_cann_refuses_the_silent_mock(tmp_path):
    nodes = _fake_nodes(tmp_path, 8)
    done = run_python(INIT.format(nodes=nodes, request=None), **NO_CANN)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert out.startswith(f"REFUSED this host has Ascend devices ({tmp_path}/dev/davinci0, {tmp_path}/dev/davinci1, "
                          f"{tmp_path}/dev/davinci2 ...) but no CANN root was found (looked for lib64/libascendcl.so "
                          "in /nonexistent/cann, /usr/local/Ascend/cann, /usr/local/Ascend/ascend-toolkit/latest)"), out
    assert "ACLNN_PY_BACKEND=/path/to/cann" in out and "ACLNN_PY_BACKEND=mock" in out and "init('mock')" in out


def test_npu_host_may_still_choose_the_mock(tmp_path):
    nodes = _fake_nodes(tmp_path, 2)
    assert run_python(INIT.format(nodes=nodes, request="'mock'"), **NO_CANN).stdout.strip() == "LOADED mock"
    env = dict(NO_CANN, ACLNN_PY_BACKEND="mock")
    assert run_python(INIT.format(nodes=nodes, request=None), **env).stdout.strip() == "LOADED mock"


def test_host_without_device_nodes_keeps_the_mock_default(tmp_path):
    nodes = str(tmp_path / "none" / "davinci[0-9]*")
    assert run_python(INIT.format(nodes=nodes, request=None), **NO_CANN).stdout.strip() == "LOADED mock"


def test_doctor_and_demo_say_which_backend_runs_and_why():
    doc = json.loads(run_cli("doctor", "--json", **NO_CANN).stdout)
    assert doc["backend"]["kind"] == "mock"
    assert doc["backend"]["reason"] == "the default where no CANN root is found and the host shows no Ascend device"
    text = run_cli("doctor", **NO_CANN).stdout
    assert "backend    mock (the package's mock root; requested: auto: the default where no CANN root" in text
    demo = run_cli("demo", "--world-size", "2", "--experts", "4", "--topk", "2")
    assert demo.returncode == 0, demo.stderr
    assert demo.stderr.splitlines()[0].startswith("demo: the mock ("), demo.stderr
