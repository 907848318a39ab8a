"""`aclnn-py demo` (the README's main job): exits 0 with a bit-exact match for its defaults, for
8 ranks with quant 2, and for the operator documentation's example through MoeDistributeBuffer;
exits 1 and says MISMATCH when the mock and the golden disagree."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from conftest import package_pythonpath


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ACLNN_PY_BACKEND="mock")
    env["PYTHONPATH"] = package_pythonpath(env)
    return subprocess.run([sys.executable, "-m", "aclnn_py", "demo", *args], env=env, capture_output=True,
                          text=True, timeout=600)


def test_demo_defaults():
    r = run_cli()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 ranks (processes)" in r.stdout and "MATCH (bit for bit with the golden)" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line[:4].strip().isdigit()]
    assert len(rows) == 4


def test_demo_eight_ranks_quant2():
    r = run_cli("--world-size", "8", "--quant-mode", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 ranks" in r.stdout and "quant=2" in r.stdout and "MATCH" in r.stdout


def test_documented_example_through_moe_distribute_buffer(acl):
    """W = 16, BS = 8, H = 7168, 32 experts, K = 8, one zero and one copy expert, quant 2, bf16."""
    from aclnn_py import demo

    m = demo.Model(world_size=16, tokens=8, hidden=7168, topk=8, experts=32, zero_experts=1, copy_experts=1,
                   quant_mode=2, dtype="bf16")
    ok, report = demo.run(m, threads=True)
    assert ok, report
    assert "16 ranks (threads)" in report


def test_demo_reports_a_mismatch(acl, monkeypatch):
    from aclnn_py import demo, golden

    real = golden.round_trip

    def off_by_one_bit(*args, **kwargs):
        disp, comb = real(*args, **kwargs)
        x = comb[0].x_out.view(np.uint16)
        x[0, 0] ^= 1
        return disp, comb

    monkeypatch.setattr(demo.golden, "round_trip", off_by_one_bit)
    ok, report = demo.run(demo.Model(world_size=2), threads=True)
    assert not ok and report.endswith("MISMATCH")
