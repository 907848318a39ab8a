"""`aclnn-py doctor`: the CANN version from an install's version files (each format CANN uses), and
the report on the mock, on a copy of the mock root (a CANN root), on one whose headers differ
(exit 1, mismatch named) and on one without headers (unverified; --strict makes it exit 1)."""

from __future__ import annotations

import json
import platform

from helpers.root_copies import DISPATCH_HEADER, OP_INCLUDE, copy_mock_root, group_string_dispatch, run_cli

from aclnn_py import __version__
from aclnn_py.tools.doctor import cann_version

DISPATCH_WS = "aclnnMoeDistributeDispatchV5GetWorkspaceSize"


# ---- version files ----------------------------------------------------------------------------------
def test_version_from_toolkit_install_info(tmp_path):
    """CANN >= 8.0: <root>/<arch>-linux/ascend_toolkit_install.info, with the ops package's info beside it."""
    d = tmp_path / "x86_64-linux"
    d.mkdir()
    (d / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.5.0\ninnerversion=V100R001C25B001\narch=x86_64\nos=linux\n"
        f"path={d}\n")
    (d / "ascend_ops_install.info").write_text("package_name=Ascend-cann-A3-ops\nversion=8.5.0.1\n")
    v = cann_version(tmp_path, arch="x86_64")
    assert (v.version, v.package, v.source) == ("8.5.0", "Ascend-cann-toolkit", str(d / "ascend_toolkit_install.info"))
    assert v.components == {"Ascend-cann-A3-ops": "8.5.0.1"}
    assert v.describe().startswith("8.5.0 (Ascend-cann-toolkit, from ")


def test_version_from_version_cfg(tmp_path):
    """CANN <= 8.3 'latest' directory: version.cfg, release after the colon."""
    (tmp_path / "version.cfg").write_text("# version: 1.0\nruntime_running_version=[7.6.0.1.220:8.0.0]\n"
                                          "compiler_running_version=[7.6.0.1.220:8.0.0]\n")
    v = cann_version(tmp_path, arch="x86_64")
    assert (v.version, v.source) == ("8.0.0", str(tmp_path / "version.cfg"))


def test_version_from_runtime_version_info(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime/version.info").write_text("Version=7.7.T20.0.B210\n")
    assert cann_version(tmp_path, arch="x86_64").version == "7.7.T20.0.B210"


def test_no_version_file_is_unknown(tmp_path):
    v = cann_version(tmp_path, arch="x86_64")
    assert v.version == "unknown" and v.source is None and v.describe().startswith("unknown (no version file")


# ---- the report ----------------------------------------------------------------------------------------
def test_doctor_on_the_mock():
    r = run_cli("doctor", "--backend", "mock")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    field = {line[:10].strip(): line[11:] for line in lines if line[:1].strip() and len(line) > 11}
    assert field["aclnn_py"].startswith(f"{__version__} imported from ")
    compiled = [line[11:].split() for line in lines[1:4]]
    assert [(part[0], part[1].endswith(".so")) for part in compiled] == \
        [("_aclnn:", True), ("_core:", True), ("_mock:", True)]
    assert field["backend"].startswith("mock (the package's mock root")
    assert field["CANN"].startswith("8.5.0 (aclnn-py-mock-cann, from ")
    assert field["ABI"].startswith("verified: all ")
    assert field["soc"] == "Ascend910_93" and field["result"] == "OK"


def test_doctor_json_on_a_copy_of_the_mock_root(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    r = run_cli("doctor", "--backend", str(root), "--json", "--strict")
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == {"requested": str(root), "loaded": True, "kind": "cann", "root": str(root),
                              "reason": "requested with --backend"}
    assert doc["cann_version"]["version"] == "8.5.0"
    assert doc["cann_version"]["source"] == str(root / f"{platform.machine()}-linux/ascend_toolkit_install.info")
    assert doc["abi"]["status"] == "verified"
    assert str(root / OP_INCLUDE / DISPATCH_HEADER) in doc["abi"]["headers"]
    assert all(f["status"] == "match" for f in doc["abi"]["functions"].values())
    assert doc["libraries"]["ops"] == [str(root / "opp/vendors/custom_transformer/op_api/lib/libcust_opapi.so")]
    assert doc["soc"] == "Ascend910_93" and doc["devices"] == 16 and doc["problems"] == [] and doc["exit_code"] == 0


def test_doctor_reports_a_mismatch_and_exits_1(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    header = root / OP_INCLUDE / DISPATCH_HEADER
    header.write_text(group_string_dispatch(header.read_text()))
    r = run_cli("doctor", "--backend", str(root), "--json")
    assert r.returncode == 1 and r.stderr == "", r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"]["loaded"] is False and doc["abi"]["status"] == "mismatch"
    f = doc["abi"]["functions"][DISPATCH_WS]
    assert f["status"] == "mismatch" and f["header"] == str(header)
    assert f["detail"].startswith("parameter 9 is `int64_t epWorldSize` in aclnn-py but `const char *groupEp`")
    t = run_cli("doctor", "--backend", str(root))
    assert t.returncode == 1
    assert "ABI        MISMATCH in 1 function(s)" in t.stdout and "backend    NOT LOADED" in t.stdout
    assert f"{DISPATCH_WS}: parameter 9 is" in t.stdout


def test_doctor_with_the_skip_variable_loads_but_reports_the_mismatch(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    header = root / OP_INCLUDE / DISPATCH_HEADER
    header.write_text(group_string_dispatch(header.read_text()))
    r = run_cli("doctor", "--backend", str(root), "--json", ACLNN_PY_SKIP_ABI_CHECK="1")
    assert r.returncode == 1 and r.stderr == "", r.stdout + r.stderr  # the warning goes into the document
    doc = json.loads(r.stdout)
    assert doc["backend"]["loaded"] is True and doc["abi"]["status"] == "mismatch"
    assert doc["problems"][0].startswith("ABI mismatch (loaded anyway because ACLNN_PY_SKIP_ABI_CHECK=1): ")
    assert any("parameter 9" in w for w in doc["warnings"])


def test_doctor_without_headers_is_unverified_and_strict_fails(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    for d in (root / "include", root / OP_INCLUDE):
        for h in sorted(d.rglob("*.h")):
            h.unlink()
    r = run_cli("doctor", "--backend", str(root))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ABI        unverified: no header under {root} declares a bound function" in r.stdout
    s = run_cli("doctor", "--backend", str(root), "--strict")
    assert s.returncode == 1 and "ABI unverified" in s.stdout.splitlines()[-1]


def test_doctor_backend_not_found_exits_1():
    r = run_cli("doctor", "--backend", "/nonexistent/cann")
    assert r.returncode == 1
    assert "backend    NOT LOADED (requested: /nonexistent/cann)" in r.stdout
    assert "is not a CANN root" in r.stdout
