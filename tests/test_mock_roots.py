"""`aclnn-py mock-root`: a mock CANN root exporting only some generations of the MoE operators. The
other generations' symbols are missing for the dynamic loader itself (dlsym), so the loader and
`aclnn-py doctor` report them missing, while the chosen generation runs a real round."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest
from helpers.root_copies import run_cli, run_python

V5 = ("aclnnMoeDistributeDispatchV5GetWorkspaceSize", "aclnnMoeDistributeCombineV5GetWorkspaceSize")
V2 = ("aclnnMoeDistributeDispatchV2GetWorkspaceSize", "aclnnMoeDistributeCombineV2GetWorkspaceSize")


@pytest.fixture(scope="module")
def v2_root(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("v2") / "root"
    done = run_cli("mock-root", str(dest), "--generations", "v2")
    assert done.returncode == 0, done.stderr
    assert "exporting generations V2" in done.stdout
    return dest


def test_dlsym_finds_only_the_chosen_generation(v2_root):
    (lib,) = (v2_root / "opp" / "vendors").glob("*/op_api/lib/libcust_opapi.so")
    so = ctypes.CDLL(str(lib))
    for name in V2:
        assert hasattr(so, name)
    for name in V5:
        with pytest.raises(AttributeError):
            getattr(so, name)


def test_doctor_reports_the_others_missing(v2_root):
    done = run_cli("doctor", "--backend", str(v2_root), "--json")
    doc = json.loads(done.stdout)
    ops = doc["symbols"]["ops"]
    assert set(V5) <= set(ops["missing"]) and not set(V2) & set(ops["missing"])
    assert ops["present"] == 4
    assert doc["abi"]["status"] == "verified"


def test_loader_refuses_v5_and_runs_v2(v2_root):
    tests = Path(__file__).resolve().parent
    code = f"""
import sys
sys.path.insert(0, {str(tests)!r})
import aclnn_py
from aclnn_py.errors import MissingSymbolError
b = aclnn_py.init({str(v2_root)!r})
assert b.symbols["aclnnMoeDistributeDispatchV5GetWorkspaceSize"] is None
try:
    b.lib.aclnnMoeDistributeDispatchV5GetWorkspaceSize()
except MissingSymbolError as e:
    print("missing:", e)
else:
    raise SystemExit("V5 was callable")
from helpers.group_gens import GenCase, World, golden_round, make_inputs, run_round
c = GenCase(gen=2, W=2, tp=2, quant=2, seed=3)
inp = make_inputs(c)
w = World(c)
got = run_round(c, w, inp)
w.close()
disp, comb = golden_round(c, inp)
for (e, t), r in got.items():
    assert r.expand_x.tobytes() == disp[t][e].expand_x.tobytes()
    ok = comb[t][e].written
    assert r.x_out[ok].tobytes() == comb[t][e].x_out[ok].tobytes()
print("V2 round ok")
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert "missing: " in done.stdout and "aclnnMoeDistributeDispatchV5GetWorkspaceSize" in done.stdout
    assert "V2 round ok" in done.stdout


def test_usage_errors(tmp_path):
    bad = run_cli("mock-root", str(tmp_path / "r"), "--generations", "6")
    assert bad.returncode == 2 and "generations: each must be one of 1, 2, 3, 4, 5 (got '6')" in bad.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    taken = run_cli("mock-root", str(tmp_path / "full"), "--generations", "2")
    assert taken.returncode == 2 and "is not empty: name a new or empty directory" in taken.stderr
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    on_file = run_cli("mock-root", str(a_file), "--generations", "2")
    assert on_file.returncode == 2
    assert "is a file, not a directory: name a new or empty directory" in on_file.stderr, on_file.stderr


def test_priority_order(tmp_path):
    from aclnn_py.tools.mock_roots import make_root

    root = make_root(tmp_path / "r", [4, 2])
    assert (root / "opp" / "vendors" / "config.ini").read_text() == "load_priority=moe_v4,moe_v2\n"


def test_first_generation_package(tmp_path):
    """Generation 1's names have no suffix: its package exports those four and nothing of V2."""
    from aclnn_py.tools.mock_roots import make_root

    root = make_root(tmp_path / "r", [1])
    (lib,) = (root / "opp" / "vendors").glob("*/op_api/lib/libcust_opapi.so")
    so = ctypes.CDLL(str(lib))
    for name in ("aclnnMoeDistributeDispatch", "aclnnMoeDistributeDispatchGetWorkspaceSize",
                 "aclnnMoeDistributeCombine", "aclnnMoeDistributeCombineGetWorkspaceSize"):
        assert hasattr(so, name)
    with pytest.raises(AttributeError):
        so.aclnnMoeDistributeDispatchV2GetWorkspaceSize  # noqa: B018
