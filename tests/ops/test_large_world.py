"""The largest worlds: one full dispatch → combine round at W = 768 on the A3 profile and W = 1024 on
the Ascend950 profile, every rank a thread of this process, checked bit for bit against the golden.

Deselected by default (marker ``large_world``; each takes tens of seconds and up to a few GiB):

    pytest -m large_world tests/ops/test_large_world.py

Small shapes (BS 2, H 1024, K 2, E = W) and a small window (HCCL_BUFFSIZE 8: 16 MiB per rank, enough
for W = 1024 at BS 2). The 0xA5 poison fill of new allocations is turned off: every rank's expand_x is
sized for maxBs × W rows, so poisoning them all would make O(W²) bytes resident (7 GiB at W = 1024)
for no check of this test (it reads only the rows the kernels wrote).
"""

from __future__ import annotations

import resource
import threading
import time

import pytest
from helpers import large_world_ranks as lw

pytestmark = pytest.mark.large_world


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("world_size", "soc"), [(768, "Ascend910_93"), (1024, "Ascend950")])
def test_a_round_on_the_largest_world(acl, mock, monkeypatch, world_size, soc):
    from aclnn_py import golden, worlds

    monkeypatch.setenv("HCCL_BUFFSIZE", "8")
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "600")
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "600")
    soc_before, poison_before = mock.soc(), mock.poison()
    mock.set_soc(soc)
    mock.set_poison(False)
    timings: dict = {}
    try:
        t0 = time.monotonic()
        res = worlds.run_threads(lw.round_rank, world_size, 0, timings, threading.Lock(), timeout=1100)
        took = time.monotonic() - t0
    finally:
        mock.set_soc(soc_before)
        mock.set_poison(poison_before)
    xs, ids, ws = zip(*[lw.inputs(r, world_size, 0) for r in range(world_size)])
    disp, comb = golden.round_trip(list(xs), list(ids), lambda r, d: d.expand_x, moe_expert_num=world_size,
                                   expert_scales=list(ws), soc=soc)
    for r in range(world_size):
        assert res[r]["n"] == disp[r].num_rows, r
        assert res[r]["expand_x"] == disp[r].expand_x.tobytes(), f"rank {r}: expand_x differs from the golden"
        assert res[r]["x_out"] == comb[r].x_out.tobytes(), f"rank {r}: x_out differs from the golden"
    assert sum(r["n"] for r in res) == world_size * lw.BS * lw.K   # every (token, k) pair arrived once
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nW={world_size} {soc}: round in {took:.1f} s (all joined {timings['joined'] - timings['start']:.1f} s "
          f"after the first rank started, contexts {timings['context'] - timings['start']:.1f} s, round done "
          f"{timings['round'] - timings['start']:.1f} s); peak RSS of this process {peak:.0f} MiB")
