"""The SoC family table: a device's own name (a member of a family) selects its family's rules
everywhere — the mock's profile (ACLNN_MOCK_SOC), the operators' profiles, the golden, and the demo,
which matches the golden for a member of each family."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from helpers.root_copies import run_cli, run_python

from aclnn_py import golden, socs
from aclnn_py.ops import profile_of

MEMBERS = {
    "Ascend910_93": ["Ascend910_93", "Ascend910_9391", "Ascend910_9392", "ascend910_9391"],
    "Ascend910B": ["Ascend910B", "Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4"],
    "Ascend950": ["Ascend950", "Ascend950PR_9589", "Ascend950DT_9581"],
}
STRANGERS = ["Ascend910", "Ascend310P3", "Ascend910_9", "", "910B3"]


@pytest.mark.parametrize(("family", "name"), [(f, n) for f, names in MEMBERS.items() for n in names])
def test_members_belong_to_their_family_in_python_and_in_the_mock(family, name):
    assert socs.family_of(name) == family
    assert profile_of(name).name == family
    assert golden.config.check_soc(name) == family
    code = "import aclnn_py as acl; acl.init('mock'); from aclnn_py import _mock; print(acl.soc_name(), _mock.soc())"
    done = run_python(code, ACLNN_MOCK_SOC=name)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [name, family]


def test_the_golden_copy_of_the_table_agrees():
    names = [n for ns in MEMBERS.values() for n in ns] + STRANGERS + [f.examples[0] for f in socs.FAMILIES]
    assert {n: golden.config.soc_family(n) for n in names} == {n: socs.family_of(n) for n in names}
    assert set(golden.config.SOCS) == {f.name for f in socs.FAMILIES}


@pytest.mark.parametrize("name", STRANGERS)
def test_names_of_no_family_are_refused_everywhere(name):
    assert socs.family_of(name) is None
    with pytest.raises(ValueError, match="belongs to no known SoC family"):
        socs.require_family(name)
    with pytest.raises(ValueError, match="soc: must name a SoC of the family"):
        golden.config.check_soc(name)
    if name:  # an empty ACLNN_MOCK_SOC means "unset"
        bad = run_cli("demo", "--world-size", "2", "--experts", "4", "--topk", "2", ACLNN_MOCK_SOC=name)
        assert bad.returncode == 2
        assert bad.stderr.startswith(f"aclnn-py demo: error: ACLNN_MOCK_SOC='{name}' cannot be read: give a name "), bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_golden_sizing_takes_member_names():
    member = golden.ep_recv_counts_size(16, 1, 256, 8, comm_alg="hierarchy", soc="Ascend910B3")
    assert member == golden.ep_recv_counts_size(16, 1, 256, 8, comm_alg="hierarchy", soc="Ascend910B")
    assert member > golden.ep_recv_counts_size(16, 1, 256, 8, comm_alg="hierarchy", soc="Ascend910_9391")
    a = dict(ep_world_size=8, max_bs=8, moe_expert_num=8, hidden=1024, topk=4)
    assert golden.window_bytes_required(**a, soc="Ascend910_9391") == golden.window_bytes_required(**a)


def test_golden_round_with_a_member_name_equals_the_family_round():
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((4, 1024)).astype(np.float32).astype(ml_dtypes.bfloat16) for _ in range(2)]
    ids = [np.array([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=np.int32) for _ in range(2)]
    by_member = golden.dispatch(xs, ids, moe_expert_num=4, shared_expert_num=0, soc="Ascend910_9392")
    by_family = golden.dispatch(xs, ids, moe_expert_num=4, shared_expert_num=0, soc="Ascend910_93")
    for a, b in zip(by_member, by_family, strict=True):
        assert np.array_equal(a.expand_x.view(np.uint16), b.expand_x.view(np.uint16))


@pytest.mark.parametrize(("name", "extra"), [
    ("Ascend910_9391", ()),
    ("Ascend910B3", ()),
    ("Ascend950PR_9589", ("--quant-mode", "4")),
])
def test_demo_on_a_member_name_matches_the_golden(name, extra):
    done = run_cli("demo", "--json", *extra, ACLNN_MOCK_SOC=name)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["result"] == "MATCH"
    assert doc["soc"] == name


def test_demo_soc_option_takes_a_member_name():
    done = run_cli("demo", "--soc", "Ascend910B3", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["result"] == "MATCH" and doc["soc"] == "Ascend910B3"
    bad = run_cli("demo", "--soc", "Ascend310P3")
    assert bad.returncode == 2
    assert bad.stderr.startswith("aclnn-py demo: error: --soc 'Ascend310P3' is of no known SoC family"), bad.stderr
