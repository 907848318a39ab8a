"""Smoke run of `aclnn-py bench --quick --json`: the benchmark runs end to end and its JSON has every
figure the README reports (no timing assertions: performance is measured, not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_quick_json():
    env = dict(os.environ, ACLNN_PY_BACKEND="mock")
    proc = subprocess.run([sys.executable, "-m", "aclnn_py", "bench", "--quick", "--json"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    for op in ("dispatch", "combine"):
        row = r["host_overhead"][op]
        for path in ("ctypes", "per_call", "plan"):
            assert 0 < row[path]["min_us"] <= row[path]["median_us"] <= row[path]["max_us"]
        assert row["ctypes_over_plan"] > 0 and row["per_call_over_plan"] > 0
    t = r["throughput"]
    assert t["bytes_moved"] > 0 and t["round_s"]["median"] > 0 and t["memcpy_floor_s"] > 0
    assert t["golden_round_s"] > 0 and t["round_over_memcpy_floor"] > 0
    assert [s["world_size"] for s in r["scaling"]] == [2, 4]
    assert all(s["round_ms"] > 0 and s["peak_rss_mb_per_rank"] > 0 for s in r["scaling"])
