"""`aclnn-py demo`: bit-exact MATCH for its defaults, for 8 ranks with quant 2, for the Ascend 950
modes (quant 4 + fp4 y-dtype with MXFP8 comm quant 3, and the others), for the operator
documentation's example through MoeDistributeBuffer, and on a copy of the mock root loaded as a
CANN root; a mismatch is reported with output, rank, first differing index and size, exit 1."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.root_copies import copy_mock_root, run_cli

ALL_OUTPUTS = ("expand_x", "dynamic_scales", "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
               "expand_scales", "x_out")


def rank_rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line[:4].strip().isdigit()]


def test_demo_defaults():
    r = run_cli("demo", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("aclnn-py demo: 4 ranks (processes) on the mock (Ascend910_93")
    assert "0 shared experts on 0 ranks" in r.stdout
    assert r.stdout.rstrip().endswith("result: MATCH (bit for bit with the golden)")
    assert len(rank_rows(r.stdout)) == 4


def test_demo_eight_ranks_quant2_two_rounds():
    r = run_cli("demo", "--world-size", "8", "--quant-mode", "2", "--rounds", "2", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 ranks" in r.stdout and "dispatch quant_mode 2" in r.stdout and "2 round(s)" in r.stdout
    assert "checked 112 outputs (7 per rank per round, 2 round(s))" in " ".join(r.stdout.split())
    assert r.stdout.rstrip().endswith("MATCH (bit for bit with the golden)")


def test_950_quant4_fp4_with_mxfp8_comm_quant3():
    r = run_cli("demo", "--soc", "Ascend950", "--quant-mode", "4", "--y-dtype", "float4_e2m1",
                "--comm-quant-mode", "3", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["result"] == "MATCH" and doc["soc"] == "Ascend950"
    assert doc["model"]["expand_x_format"] == "float4_e2m1" and doc["model"]["comm_quant_mode"] == 3
    produced = {c["output"] for c in doc["checks"] if c["produced"]}
    assert produced == set(ALL_OUTPUTS)
    assert all(c["equal"] and c["max_abs_diff"] == 0 for c in doc["checks"])


def test_atlas_a2_defaults_to_its_smallest_world_and_matches_with_the_extra_ep_recv_counts():
    # A2 runs on 16 ranks or more, and its ep_recv_counts (with weights) is longer than its counts
    r = run_cli("demo", "--soc", "Ascend910B", "--threads", "--quant-mode", "2", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["result"] == "MATCH" and doc["soc"] == "Ascend910B"
    assert doc["model"]["world_size"] == 16 and doc["model"]["experts"] == 16
    assert all(c["equal"] for c in doc["checks"])


MODES_950 = [
    "--quant-mode 1 --y-dtype hifloat8 --comm-quant-mode 4",
    "--quant-mode 1 --y-dtype int8 --comm-quant-mode 2 --dtype fp16",
    "--quant-mode 2 --y-dtype float8_e5m2 --mask 2d",
    "--quant-mode 3 --y-dtype float8_e4m3fn --world-size 4 --shared-experts 1 --shared-expert-ranks 1",
    "--quant-mode 4 --y-dtype float4_e1m2 --zero-experts 1 --copy-experts 1",
    "--quant-mode 5 --y-dtype float8_e5m2 --no-weights --mask 1d",
]


@pytest.mark.parametrize("args", MODES_950)
def test_950_modes_match(args):
    # later options override the defaults given first (argparse keeps the last value)
    r = run_cli("demo", "--soc", "Ascend950", "--world-size", "3", "--experts", "6", "--topk", "3", "--quiet",
                *args.split())
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("MATCH (bit for bit with the golden)")


def test_demo_on_a_copy_of_the_mock_root(tmp_path):
    """The copy is a CANN root: loaded as kind cann, ABI verified, version read from its files."""
    root = copy_mock_root(tmp_path / "cann")
    r = run_cli("demo", "--backend", str(root), "--world-size", "2", "--experts", "4", "--topk", "2",
                "--quant-mode", "2", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["result"] == "MATCH" and doc["cann_version"] == "8.5.0"
    assert doc["title"].startswith(f"aclnn-py demo: 2 ranks (processes) on CANN 8.5.0 at {root} (Ascend910_93")


def test_demo_on_chosen_devices():
    r = run_cli("demo", "--devices", "5,2", "--experts", "4", "--topk", "2", "--json", ACLNN_MOCK_DEVICE_COUNT="6")
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["result"] == "MATCH" and doc["devices"] == [5, 2]
    assert [(row["rank"], row["device"]) for row in doc["ranks"]] == [(0, 5), (1, 2)]


def test_documented_example_through_moe_distribute_buffer(acl):
    """W = 16, BS = 8, H = 7168, 32 experts, K = 8, one zero and one copy expert, quant 2, bf16."""
    from aclnn_py.tools import demo

    m = demo.Model(world_size=16, tokens=8, hidden=7168, topk=8, experts=32, zero_experts=1, copy_experts=1,
                   quant_mode=2, dtype="bf16")
    result = demo.run(m, threads=True, where="the mock")
    assert result.ok, result.text()
    assert result.text().startswith("aclnn-py demo: 16 ranks (threads) on the mock")


def test_demo_reports_a_mismatch(acl, monkeypatch):
    """One bit flipped in the golden's x_out of rank 1, token 2: the report names output, rank,
    index and size, and the result is MISMATCH."""
    from aclnn_py import golden
    from aclnn_py.tools import demo

    real = golden.round_trip

    def off_by_one_bit(*args, **kwargs):
        disp, comb = real(*args, **kwargs)
        x = comb[1].x_out.view(np.uint16)
        x[2, 5] ^= 1
        return disp, comb

    monkeypatch.setattr(demo.golden, "round_trip", off_by_one_bit)
    result = demo.run(demo.Model(world_size=2, experts=4, topk=2), threads=True)
    assert not result.ok
    bad = result.mismatches
    assert [(c.output, c.rank, c.first_index, c.differing) for c in bad] == [("x_out", 1, (2, 5), 1)]
    assert 0 < bad[0].max_abs_diff < 0.05
    text = result.text()
    assert text.endswith("result: MISMATCH")
    assert "round 1, rank 1, x_out: 1 of 8192 elements differ; the first at [2, 5] is" in " ".join(text.split())


def test_compare_names_shape_and_first_difference():
    from aclnn_py.tools.demo_check import compare

    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = a.copy()
    b[1, 2] += 7
    c = compare("ep_recv_counts", 0, 0, a, b)
    assert (c.equal, c.first_index, c.ours, c.golden, c.max_abs_diff, c.differing) == (False, (1, 2), 6, 13, 7, 1)
    assert compare("ep_recv_counts", 0, 0, a[:2], b).note == "shape (2, 4) here but (3, 4) in the golden"
    assert compare("expand_scales", 0, 0, None, None).produced is False
    # -0.0 vs +0.0: equal values, different bits -> a mismatch of size 0
    z = compare("x_out", 0, 0, np.array([-0.0], np.float32), np.array([0.0], np.float32))
    assert not z.equal and z.max_abs_diff == 0
