"""The Atlas A2 (``Ascend910B``) rules of phase 1, one test per rule: each breaks one rule of a valid
call of rank 0 in a 16-rank world and asserts the status and the message naming the parameter, the
rule and the value — the same with and without aclnn-py's Python pre-checks (which must agree with C)
— and, where a rule has a boundary, that the value just inside it is accepted. Base call: W=16, E=32
(L=2), BS=4, H=64, K=2."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.a2_calls import ACCEPTED, BF16, BS, E, H, K, W, World2, combine, dispatch, refused
from helpers.moe_cases import A2, on_profile

pytestmark = on_profile(A2)


@pytest.fixture(scope="module")
def world(acl):
    w = World2(ranks=W)
    yield w
    w.close()


def test_valid_calls_pass(world, profile):
    assert dispatch(world) == ACCEPTED
    assert dispatch(world, quant_mode=2, comm_alg="fullmesh", expert_scales=np.ones((BS, K), np.float32),
                    scales=np.ones((E, H), np.float32), x_active_mask=np.ones(BS, bool)) == ACCEPTED
    assert dispatch(world, quant_mode=2, comm_alg="hierarchy") == ACCEPTED
    assert combine(world) == ACCEPTED
    assert combine(world, comm_alg="hierarchy", comm_quant_mode=2) == ACCEPTED


NEWEST_WORLDS = "2 ... 8, 16, 32, 64, 128, 192, 256 or 384"
OLD_WORLDS = "16, 32, 64, 128 or 256 (the CANN 8.3.RC1 rules)"


@pytest.mark.parametrize("w", [1, 9, 24, 512])
def test_world_size_set(world, profile, w):
    refused(dispatch(world, ep_world_size=w, moe_expert_num=max(w, 1)),
            f"ep_world_size: must be {NEWEST_WORLDS} on Ascend910B (got {w})")


@pytest.mark.parametrize("w", [2, 3, 8, 192, 384])
def test_world_sizes_of_the_newest_documents(world, profile, mock, w):
    """The newest documents accept one-server worlds (2 ... 8) and 192, 384 for "fullmesh": the rule
    passes (only this 16-rank communicator differs); under ACLNN_MOCK_CANN_VERSION=8.3.RC1 they are
    refused with that release's list."""
    refused(dispatch(world, ep_world_size=w, moe_expert_num=w),
            f"ep_world_size: must equal the rank count of the context's communicator (got {w}")
    mock.set_cann_version("8.3.RC1")
    try:
        refused(dispatch(world, ep_world_size=w, moe_expert_num=w),
                f"ep_world_size: must be {OLD_WORLDS} on Ascend910B (got {w})")
        assert dispatch(world) == ACCEPTED   # W = 16 is in both lists
    finally:
        mock.set_cann_version("")


def test_world_size_hierarchy(world, profile):
    refused(dispatch(world, ep_world_size=128, moe_expert_num=128, comm_alg="hierarchy"),
            'ep_world_size: must be 16, 32 or 64 with comm_alg "hierarchy" on Ascend910B (got 128)')
    refused(combine(world, ep_world_size=256, moe_expert_num=256, comm_alg="hierarchy"),
            'ep_world_size: must be 16, 32 or 64 with comm_alg "hierarchy" on Ascend910B (got 256)')


@pytest.mark.parametrize("alg", ["fullmesh_v1", "fullmesh_v2", "ring"])
def test_comm_alg_values(world, profile, alg):
    refused(dispatch(world, comm_alg=alg),
            f'comm_alg: must be "", "fullmesh" or "hierarchy" on Ascend910B (got "{alg}")')


def test_tensor_parallelism_refused(world, profile):
    refused(dispatch(world, tp_world_size=2), "tp_world_size: must be 0 or 1, tensor parallelism is not supported")


@pytest.mark.parametrize("param,value,what", [("shared_expert_rank_num", 1, "shared experts"),
                                              ("zero_expert_num", 1, "zero experts"),
                                              ("copy_expert_num", 2, "copy experts"),
                                              ("const_expert_num", 1, "const experts")])
def test_special_experts_refused(world, profile, param, value, what):
    refused(dispatch(world, **{param: value}), f"{param}: must be 0 on Ascend910B, {what} are not supported "
                                               f"(got {value})")
    refused(combine(world, **{param: value}), f"{param}: must be 0 on Ascend910B, {what} are not supported")


def test_shared_expert_num(world, profile):
    assert dispatch(world, shared_expert_num=0) == ACCEPTED
    refused(dispatch(world, shared_expert_num=2),
            "shared_expert_num: must be 0 or 1 on Ascend910B, shared experts are not supported (got 2)")


def test_expert_count_limits(world, profile):
    """The newest A2 tiling bounds E by 1024 with "fullmesh" (512 with "hierarchy") and puts no bound on
    the local experts per rank: CANN's own V4 A2 sample runs E = 256 on 8 ranks (L = 32)."""
    refused(dispatch(world, moe_expert_num=1040),
            'moe_expert_num: must be in [1, 1024] on Ascend910B with comm_alg "" (got 1040)')
    refused(dispatch(world, moe_expert_num=528, comm_alg="hierarchy"),
            'moe_expert_num: must be in [1, 512] on Ascend910B with comm_alg "hierarchy" (got 528)')
    refused(dispatch(world, moe_expert_num=40),
            "moe_expert_num: must be divisible by ep_world_size - shared_expert_rank_num (got 40 % 16)")
    assert dispatch(world, moe_expert_num=384) == ACCEPTED          # L = 24
    assert dispatch(world, moe_expert_num=400) == ACCEPTED          # L = 25
    assert dispatch(world, moe_expert_num=400, comm_alg="hierarchy") == ACCEPTED


def test_expert_count_limits_of_8_3(world, profile, mock):
    """Under ACLNN_MOCK_CANN_VERSION=8.3.RC1: E <= 512 and L <= 24 unless "hierarchy"."""
    mock.set_cann_version("8.3.RC1")
    try:
        refused(dispatch(world, moe_expert_num=528), 'moe_expert_num: must be in [1, 512] on Ascend910B with '
                'comm_alg "" (the CANN 8.3.RC1 rules) (got 528)')
        assert dispatch(world, moe_expert_num=384) == ACCEPTED      # L = 24
        refused(dispatch(world, moe_expert_num=400), "moe_expert_num: local experts per rank (moe_expert_num / "
                'ep_world_size) must be <= 24 on Ascend910B unless comm_alg is "hierarchy" (the CANN 8.3.RC1 rules) '
                "(got 400 / 16 = 25)")
        assert dispatch(world, moe_expert_num=400, comm_alg="hierarchy") == ACCEPTED
    finally:
        mock.set_cann_version("")


def test_quant_modes(world, profile):
    refused(dispatch(world, quant_mode=1), "quant_mode: must be 0 or 2 on Ascend910B, static quant is not supported "
                                           "(got 1)")
    refused(dispatch(world, quant_mode=3), "quant_mode: must be 0 or 2 on Ascend910B (got 3)")


def test_bs_range(world, profile):
    assert dispatch(world, bs=256, ccl_buffer_size=world.ctx[0][1]) == ACCEPTED
    refused(dispatch(world, bs=257), "x: dim 0 (BS) must be in [1, 256] on Ascend910B (got 257)")


@pytest.mark.parametrize("alg,h,ok", [("", 7168, True), ("fullmesh", 7200, False), ("", 48, False),
                                      ("hierarchy", 10240, True), ("hierarchy", 10272, False), ("hierarchy", 32, True)])
def test_hidden_range(world, profile, alg, h, ok):
    out = dispatch(world, h=h, comm_alg=alg, bs=1)
    if ok:
        assert out == ACCEPTED
    else:
        hmax = 10240 if alg == "hierarchy" else 7168
        refused(out, f'x: dim 1 (H) must be a multiple of 32 in [32, {hmax}] on Ascend910B with comm_alg "{alg}" '
                     f"(got {h})")


@pytest.mark.parametrize("alg", ["fullmesh", "hierarchy"])
def test_window_formula_boundary(world, profile, alg):
    """The A2 formula of the comm_alg, exactly at its boundary (the golden computes it independently)."""
    from aclnn_py import golden
    from aclnn_py.ops.sizing import window_requirement

    need = golden.a2_window_bytes_required(W, BS, H, E, K, comm_alg=alg)
    assert window_requirement(W, BS, H, E, K, comm_alg=alg, soc="Ascend910B3")[0] == need
    assert dispatch(world, comm_alg=alg, ccl_buffer_size=need) == ACCEPTED
    out = dispatch(world, comm_alg=alg, ccl_buffer_size=need - 1)
    refused(out, f'ccl_buffer_size: window too small for comm_alg "{alg}" on Ascend910B: ')
    assert f"= {need} bytes must be <= ccl_buffer_size; set HCCL_BUFFSIZE >= {-(-need // (1 << 21))} (MiB)" in out[2]


def test_two_dimensional_mask_refused(world, profile):
    refused(dispatch(world, x_active_mask=np.ones((BS, K), bool)),
            f"x_active_mask: must be 1-D (BS,) on Ascend910B, a 2-D (BS, K) mask is not supported (got shape "
            f"({BS}, {K}))")
    refused(combine(world, x_active_mask=np.ones((BS, K), bool)), "x_active_mask: must be 1-D (BS,) on Ascend910B")


def test_scales_refused_with_hierarchy(world, profile):
    refused(dispatch(world, quant_mode=2, comm_alg="hierarchy", scales=np.ones((E, H), np.float32)),
            f'scales: must be NULL with comm_alg "hierarchy" on Ascend910B (got a ({E}, {H}) tensor)')


def test_ep_recv_counts_space_of_the_algorithm(world, profile):
    """ep_recv_counts holds what the chosen algorithm writes: the W * L counts for "fullmesh" (with or
    without expert_scales), and the reduce information after them for "hierarchy"."""
    from aclnn_py import Tensor

    counts = W * (E // W)
    escales = np.ones((BS, K), np.float32)
    assert dispatch(world, expert_scales=escales, outputs={"ep_recv_counts": Tensor.empty((counts,), np.int32)}) \
        == ACCEPTED
    refused(dispatch(world, outputs={"ep_recv_counts": Tensor.empty((counts - 1,), np.int32)}),
            f"ep_recv_counts: dim 0 must be >= ep_world_size * L = {counts} (got {counts - 1})")
    need = counts + 2 * BS * W * K * (W // 8)
    short = Tensor.empty((need - 1,), np.int32)
    refused(dispatch(world, quant_mode=2, comm_alg="hierarchy", outputs={"ep_recv_counts": short}),
            f"ep_recv_counts: dim 0 must be >= ep_world_size * L + 2 * G * K * (ep_world_size / 8) = {need} on "
            f'Ascend910B with comm_alg "hierarchy", whose reduce information follows the counts (got {need - 1})')
    assert dispatch(world, quant_mode=2, comm_alg="hierarchy",
                    outputs={"ep_recv_counts": Tensor.empty((need,), np.int32)}) == ACCEPTED


def test_performance_info_from_generation_4(world, profile):
    """performance_info (W,) int64 on A2 (the V4 documents, every revision); its nearest refused
    neighbours: a wrong shape or dtype (161002)."""
    assert dispatch(world, performance_info=np.zeros(W, np.int64)) == ACCEPTED
    assert combine(world, performance_info=np.zeros(W, np.int64)) == ACCEPTED
    refused(dispatch(world, performance_info=np.zeros(W - 1, np.int64)),
            f"performance_info: shape must be (ep_world_size,) = ({W},) (got ({W - 1},))")
    refused(combine(world, performance_info=np.zeros(W, np.int32)), "performance_info: dtype must be ACL_INT64")


def test_reserved_inputs(world, profile):
    refused(dispatch(world, elastic_info=np.zeros(4 + 2 * W, np.int32)),
            f"elastic_info: is reserved on Ascend910B and must be NULL (got a ({4 + 2 * W},) tensor)")
    refused(combine(world, shared_expert_x=np.zeros((BS, H), BF16)),
            f"shared_expert_x: is reserved on Ascend910B and must be NULL (got a ({BS}, {H}) tensor)")


@pytest.mark.parametrize("alg", ["", "fullmesh"])
def test_comm_quant_needs_hierarchy(world, profile, alg):
    refused(combine(world, comm_alg=alg, comm_quant_mode=2),
            f'comm_quant_mode: 2 needs comm_alg "hierarchy" on Ascend910B (got comm_alg "{alg}")')
    refused(combine(world, comm_alg="hierarchy", comm_quant_mode=3), "comm_quant_mode: must be 0 or 2 on Ascend910B")


@pytest.mark.parametrize("name", ["Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4"])
def test_every_a2_name_gives_the_a2_rules(world, mock, profile, name):
    import aclnn_py as acl

    mock.set_soc(name)
    assert acl.soc_name() == name and mock.soc() == "Ascend910B"
    refused(dispatch(world, ep_world_size=9, moe_expert_num=9), "on Ascend910B (got 9)")


def test_window_requirement_names_the_larger_need(world, profile):
    """With L > K the mock's own layout (a receive block per local expert and source) needs more than
    A2's formula: window_requirement gives that one, and phase 1 refuses one byte less with its rule."""
    from aclnn_py.ops.sizing import window_requirement

    e, k, h = 24 * W, 1, 4096
    need, how = window_requirement(W, BS, h, e, k, soc="Ascend910B")
    assert how.startswith("2*(maxBs*Td*W*L + maxBs*Tc*(K+S)) + 1 MiB")
    assert dispatch(world, moe_expert_num=e, k=k, h=h, ccl_buffer_size=need) == ACCEPTED
    refused(dispatch(world, moe_expert_num=e, k=k, h=h, ccl_buffer_size=need - 1), "ccl_buffer_size: window too small: ")
