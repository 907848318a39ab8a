"""MoeDistributeBuffer's result contract: each method keeps a ring of result sets (two by default). A call
writes into the next set's memory and hands out new Tensors; a result stays valid until that many more
calls of the same method, then every read of it — the Tensor's numpy(), a zero-copy view, a DLPack
export, passing it to an operator — raises RecycledError saying so. keep=True and clone() keep a result
for good. A set is written again only when that is safe: never after a Tensor of it was exported or read
on another stream, never from another stream; and the bytes a call gives are the same whichever
memory it wrote (the poison of new memory included, where the operator writes nothing)."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import ml_dtypes
import numpy as np
import pytest

E, BS, H, K = 4, 8, 1024, 2
POISON = 0xA5


def _inputs(acl: Any, rank: int, i: int) -> tuple[Any, Any, Any]:
    """Input set `i`: each set sends a different number of rows to each rank, so rows one call leaves
    unwritten were written by the call before."""
    rng = np.random.default_rng(1000 * rank + i)
    x = rng.uniform(-1, 1, (BS, H)).astype(ml_dtypes.bfloat16)
    if i % 2:
        ids = np.stack([rng.choice(E, K, replace=False) for _ in range(BS)]).astype(np.int32)
    else:  # every token to experts 0 and 1, both on rank 0
        ids = np.tile(np.array([0, 1], np.int32), (BS, 1))
    w = rng.uniform(0, 1, (BS, K)).astype(np.float32)
    return acl.Tensor.from_numpy(x), acl.Tensor.from_numpy(ids), acl.Tensor.from_numpy(w)


def _snapshot(out: Any, stream: Any) -> list[bytes]:
    """Every byte of every output in device memory, the unwritten ones included (a download copies the
    received rows only)."""
    stream.synchronize()
    return [t.numpy_view().tobytes() for t in out]


T = TypeVar("T")
Scenario = Callable[[Any, Any, Any, int, list[Any]], dict[str, Any]]


def _world(acl: Any, scenario: Scenario, **buffer_args: Any) -> list[dict[str, Any]]:
    """`scenario(acl, buf, stream, rank, sets)` on two thread ranks, each with its buffer and stream."""

    def rank_fn(rank: int, world_size: int, root: bytes) -> dict[str, Any]:
        with acl.hccl.Communicator(world_size, rank, root) as comm, \
                acl.MoeDistributeBuffer(comm, **buffer_args) as buf:
            s = acl.Device(rank).create_stream()
            try:
                sets = [_inputs(acl, rank, i) for i in range(3)]
                result = scenario(acl, buf, s, rank, sets)
                s.synchronize()
                if not comm.closed:  # a scenario may close it
                    comm.barrier()
                return result
            finally:
                s.close()

    return acl.worlds.run_threads(rank_fn, 2, timeout=120)


def _dispatch(buf: Any, s: Any, data: tuple[Any, Any, Any], **kw: Any) -> Any:
    x, ids, w = data
    return buf.low_latency_dispatch(x, ids, E, topk_weights=w, stream=s, **kw)


def _combine(buf: Any, s: Any, data: tuple[Any, Any, Any], out: Any, **kw: Any) -> Any:
    return buf.low_latency_combine(out.expand_x, data[1], data[2], out.assist_info_for_combine, out.ep_recv_counts,
                                   num_experts=E, stream=s, **kw)


def _reads(t: Any) -> dict[str, str]:
    """What each way of reading `t` raises (the error class), or "read"."""
    import aclnn_py as acl

    ways: dict[str, Callable[[], object]] = {
        "numpy": t.numpy, "numpy_view": t.numpy_view, "asarray": lambda: np.asarray(t),
        "dlpack": lambda: t.__dlpack__(), "clone": t.clone, "borrow": lambda: acl.Tensor.from_dlpack(t),
        "ptr": lambda: t.ptr,
    }
    out = {}
    for name, read in ways.items():
        try:
            read()
            out[name] = "read"
        except Exception as exc:  # noqa: BLE001
            out[name] = type(exc).__name__
    return out


def test_every_call_hands_out_new_tensors_and_the_bytes_of_fresh_memory(acl: Any) -> None:
    """Over the input sets in turn: the same bytes whether a call wrote a set's memory again or new
    memory (poison where nothing is written), and the ring in steady state."""

    def run(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any], fresh: bool) -> dict[str, Any]:
        snapshots, new_objects = [], []
        held: list[Any] = []  # every result, so that no object's id is given to a later one
        for step in range(6):
            data = sets[step % 3]
            out = _dispatch(buf, s, data, keep=fresh)
            y = _combine(buf, s, data, out, keep=fresh)
            snapshots.append(_snapshot(list(out) + [y], s) if fresh or step < 5 else [])
            new_objects.append(all(t is not u for t in list(out) + [y] for r in held for u in r))
            held.append(list(out) + [y])
        return {"bytes": snapshots[:5], "new objects": all(new_objects), "held": buf.held_result_sets}

    ring = _world(acl, lambda *a: run(*a, fresh=False))
    kept = _world(acl, lambda *a: run(*a, fresh=True))
    for r, k in zip(ring, kept):
        assert r["bytes"] == k["bytes"]  # written rows and the poison of the unwritten ones alike
        assert r["held"] == (2, 2) and k["held"] == (0, 0)
        assert r["new objects"] and k["new objects"]


def test_a_result_is_valid_until_the_ring_comes_round_then_every_read_raises(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        first = _dispatch(buf, s, sets[0])
        before = _snapshot(first, s)
        second = _dispatch(buf, s, sets[1])
        report: dict[str, Any] = {"valid after one call": _snapshot(first, s) == before}
        third = _dispatch(buf, s, sets[2])
        report["recycled"] = first.expand_x.recycled
        report["reads"] = _reads(first.expand_x)
        try:
            first.ep_recv_counts.numpy()
        except acl.RecycledError as exc:
            report["message"] = str(exc)
        try:  # a recycled result passed to an operator
            _combine(buf, s, sets[0], first)
        except acl.RecycledError as exc:
            report["as input"] = str(exc)
        report["second valid"] = not second.expand_x.recycled and third.expand_x.numpy(stream=s) is not None
        return report

    for r in _world(acl, scenario):
        assert r["valid after one call"] and r["recycled"] and r["second valid"]
        assert set(r["reads"].values()) == {"RecycledError"}, r["reads"]
        assert "is a result of MoeDistributeBuffer.low_latency_dispatch that was recycled" in r["message"]
        assert "valid until 2 more calls of the method" in r["message"] and "clone() it or pass keep=True" in r["message"]
        assert "cannot download it" in r["message"]
        assert "x: " in r["as input"] and "was recycled" in r["as input"], r["as input"]


def test_the_ring_size_is_the_buffers_to_choose(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        results = [_dispatch(buf, s, sets[i % 3]) for i in range(4)]
        return {"recycled": [r.expand_x.recycled for r in results], "sets": buf.result_sets}

    for r in _world(acl, scenario, result_sets=3):
        assert r["sets"] == 3 and r["recycled"] == [True, False, False, False]
    with pytest.raises(ValueError, match="result_sets: must be an int >= 1"):
        _world(acl, scenario, result_sets=0)


def test_kept_and_cloned_results_survive_any_number_of_calls(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        kept = _dispatch(buf, s, sets[0], keep=True)
        plain = _dispatch(buf, s, sets[0])
        cloned = plain.expand_x.clone(stream=s)
        before, clone_before = _snapshot(kept, s), cloned.numpy(stream=s).tobytes()
        for i in range(5):
            _dispatch(buf, s, sets[(i + 1) % 3])
        return {"kept": _snapshot(kept, s) == before, "clone": cloned.numpy(stream=s).tobytes() == clone_before,
                "plain recycled": plain.expand_x.recycled, "kept recycled": kept.expand_x.recycled}

    for r in _world(acl, scenario):
        assert r == {"kept": True, "clone": True, "plain recycled": True, "kept recycled": False}


def test_a_layer_pipelined_loop_keeps_its_dispatch_results_for_the_next_combine(acl: Any) -> None:
    """dispatch(i+1) before combine(i): combine reads dispatch i's results after one more dispatch."""

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        got, want = [], []
        pending = _dispatch(buf, s, sets[0])
        for i in range(1, 5):
            nxt = _dispatch(buf, s, sets[i % 3])
            got.append(_combine(buf, s, sets[(i - 1) % 3], pending).numpy(stream=s).tobytes())
            pending = nxt
        for i in range(4):
            out = _dispatch(buf, s, sets[i % 3], keep=True)
            want.append(_combine(buf, s, sets[i % 3], out, keep=True).numpy(stream=s).tobytes())
        return {"same": got == want}

    for r in _world(acl, scenario):
        assert r["same"]


@pytest.mark.parametrize("export", ["numpy_view", "dlpack", "borrow"])
def test_an_exported_result_keeps_its_bytes_and_its_set_takes_new_memory(acl: Any, export: str) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        first = _dispatch(buf, s, sets[0])
        s.synchronize()
        t = first.ep_recv_counts  # int32: numpy takes its DLPack export
        view = {"numpy_view": t.numpy_view, "dlpack": lambda: np.from_dlpack(t),
                "borrow": lambda: acl.Tensor.from_dlpack(t)}[export]()
        before = bytes(np.asarray(view).tobytes()) if export != "borrow" else view.numpy().tobytes()
        for i in range(4):  # the ring comes round twice
            _dispatch(buf, s, sets[(i + 1) % 3])
        s.synchronize()
        after = bytes(np.asarray(view).tobytes()) if export != "borrow" else view.numpy().tobytes()
        return {"same": after == before, "recycled": t.recycled}

    for r in _world(acl, scenario):
        assert r == {"same": True, "recycled": True}


def test_results_read_on_another_stream_are_not_written_again(acl: Any) -> None:
    """Combine on a second stream reads dispatch's results: their set never takes a later call's result
    (a write on the first stream could land under that read), it takes new memory."""

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        other = acl.Device(rank).create_stream()
        try:
            out = _dispatch(buf, s, sets[0])
            address = out.expand_x.data_ptr
            y = _combine(buf, other, sets[0], out)  # reads dispatch's results on `other`
            got = y.numpy(stream=other).tobytes()  # (the ranks' collectives stay in one order)
            later = [_dispatch(buf, s, sets[(i + 1) % 3]) for i in range(2)]  # the ring comes round
            ref_out = _dispatch(buf, s, sets[0], keep=True)
            want = _combine(buf, s, sets[0], ref_out, keep=True).numpy(stream=s).tobytes()
            return {"same": got == want, "new memory": later[1].expand_x.data_ptr != address,
                    "recycled": out.expand_x.recycled}
        finally:
            other.close()

    for r in _world(acl, scenario):
        assert r == {"same": True, "new memory": True, "recycled": True}


def test_changed_attributes_and_a_group_string_generation_use_the_ring(acl: Any) -> None:
    """Alternating quantisation modes get their own results; a buffer of generation 4 (group names, no
    context tensor) keeps result sets too."""

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        got = []
        for step in range(4):
            x, ids, w = sets[step % 2]
            out = buf.low_latency_dispatch(x, ids, E, topk_weights=w, quant_mode=2 * (step % 2), stream=s)
            got.append((out.expand_x.dtype.name, _snapshot(out, s)))
        return {"modes": [g[0] for g in got], "repeat": got[0] == got[2] and got[1] == got[3],
                "generation": buf.generation, "held": buf.held_result_sets}

    for r in _world(acl, scenario):
        assert r["modes"] == ["BF16", "INT8", "BF16", "INT8"] and r["repeat"] and r["held"] == (2, 0)
    for r in _world(acl, scenario, generation=4):
        assert r["generation"] == 4 and r["repeat"] and r["held"] == (2, 0)


def test_close_and_update_ctx_let_the_result_sets_go(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        out = _dispatch(buf, s, sets[0])
        _combine(buf, s, sets[0], out)
        held = buf.held_result_sets
        s.synchronize()
        buf.update_ctx(buf.comm)
        after_update = buf.held_result_sets
        survivor = _snapshot(out, s)  # handed-out results keep their memory
        buf.close()
        return {"held": held, "after update": after_update, "after close": buf.held_result_sets,
                "readable": len(survivor) == 6}

    for r in _world(acl, scenario):
        assert r == {"held": (1, 1), "after update": (0, 0), "after close": (0, 0), "readable": True}


def test_a_sets_executor_holds_its_outputs_without_exporting_them(acl: Any) -> None:
    """The set's executor refers to the set's own memory, which no one else sees: an export would count
    as the user's, mark the memory host-written when it goes, and make closing the buffer cost more."""
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        out = _dispatch(buf, s, sets[0])
        x_out = _combine(buf, s, sets[0], out)
        s.synchronize()
        handed_out = [*out, x_out]
        return {"exports": {t._mem.exports for t in handed_out if t._mem is not None},
                "shared": {t._shared for t in handed_out}}

    for r in _world(acl, scenario):
        assert r == {"exports": {0}, "shared": {False}}


def test_a_weak_reference_to_a_recycled_result_reads_nothing_of_the_next_call(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        ref = weakref.ref(_dispatch(buf, s, sets[0]).expand_x)
        gc.collect()
        for i in range(2):
            _dispatch(buf, s, sets[i + 1])
        t = ref()
        return {"gone or refused": t is None or set(_reads(t).values()) == {"RecycledError"}}

    for r in _world(acl, scenario):
        assert r["gone or refused"]


def test_unwritten_rows_of_a_set_written_again_show_poison(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        _dispatch(buf, s, sets[0])  # rank 0 receives every row
        _dispatch(buf, s, sets[0])
        third = _dispatch(buf, s, sets[1])  # the first call's set, written again with fewer rows
        s.synchronize()
        rows = int(third.ep_recv_counts.numpy()[-1])
        tail = third.expand_x.numpy_view().view(np.uint8).reshape(third.expand_x.shape[0], -1)[rows:]
        return {"rows": rows, "capacity": third.expand_x.shape[0], "tail_is_poison": bool((tail == POISON).all())}

    for r in _world(acl, scenario):
        assert r["rows"] < r["capacity"] and r["tail_is_poison"]


def test_a_download_copies_the_received_rows_and_combine_uploads_only_those(acl: Any, monkeypatch: Any) -> None:
    """A download of a dispatch result copies the rows its call received (the rest of the host array reads
    zero; the device keeps its poison there), outputs not written row by row whole, and a result the caller
    wrote into whole again; a host expand_x given to combine after such a download is uploaded up to the
    received rows, and combines to the same bytes as the device result. A plan's outputs (not a buffer's)
    download whole."""
    from aclnn_py.ops.host_inputs import HostInputs

    leading: list[tuple[int, int]] = []
    real = HostInputs.upload
    both = threading.Barrier(2)

    def recorded(self: Any, array: Any, param: str, dtype: Any = None, rows: int = -1) -> Any:
        if rows >= 0:
            leading.append((rows, array.shape[0]))
        return real(self, array, param, dtype, rows)

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        x, ids, w = sets[1]
        out = _dispatch(buf, s, sets[1])
        s.synchronize()
        n = int(out.ep_recv_counts.numpy()[-1])
        host, device = out.expand_x.numpy(), out.expand_x.numpy_view()
        assist, assist_dev = out.assist_info_for_combine.numpy(), out.assist_info_for_combine.numpy_view()
        report = {
            "rows": n, "capacity": host.shape[0],
            "received rows copied": host[:n].tobytes() == device[:n].tobytes() and
            assist[:3 * n].tobytes() == assist_dev[:3 * n].tobytes(),
            "rest zero": not host[n:].view(np.uint16).any() and not assist[3 * n:].any(),
            "device keeps poison": bool((device[n:].view(np.uint8) == POISON).all()),
            "whole": out.expert_token_nums.numpy().tobytes() == out.expert_token_nums.numpy_view().tobytes(),
        }
        y_dev = _combine(buf, s, sets[1], out, keep=True).numpy(stream=s)
        both.wait()
        if rank == 0:
            monkeypatch.setattr(HostInputs, "upload", recorded)
        both.wait()
        host[n:] = np.nan  # never read by combine
        y_host = buf.low_latency_combine(host, ids, w, out.assist_info_for_combine, out.ep_recv_counts,
                                         num_experts=E, stream=s).numpy(stream=s)
        report["same combine"] = y_host.tobytes() == y_dev.tobytes()
        again, mine = _dispatch(buf, s, sets[1]), np.ones(host.shape, host.dtype)
        again.expand_x.copy_from(mine, stream=s)  # written by the caller: every row is downloaded again
        report["caller's rows downloaded"] = again.expand_x.numpy(stream=s).tobytes() == mine.tobytes()
        dplan = buf.plan_dispatch(BS, H, E, K, x_dtype=ml_dtypes.bfloat16, with_weights=True, stream=s)
        planned = dplan(x, ids, topk_weights=w, stream=s)
        report["plan downloads whole"] = planned.expand_x.numpy(stream=s).tobytes() == \
            planned.expand_x.numpy_view().tobytes()
        dplan.close()
        return report

    results = _world(acl, scenario)
    for r in results:
        assert r["rows"] < r["capacity"], r
        assert r["received rows copied"] and r["rest zero"] and r["device keeps poison"] and r["whole"], r
        assert r["same combine"] and r["plan downloads whole"] and r["caller's rows downloaded"], r
    assert sorted(leading) == sorted((r["rows"], r["capacity"]) for r in results)  # one upload per rank


def test_a_closed_input_or_communicator_raises_through_the_method(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        _dispatch(buf, s, sets[1])
        x, ids, w = _inputs(acl, rank, 1)
        x.close()
        report = {}
        try:
            buf.low_latency_dispatch(x, ids, E, topk_weights=w, stream=s)
        except acl.ClosedError as exc:
            report["closed input"] = str(exc)
        buf.comm.barrier(s, wait=True)
        buf.comm.close()
        try:
            _dispatch(buf, s, sets[1])
        except acl.ClosedError as exc:
            report["closed communicator"] = str(exc)
        return report

    for r in _world(acl, scenario):
        assert "is closed: cannot pass it to an operator" in r["closed input"]
        assert r["closed communicator"].startswith("Communicator(rank ") and "run low_latency_dispatch" in \
            r["closed communicator"]


def test_an_error_of_the_method_names_the_callers_parameter(acl: Any) -> None:
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        x, ids, w = sets[0]
        _dispatch(buf, s, sets[0])
        bad_ids = acl.Tensor.from_numpy(np.zeros((BS, K), np.int64))
        try:
            buf.low_latency_dispatch(x, bad_ids, E, topk_weights=w, stream=s)
        except acl.AclnnParamInvalid as exc:
            message = exc.message
        _dispatch(buf, s, sets[0])  # still usable
        return {"message": message}

    for r in _world(acl, scenario):
        assert r["message"].startswith("topk_idx: "), r["message"]


def test_a_steady_call_launches_its_sets_executor_again_and_a_strided_input_runs_both_phases(acl: Any) -> None:
    """A set keeps a repeatable executor of its layout: steady calls over the input sets in turn create
    no executor and no descriptor (phase 1 ran at the first call of the layout). A new layout (another
    batch size) makes new ones; a strided x runs both phases (and phase 1 refuses it, as without a
    set's executor). Every call gives the bytes of a call with keep=True (both phases, new memory)."""
    from aclnn_py import _mock

    both = threading.Barrier(2)

    def counts() -> tuple[int, int]:
        n = _between_calls(both, _mock.stats)
        return int(n["executors"]), int(n["tensors"])

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        same = []

        def round_(data: tuple[Any, Any, Any]) -> None:
            out, y = _dispatch(buf, s, data), None
            y = _combine(buf, s, data, out)
            got = _snapshot(list(out) + [y], s)
            kept = _dispatch(buf, s, data, keep=True)
            same.append(got == _snapshot(list(kept) + [_combine(buf, s, data, kept, keep=True)], s))

        base = counts()
        for step in range(4):
            round_(sets[step % 3])
        warm = counts()
        for step in range(4, 10):
            round_(sets[step % 3])
        steady = counts()
        x, ids, w = sets[0]
        half = (acl.Tensor.from_numpy(x.numpy()[:BS // 2]), acl.Tensor.from_numpy(ids.numpy()[:BS // 2]),
                acl.Tensor.from_numpy(w.numpy()[:BS // 2]))
        round_(half)  # another layout: new outputs and executors for the set it takes
        wide = acl.Tensor.zeros((BS, 2 * H), ml_dtypes.bfloat16)
        wide.numpy_view()[:, :H] = x.numpy()
        strided = acl.Tensor.from_address(wide.ptr, (BS, H), ml_dtypes.bfloat16, strides=(2 * H, 1), owner=wide)
        try:
            _dispatch(buf, s, (strided, ids, w))
            refused = ""
        except acl.AclnnParamInvalid as exc:
            refused = str(exc)
        round_(sets[0])
        return {"same": same, "base": base, "warm": warm, "steady": steady, "refused": refused}

    for r in _world(acl, scenario):
        assert r["same"] == [True] * 12
        # two ranks x two methods x two sets: each set's executor lives on, none more (keep=True's are
        # destroyed by their launch)
        assert r["steady"] == r["warm"] and r["steady"][0] == r["base"][0] + 8, r
        # both phases run: phase 1's own refusal, in the caller's words
        assert r["refused"].startswith("aclnnMoeDistributeDispatchV5GetWorkspaceSize failed") and \
            "x: must be contiguous (got strides (2048, 1)" in r["refused"], r["refused"]


def test_a_buffer_dropped_without_close_lets_its_executors_go_at_once(acl: Any) -> None:
    """The result sets' executors go when the buffer is dropped (its sets live on in a cycle with the
    Tensors they handed out until the collector runs); the Tensors handed out keep their memory."""
    from aclnn_py import _mock

    both = threading.Barrier(2)

    def executors() -> int:
        return int(_between_calls(both, _mock.stats)["executors"])

    def rank_fn(rank: int, world_size: int, root: bytes) -> dict[str, Any]:
        gc.disable()  # the drop alone, not the collector, lets them go
        try:
            with acl.hccl.Communicator(world_size, rank, root) as comm:
                s = acl.Device(rank).create_stream()
                before = executors()
                buf = acl.MoeDistributeBuffer(comm)
                data = _inputs(acl, rank, 0)
                out = _dispatch(buf, s, data)
                y = _combine(buf, s, data, out)
                s.synchronize()
                during = executors()
                want = y.numpy()
                del buf
                s.synchronize()  # the executors are released once the stream has passed their launches
                after = executors()
                same = y.numpy().tobytes() == want.tobytes()
                s.close()
                return {"before": before, "during": during, "after": after, "kept": same}
        finally:
            gc.enable()

    for r in acl.worlds.run_threads(rank_fn, 2, timeout=120):
        assert r["during"] == r["before"] + 4 and r["after"] == r["before"] and r["kept"], r


def test_a_layout_whose_results_were_exported_is_not_kept_for_later(acl: Any) -> None:
    """Outputs a host view was taken of are never written again: when the set turns to a layout it kept,
    the exported layout is let go of (its executor too), and a later call of that layout writes new
    outputs while the view still shows the bytes it was taken of."""
    from aclnn_py import _mock

    both = threading.Barrier(2)

    def executors() -> int:
        return int(_between_calls(both, _mock.stats)["executors"])

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        x, ids, w = (t.numpy() for t in sets[1])
        data = {bs: tuple(acl.Tensor.from_numpy(a[:bs]) for a in (x, ids, w)) for bs in (BS, 3)}
        _dispatch(buf, s, data[3])  # layout A
        out = _dispatch(buf, s, data[BS])  # layout B (A set aside)
        s.synchronize()
        view = out.expand_x.numpy_view()  # B's outputs are exported
        taken = view.tobytes()
        two = executors()  # A's and B's
        _dispatch(buf, s, data[3])  # back to A: B is let go of
        one = executors()
        again = _dispatch(buf, s, data[BS])  # B anew, in new memory
        s.synchronize()
        return {"two": two, "one": one, "after": executors(), "view kept": view.tobytes() == taken,
                "new memory": again.expand_x.ptr != out.expand_x._ptr}

    for r in _world(acl, scenario, result_sets=1):
        # per process: two ranks x one dispatch set
        assert (r["two"], r["one"], r["after"]) == (4, 2, 4), r
        assert r["view kept"] and r["new memory"], r


def _between_calls(both: threading.Barrier, read: Callable[[], T]) -> T:
    """`read()` while every rank waits at `both` between its calls: none goes on before all have read."""
    both.wait()
    found = read()
    both.wait()
    return found


def _collect_alone(rank: int, both: threading.Barrier) -> None:
    """A collection of the whole process by one rank while the other waits: gc.collect() returns at
    once, collecting nothing, when another thread's collection is under way (it lets go of the GIL in
    the finalizers it runs), and a rank measuring then would count the garbage that one frees later."""
    both.wait()
    if rank == 0:
        gc.collect()
    both.wait()


def _malloc_counter(monkeypatch: Any) -> tuple[list[int], Callable[[], None]]:
    """A list of the sizes the memory pool allocates once the returned function has run (call it on one
    thread while the others wait: it patches the pool for every thread)."""
    from aclnn_py.runtime import _pool

    mallocs: list[int] = []
    real = _pool.MemoryPool.malloc

    def counted(self: Any, nbytes: int, device: int) -> int:
        mallocs.append(nbytes)
        return real(self, nbytes, device)

    def start() -> None:
        monkeypatch.setattr(_pool.MemoryPool, "malloc", counted)

    return mallocs, start


def test_host_arrays_go_into_device_tensors_each_result_set_keeps(acl: Any, monkeypatch: Any) -> None:
    """A loop over host arrays copies them into device Tensors each result set keeps (dispatch's x,
    expert ids and weights; combine's expand_x, expert ids and weights): once both rings have been
    round, a call allocates no device memory, and closing the buffer (and the stream, which keeps its
    workspace block) gives all of it back."""
    mallocs, count_mallocs = _malloc_counter(monkeypatch)
    both = threading.Barrier(2)

    def rank_fn(rank: int, world_size: int, root: bytes) -> dict[str, Any]:
        s = acl.Device(rank).create_stream()
        pool = acl.get_memory_pool()
        try:
            with acl.hccl.Communicator(world_size, rank, root) as comm:
                host = [tuple(t.numpy() for t in _inputs(acl, rank, i)) for i in range(2)]
                _collect_alone(rank, both)
                before = pool.used_bytes(rank)
                buf = acl.MoeDistributeBuffer(comm)
                results = []

                def step(i: int) -> None:
                    x, ids, w = host[i % 2]
                    out = buf.low_latency_dispatch(x, ids, E, topk_weights=w, stream=s)
                    y = buf.low_latency_combine(out.expand_x.numpy(), ids, w, out.assist_info_for_combine,
                                                out.ep_recv_counts, num_experts=E, stream=s)
                    results.append(y.numpy(stream=s))

                for i in range(2):  # each set of both rings once: outputs, executors, kept host inputs
                    step(i)
                both.wait()
                if rank == 0:
                    count_mallocs()
                both.wait()
                for i in range(2, 8):
                    step(i)
                both.wait()
                steady = len(mallocs)
                buf.close()
                s.close()  # after the buffer's work (and with the stream's workspace block)
                _collect_alone(rank, both)  # both buffers and streams closed, their cycles collected
                after = pool.used_bytes(rank)
                both.wait()
                same = all(results[i].tobytes() == results[i % 2].tobytes() for i in range(2, 8))
                return {"steady mallocs": steady, "before": before, "after": after, "same": same}
        finally:
            s.close()

    for r in acl.worlds.run_threads(rank_fn, 2, timeout=120):
        assert r["steady mallocs"] == 0 and r["same"], r
        assert r["after"] == r["before"], r


def test_a_host_array_loop_whose_token_count_varies_allocates_nothing_once_warm(acl: Any, monkeypatch: Any) -> None:
    """Host arrays whose token count cycles through four values: once every set has seen its counts, a
    call allocates no device memory (each set keeps the outputs of each layout and a device copy of each
    input per shape), and every result is the bytes of the same call with device Tensors."""
    mallocs, count_mallocs = _malloc_counter(monkeypatch)
    both = threading.Barrier(2)

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        x, ids, w = (t.numpy() for t in sets[1])
        host = {bs: (x[:bs], ids[:bs], w[:bs]) for bs in (BS, 3, 5, 1)}

        def call(b: Any, bs: int, device: bool) -> bytes:
            args = tuple(acl.Tensor.from_numpy(a) for a in host[bs]) if device else host[bs]
            out = b.low_latency_dispatch(args[0], args[1], E, topk_weights=args[2], stream=s)
            y = b.low_latency_combine(out.expand_x, args[1], args[2], out.assist_info_for_combine,
                                      out.ep_recv_counts, num_experts=E, stream=s)
            return bytes(y.numpy(stream=s).tobytes())

        with acl.MoeDistributeBuffer(buf.comm) as fresh:
            expected = {bs: call(fresh, bs, True) for bs in host}
        order = [(BS, 3, 5, 1)[i % 4] for i in range(20)]
        same = [call(buf, bs, False) == expected[bs] for bs in order[:8]]
        both.wait()
        if rank == 0:
            count_mallocs()
        both.wait()
        same += [call(buf, bs, False) == expected[bs] for bs in order[8:]]
        both.wait()
        return {"same": same, "steady mallocs": len(mallocs)}

    for r in _world(acl, scenario):
        assert r["same"] == [True] * 20 and r["steady mallocs"] == 0, r


def test_kept_host_inputs_follow_the_calls_stream_and_shapes(acl: Any) -> None:
    """A result set makes its kept host-input Tensors again for a call on another stream or with other
    shapes, takes strided arrays and ids of another integer type as well, and a call with host arrays
    gives the bytes of the same call with device Tensors."""
    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        other = acl.Device(rank).create_stream()
        rng = np.random.default_rng(50 + rank)
        same = []
        steps = [(s, 8, ""), (other, 8, ""), (s, 5, ""), (s, 8, ""), (other, 3, ""), (other, 3, "strided"),
                 (s, 3, "int64"), (s, 3, "")]
        for stream, bs, kind in steps:
            x = rng.uniform(-1, 1, (bs, H)).astype(ml_dtypes.bfloat16)
            ids = np.stack([rng.choice(E, K, replace=False) for _ in range(bs)]).astype(np.int32)
            w = rng.uniform(0, 1, (bs, K)).astype(np.float32)
            given_x, given_ids = x, ids
            if kind == "strided":  # the same values, every other column of a wider array
                given_x = np.repeat(x, 2, axis=1)[:, ::2]
                assert not given_x.flags.c_contiguous
            elif kind == "int64":
                given_ids = ids.astype(np.int64)
            d = buf.low_latency_dispatch(given_x, given_ids, E, topk_weights=w, stream=stream)
            y = buf.low_latency_combine(d.expand_x.numpy(), ids, w, d.assist_info_for_combine, d.ep_recv_counts,
                                        num_experts=E, stream=stream).numpy(stream=stream)
            xd, idd, wd = (acl.Tensor.from_numpy(a, stream=stream) for a in (x, ids, w))
            dd = buf.low_latency_dispatch(xd, idd, E, topk_weights=wd, stream=stream, keep=True)
            yd = buf.low_latency_combine(dd.expand_x, idd, wd, dd.assist_info_for_combine, dd.ep_recv_counts,
                                         num_experts=E, stream=stream, keep=True)
            same.append(y.tobytes() == yd.numpy(stream=stream).tobytes())
        other.synchronize()
        other.close()
        return {"same": same}

    for r in _world(acl, scenario):
        assert all(r["same"]) and len(r["same"]) == 8, r


def test_a_serving_loop_whose_token_count_varies_reuses_each_layouts_outputs_and_executor(acl: Any,
                                                                                          monkeypatch: Any) -> None:
    """Calls whose token count cycles through a few values (a serving loop's batches) find each
    layout's outputs and executor kept by the set they take: once every set has seen its counts, no
    executor or descriptor is made, and every result is the bytes of the same call on a fresh buffer.
    A set that meets a fifth layout lets its oldest go (four kept), and still gives the same bytes."""
    from aclnn_py import _mock
    from aclnn_py.ops import plan_parts

    both = threading.Barrier(2)
    cycle = (BS, 3, 5, 1)  # with two sets per ring: one set sees BS and 5, the other 3 and 1
    phase1: list[int] = []
    real = plan_parts.result_set_executor

    def counted(*args: Any) -> Any:
        phase1.append(1)
        return real(*args)

    monkeypatch.setattr(plan_parts, "result_set_executor", counted)

    def made() -> tuple[int, int, int]:
        n, phase1_calls = _between_calls(both, lambda: (_mock.stats(), len(phase1)))
        return int(n["executors"]), int(n["tensors"]), phase1_calls

    def scenario(acl: Any, buf: Any, s: Any, rank: int, sets: list[Any]) -> dict[str, Any]:
        x, ids, w = (t.numpy() for t in sets[1])
        data = {bs: tuple(acl.Tensor.from_numpy(a[:bs]) for a in (x, ids, w)) for bs in (*cycle, 7, 2, 6)}

        def call(b: Any, bs: int) -> list[bytes]:
            out = _dispatch(b, s, data[bs])
            y = _combine(b, s, data[bs], out)
            s.synchronize()
            return [out.expand_x.numpy()[:int(out.ep_recv_counts.numpy()[-1])].tobytes(),
                    out.ep_recv_counts.numpy().tobytes(), y.numpy().tobytes()]

        with acl.MoeDistributeBuffer(buf.comm) as fresh:
            expected = {bs: call(fresh, bs) for bs in data}
        order = [cycle[i % len(cycle)] for i in range(24)]
        got = [call(buf, bs) == expected[bs] for bs in order[:8]]
        warm = made()
        got += [call(buf, bs) == expected[bs] for bs in order[8:]]
        steady = made()
        # each set now meets 7, 2 and 6 (five layouts: its oldest goes), then its first two again
        got += [call(buf, bs) == expected[bs] for bs in (7, 7, 2, 2, 6, 6, BS, 3, 5, 1)]
        return {"same": got, "warm": warm, "steady": steady, "after": made()}

    for r in _world(acl, scenario):
        assert r["same"] == [True] * 34, r["same"]
        assert r["steady"] == r["warm"], r  # no phase 1, executor or descriptor once warm
        # two ranks x two methods x two sets: two layouts each once warm, at most four in the end
        assert r["warm"][0] == 2 * 2 * 2 * 2 and r["after"][0] == 2 * 2 * 2 * 4, r
