"""Phase-1 rules of the group-string generations: group_ep / group_tp name live communicators of the
right size and rank, and the TP domain's rules (docs/operators.md, "Group-string generations"). Each
call breaks exactly one rule and must give the documented status and a message naming the parameter."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from helpers.group_gens import GenCase, World, make_inputs, phase1

NULLPTR, INVALID = 161001, 161002


@pytest.fixture(scope="module")
def tp_world() -> Iterator[tuple[GenCase, World]]:
    c = GenCase(gen=2, W=2, tp=2)
    w = World(c)
    yield c, w
    w.close()


@pytest.fixture(scope="module")
def ep_world() -> Iterator[tuple[GenCase, World]]:
    c = GenCase(gen=3, W=4, R=0)
    w = World(c)
    yield c, w
    w.close()


def _expect(got: tuple[int, str], code: int, text: str) -> None:
    assert got[0] == code, got
    assert text in got[1], got[1]


@pytest.mark.parametrize("gen", [2, 3, 4])
@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_valid_calls_pass(tp_world, gen, op):
    c, w = tp_world
    c2 = GenCase(gen=gen, W=c.W, tp=2)
    assert phase1(c2, w, make_inputs(c2), op) == (0, "")


@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_group_names(tp_world, op):
    c, w = tp_world
    inp = make_inputs(c)
    _expect(phase1(c, w, inp, op, attrs={"group_ep": None}), NULLPTR, "group_ep: must not be NULL")
    # CANN's aclnn layer: an empty name is a missing one (161001); an over-long one is 161001 from
    # dispatch (aclnn_moe_distribute_dispatch_v2.cpp / _v3.cpp) and 161002 from combine
    _expect(phase1(c, w, inp, op, attrs={"group_ep": b""}), NULLPTR, "group_ep: must name a communicator")
    too_long = NULLPTR if op == "dispatch" else INVALID
    _expect(phase1(c, w, inp, op, attrs={"group_ep": b"x" * 130}), too_long, "group_ep: must be shorter than 128")
    _expect(phase1(c, w, inp, op, attrs={"group_tp": b"y" * 128}), too_long, "group_tp: must be shorter than 128")
    # the group strings are checked before the tensors: a NULL x still reports the empty group_ep
    _expect(phase1(c, w, inp, op, attrs={"group_ep": b""}, tensors={"expand_x": None, "expand_x_in": None}),
            NULLPTR, "group_ep: must name a communicator")
    _expect(phase1(c, w, inp, op, attrs={"group_ep": b"no_such_group"}), INVALID,
            'group_ep: no live communicator of this process is named "no_such_group"')
    # rank 1's communicator named by rank 0
    _expect(phase1(c, w, inp, op, attrs={"group_ep": w.ep[1, 0].name.encode()}), INVALID,
            "ep_rank_id is 0")
    _expect(phase1(c, w, inp, op, attrs={"group_tp": b"no_such_tp"}), INVALID,
            'group_tp: no live communicator of this process is named "no_such_tp"')
    _expect(phase1(c, w, inp, op, attrs={"group_tp": w.ep[0, 0].name.encode()}), INVALID,
            "group_tp: must differ from group_ep")
    _expect(phase1(c, w, inp, op, attrs={"group_tp": b""}), INVALID,
            "group_tp: must name the TP communicator (HcclGetCommName) with tp_world_size 2")


@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_tp_attributes(tp_world, op):
    c, w = tp_world
    inp = make_inputs(c)
    _expect(phase1(c, w, inp, op, attrs={"tp_world": 3}), INVALID,
            "tp_world_size: must be 0 or 1 (no TP domain) or 2 on Ascend910_93 (got 3)")
    _expect(phase1(c, w, inp, op, attrs={"tp_rank": 2}), INVALID, "tp_rank_id: must be 0 or 1 with tp_world_size 2")
    _expect(phase1(c, w, inp, op, attrs={"tp_rank": 1}), INVALID, "tp_rank_id is 1")
    _expect(phase1(c, w, inp, op, attrs={"tp_world": 1, "tp_rank": 1}), INVALID,
            "tp_rank_id: must be 0 without a TP domain (tp_world_size 0 or 1) (got 1)")


def test_tp_needs_one_local_expert(tp_world):
    c, w = tp_world
    c4 = GenCase(gen=2, W=2, tp=2)
    c4.E, c4.K = 4, 2    # L = 2
    _expect(phase1(c4, w, make_inputs(c4), "dispatch"), INVALID,
            "moe_expert_num: a TP domain needs one local expert per MoE rank")


def test_tp_outputs(tp_world):
    c, w = tp_world
    inp = make_inputs(c)
    A = c.capacity(0)
    _expect(phase1(c, w, inp, "dispatch", tensors={"tp_recv_counts": None}), NULLPTR,
            "tp_recv_counts: must not be NULL with tp_world_size 2")
    from aclnn_py import Tensor
    _expect(phase1(c, w, inp, "dispatch", tensors={"expand_x": Tensor.empty((A, c.H), c.dtype)}), INVALID,
            f"expand_x: shape must be (>= A * tp_world_size, H) = (>= {2 * A}, {c.H})")
    _expect(phase1(c, w, inp, "dispatch", tensors={"ep_recv_counts": Tensor.empty((c.W,), np.int32)}), INVALID,
            f"ep_recv_counts: dim 0 must be >= ep_world_size * L * tp_world_size = {2 * c.W}")
    _expect(phase1(c, w, inp, "combine", tensors={"tp_counts_in": None}), NULLPTR,
            "tp_send_counts: must not be NULL with tp_world_size 2")
    _expect(phase1(c, w, inp, "combine", tensors={"expand_x_in": np.zeros((A, c.H), c.dtype)}), INVALID,
            f"expand_x: dim 0 must be >= A * tp_world_size = {2 * A}")
    _expect(phase1(c, w, inp, "combine", attrs={"comm_quant": 2}), INVALID,
            "comm_quant_mode: must be 0 with tp_world_size 2 (got 2)")


def test_no_tp_domain_rules(ep_world):
    c, w = ep_world
    inp = make_inputs(c)
    for op in ("dispatch", "combine"):
        assert phase1(c, w, inp, op) == (0, "")
        # without a TP domain group_tp may be empty, and L > 1 is fine
        _expect(phase1(c, w, inp, op, attrs={"group_tp": w.ep[0, 0].name.encode()}), INVALID,
                "group_tp: must differ from group_ep")
    # CANN's tilings ignore tp_send_counts without a TP domain (its newer samples pass it): accepted
    assert phase1(c, w, inp, "combine", tensors={"tp_counts_in": np.zeros(2, np.int32)}) == (0, "")
    assert phase1(c, w, inp, "combine", tensors={"tp_counts_in": np.zeros(7, np.int32)}) == (0, "")


@pytest.mark.parametrize("gen", [1, 2, 3, 4])
def test_group_list_type_is_not_read(v1_world, ep_world, gen):
    """The reserved combine attribute group_list_type: any value passes on every generation (CANN's
    CombineV2 sample passes 1); its nearest refused neighbour out_dtype keeps 161002."""
    c, w = v1_world if gen == 1 else ep_world
    c = GenCase(gen=gen, W=c.W, BS=c.BS)
    inp = make_inputs(c)
    for v in (1, 3):
        assert phase1(c, w, inp, "combine", attrs={"group_list_type": v}) == (0, "")
    _expect(phase1(c, w, inp, "combine", attrs={"out_dtype": 1}), INVALID, "out_dtype: is reserved and must be 0")


def test_tp_domain_needs_the_a3_profile(tp_world, mock):
    c, w = tp_world
    mock.set_soc("Ascend950")
    try:
        _expect(phase1(c, w, make_inputs(c), "dispatch"), INVALID,
                "tp_world_size: must be 0 or 1, tensor parallelism is not supported on Ascend950 (got 2)")
    finally:
        mock.set_soc("Ascend910_93")


@pytest.fixture(scope="module")
def v1_world() -> Iterator[tuple[GenCase, World]]:
    c = GenCase(gen=1, W=8, BS=2)
    w = World(c)
    yield c, w
    w.close()


@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_first_generation_rules(v1_world, ep_world, op):
    c, w = v1_world
    inp = make_inputs(c)
    assert phase1(c, w, inp, op) == (0, "")
    c1k = GenCase(gen=1, W=8, BS=2, H=1024)
    where = "x" if op == "dispatch" else "expand_x"
    _expect(phase1(c1k, w, make_inputs(c1k), op), INVALID,
            f"{where}: dim 1 (H) must be 7168 for the first generation (got 1024)")
    c9 = GenCase(gen=1, W=8, BS=2, K=9)
    c9.E = 16   # K <= E
    _expect(phase1(c9, w, make_inputs(c9), op, attrs={"E": 16}), INVALID,
            "expert_ids: dim 1 (K) must be in [1, 8] for the first generation (got 9)")
    # shared-expert ranks are simulated (CANN's sample uses one of 8); the nearest refusal: R must
    # divide ep_world_size (aclnnMoeDistributeDispatch.md)
    c_r1 = GenCase(gen=1, W=8, BS=2, R=1)
    assert phase1(c_r1, w, make_inputs(c_r1), op) == (0, "")
    _expect(phase1(c, w, inp, op, attrs={"R": 3, "E": 5}), INVALID,
            "shared_expert_rank_num: must divide ep_world_size for the first generation (got 3 with ep_world_size 8)")
    c4, w4 = ep_world
    v1_on_4 = GenCase(gen=1, W=4)
    _expect(phase1(v1_on_4, w4, make_inputs(v1_on_4), op), INVALID,
            "ep_world_size: must be one of 8, 16, 32, 64, 128, 144, 256, 288 for the first generation on Ascend910_93 "
            "(got 4)")


def test_first_generation_tensors(v1_world):
    from aclnn_py import Tensor

    c, w = v1_world
    inp = make_inputs(c)
    _expect(phase1(c, w, inp, "dispatch", tensors={"x_active_mask": np.ones(c.BS, bool)}), INVALID,
            "x_active_mask: must be NULL for aclnnMoeDistributeDispatch")
    # expert_scales (BS, K) is an input of the first generation (its document and CANN's sample); the
    # nearest refused neighbours: a wrong shape (161002) and expert_scales without expand_scales (161001)
    A = c.capacity(0)
    assert phase1(c, w, inp, "dispatch", tensors={"expert_scales": inp.weights[0][0],
                                                   "expand_scales": Tensor.empty((A,), np.float32)}) == (0, "")
    _expect(phase1(c, w, inp, "dispatch", tensors={"expert_scales": inp.weights[0][0][:, :1],
                                                    "expand_scales": Tensor.empty((A,), np.float32)}), INVALID,
            "expert_scales: shape must be (BS, K)")
    _expect(phase1(c, w, inp, "dispatch", tensors={"expert_scales": inp.weights[0][0]}), NULLPTR,
            "expand_scales: must not be NULL when expert_scales is given")
    _expect(phase1(c, w, inp, "dispatch", tensors={"assist_info": Tensor.empty((c.BS * c.K - 1,), np.int32)}),
            INVALID, f"expand_idx: dim 0 must be >= BS * K = {c.BS * c.K}")
    _expect(phase1(c, w, inp, "dispatch", tensors={"assist_info": None}), NULLPTR, "expand_idx: must not be NULL")
    _expect(phase1(c, w, inp, "combine", tensors={"assist_in": None}), NULLPTR, "expand_idx: must not be NULL")


def test_tp_send_counts_from_another_dispatch_fail_the_kernel():
    """Rank (0, 0) claims one own row more than dispatch gave it: the reduce-scatter of its TP pair
    fails on both ranks with 507015 naming tp_send_counts, and the other pair finishes (nobody waits
    for a rank that gave up)."""
    from helpers.group_gens import rank_round, run_ranks

    from aclnn_py import AclError

    c = GenCase(gen=2, W=2, tp=2, seed=5)
    inp = make_inputs(c)
    w = World(c)
    errors: dict[tuple[int, int], str] = {}

    def rank(e: int, t: int) -> None:
        def wrong(counts: np.ndarray) -> np.ndarray:
            bad = counts.copy()
            bad[t] += 1
            return bad

        try:
            rank_round(c, inp, e, t, w.ep[e, t].name, w.tp[e, t].name, w.streams[e, t],
                       tp_send_counts=wrong if (e, t) == (0, 0) else None)
        except AclError as ex:
            errors[e, t] = f"{ex.code} {ex}"

    try:
        run_ranks(c, rank)
    finally:
        w.close()
    # the pair (0, 0), (0, 1) fails, each naming the counts; the other TP pair finishes
    assert sorted(errors) == [(0, 0), (0, 1)], errors
    for msg in errors.values():
        assert msg.startswith("507015") and "aclnnMoeDistributeCombineV2: rank 0" in msg and "tp_send_counts" in msg



@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_performance_info_on_a2_from_generation_4(ep_world, mock, op):
    """The V4 documents take performanceInfo on Atlas A2 in every revision: accepted there; on Atlas A3
    it stays reserved (161002), and a wrong shape on A2 is 161002 too."""
    c, w = ep_world
    c4 = GenCase(gen=4, W=c.W, BS=c.BS)
    inp = make_inputs(c4)
    perf = np.zeros(c.W, np.int64)
    _expect(phase1(c4, w, inp, op, tensors={"performance_info": perf}), INVALID,
            "performance_info: is reserved on Ascend910_93")
    mock.set_soc("Ascend910B3")
    try:
        assert phase1(c4, w, inp, op, tensors={"performance_info": perf}) == (0, "")
        _expect(phase1(c4, w, inp, op, tensors={"performance_info": np.zeros(c.W + 1, np.int64)}), INVALID,
                f"performance_info: shape must be (ep_world_size,) = ({c.W},)")
    finally:
        mock.set_soc("Ascend910_93")
