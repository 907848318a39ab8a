"""One dispatch → combine round on a world of W processes (aclnn_py.worlds.spawn), checked bit for
bit against the golden; prints how long it took and the memory it used. For finding how large a
process world a machine holds:

    python tests/helpers/largest_process_world.py W [BS H K]      (defaults BS 8, H 2048, K 2)

The window is sized for the shapes (HCCL_BUFFSIZE from the buffer formula, unless set).
"""

from __future__ import annotations

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def meminfo_mib() -> dict[str, float]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v.split()[0]) / 1024
    return out


def main() -> int:
    w = int(sys.argv[1])
    bs, h, k = (int(a) for a in sys.argv[2:5]) if len(sys.argv) >= 5 else (8, 2048, 2)
    td = -(-(-(-(2 * h) // 32) * 32 + 44) // 512) * 512
    tc = -(-(2 * h) // 512) * 512
    need = 2 * (bs * td * w + bs * tc * k) + (1 << 20)
    os.environ.setdefault("HCCL_BUFFSIZE", str(-(-need // (1 << 21)) + 1))
    os.environ.setdefault("HCCL_CONNECT_TIMEOUT", "1800")
    os.environ.setdefault("HCCL_EXEC_TIMEOUT", "1800")
    from aclnn_py import golden, worlds
    from helpers import large_world_ranks as lw

    before = meminfo_mib()
    lowest = {"MemAvailable": before["MemAvailable"], "PageTables": 0.0, "Shmem": 0.0}
    done = threading.Event()

    def sample() -> None:   # the machine-wide cost of the world: memory it takes while it runs
        while not done.wait(0.2):
            m = meminfo_mib()
            lowest["MemAvailable"] = min(lowest["MemAvailable"], m["MemAvailable"])
            lowest["PageTables"] = max(lowest["PageTables"], m["PageTables"] - before["PageTables"])
            lowest["Shmem"] = max(lowest["Shmem"], m["Shmem"] - before["Shmem"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    try:
        res = worlds.spawn(lw.process_round, w, 0, bs, h, k, timeout=3600)
    finally:
        done.set()
    took = time.monotonic() - t0
    xs, ids, ws = zip(*[lw.process_inputs(r, w, 0, bs, h, k) for r in range(w)])
    disp, comb = golden.round_trip(list(xs), list(ids), lambda r, d: d.expand_x, moe_expert_num=w,
                                   expert_scales=list(ws))
    bad = [r for r in range(w) if res[r]["expand_x"] != disp[r].expand_x.tobytes()
           or res[r]["x_out"] != comb[r].x_out.tobytes()]
    first = min(r["stamps"]["start"] for r in res)
    phase = {p: max(r["stamps"][p] for r in res) - first for p in ("joined", "round")}
    rss = sorted(r["rss_mib"] for r in res)
    print(f"W={w} BS={bs} H={h} K={k} HCCL_BUFFSIZE={os.environ['HCCL_BUFFSIZE']}: spawn returned after "
          f"{took:.1f} s; all joined {phase['joined']:.1f} s, round done {phase['round']:.1f} s after the first "
          f"rank started; peak RSS per rank median {rss[w // 2]:.0f} MiB max {rss[-1]:.0f} MiB; "
          f"machine: MemAvailable fell by up to {before['MemAvailable'] - lowest['MemAvailable']:.0f} MiB (page tables "
          f"+{lowest['PageTables']:.0f} MiB, shared memory +{lowest['Shmem']:.0f} MiB); mismatches {len(bad)}",
          flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
