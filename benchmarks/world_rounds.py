"""What one rank of a world does in the scaling and thread-world sections, the way users run it: a
Communicator and a MoeDistributeBuffer, then rounds of ``low_latency_dispatch`` → expert →
``low_latency_combine``, first with device Tensors (inputs uploaded once, the expert on the device
side, here the identity), then with host arrays (numpy in, ``.numpy()`` out, a numpy expert between).

Each phase is timed apart: start-up (from the launch until every rank's stream, communicator and
buffer are ready and a barrier has passed; the inputs are made after it), warm-up
rounds (the first touch of the windows; each starts after a barrier), steady rounds (back to back after
one barrier, as a serving loop runs them), and teardown. Memory is read after a barrier too, so no rank
measures while another still runs a round.

With ``c_loop`` the ranks then run the device rounds once more from C (benchmarks/c_floor.c): the same
dispatch and combine on repeatable executors, launched and synchronised by a C loop that holds no GIL,
back to back after one barrier, timed as the steady rounds are. That is the floor the binding's rounds
are compared with: what the mock's kernels and streams cost without the interpreter.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import memory

#: The modules the bench's rank functions and what they import come from: the fork server of the process
#: worlds imports them once (spawn's `preload`; multiprocessing keeps the list of the first spawn), so
#: that no rank spends its start importing them.
RANK_MODULES = ("benchmarks.world_rounds", "benchmarks.throughput", "aclnn_py.tools.demo")

#: A world's steady rounds: at least MIN_ROUNDS, and up to MAX_ROUNDS while W * rounds stays within
#: ROUND_BUDGET. A small world's round takes a few ms and its median over five swung by 1.6x from run
#: to run (A3 W = 64, three runs: 2.26 / 2.55 / 3.69 ms), so the growth per doubling from it did too.
MIN_ROUNDS, MAX_ROUNDS, ROUND_BUDGET = 5, 32, 2048


def steady_rounds(world_size: int) -> int:
    """How many steady rounds a world of `world_size` ranks runs of each kind (device, host)."""
    return max(MIN_ROUNDS, min(MAX_ROUNDS, ROUND_BUDGET // max(world_size, 1)))


@dataclass(frozen=True)
class WorldRounds:
    """The model and the rounds each rank runs (experts default to W)."""

    world_size: int
    tokens: int
    hidden: int
    topk: int
    experts: int
    warmup: int = 2
    rounds: int = 0  # steady rounds of each kind; 0: steady_rounds(world_size)
    keep_outputs: bool = False  # return the last host round's outputs, for the golden
    # threads of one process share its memory figures: only rank 0 reads them (a thousand ranks each
    # walking /proc/self/smaps_rollup of a process mapping every window took minutes)
    memory_of_rank0_only: bool = False
    c_loop: bool = False  # also run the device rounds from a C loop (the floor)

    def __post_init__(self) -> None:
        if self.rounds == 0:
            object.__setattr__(self, "rounds", steady_rounds(self.world_size))

    def demo_model(self) -> Any:
        from aclnn_py.tools.demo import Model

        return Model(world_size=self.world_size, tokens=self.tokens, hidden=self.hidden, topk=self.topk,
                     experts=self.experts, seed=11)


_floor_lock = threading.Lock()
_floor: Any = None  # the CFloor, or the reason it could not be made (str)


def _c_floor() -> Any:
    """The process's C floor library (built on first use), shared by its rank threads; the reason as a
    str when it cannot be built (no C compiler): then no rank of the world runs the C loop."""
    global _floor
    with _floor_lock:
        if _floor is None:
            from .c_floor import CFloor, FloorError

            try:
                _floor = CFloor()
            except FloorError as exc:
                _floor = str(exc)
        return _floor


def _c_loop_rounds(comm: Any, stream: Any, buf: Any, m: Any, rank: int, inputs: tuple[Any, Any, Any],
                   spec: WorldRounds) -> list[float] | str:
    """The device rounds from C: dispatch and combine prepared once on repeatable executors (with the
    buffer's context), the warm-up rounds, then after a barrier the steady rounds launched and
    synchronised by the C loop; when each steady round ended (``perf_counter``), or why the C floor
    could not be built."""
    import aclnn_py as acl
    from aclnn_py.ops import prepare_combine, prepare_dispatch

    from .c_floor import address

    floor = _c_floor()
    if isinstance(floor, str):
        return floor
    x, ids, weights = inputs
    attrs = dict(ep_world_size=m.world_size, ep_rank_id=rank, moe_expert_num=m.experts,
                 ccl_buffer_size=buf.ccl_buffer_size)
    d = prepare_dispatch(buf.context, x, ids, expert_scales=weights, repeatable=True, stream=stream, **attrs)
    out = d.result
    c = prepare_combine(buf.context, out.expand_x, ids, out.assist_info_for_combine, out.ep_recv_counts, weights,
                        repeatable=True, stream=stream, **attrs)
    workspaces = [acl.DeviceMemory(max(p.workspace_size, 32)) for p in (d, c)]
    loop = (address(d.executor), workspaces[0].ptr, d.workspace_size, address(c.executor), workspaces[1].ptr,
            c.workspace_size, stream.handle)
    try:
        floor.world_rounds(*loop, spec.warmup)  # the first touch of the new outputs
        _together(comm, stream)
        # a round before the timed ones (the ranks leave the barrier one after another; then they run in
        # step) and one after (the first ranks to finish go on in Python, on the same CPU)
        return floor.world_rounds(*loop, spec.rounds + 2)[:-1]
    finally:
        for closing in (d, c, *workspaces):
            closing.close()


def _together(comm: Any, stream: Any) -> None:
    """Return once every rank of the world has come here (a barrier, waited for on the host)."""
    comm.barrier(stream)
    stream.synchronize()


def _timed_round(comm: Any, stream: Any, body: Any) -> float:
    """A warm-up round: from the end of a barrier until this rank's round has ended."""
    _together(comm, stream)
    t0 = time.perf_counter()
    body()
    stream.synchronize()
    return time.perf_counter() - t0


def _steady_rounds(comm: Any, stream: Any, body: Any, rounds: int) -> list[float]:
    """`rounds` steady rounds back to back after one barrier, as a serving loop runs them and as the C
    loop does: when each ended on this rank (``perf_counter``), from the round before the timed ones on.
    One round more runs after them, so the ranks that finish first do not go on to the next phase while
    others still run the last timed round."""
    _together(comm, stream)
    ends = []
    for _ in range(rounds + 1):
        body()
        stream.synchronize()
        ends.append(time.perf_counter())
    body()
    stream.synchronize()
    return ends


def rank_rounds(rank: int, world_size: int, root: bytes, spec: WorldRounds, t_launch: float) -> dict[str, Any]:
    """One rank: its timestamps (``perf_counter`` is CLOCK_MONOTONIC, one clock for every process of the
    machine), its round times, its memory, and with ``keep_outputs`` its last host round's outputs."""
    import aclnn_py as acl
    from aclnn_py.buffer import MoeDistributeBuffer
    from aclnn_py.hccl import Communicator
    from aclnn_py.tools.demo import expert_ffn, rank_inputs

    stream = acl.Device.current().create_stream()
    comm = Communicator(world_size, rank, root)
    buf = MoeDistributeBuffer(comm)
    _together(comm, stream)
    t_ready = time.perf_counter()
    # the model's inputs are the user's data, made after the world is ready: start-up is the
    # library's (stream, communicator, buffer), not the demo's random number generation. A rank out
    # of the barrier early waits until every rank has seen it end: were it to make its inputs at once,
    # it would hold the GIL that the last ranks need to return from the barrier, and their start-up
    # would count the demo's work (a W = 1024 thread world measured 0.8-1.0 s instead of 0.5)
    _together(comm, stream)
    m = spec.demo_model()
    inp = rank_inputs(m, rank)
    xt, idt, wt = (acl.Tensor.from_numpy(a) for a in (inp.x, inp.ids, inp.weights))

    def device_round() -> None:
        out = buf.low_latency_dispatch(xt, idt, m.experts, topk_weights=wt, stream=stream)
        buf.low_latency_combine(out.expand_x, idt, wt, out.assist_info_for_combine, out.ep_recv_counts,
                                num_experts=m.experts, stream=stream)

    kept: dict[str, Any] = {}

    def host_round() -> None:
        out = buf.low_latency_dispatch(inp.x, inp.ids, m.experts, topk_weights=inp.weights, stream=stream)
        counts = out.ep_recv_counts.numpy()
        n = int(counts[-1])
        expand_x = out.expand_x.numpy()
        y = np.empty_like(expand_x)  # combine reads the received rows only: the others need no value
        y[:n] = expert_ffn(m, rank, expand_x[:n], None, out.expert_token_nums.numpy())
        x_out = buf.low_latency_combine(y, inp.ids, inp.weights, out.assist_info_for_combine, out.ep_recv_counts,
                                        num_experts=m.experts, stream=stream).numpy()
        if spec.keep_outputs:
            last.update(out=out, counts=counts, n=n, expand_x=expand_x, x_out=x_out)

    last: dict[str, Any] = {}
    device = [_timed_round(comm, stream, device_round) for _ in range(spec.warmup)]
    device_ends = _steady_rounds(comm, stream, device_round, spec.rounds)
    host = [_timed_round(comm, stream, host_round)]
    host_ends = _steady_rounds(comm, stream, host_round, spec.rounds)
    if spec.keep_outputs:
        # taken after the timed rounds (the golden's keepsakes are not a user's work), as copies of the
        # received rows only: a slice would keep the whole host copy alive, and the world's peak memory
        # would count them
        n = last["n"]
        kept.update(expand_x=last["expand_x"][:n].copy(), ep_recv_counts=last["counts"], x_out=last["x_out"],
                    assist=last["out"].assist_info_for_combine.numpy()[:3 * n].copy())
        last.clear()
    _together(comm, stream)  # every rank has finished its rounds before memory is read
    if spec.memory_of_rank0_only and rank != 0:
        mem = {"shm_mb": 0.0, "pss_mb": 0.0, "peak_rss_mb": 0.0}
    else:
        mem = {"shm_mb": memory.windows_mb(), "pss_mb": memory.pss_mb(), "peak_rss_mb": memory.peak_rss_mb()}
    _together(comm, stream)  # nobody unmaps (or makes the C loop's outputs) before every rank has measured
    c_loop = None
    if spec.c_loop:
        c_loop = _c_loop_rounds(comm, stream, buf, m, rank, (xt, idt, wt), spec)
        _together(comm, stream)  # teardown starts together, as without the C loop
    t_close = time.perf_counter()
    buf.close()
    comm.close()
    stream.close()
    result: dict[str, Any] = {"t_launch": t_launch, "t_ready": t_ready, "t_close": t_close,
                              "t_closed": time.perf_counter(), "device_s": device, "host_s": host,
                              "device_ends": device_ends, "host_ends": host_ends, **mem}
    if spec.keep_outputs:
        result.update(kept)
    if c_loop is not None:
        result["c_loop"] = c_loop
    return result


def summarize(spec: WorldRounds, ranks: list[dict[str, Any]], t_end: float) -> dict[str, Any]:
    """A world's figures from its ranks: a warm-up round lasts until its slowest rank ends it, a steady
    round from the end of the one before on the slowest rank to its own end there (the median of them)."""
    steady, host_steady = _periods([r["device_ends"] for r in ranks]), _periods([r["host_ends"] for r in ranks])
    return {
        "startup_s": max(r["t_ready"] for r in ranks) - ranks[0]["t_launch"],
        "first_round_ms": 1e3 * max(r["device_s"][0] for r in ranks),
        "round_ms": 1e3 * statistics.median(steady),
        "round_ms_min": 1e3 * min(steady), "round_ms_max": 1e3 * max(steady),
        "host_round_ms": 1e3 * statistics.median(host_steady),
        "teardown_s": t_end - min(r["t_close"] for r in ranks),
        "peak_rss_mb_per_rank": max(r["peak_rss_mb"] for r in ranks),
        "pss_mb_total": sum(r["pss_mb"] for r in ranks),
        "shm_touched_mb": max(r["shm_mb"] for r in ranks),
        **_c_loop_figures(spec, ranks),
    }


def _periods(ends: list[list[float]]) -> list[float]:
    """A world's rounds run back to back, from each rank's list of when its rounds ended: how long each
    round after the first took, from the slowest rank's end of the one before to its end of this one."""
    world = [max(e[i] for e in ends) for i in range(len(ends[0]))]
    return [b - a for a, b in zip(world, world[1:])]


def _c_loop_figures(spec: WorldRounds, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The world's C-loop round: the median of its rounds after the one before the timed ones (as
    :func:`summarize` takes the steady rounds'); or why it did not run."""
    first = ranks[0].get("c_loop") if spec.c_loop and ranks else None
    if first is None:
        return {}
    if isinstance(first, str):  # the same for every rank: they share the process's floor
        return {"c_loop_error": first}
    return {"c_loop_round_ms": 1e3 * statistics.median(_periods([r["c_loop"] for r in ranks]))}


def growth_per_doubling(rows: list[dict[str, Any]], key: str = "round_ms", above: int = 64) -> None:
    """Set ``growth`` on each row after the first of W > `above` (same series, W ascending): how many
    times the previous size's `key` it takes, per doubling of W (O(W) per rank gives 2, O(W²) 4)."""
    prev: dict[str, Any] | None = None
    for row in rows:
        if "error" in row or row["world_size"] < above:
            continue
        if prev is not None and row["world_size"] > prev["world_size"] and prev[key] > 0:
            doublings = float(np.log2(row["world_size"] / prev["world_size"]))
            row["growth"] = (row[key] / prev[key]) ** (1.0 / doublings)
        prev = row
