"""Thread worlds: one full dispatch → expert → combine round with the W ranks as threads of one
process, at the largest worlds each SoC profile allows (A3: 768, Ascend950: 1024), checked against
:mod:`aclnn_py.golden`, with the round's time and the process's peak memory.

Each world runs in a child process of its own, so its peak memory is its own, the SoC switch
(``_mock.set_soc``) stays there, and a crash or hang of the mock becomes a row with the reason.
When a size fails, smaller ones (halving) are tried until one works, so the section always
reports the largest size that runs today next to the failure.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import memory
from .progress import SILENT, Progress
from .scaling import short_reason

DEFAULT_WORLDS = (("Ascend910_93", 768), ("Ascend950", 1024))
SOC_ALIASES = {"a3": "Ascend910_93", "ascend910_93": "Ascend910_93", "950": "Ascend950", "ascend950": "Ascend950"}


@dataclass(frozen=True)
class ThreadWorld:
    """One thread-world round: SoC profile, ranks, and the (small) model; experts = W."""

    soc: str
    world_size: int
    tokens: int = 1
    hidden: int = 1024
    topk: int = 1

    def demo_model(self) -> Any:
        from aclnn_py.tools.demo import Model

        return Model(world_size=self.world_size, tokens=self.tokens, hidden=self.hidden, topk=self.topk,
                     experts=self.world_size, seed=11)


def parse_world(spec: str) -> tuple[str, int]:
    """``"A3:768"`` / ``"Ascend950:1024"`` → (SoC profile name, W)."""
    soc, sep, w = spec.partition(":")
    name = SOC_ALIASES.get(soc.strip().lower())
    if not sep or name is None or not w.strip().isdigit() or int(w) < 2:
        raise ValueError(f"thread world {spec!r}: expected SOC:W with SOC one of A3, Ascend910_93, 950, "
                         f"Ascend950 and W >= 2")
    return name, int(w)


def _rank(rank: int, world_size: int, root: bytes, tw: ThreadWorld) -> dict[str, Any]:
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator
    from aclnn_py.runtime import Device
    from aclnn_py.tools.demo import expert_ffn, rank_inputs

    m = tw.demo_model()
    inp = rank_inputs(m, rank)
    stream = Device.current().create_stream()
    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        comm.barrier(stream)
        stream.synchronize()
        t0 = time.perf_counter()
        out = buf.low_latency_dispatch(inp.x, inp.ids, m.experts, topk_weights=inp.weights, stream=stream)
        buf.synchronize(stream)
        counts = out.ep_recv_counts.numpy()
        n = int(counts[-1])
        expand_x = out.expand_x.numpy()[:n]
        tok_nums = out.expert_token_nums.numpy()
        y = np.zeros(out.expand_x.shape, expand_x.dtype)
        y[:n] = expert_ffn(m, rank, expand_x, None, tok_nums)
        x_out = buf.low_latency_combine(y, inp.ids, inp.weights, out.assist_info_for_combine,
                                        out.ep_recv_counts, num_experts=m.experts, stream=stream)
        buf.synchronize(stream)
        t1 = time.perf_counter()
        result = {"expand_x": expand_x, "assist": out.assist_info_for_combine.numpy()[:3 * n],
                  "ep_recv_counts": counts, "x_out": x_out.numpy(), "t0": t0, "t1": t1,
                  "shm_mb": memory.windows_mb()}  # the world's windows are all still mapped
        comm.barrier(stream)  # every rank has read its outputs before any window goes away
        stream.synchronize()
    stream.close()
    return result


def _child(rank: int, world_size: int, root: bytes, tw: ThreadWorld, timeout: float) -> dict[str, Any]:
    """The child process: switch the SoC profile, run the W threads, report time and memory."""
    from aclnn_py import _mock
    from aclnn_py.worlds import run_threads

    _mock.set_soc(tw.soc)
    t0 = time.perf_counter()
    res = run_threads(_rank, tw.world_size, tw, timeout=timeout)
    wall = time.perf_counter() - t0
    return {"ranks": res, "world_s": wall, "peak_rss_mb": memory.peak_rss_mb(),
            "shm_touched_mb": max(r["shm_mb"] for r in res)}


def golden_mismatches(tw: ThreadWorld, ranks: list[dict[str, Any]]) -> list[int]:
    """Ranks whose expand_x, assist info, receive counts or x_out differ from the golden's bytes."""
    from aclnn_py import golden
    from aclnn_py.tools.demo import expert_ffn, rank_inputs

    m = tw.demo_model()
    inputs = [rank_inputs(m, r) for r in range(tw.world_size)]

    def fn(rank: int, d: golden.DispatchResult) -> np.ndarray:
        return expert_ffn(m, rank, d.expand_x, None, d.expert_token_nums)

    def field(name: str) -> list[np.ndarray]:
        arrays = [getattr(i, name) for i in inputs]
        assert all(a is not None for a in arrays)  # the model has weights and no mask
        return arrays

    g_disp, g_comb = golden.round_trip(field("x"), field("ids"), fn, expert_scales=field("weights"),
                                       moe_expert_num=m.experts, soc=tw.soc)
    bad = []
    for r, (res, gd, gc) in enumerate(zip(ranks, g_disp, g_comb)):
        same = (res["expand_x"].tobytes() == gd.expand_x.tobytes()
                and np.array_equal(res["assist"], gd.assist_info_for_combine)
                and np.array_equal(res["ep_recv_counts"], gd.ep_recv_counts)
                and res["x_out"][gc.written].tobytes() == gc.x_out[gc.written].tobytes())
        if not same:
            bad.append(r)
    return bad


def run_thread_world(tw: ThreadWorld, timeout: float, connect_timeout: float | None = None) -> dict[str, Any]:
    """One thread world in a child process, checked against the golden; a row with figures, or with
    ``error`` when it failed."""
    from aclnn_py.worlds import spawn

    row: dict[str, Any] = {**asdict(tw), "experts": tw.world_size}
    saved = os.environ.get("HCCL_CONNECT_TIMEOUT")
    if connect_timeout is not None:  # the child reads it when its world forms
        os.environ["HCCL_CONNECT_TIMEOUT"] = str(connect_timeout)
    t0 = time.perf_counter()
    try:
        child = spawn(_child, 1, tw, timeout, timeout=timeout + 60)[0]
    except Exception as exc:  # noqa: BLE001 - the failure of this size is the row
        row.update(error=short_reason(exc), wall_s=time.perf_counter() - t0)
        return row
    finally:
        if connect_timeout is not None:
            if saved is None:
                os.environ.pop("HCCL_CONNECT_TIMEOUT", None)
            else:
                os.environ["HCCL_CONNECT_TIMEOUT"] = saved
    ranks = child["ranks"]
    row.update(round_s=max(r["t1"] for r in ranks) - min(r["t0"] for r in ranks), world_s=child["world_s"],
               peak_rss_mb=child["peak_rss_mb"], shm_touched_mb=child["shm_touched_mb"],
               wall_s=time.perf_counter() - t0)
    g0 = time.perf_counter()
    bad = golden_mismatches(tw, ranks)
    row.update(golden_s=time.perf_counter() - g0, golden_match=not bad, mismatched_ranks=bad[:16])
    return row


def thread_worlds(worlds: list[tuple[str, int]], tokens: int = 1, hidden: int = 1024, topk: int = 1,
                  timeout: float = 900.0, connect_timeout: float | None = None, fallback: bool = True,
                  smallest: int = 16, progress: Progress = SILENT) -> list[dict[str, Any]]:
    """For each (SoC, W): a row per attempted size. On a failure and with `fallback`, W is halved
    (not below `smallest`) until a size works; every attempt is a row."""
    rows: list[dict[str, Any]] = []
    for soc, w in worlds:
        size = w
        while True:
            tw = ThreadWorld(soc=soc, world_size=size, tokens=tokens, hidden=hidden, topk=topk)
            progress(f"thread world: {soc} W={size} threads (BS={tokens}, H={hidden}, K={topk}, E={size})")
            row = run_thread_world(tw, timeout, connect_timeout)
            row["requested_world_size"] = w
            rows.append(row)
            if "error" in row:
                progress(f"thread world: {soc} W={size} failed: {row['error']}")
            else:
                progress(f"thread world: {soc} W={size} round {row['round_s']:.2f} s, peak RSS "
                         f"{row['peak_rss_mb']:.0f} MiB, golden {'match' if row['golden_match'] else 'MISMATCH'}")
            if "error" not in row or not fallback or size // 2 < smallest:
                break
            size //= 2
    return rows
