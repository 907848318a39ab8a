"""One Python API over every generation of the operators: MoeDistributeBuffer and ops.moe_distribute_*
pick the newest generation the backend exports or the one a config names, run it through the same
compiled launch, and name what a generation lacks; a root exporting only V2 is used as such by the
loader, doctor and the demo. Outputs are compared bit for bit with the golden."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.group_gens import GenCase, World, expert, golden_round, make_inputs, run_ranks, run_round

import aclnn_py as acl
from aclnn_py import MoeDistributeBuffer, golden, ops
from aclnn_py.ops import generations
from aclnn_py.ops.generations import GenerationError


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    want = np.ascontiguousarray(np.asarray(want, dtype=got.dtype))
    assert got.shape == want.shape, f"{what}: shape {got.shape} != golden {want.shape}"
    assert got.tobytes() == want.tobytes(), f"{what}: differs from the golden"


def test_the_full_mock_exports_every_generation_and_configs_default_to_the_newest(acl):
    assert [g.number for g in generations.exported()] == [5, 4, 3, 2, 1]
    cfg = ops.MoeConfig(ep_world_size=2, ep_rank_id=0, moe_expert_num=2, ccl_buffer_size=1 << 20)
    assert cfg.generation == 5
    old = ops.MoeConfig(ep_world_size=2, ep_rank_id=0, moe_expert_num=2, ccl_buffer_size=0, generation=2,
                        group_ep="g")
    assert old.generation == 2 and old._operators == ("aclnnMoeDistributeDispatchV2", "aclnnMoeDistributeCombineV2")


BUFFER_CASES = [GenCase(gen=4, W=3, quant=2, seed=31), GenCase(gen=3, W=2, quant=0, seed=32, weights=False),
                GenCase(gen=2, W=4, quant=2, R=1, seed=33), GenCase(gen=1, W=8, BS=2, quant=0, seed=34)]


@pytest.mark.parametrize("case", BUFFER_CASES, ids=[c.label() for c in BUFFER_CASES])
def test_buffer_round_on_a_named_generation_matches_golden(case):
    inp = make_inputs(case)
    world = World(case)
    got: dict[int, tuple] = {}

    def rank(e: int, t: int) -> None:
        acl.Device(e * case.tp + t).set_current()
        with MoeDistributeBuffer(world.ep[e, t], generation=case.gen) as buf:
            assert buf.generation == case.gen and buf.context is None
            s = world.streams[e, t]
            w = inp.weights[t][e] if case.weights else None
            out = buf.low_latency_dispatch(inp.x[t][e], inp.ids[t][e], case.E, quant_mode=case.quant,
                                           x_smooth_scale=inp.scales,
                                           topk_weights=w if case.gen > 1 else None,  # V1: combine's only
                                           shared_expert_rank_num=case.R, shared_expert_num=case.S, stream=s)
            n = int(out.ep_recv_counts.numpy()[case.W - 1])
            rows = out.expand_x.numpy()[:n]
            dyn = out.dynamic_scales.numpy()[:n] if case.quant == 2 else None
            y = np.zeros((out.expand_x.shape[0], case.H), case.dtype)
            y[:n] = expert(case, t, rows, dyn)
            x_out = buf.low_latency_combine(y, inp.ids[t][e], w, out.assist_info_for_combine, out.ep_recv_counts,
                                            num_experts=case.E, shared_expert_rank_num=case.R,
                                            shared_expert_num=case.S, stream=s)
            got[e] = (rows, dyn, out.assist_info_for_combine.numpy(), x_out.numpy())

    try:
        run_ranks(case, rank)
    finally:
        world.close()
    disp, comb = golden_round(case, inp)
    for e, (rows, dyn, routing, x_out) in got.items():
        d = disp[0][e]
        _same(rows, d.expand_x, f"rank {e} expand_x")
        if dyn is not None:
            _same(dyn, d.dynamic_scales, f"rank {e} dynamic_scales")
        if case.gen == 1:  # the first generation's expand_idx travels as assist_info_for_combine
            _same(routing, golden.expand_idx(inp.ids[0])[e], f"rank {e} expand_idx")
        else:
            _same(routing[:d.assist_info_for_combine.size], d.assist_info_for_combine, f"rank {e} assist_info")
        written = comb[0][e].written
        _same(x_out[written], comb[0][e].x_out[written], f"rank {e} x_out")


def test_ops_with_a_tp_domain_match_golden_and_size_the_tp_outputs():
    case = GenCase(gen=3, W=2, tp=2, quant=2, seed=41)
    inp = make_inputs(case)
    world = World(case)
    got: dict[tuple[int, int], tuple] = {}

    def rank(e: int, t: int) -> None:
        acl.Device(e * case.tp + t).set_current()
        cfg = ops.MoeConfig(ep_world_size=case.W, ep_rank_id=e, moe_expert_num=case.E, ccl_buffer_size=0,
                            tp_world_size=2, tp_rank_id=t, quant_mode=case.quant, generation=case.gen,
                            group_ep=world.ep[e, t].name, group_tp=world.tp[e, t].name)
        s = world.streams[e, t]
        out = ops.moe_distribute_dispatch(None, inp.x[t][e], inp.ids[t][e], config=cfg, scales=inp.scales,
                                          stream=s)
        a = case.capacity(e)
        assert out.expand_x.shape == (2 * a, case.H) and out.tp_recv_counts.shape == (2,)
        assert out.ep_recv_counts.shape == (2 * case.W,) and out.dynamic_scales.shape == (2 * a,)
        tp_counts = out.tp_recv_counts.numpy()
        n = int(tp_counts[0] + tp_counts[1])
        rows, dyn = out.expand_x.numpy()[:n], out.dynamic_scales.numpy()[:n]
        y = np.zeros((2 * a, case.H), case.dtype)
        y[:n] = expert(case, t, rows, dyn)
        x_out = ops.moe_distribute_combine(None, y, inp.ids[t][e], out.assist_info_for_combine, out.ep_recv_counts,
                                           inp.weights[t][e], config=cfg, tp_send_counts=out.tp_recv_counts,
                                           stream=s)
        got[e, t] = (rows, dyn, tp_counts, x_out.numpy())

    try:
        run_ranks(case, rank)
    finally:
        world.close()
    disp, comb = golden_round(case, inp)
    for (e, t), (rows, dyn, tp_counts, x_out) in got.items():
        d = disp[t][e]
        _same(rows, d.expand_x, f"rank ({e}, {t}) expand_x")
        _same(dyn, d.dynamic_scales, f"rank ({e}, {t}) dynamic_scales")
        _same(tp_counts, d.tp_recv_counts, f"rank ({e}, {t}) tp_recv_counts")
        written = comb[t][e].written
        _same(x_out[written], comb[t][e].x_out[written], f"rank ({e}, {t}) x_out")


TP_BUFFER_CASES = [GenCase(gen=4, W=4, tp=2, quant=2, seed=43), GenCase(gen=2, W=4, tp=2, quant=0, seed=44)]


@pytest.mark.parametrize("case", TP_BUFFER_CASES, ids=[c.label() for c in TP_BUFFER_CASES])
def test_a_buffer_with_a_tp_domain_runs_an_ep4_tp2_world_bit_for_bit(case):
    """EP 4 x TP 2 through MoeDistributeBuffer(comm, tp_comm=...): dispatch's rows (own, then the TP
    peer's), and combine given the dispatch result's ep_recv_counts (the buffer passes that dispatch's
    tp_recv_counts), against the golden. The even seed keeps its results (keep=True)."""
    inp = make_inputs(case)
    world = World(case)
    got: dict[tuple[int, int], tuple] = {}
    keep = case.seed % 2 == 0

    def rank(e: int, t: int) -> None:
        acl.Device(e * case.tp + t).set_current()
        # generation 0: the newest with a TP domain, 4
        with MoeDistributeBuffer(world.ep[e, t], generation=0 if case.gen == 4 else case.gen,
                                 tp_comm=world.tp[e, t]) as buf:
            assert buf.generation == case.gen
            s = world.streams[e, t]
            out = buf.low_latency_dispatch(inp.x[t][e], inp.ids[t][e], case.E, quant_mode=case.quant,
                                           x_smooth_scale=inp.scales, stream=s, keep=keep)
            a = case.capacity(e)
            assert out.expand_x.shape == (2 * a, case.H) and out.ep_recv_counts.shape == (2 * case.W,)
            counts = out.ep_recv_counts.numpy()
            n = int(counts[case.W - 1] + counts[2 * case.W - 1])  # own rows, then the TP peer's
            rows = out.expand_x.numpy()[:n]
            dyn = out.dynamic_scales.numpy()[:n] if case.quant == 2 else None
            y = np.zeros((2 * a, case.H), case.dtype)
            y[:n] = expert(case, t, rows, dyn)
            x_out = buf.low_latency_combine(y, inp.ids[t][e], inp.weights[t][e], out.assist_info_for_combine,
                                            out.ep_recv_counts, num_experts=case.E, stream=s, keep=keep)
            got[e, t] = (rows, dyn, x_out.numpy())

    try:
        run_ranks(case, rank)
    finally:
        world.close()
    disp, comb = golden_round(case, inp)
    for (e, t), (rows, dyn, x_out) in got.items():
        d = disp[t][e]
        _same(rows, d.expand_x, f"rank ({e}, {t}) expand_x")
        if dyn is not None:
            _same(dyn, d.dynamic_scales, f"rank ({e}, {t}) dynamic_scales")
        written = comb[t][e].written
        _same(x_out[written], comb[t][e].x_out[written], f"rank ({e}, {t}) x_out")


def test_a_tp_buffer_s_combine_without_its_dispatch_s_counts_says_what_to_pass():
    case = GenCase(gen=4, W=2, tp=2, seed=45)
    inp = make_inputs(case)
    world = World(case)
    errors: dict[tuple[int, int], str] = {}

    def rank(e: int, t: int) -> None:
        acl.Device(e * case.tp + t).set_current()
        with MoeDistributeBuffer(world.ep[e, t], tp_comm=world.tp[e, t]) as buf:
            out = buf.low_latency_dispatch(inp.x[t][e], inp.ids[t][e], case.E, stream=world.streams[e, t])
            try:
                buf.low_latency_combine(out.expand_x, inp.ids[t][e], inp.weights[t][e], out.assist_info_for_combine,
                                        out.ep_recv_counts.numpy(), num_experts=case.E, stream=world.streams[e, t])
            except ValueError as exc:
                errors[e, t] = str(exc)
            world.streams[e, t].synchronize()

    try:
        run_ranks(case, rank)
    finally:
        world.close()
    assert len(errors) == 4
    for message in errors.values():
        assert message.startswith("tp_send_counts:") and "ep_recv_counts" in message


def _config(**kw):
    base = dict(ep_world_size=2, ep_rank_id=0, moe_expert_num=2, ccl_buffer_size=0, group_ep="any")
    return ops.MoeConfig(**{**base, **kw})


def test_what_a_generation_lacks_is_named_before_anything_runs(acl):
    x, ids = np.zeros((1, 1024), np.float16), np.zeros((1, 1), np.int32)
    with pytest.raises(GenerationError, match=r"zero_expert_num: aclnnMoeDistributeDispatchV2 \(generation 2\) has "
                                              r"no attribute zero_expert_num; generation\(s\) 5, 4, 3 have it"):
        ops.moe_distribute_dispatch(None, x, ids, config=_config(generation=2, zero_expert_num=1))
    with pytest.raises(GenerationError, match=r"performance_info: aclnnMoeDistributeDispatchV3 \(generation 3\) has "
                                              r"no input performance_info; generation\(s\) 5, 4 have it"):
        ops.moe_distribute_dispatch(None, x, ids, config=_config(generation=3),
                                    performance_info=np.zeros((2,), np.int64))
    with pytest.raises(GenerationError, match=r"comm_alg: aclnnMoeDistributeCombine \(generation 1\) has no "
                                              r"attribute comm_alg"):
        ops.moe_distribute_combine(None, x, ids, np.zeros((128,), np.int32), np.zeros((2,), np.int32),
                                   config=_config(generation=1, comm_alg="fullmesh_v1"))
    # phase 1 alone runs every generation too: here generation 4's own refusal of the group name
    with pytest.raises(acl.AclnnParamInvalid, match="aclnnMoeDistributeDispatchV4GetWorkspaceSize.*group_ep"):
        ops.prepare_dispatch(None, x, ids, config=_config(generation=4))


def test_a_config_of_an_older_generation_needs_its_group_name_and_a_known_generation(acl):
    with pytest.raises(GenerationError, match="group_ep: generation 2 .* names its EP communicator by group string"):
        _config(generation=2, group_ep="")
    with pytest.raises(GenerationError, match=r"generation: must be 0 .* or 1 … 5 \(got 7\)"):
        _config(generation=7)
    with pytest.raises(TypeError, match="generation: expected an int"):
        _config(generation="2")


def test_an_unknown_group_name_is_the_operator_s_error(acl):
    x, ids = np.zeros((1, 1024), np.float16), np.zeros((1, 1), np.int32)
    with pytest.raises(acl.AclnnParamInvalid, match="group_ep"):
        ops.moe_distribute_dispatch(None, x, ids, config=_config(generation=2, group_ep="nobody"))


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_a_root_exporting_only_v2_is_found_so_and_runs_the_demo(tmp_path: Path):
    from aclnn_py.tools.mock_roots import make_root

    root = make_root(tmp_path / "v2", [2])
    doctor = _run("-m", "aclnn_py", "doctor", "--backend", str(root))
    assert "operators  generations 2 exported; calls use generation 2 (aclnnMoeDistributeDispatchV2" in doctor.stdout, \
        doctor.stdout + doctor.stderr
    demo = _run("-m", "aclnn_py", "demo", "--backend", str(root), "--world-size", "2", "--quant-mode", "2")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    text = " ".join(demo.stdout.split())
    assert "operators: generation 2 (aclnnMoeDistributeDispatchV2 / aclnnMoeDistributeCombineV2)" in text
    assert text.endswith("result: MATCH (bit for bit with the golden)")
    refused = _run("-c", "import aclnn_py as a; a.init(); from aclnn_py import ops\n"
                         "ops.MoeConfig(ep_world_size=2, ep_rank_id=0, moe_expert_num=2, ccl_buffer_size=0, "
                         "generation=5)", ACLNN_PY_BACKEND=str(root))
    assert refused.returncode != 0
    assert "does not export generation 5 (aclnnMoeDistributeDispatchV5 / aclnnMoeDistributeCombineV5) (missing " \
           "aclnnMoeDistributeDispatchV5GetWorkspaceSize" in refused.stderr, refused.stderr


def test_the_demo_on_the_full_mock_uses_v5():
    demo = _run("-m", "aclnn_py", "demo", "--threads", "--world-size", "2", "--json")
    import json

    doc = json.loads(demo.stdout)
    assert doc["generation"] == 5 and doc["result"] == "MATCH"


def test_a_steady_call_with_an_older_generation_s_config_runs_that_generation():
    # a serving-shape call (device Tensors, given outputs, a Stream, no pre-checks) with a config of
    # generation 2 runs generation 2, never V5 (here with a dummy context tensor, which V2 does not take)
    case = GenCase(gen=2, W=2, quant=0, seed=51)
    inp = make_inputs(case)
    world = World(case)
    got: dict[int, list[bytes]] = {}

    def rank(e: int, t: int) -> None:
        acl.Device(e).set_current()
        cfg = ops.MoeConfig(ep_world_size=case.W, ep_rank_id=e, moe_expert_num=case.E, ccl_buffer_size=0,
                            generation=2, group_ep=world.ep[e, t].name)
        s = world.streams[e, t]
        dummy_context = acl.Tensor.from_numpy(np.zeros((2052,), np.int32), stream=s)
        dummy_context.descriptor()  # what the compiled route asks of every tensor it takes
        x, ids = acl.Tensor.from_numpy(inp.x[t][e], stream=s), acl.Tensor.from_numpy(inp.ids[t][e], stream=s)
        first = ops.moe_distribute_dispatch(dummy_context, x, ids, config=cfg, stream=s)
        n = int(first.ep_recv_counts.numpy()[case.W - 1])
        rows = [first.expand_x.numpy()[:n].tobytes()]
        for _ in range(2):
            again = ops.moe_distribute_dispatch(dummy_context, x, ids, config=cfg, outputs=first, stream=s,
                                                precheck=False)
            rows.append(again.expand_x.numpy()[:n].tobytes())
        got[e] = rows

    try:
        run_ranks(case, rank)
    finally:
        world.close()
    disp, _ = golden_round(case, inp)
    for e, rows in got.items():
        want = np.ascontiguousarray(disp[0][e].expand_x).tobytes()
        assert rows == [want] * 3, f"rank {e}"


@pytest.mark.parametrize("profile", ["Ascend910B"], indirect=True)
@pytest.mark.parametrize("gen,quant", [(2, 2), (4, 0)])
def test_an_older_generation_on_atlas_a2_matches_golden(profile, gen, quant):
    # Atlas A2 runs the group-string generations too (no TP domain there): 16 ranks, one expert each
    assert acl.soc_name() == "Ascend910B"
    case = GenCase(gen=gen, W=16, BS=2, quant=quant, seed=60 + gen)
    inp = make_inputs(case)
    world = World(case)
    try:
        got = run_round(case, world, inp)
    finally:
        world.close()
    disp, comb = golden_round(case, inp)
    for (e, t), r in got.items():
        _same(r.expand_x, disp[t][e].expand_x, f"rank {e} expand_x")
        written = comb[t][e].written
        _same(r.x_out[written], comb[t][e].x_out[written], f"rank {e} x_out")


@pytest.mark.parametrize("profile", ["Ascend910B"], indirect=True)
def test_a_tp_domain_is_refused_on_atlas_a2(profile):
    from helpers.group_gens import phase1

    case = GenCase(gen=2, W=16, BS=2)
    world = World(case)
    try:
        status, message = phase1(case, world, make_inputs(case), attrs={"tp_world": 2, "group_tp": b"peer"})
    finally:
        world.close()
    assert status == 161002 and "tp_world_size" in message, message


def test_plans_of_a_tp_buffer_run_an_ep2_tp2_world_bit_for_bit():
    """A dispatch plan and a combine plan of a buffer with a TP domain; combine's plan takes the
    dispatch plan's tp_recv_counts as tp_send_counts on every call (and refuses a call without)."""
    case = GenCase(gen=4, W=2, tp=2, quant=2, seed=47)
    inp = make_inputs(case)
    world = World(case)
    got: dict[tuple[int, int], tuple] = {}

    def rank(e: int, t: int) -> None:
        acl.Device(e * case.tp + t).set_current()
        s = world.streams[e, t]
        with MoeDistributeBuffer(world.ep[e, t], tp_comm=world.tp[e, t]) as buf:
            dplan = buf.plan_dispatch(case.BS, case.H, case.E, case.K, x_dtype=case.dtype, quant_mode=case.quant,
                                      smooth_scales_shape=None if inp.scales is None else inp.scales.shape, stream=s)
            cplan = buf.plan_combine(dplan, with_weights=True, num_experts=case.E, stream=s)
            out = dplan(inp.x[t][e], inp.ids[t][e], scales=inp.scales, stream=s)
            tp_counts = out.tp_recv_counts.numpy()
            n = int(tp_counts[0] + tp_counts[1])
            rows, dyn = out.expand_x.numpy()[:n], out.dynamic_scales.numpy()[:n]
            y = np.zeros(out.expand_x.shape, case.dtype)
            y[:n] = expert(case, t, rows, dyn)
            with pytest.raises(acl.AclnnParamInvalid, match="tp_send_counts"):
                cplan(y, inp.ids[t][e], out.assist_info_for_combine, out.ep_recv_counts, inp.weights[t][e], stream=s)
            x_out = cplan(y, inp.ids[t][e], out.assist_info_for_combine, out.ep_recv_counts, inp.weights[t][e],
                          tp_send_counts=out.tp_recv_counts, stream=s)
            got[e, t] = (rows, dyn, x_out.numpy())
            cplan.close()
            dplan.close()

    try:
        run_ranks(case, rank)
    finally:
        world.close()
    disp, comb = golden_round(case, inp)
    for (e, t), (rows, dyn, x_out) in got.items():
        d = disp[t][e]
        _same(rows, d.expand_x, f"rank ({e}, {t}) expand_x")
        _same(dyn, d.dynamic_scales, f"rank ({e}, {t}) dynamic_scales")
        written = comb[t][e].written
        _same(x_out[written], comb[t][e].x_out[written], f"rank ({e}, {t}) x_out")
