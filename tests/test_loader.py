"""Backend discovery against fake CANN trees (the search order of docs/real_cann.md), and loading the mock root."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from aclnn_py._binding import loader as _loader


def touch(root: Path, *rels: str) -> None:
    for rel in rels:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")


def test_cann_candidates_order(tmp_path):
    env = {"ASCEND_HOME_PATH": str(tmp_path / "home"), "ASCEND_TOOLKIT_HOME": str(tmp_path / "tk")}
    cands = _loader.cann_candidates(env)
    assert cands[:2] == [tmp_path / "home", tmp_path / "tk"]
    assert cands[2:] == [Path("/usr/local/Ascend/cann"), Path("/usr/local/Ascend/ascend-toolkit/latest")]


def test_find_cann_root_skips_roots_without_libascendcl(tmp_path):
    touch(tmp_path / "tk", "lib64/libascendcl.so")
    (tmp_path / "home").mkdir()
    env = {"ASCEND_HOME_PATH": str(tmp_path / "home"), "ASCEND_TOOLKIT_HOME": str(tmp_path / "tk")}
    assert _loader.find_cann_root(env) == tmp_path / "tk"


def test_find_cann_root_none(tmp_path, monkeypatch):
    env = {"ASCEND_HOME_PATH": str(tmp_path / "nothing")}
    if Path("/usr/local/Ascend").exists():
        pytest.skip("a real /usr/local/Ascend exists on this machine")
    assert _loader.find_cann_root(env) is None


def test_cann_85_layout(tmp_path):
    """CANN >= 8.5: split libopapi_*.so, libhcomm.so before libhccl.so, custom vendor first."""
    root = tmp_path / "cann"
    touch(root, "lib64/libascendcl.so", "lib64/libnnopbase.so", "lib64/libhccl.so", "lib64/libhcomm.so",
          "lib64/libopapi_math.so", "lib64/libopapi_transformer.so",
          "opp/vendors/custom_transformer/op_api/lib/libcust_opapi.so")
    (root / "opp/vendors/config.ini").write_text("load_priority=custom_transformer\n")
    plan = _loader.library_plan(root, {})
    assert plan["runtime"] == [root / "lib64/libascendcl.so"]
    assert plan["meta"] == [root / "lib64/libnnopbase.so"]
    assert plan["hccl"] == [root / "lib64/libhcomm.so", root / "lib64/libhccl.so"]
    assert plan["ops"] == [root / "opp/vendors/custom_transformer/op_api/lib/libcust_opapi.so",
                           root / "lib64/libopapi_transformer.so", root / "lib64/libopapi_math.so"]


def test_cann_83_layout_legacy_opapi(tmp_path):
    """CANN <= 8.3: one libopapi.so, HCCL only in libhccl.so, the built-in legacy location."""
    root = tmp_path / "toolkit"
    arch = platform.machine()
    touch(root, "lib64/libascendcl.so", "lib64/libnnopbase.so", "lib64/libhccl.so", "lib64/libopapi.so",
          f"opp/built-in/op_impl/ai_core/tbe/op_api/lib/linux/{arch}/libopapi.so")
    plan = _loader.library_plan(root, {})
    assert plan["hccl"] == [root / "lib64/libhccl.so"]
    assert plan["ops"] == [root / "lib64/libopapi.so",
                           root / f"opp/built-in/op_impl/ai_core/tbe/op_api/lib/linux/{arch}/libopapi.so"]


def test_vendor_priority_and_custom_opp_path(tmp_path):
    root = tmp_path / "cann"
    touch(root, "opp/vendors/zzz/op_api/lib/libcust_opapi.so", "opp/vendors/aaa/op_api/lib/libcust_opapi.so",
          "opp/vendors/mine/op_api/lib/libcust_opapi.so")
    (root / "opp/vendors/config.ini").write_text("load_priority=zzz,mine\n")
    custom = tmp_path / "elsewhere/vendors/customize"
    touch(custom, "op_api/lib/libcust_opapi.so")
    env = {"ASCEND_CUSTOM_OPP_PATH": f"{custom}:{tmp_path / 'missing'}"}
    ops = _loader.library_plan(root, env)["ops"]
    assert ops == [custom / "op_api/lib/libcust_opapi.so",
                   root / "opp/vendors/zzz/op_api/lib/libcust_opapi.so",
                   root / "opp/vendors/mine/op_api/lib/libcust_opapi.so",
                   root / "opp/vendors/aaa/op_api/lib/libcust_opapi.so"]


def test_ascend_opp_path_overrides_root_opp(tmp_path):
    root = tmp_path / "cann"
    opp = tmp_path / "opp2"
    touch(opp, "vendors/v/op_api/lib/libcust_opapi.so")
    assert _loader.library_plan(root, {"ASCEND_OPP_PATH": str(opp)})["ops"] == [
        opp / "vendors/v/op_api/lib/libcust_opapi.so"]


@pytest.mark.parametrize("name,group", [
    ("aclInit", "runtime"), ("aclrtMalloc", "runtime"), ("aclDataTypeSize", "runtime"),
    ("aclCreateTensor", "meta"), ("aclnnInit", "meta"), ("aclSetTensorAddr", "meta"),
    ("HcclBarrier", "hccl"), ("aclnnMoeDistributeCombineV5", "ops"),
])
def test_symbol_groups(name, group):
    assert _loader.symbol_group(name) == group


def test_mock_backend_loads_with_mock_layout(acl):
    b = acl.backend()
    assert b.kind == "mock" and b.is_mock and b.abi is None  # the package's own root is not guarded
    root = acl.mock_root()
    assert b.root.resolve() == root.resolve()
    assert b.libraries["runtime"] == [str(root / "lib64/libascendcl.so")]
    assert b.libraries["meta"] == [str(root / "lib64/libnnopbase.so")]
    runtime_and_meta = [n for n in b.symbols if _loader.symbol_group(n) in ("runtime", "meta")]
    assert runtime_and_meta and all(b.symbols[n] for n in runtime_and_meta), b.missing


def test_switching_backend_is_refused(acl, tmp_path):
    touch(tmp_path, "lib64/libascendcl.so")
    with pytest.raises(acl.BackendError, match="already loaded"):
        acl.init(str(tmp_path))


def test_not_a_cann_root(acl, tmp_path):
    with pytest.raises(acl.BackendError, match="not a CANN root"):
        _loader._resolve_request(str(tmp_path))


def test_missing_symbol_raises_clear_error(acl):
    """A symbol the backend lacks: the raw trampoline returns the stub's code and records the name;
    the Python lib raises MissingSymbolError naming the symbol and the libraries searched."""
    from aclnn_py import _aclnn

    b = acl.backend()
    lib = _loader._Lib(_aclnn.lib, {"aclrtMalloc": "/x/lib64/libascendcl.so"})
    with pytest.raises(acl.MissingSymbolError, match=r"aclrtMalloc not found in: /x/lib64/libascendcl.so"):
        lib.aclrtMalloc(b.ffi.NULL, 1, 0)
    assert lib.ACL_BF16 == 27  # constants still resolve
