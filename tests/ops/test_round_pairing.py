"""A combine paired with the wrong dispatch is refused, not mixed (docs/reliability.md): each dispatch
records what it wrote, each combine finds the dispatch its assist_info_for_combine / ep_send_counts
come from, carries that round to every receiver, and every receiver compares it with its own.

Two dispatch calls A and B with the same shapes and the same expert_ids (so every count matches and
nothing but the round tells them apart), then combines fed from the wrong one, deterministically."""

from __future__ import annotations

import re

import numpy as np
import pytest

from aclnn_py.dtypes import bfloat16

W, BS, H, E, K = 2, 4, 1024, 4, 2
KERNEL_FAIL = 507015


def _inputs(rank: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed * 10 + rank)
    x = rng.standard_normal((BS, H), dtype=np.float32).astype(bfloat16)
    ids = np.array([[0, 3], [1, 2], [2, 0], [3, 1]], np.int32)      # the same routing for every call
    return x, ids


def _two_dispatches_then(rank, world_size, root, how):
    """Dispatch A, dispatch B on every rank, then the combine `how` picks; returns (status, message,
    x_out or None)."""
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import moe_distribute_combine, moe_distribute_dispatch

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        kw = dict(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl, stream=s)
        xa, ids = _inputs(rank, 1)
        xb, _ = _inputs(rank, 2)
        a = moe_distribute_dispatch(ctx, xa, ids, **kw)
        b = moe_distribute_dispatch(ctx, xb, ids, **kw)
        ids_other = np.array([[1, 2], [0, 3], [3, 1], [2, 0]], np.int32)
        later = int(how.removeprefix("later_")) if how.startswith("later_") else 0
        for _ in range(later):               # dispatches of another routing after A and B
            moe_distribute_dispatch(ctx, xb, ids_other, **kw)
        s.synchronize()
        if how == "rank0_from_a":            # rank 0 returns A's rows, rank 1 B's
            d = a if rank == 0 else b
            args = (d.expand_x, ids, d.assist_info_for_combine, d.ep_recv_counts)
        elif how == "assist_a_counts_b" or later:   # both ranks: routing inputs of two calls
            args = (b.expand_x, ids, a.assist_info_for_combine, b.ep_recv_counts)
        elif how == "rows_of_a":             # both ranks: B's routing, A's rows (unchanged)
            args = (a.expand_x, ids, b.assist_info_for_combine, b.ep_recv_counts)
        elif how == "ids_of_c":              # both ranks: B's routing, the expert_ids of dispatch C
            c = moe_distribute_dispatch(ctx, xb, ids_other, **kw)
            s.synchronize()
            args = (b.expand_x, ids_other, b.assist_info_for_combine, b.ep_recv_counts)
            del c
        elif how == "copied_by_hand":        # B's routing as host copies, rows and triples reordered
            n = int(b.ep_recv_counts.numpy()[-1])
            perm = np.random.default_rng(rank).permutation(n)
            assist = b.assist_info_for_combine.numpy().copy()
            assist[:3 * n] = assist[:3 * n].reshape(n, 3)[perm].reshape(-1)
            ex = b.expand_x.numpy().copy()
            ex[:n] = ex[:n][perm]
            args = (ex, ids, assist, b.ep_recv_counts.numpy().copy())
        else:                                # both ranks: B, as it should be
            args = (b.expand_x, ids, b.assist_info_for_combine, b.ep_recv_counts)
        out = moe_distribute_combine(ctx, *args, None, **kw)
        try:
            s.synchronize()
            res = (0, "", out.numpy())
        except AclError as e:
            res = (e.code, e.message, None)
        s.close()
    return res


def _run(how):
    from aclnn_py.worlds import run_threads

    return run_threads(_two_dispatches_then, W, how, timeout=120)


def _golden_b():
    from aclnn_py import golden

    xs = [_inputs(r, 2)[0] for r in range(W)]
    ids = [_inputs(r, 2)[1] for r in range(W)]
    _, comb = golden.round_trip(xs, ids, lambda r, d: d.expand_x, moe_expert_num=E)
    return [c.x_out for c in comb]


def _rounds(msg: str) -> tuple[int, int]:
    m = re.search(r"call #(\d+)\D.*call #(\d+)", msg)
    assert m, msg
    return int(m.group(1)), int(m.group(2))


def test_matching_combine_is_exact(acl):
    g = _golden_b()
    for r, (code, msg, out) in enumerate(_run("b")):
        assert code == 0, msg
        assert out.tobytes() == g[r].tobytes()


def test_ranks_paired_with_different_dispatch_calls_fail(acl):
    res = _run("rank0_from_a")
    for r, (code, msg, _) in enumerate(res):
        assert code == KERNEL_FAIL, msg
        assert f"aclnnMoeDistributeCombineV5: rank {r}: the rows of rank {1 - r} belong to the dispatch of " \
               "collective call #" in msg, msg
        assert f"those of rank {r} (this rank) to the dispatch of call #" in msg, msg
        assert "the ranks paired this combine with different dispatch calls" in msg, msg
    other0, own0 = _rounds(res[0][1])
    other1, own1 = _rounds(res[1][1])
    assert own0 == other1 and own1 == other0 and own1 == own0 + 1     # A then B


def test_routing_inputs_of_two_dispatch_calls_fail(acl):
    for code, msg, _ in _run("assist_a_counts_b"):
        assert code == KERNEL_FAIL, msg
        assert "assist_info_for_combine is the output of the dispatch of collective call #" in msg, msg
        assert "but ep_send_counts that of call #" in msg, msg
        a, b = _rounds(msg)
        assert b == a + 1


@pytest.mark.parametrize("later", [62, 63])
def test_the_last_64_dispatches_of_a_communicator_are_traced(acl, later):
    # A, B, then `later` dispatches of another routing: A is traced while at most 63 dispatches ran
    # after it. Evicted, its assist_info_for_combine is known only by content, which is B's (the same
    # routing): the combine is then B's, and exact.
    res = _run(f"later_{later}")
    if later == 62:
        for code, msg, _ in res:
            assert code == KERNEL_FAIL, msg
            a, b = _rounds(msg)
            assert "assist_info_for_combine is the output of the dispatch of collective call #" in msg and b == a + 1
    else:
        g = _golden_b()
        for r, (code, msg, out) in enumerate(res):
            assert code == 0, msg
            assert out.tobytes() == g[r].tobytes()


def test_rows_of_another_dispatch_fail(acl):
    for code, msg, _ in _run("rows_of_a"):
        assert code == KERNEL_FAIL, msg
        assert "expand_x holds, unchanged, the rows the dispatch of collective call #" in msg, msg
        a, b = _rounds(msg)
        assert b == a + 1


def test_expert_ids_of_another_dispatch_fail(acl):
    for code, msg, _ in _run("ids_of_c"):
        assert code == KERNEL_FAIL, msg
        assert "expert_ids are the input of the dispatch of collective call #" in msg, msg
        c, b = _rounds(msg)
        assert c == b + 1


def test_inputs_built_by_hand_are_accepted(acl):
    """Copies that no dispatch wrote (here B's, reordered consistently) cannot be traced: accepted,
    and the result is exact."""
    g = _golden_b()
    for r, (code, msg, out) in enumerate(_run("copied_by_hand")):
        assert code == 0, msg
        assert out.tobytes() == g[r].tobytes()


def _reused_buffer_body(rank, world_size, root):
    """Dispatch A sends every token to rank 1 (rank 0 receives no row), dispatch B is an ordinary
    call; B's expert rows (doubled) are then written into A's expand_x tensor, which the combine of B
    takes: a reused buffer is not A's rows, whether A wrote rows there (rank 1) or none (rank 0)."""
    from aclnn_py import Device
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import moe_distribute_combine, moe_distribute_dispatch

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        kw = dict(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=E, ccl_buffer_size=ccl, stream=s)
        xa, _ = _inputs(rank, 1)
        xb, ids = _inputs(rank, 2)
        a = moe_distribute_dispatch(ctx, xa, np.array([[2, 3]] * BS, np.int32), **kw)
        b = moe_distribute_dispatch(ctx, xb, ids, **kw)
        s.synchronize()
        n_a = int(a.ep_recv_counts.numpy()[-1])
        a.expand_x.copy_from(_double(b.expand_x.numpy()))
        out = moe_distribute_combine(ctx, a.expand_x, ids, b.assist_info_for_combine, b.ep_recv_counts, None, **kw)
        s.synchronize()
        res = (n_a, out.numpy())
        s.close()
    return res


def _double(rows):
    return (rows.astype(np.float32) * 2).astype(rows.dtype)


def test_reused_output_buffer_is_not_taken_for_its_old_rows(acl):
    from aclnn_py import golden
    from aclnn_py.worlds import run_threads

    xs, ids = [_inputs(r, 2)[0] for r in range(W)], [_inputs(r, 2)[1] for r in range(W)]
    g = [c.x_out for c in golden.round_trip(xs, ids, lambda r, d: _double(d.expand_x), moe_expert_num=E)[1]]
    res = run_threads(_reused_buffer_body, W, timeout=120)
    assert [n for n, _ in res] == [0, 2 * BS * W]
    for r, (_, out) in enumerate(res):
        assert out.tobytes() == g[r].tobytes()


@pytest.mark.parametrize("how", ["rank0_from_a"])
def test_rounds_are_checked_in_processes(acl, how):
    from aclnn_py.worlds import spawn

    for code, msg, _ in spawn(_two_dispatches_then, W, how, timeout=120):
        assert code == KERNEL_FAIL and "paired this combine with different dispatch calls" in msg, msg


# ---- three threads per rank, one MoeDistributeBuffer and one stream, no common order across ranks -----------
THREADS, ROUNDS = 3, 15
F32 = np.float32


def _schedule(seed: int, rank: int) -> list[tuple[int, str, int]]:
    """A seeded merge of the threads' programs (dispatch i, combine i, ...) for one rank: every rank runs
    its threads' calls in its own order."""
    rng = np.random.default_rng([seed, rank])
    left = {t: [(t, op, i) for i in range(ROUNDS) for op in ("D", "C")] for t in range(THREADS)}
    order = []
    while any(left.values()):
        t = int(rng.choice([t for t, ops in left.items() if ops]))
        order.append(left[t].pop(0))
    return order


def _round_inputs(seed: int, t: int, i: int, rank: int, shared_routing: bool):
    """x, expert ids, top-k weights of thread t's round i on `rank`."""
    rng = np.random.default_rng([seed, t, i, rank])
    x = (rng.standard_normal((BS, H), dtype=F32) * 4).astype(bfloat16)
    x[0, 0] = t * 100 + i      # every round's data differs
    if shared_routing:         # one routing for every round: all counts match, only the round differs
        ids = np.array([[0, 3], [1, 2], [2, 0], [3, 1]], np.int32)
    else:
        ids = np.stack([rng.permutation(E)[:K] for _ in range(BS)]).astype(np.int32)
    w = rng.random((BS, K), dtype=F32)
    return x, ids, w


def _expert(expand_x: np.ndarray, dynamic_scales: np.ndarray | None, recv_counts: np.ndarray) -> np.ndarray:
    """A per-row expert: the (dequantised) row times a factor of its local expert j (slot j*W + src)."""
    counts = np.asarray(recv_counts).astype(np.int64)
    n = int(min(max(counts[-1], 0), expand_x.shape[0]))
    j = np.searchsorted(counts, np.arange(n), side="right") // W
    xf = expand_x[:n].astype(F32)
    if dynamic_scales is not None:
        xf = xf * dynamic_scales[:n].astype(F32)[:, None]
    return (xf * (F32(1) + j.astype(F32) / F32(4))[:, None]).astype(bfloat16)


class _Turns:
    """Lets the threads of one rank run their calls in the scheduled order, one call at a time (launch
    and synchronise: a stream's failure is reported to whoever synchronises first, so each call is
    synchronised before the next is launched)."""

    def __init__(self, order):
        import threading

        self.order, self.pos, self.cv = order, 0, threading.Condition()

    def run(self, who, fn):
        with self.cv:
            self.cv.wait_for(lambda: self.order[self.pos] == who, timeout=300)
            assert self.order[self.pos] == who, f"{who} never got its turn"
        try:
            return fn()
        finally:
            with self.cv:
                self.pos += 1
                self.cv.notify_all()


def _threads_body(rank, world_size, root, seed, shared_routing, quant):
    """THREADS threads on this rank, each running ROUNDS dispatch → expert → combine rounds of its own
    through one MoeDistributeBuffer on one stream, in the rank's own scheduled order. Returns, per
    (thread, round), the errors of its dispatch and combine and its x_out."""
    import threading

    from aclnn_py import Device, MoeDistributeBuffer
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator

    dev = Device.current()
    results, crashes = {}, []
    with Communicator(world_size, rank, root) as comm:
        buf = MoeDistributeBuffer(comm)
        s = dev.create_stream()
        turns = _Turns(_schedule(seed, rank))

        def launch_and_sync(fn, read):
            """Launch, synchronise and read the results back, all within the caller's turn: a read
            waits for the stream, and outside the turn it could wait for (and be handed the failure
            of) another thread's call."""
            out = fn()    # phase 1 and the launch; a failing kernel shows at the synchronisation
            try:
                buf.synchronize(s)
                err = None
            except AclError as e:
                err = (e.code, e.message)
            return out, err, read(out, err)

        def round_of(t, i):
            x, ids, w = _round_inputs(seed, t, i, rank, shared_routing)
            d, err_d, (ex_rows, ds, counts) = turns.run((t, "D", i), lambda: launch_and_sync(
                # kept: a thread holds its dispatch's results until its combine while the other threads
                # run any number of rounds (the buffer's own result sets would be recycled meanwhile)
                lambda: buf.low_latency_dispatch(x, ids, E, quant_mode=quant, stream=s, keep=True),
                lambda d, _: (d.expand_x.numpy(), d.dynamic_scales.numpy() if quant == 2 else None,
                              d.ep_recv_counts.numpy())))
            # after a failed dispatch its outputs hold whatever the allocation held; the combine still
            # runs, so that every rank makes the same number of collective calls
            y = _expert(ex_rows, ds, counts)
            ex = np.zeros((d.expand_x.shape[0], H), bfloat16)
            ex[:y.shape[0]] = y
            _, err_c, x_out = turns.run((t, "C", i), lambda: launch_and_sync(
                lambda: buf.low_latency_combine(ex, ids, w, d.assist_info_for_combine, d.ep_recv_counts,
                                                num_experts=E, stream=s),
                lambda out, err: out.numpy() if err is None else None))
            results[(t, i)] = (err_d, err_c, x_out)

        def worker(t):
            try:
                dev.set_current()
                for i in range(ROUNDS):
                    round_of(t, i)
            except BaseException as e:  # noqa: BLE001
                crashes.append(e)

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        s.close()
    if crashes:
        raise crashes[0]
    return results


ROUND_ERRORS = ("the ranks paired this combine with different dispatch calls",
                "assist_info_for_combine is the output of the dispatch of collective call",
                "expert_ids are the input of the dispatch of collective call",
                "expand_x holds, unchanged, the rows the dispatch")


@pytest.mark.parametrize("seed,shared_routing,quant", [(11, True, 0), (12, False, 2), (13, True, 2),
                                                       (15, False, 0)])
def test_threads_sharing_a_buffer_and_stream_are_exact_or_refused(acl, seed, shared_routing, quant):
    """Every round of every thread on every rank is bit-exact vs the golden, or its dispatch or combine
    failed with 507015 — never silently wrong."""
    from aclnn_py import golden
    from aclnn_py.worlds import run_threads

    res = run_threads(_threads_body, W, seed, shared_routing, quant, timeout=600)
    exact = refused = by_round = 0
    for t in range(THREADS):
        for i in range(ROUNDS):
            inp = [_round_inputs(seed, t, i, r, shared_routing) for r in range(W)]
            _, g = golden.round_trip(
                [a[0] for a in inp], [a[1] for a in inp],
                lambda r, d: _expert(d.expand_x, d.dynamic_scales, d.ep_recv_counts),
                moe_expert_num=E, expert_scales=[a[2] for a in inp], quant_mode=quant)
            for r in range(W):
                err_d, err_c, x_out = res[r][(t, i)]
                errs = [e for e in (err_d, err_c) if e is not None]
                if not errs:
                    assert x_out.tobytes() == g[r].x_out.tobytes(), f"thread {t} round {i} rank {r}: silently wrong"
                    exact += 1
                    continue
                for code, msg in errs:
                    assert code == KERNEL_FAIL, msg
                refused += 1
                by_round += any(text in msg for _, msg in errs for text in ROUND_ERRORS)
    assert exact + refused == THREADS * ROUNDS * W
    assert by_round > 0, "no combine was paired with another rank's dispatch (the schedule exercised nothing)"
    assert exact > 0


def _two_planned_dispatches_then(rank, world_size, root, how):
    """_two_dispatches_then through plans: a repeatable executor reads and writes through descriptors of
    its own (rebound to the memory it is given), so the combine's inputs are traced to the dispatch that
    wrote them by address."""
    from aclnn_py import Device, MoeDistributeBuffer
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator

    with Communicator(world_size, rank, root) as comm, MoeDistributeBuffer(comm) as buf:
        s = Device.current().create_stream()
        (xa, ids), (xb, _) = _inputs(rank, 1), _inputs(rank, 2)
        plan_a, plan_b = (buf.plan_dispatch(BS, H, E, ids.shape[1], x_dtype=bfloat16, stream=s) for _ in range(2))
        a, b = plan_a(xa, ids, stream=s), plan_b(xb, ids, stream=s)
        combine = buf.plan_combine(plan_a, num_experts=E, stream=s)
        d = a if how == "rank0_from_a" and rank == 0 else b
        args = {"rank0_from_a": (d.expand_x, d.assist_info_for_combine, d.ep_recv_counts),
                "assist_a_counts_b": (b.expand_x, a.assist_info_for_combine, b.ep_recv_counts),
                "rows_of_a": (a.expand_x, b.assist_info_for_combine, b.ep_recv_counts),
                "b": (b.expand_x, b.assist_info_for_combine, b.ep_recv_counts)}[how]
        out = combine(args[0], ids, args[1], args[2], stream=s)
        try:
            s.synchronize()
            res = (0, "", out.numpy())
        except AclError as e:
            res = (e.code, e.message, None)
        for p in (plan_a, plan_b, combine):
            p.close()
        s.close()
    return res


@pytest.mark.parametrize("how,error", [
    ("b", None),
    ("rank0_from_a", "the ranks paired this combine with different dispatch calls"),
    ("assist_a_counts_b", "assist_info_for_combine is the output of the dispatch of collective call #"),
    ("rows_of_a", "expand_x holds, unchanged, the rows the dispatch of collective call #")])
def test_plans_are_traced_to_their_dispatch_by_address(acl, how, error):
    from aclnn_py.worlds import run_threads

    g = _golden_b()
    for r, (code, msg, out) in enumerate(run_threads(_two_planned_dispatches_then, W, how, timeout=120)):
        if error is None:
            assert code == 0, msg
            assert out.tobytes() == g[r].tobytes()
        else:
            assert code == KERNEL_FAIL and error in msg, msg


def _large_world_mixed_routing(rank, world_size, root):
    """Every rank of a large thread world: dispatch A, dispatch B (the same routing), then a combine
    taking A's assist_info_for_combine with B's counts; returns (status, message)."""
    from aclnn_py import Device
    from aclnn_py.errors import AclError
    from aclnn_py.hccl import Communicator, build_context
    from aclnn_py.ops import moe_distribute_combine, moe_distribute_dispatch

    with Communicator(world_size, rank, root) as comm:
        ctx, ccl = build_context(comm)
        s = Device.current().create_stream()
        kw = dict(ep_world_size=world_size, ep_rank_id=rank, moe_expert_num=world_size, ccl_buffer_size=ccl, stream=s)
        x = np.full((1, H), rank, np.float32).astype(bfloat16)
        ids = np.array([[(rank + 1) % world_size]], np.int32)
        a = moe_distribute_dispatch(ctx, x, ids, **kw)
        b = moe_distribute_dispatch(ctx, x, ids, **kw)
        out = moe_distribute_combine(ctx, b.expand_x, ids, a.assist_info_for_combine, b.ep_recv_counts, None, **kw)
        try:
            s.synchronize()
            res = (0, "")
        except AclError as e:
            res = (e.code, e.message)
        del out
        s.close()
    return res


def test_every_rank_of_a_world_of_hundreds_of_threads_is_traced(acl):
    """Each rank of one process keeps its own dispatch records: with more thread ranks than a
    process-wide table of communicators could hold, the last ranks' records would push out the first
    ones' before their combines looked them up, and those combines would go unchecked."""
    from aclnn_py.worlds import run_threads

    res = run_threads(_large_world_mixed_routing, 320, timeout=300, share_one_cpu=True)
    unchecked = [r for r, (code, _) in enumerate(res) if code != KERNEL_FAIL]
    assert not unchecked, f"{len(unchecked)} ranks' combines were not traced, e.g. rank {unchecked[0]}: {res[unchecked[0]]}"
    assert all("assist_info_for_combine is the output of the dispatch of collective call #" in msg for _, msg in res)
