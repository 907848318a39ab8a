"""Phase-1 checks of aclnnMoeDistributeCombineV5 on the mock: one negative test per rule of SPEC §5
(plus the shared attribute rules of §3.2, §9.3 and the 161001 cases), asserting status and message.
Each test starts from a valid call (rank 0 of a 2-rank world, W=2, E=4, BS=4, H=1024, K=2; A=16)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.moe_calls import BF16, NULL, CombineCall, RawDesc, World2

NULLPTR, INVALID = 161001, 161002
NZ = 29


@pytest.fixture(scope="module")
def world(acl):
    w = World2()
    yield w
    w.close()


def expect(call, code, *texts):
    ret, msg = call.run()
    assert ret == code, f"status {ret}, message {msg!r}"
    for t in texts:
        assert t in msg, f"{t!r} not in {msg!r}"
    return msg


def _c(world, attrs=None, **tensors):
    c = CombineCall(world, **(attrs or {}))
    c.tensors.update(tensors)
    return c


def test_valid_calls_pass(world):
    assert CombineCall(world).run()[0] == 0
    c = _c(world, dict(C=1, Q=2, Z=1, comm_quant=2), expert_scales=np.ones((4, 2), np.float32),
           x_active_mask=np.ones((4, 2), bool), shared_expert_x=np.zeros((2, 2, 1024), BF16),
           expand_scales=np.zeros(16, np.float32))
    assert c.run()[0] == 0
    assert _c(world, dict(S=1, R=1, E=2)).run()[0] == 0          # shared rank


@pytest.mark.parametrize("name", ["context", "expand_x", "expert_ids", "assist_info_for_combine",
                                  "ep_send_counts", "expert_scales", "x_out", "workspaceSize", "executor"])
def test_null_required(world, name):
    expect(_c(world, **{name: NULL}), NULLPTR, f"{name}: must not be NULL")


def test_ori_x_and_const_tensors_required(world):
    expect(_c(world, dict(C=1), ori_x=NULL), NULLPTR,
           "ori_x: must not be NULL when copy_expert_num or const_expert_num is > 0 (got 1, 0)")
    expect(_c(world, dict(Q=1), ori_x=NULL), NULLPTR, "ori_x: must not be NULL")
    for n in ("const_expert_alpha_1", "const_expert_alpha_2", "const_expert_v"):
        expect(_c(world, dict(Q=2), **{n: NULL}), NULLPTR, f"{n}: must not be NULL when const_expert_num is > 0 (got 2)")


def test_descriptor_rules(world):
    expect(_c(world, expand_x=RawDesc((16, 1024), 27, destroyed=True)), INVALID, "expand_x: must be a live aclTensor")
    expect(_c(world, expand_x=RawDesc((16, 1024), 27, fmt=NZ)), INVALID, "expand_x: format must be ND", "FRACTAL_NZ")
    expect(_c(world, x_out=RawDesc((4, 1024), 27, fmt=NZ)), INVALID, "x_out: format must be ND")
    expect(_c(world, expand_x=RawDesc((16, 1024), 27, strides=(1, 16))), INVALID, "expand_x: must be contiguous")


@pytest.mark.parametrize("fmt,name", [(0, "NCHW"), (1, "NHWC"), (35, "NC"), (47, "NCL"), (29, "FRACTAL_NZ")])
@pytest.mark.parametrize("arg,shape,dt", [("expand_x", (16, 1024), 27), ("assist_info_for_combine", (2048,), 3),
                                          ("ep_send_counts", (4,), 3), ("x_out", (4, 1024), 27)])
def test_only_nd_format_accepted(world, fmt, name, arg, shape, dt):
    expect(_c(world, **{arg: RawDesc(shape, dt, fmt=fmt)}), INVALID, f"{arg}: format must be ND (or UNDEFINED)",
           f"(got {name})")


def test_undefined_format_taken_as_nd(world):
    assert _c(world, expand_x=RawDesc((16, 1024), 27, fmt=-1), x_out=RawDesc((4, 1024), 27, fmt=-1)).run()[0] == 0


def test_context_rules(world):
    expect(_c(world, context=np.zeros(4100, np.int64)), INVALID, "context: dtype must be ACL_INT32")
    expect(_c(world, context=np.zeros(4100, np.int32)), INVALID, "context: kfcContextAddr is not a live")
    expect(_c(world, context=world.ctx[1][0]), INVALID, "ep_rank_id: must equal this rank's id")


ATTR_CASES = [
    ("W<2", dict(W=1), "ep_world_size: must be in [2, 768] on Ascend910_93 (got 1)"),
    ("r>=W", dict(r=2), "ep_rank_id: must be in [0, ep_world_size) (got 2"),
    ("tp>=2", dict(tp_world=2), "tp_world_size: must be 0 or 1"),
    ("shard", dict(shard=1), "expert_shard_type: must be 0 (got 1)"),
    ("S>4", dict(S=5), "shared_expert_num: must be in [0, 4] (got 5)"),
    ("R>=W", dict(R=2), "shared_expert_rank_num: must be in [0, ep_world_size) (got 2"),
    ("S xor R", dict(S=2, R=0), "must both be 0 or both be non-zero"),
    ("R%S", dict(W=8, S=2, R=3, E=5), "shared_expert_rank_num: must be divisible by shared_expert_num (got 3 % 2)"),
    ("E range", dict(E=0), "moe_expert_num: must be in [1, 1024] (got 0)"),
    ("E%(W-R)", dict(W=8, S=1, R=1, E=30),
     "moe_expert_num: must be divisible by ep_world_size - shared_expert_rank_num (got 30 % 7)"),
    ("L*W", dict(W=8, S=2, R=6, E=1024), "× ep_world_size must be in [1, 2048] (got 512 × 8 = 4096)"),
    ("Z<0", dict(Z=-1), "zero_expert_num: must be >= 0 (got -1)"),
    ("comm_quant 1", dict(comm_quant=1), "comm_quant_mode: must be 0 or 2 on Ascend910_93 (got 1)"),
    ("comm_quant 3", dict(comm_quant=3), "comm_quant_mode: must be 0 or 2 on Ascend910_93 (got 3)"),
    ("out_dtype", dict(out_dtype=1), "out_dtype: is reserved and must be 0 (got 1)"),
    ("group_list_type", dict(group_list_type=1), "group_list_type: is reserved and must be 0 (got 1)"),
    ("hierarchy", dict(comm_alg="hierarchy"), 'comm_alg: "hierarchy" is not supported with a context tensor'),
    ("comm_alg", dict(comm_alg="x"), 'comm_alg: must be "", "fullmesh_v1" or "fullmesh_v2" (got "x")'),
    ("BS>512", dict(BS=513), "expert_ids: dim 0 (BS) must be in [1, 512] (got 513)"),
    ("H<1024", dict(H=1000), "expand_x: dim 1 (H) must be in [1024, 8192] (got 1000)"),
    ("H>8192", dict(H=8193), "expand_x: dim 1 (H) must be in [1024, 8192] (got 8193)"),
    ("K>16", dict(K=17, E=32), "expert_ids: dim 1 (K) must be in [1, 16] (got 17)"),
    ("K>E+Z+C+Q", dict(E=2, K=3), "expert_ids: dim 1 (K) must be <= moe_expert_num + zero_expert_num + "
                                  "copy_expert_num + const_expert_num (got 3 > 2)"),
    ("global_bs", dict(global_bs=7), "global_bs: must be 0 or a multiple of ep_world_size"),
    ("v2 BS", dict(comm_alg="fullmesh_v2", BS=257), 'expert_ids: dim 0 (BS) must be <= 256 with comm_alg "fullmesh_v2"'),
    ("v2 K", dict(comm_alg="fullmesh_v2", K=13, E=16), 'expert_ids: dim 1 (K) must be <= 12 with comm_alg "fullmesh_v2"'),
    ("window", dict(ccl=(1 << 20) + 100), "ccl_buffer_size: window too small"),
    ("ccl<0", dict(ccl=-5), "ccl_buffer_size: must be >= 0 (got -5)"),
]


@pytest.mark.parametrize("kw,text", [pytest.param(kw, t, id=i) for i, kw, t in ATTR_CASES])
def test_attribute_rule(world, kw, text):
    expect(CombineCall(world, **kw), INVALID, text)


def test_ccl_larger_than_the_real_window(world):
    real = world.ctx[0][1]
    expect(CombineCall(world, ccl=real + 1), INVALID, "ccl_buffer_size: must not exceed the window")


TENSOR_CASES = [
    ("expand_x f32", {}, dict(expand_x=np.zeros((16, 1024), np.float32)),
     "expand_x: dtype must be ACL_FLOAT16 or ACL_BF16 (got ACL_FLOAT)"),
    ("expand_x i32", {}, dict(expand_x=np.zeros((16, 1024), np.int32)),
     "expand_x: dtype must be ACL_FLOAT16 or ACL_BF16 (got ACL_INT32)"),
    ("expand_x 1-D", {}, dict(expand_x=np.zeros(16 * 1024, BF16)), "expand_x: must be 2-D"),
    ("expand_x rows", {}, dict(expand_x=np.zeros((15, 1024), BF16)), "expand_x: dim 0 must be >= A = 16 (got 15)"),
    ("ids dtype", {}, dict(expert_ids=np.zeros((4, 2), np.int64)), "expert_ids: dtype must be ACL_INT32"),
    ("ids 1-D", {}, dict(expert_ids=np.zeros(8, np.int32)), "expert_ids: must be 2-D"),
    ("assist dtype", {}, dict(assist_info_for_combine=np.zeros(2048, np.int64)),
     "assist_info_for_combine: dtype must be ACL_INT32"),
    ("assist size", {}, dict(assist_info_for_combine=np.zeros(2047, np.int32)),
     "assist_info_for_combine: dim 0 must be >= A * 128 = 2048 (got 2047)"),
    ("assist 2-D", {}, dict(assist_info_for_combine=np.zeros((2048, 1), np.int32)),
     "assist_info_for_combine: must be 1-D"),
    ("send dtype", {}, dict(ep_send_counts=np.zeros(4, np.int64)), "ep_send_counts: dtype must be ACL_INT32"),
    ("send size", {}, dict(ep_send_counts=np.zeros(3, np.int32)),
     "ep_send_counts: dim 0 must be >= ep_world_size * L = 4 (got 3)"),
    ("send size shared", dict(S=1, R=1, E=2), dict(ep_send_counts=np.zeros(1, np.int32)),
     "ep_send_counts: dim 0 must be >= ep_world_size on a shared-expert rank = 2 (got 1)"),
    ("weights dtype", {}, dict(expert_scales=np.ones((4, 2), np.float16)), "expert_scales: dtype must be ACL_FLOAT"),
    ("weights shape", {}, dict(expert_scales=np.ones((4, 3), np.float32)),
     "expert_scales: shape must be (BS, K) = (4, 2) or empty (got (4, 3))"),
    ("mask dtype", {}, dict(x_active_mask=np.ones(4, np.int32)), "x_active_mask: dtype must be ACL_BOOL"),
    ("mask shape", {}, dict(x_active_mask=np.ones((4, 3), bool)), "x_active_mask: 2-D mask must have shape (BS, K)"),
    ("mask uneven", dict(global_bs=16), dict(x_active_mask=np.ones(4, bool)),
     "x_active_mask: is not supported with uneven BS"),
    ("activation_scale", {}, dict(activation_scale=np.ones(4, np.float32)), "activation_scale: must be NULL"),
    ("weight_scale", {}, dict(weight_scale=np.ones(4, np.float32)), "weight_scale: must be NULL"),
    ("group_list", {}, dict(group_list=np.ones(4, np.int64)), "group_list: must be NULL"),
    ("expand_scales dtype", {}, dict(expand_scales=np.ones(16, np.float16)), "expand_scales: dtype must be ACL_FLOAT"),
    ("expand_scales 2-D", {}, dict(expand_scales=np.ones((16, 1), np.float32)), "expand_scales: must be 1-D"),
    ("shared_x with R", dict(S=1, R=1, E=2), dict(shared_expert_x=np.zeros((4, 1024), BF16)),
     "shared_expert_x: is only allowed when shared_expert_rank_num is 0 (got shared_expert_rank_num 1)"),
    ("shared_x dtype", {}, dict(shared_expert_x=np.zeros((4, 1024), np.float16)),
     "shared_expert_x: dtype must be ACL_BF16 (expand_x's dtype) (got ACL_FLOAT16)"),
    ("shared_x shape", {}, dict(shared_expert_x=np.zeros((4, 2048), BF16)),
     "shared_expert_x: shape must be (BS, H) = (4, 1024) or 3-D (a, b, H) with a*b == BS (got (4, 2048))"),
    ("shared_x 3-D", {}, dict(shared_expert_x=np.zeros((3, 2, 1024), BF16)), "shared_expert_x: shape must be"),
    ("elastic", {}, dict(elastic_info=np.zeros(8, np.int32)), "elastic_info: is reserved on Ascend910_93"),
    ("perf", {}, dict(performance_info=np.zeros(2, np.int64)), "performance_info: is reserved on Ascend910_93"),
    ("ori_x dtype", dict(C=1), dict(ori_x=np.zeros((4, 1024), np.float16)),
     "ori_x: dtype must be ACL_BF16 (expand_x's dtype) (got ACL_FLOAT16)"),
    ("ori_x shape", dict(C=1), dict(ori_x=np.zeros((4, 2048), BF16)), "ori_x: shape must be (BS, H) = (4, 1024)"),
    ("alpha1 shape (Q,)", dict(Q=2), dict(const_expert_alpha_1=np.zeros(2, BF16)),
     "const_expert_alpha_1: shape must be (const_expert_num, H) = (2, 1024) (got (2,))"),
    ("alpha2 dtype", dict(Q=2), dict(const_expert_alpha_2=np.zeros((2, 1024), np.float16)),
     "const_expert_alpha_2: dtype must be ACL_BF16"),
    ("const_v shape", dict(Q=2), dict(const_expert_v=np.zeros((3, 1024), BF16)),
     "const_expert_v: shape must be (const_expert_num, H) = (2, 1024) (got (3, 1024))"),
    ("x_out dtype", {}, dict(x_out=np.zeros((4, 1024), np.float16)),
     "x_out: dtype must be ACL_BF16 (expand_x's dtype) (got ACL_FLOAT16)"),
    ("x_out shape", {}, dict(x_out=np.zeros((5, 1024), BF16)), "x_out: shape must be (BS, H) = (4, 1024) (got (5, 1024))"),
]


@pytest.mark.parametrize("attrs,tensors,text", [pytest.param(a, t, m, id=i) for i, a, t, m in TENSOR_CASES])
def test_tensor_rule(world, attrs, tensors, text):
    expect(_c(world, attrs, **tensors), INVALID, text)


def test_empty_weights_accepted(world):
    assert _c(world, expert_scales=np.zeros((0, 2), np.float32)).run()[0] == 0


def test_tp_send_counts_must_be_null(world):
    expect(_c(world, tp_send_counts=np.zeros(2, np.int32)), INVALID,
           "tp_send_counts: is reserved and must be NULL, tensor parallelism is not supported (got a (2,) tensor)")
    expect(_c(world, tp_send_counts=np.zeros(0, np.int32)), INVALID, "tp_send_counts: is reserved and must be NULL")


@pytest.fixture
def soc950(mock):
    mock.set_soc("Ascend950")
    yield
    mock.set_soc("Ascend910_93")


def test_950(world, soc950):
    # comm quant 3 / 4 (MXFP8) exist on the 950; every other 950 rule: tests/test_moe_checks_950.py
    for q in (0, 2, 3, 4):
        assert CombineCall(world, comm_quant=q).run()[0] == 0
    expect(CombineCall(world, comm_quant=5), INVALID, "comm_quant_mode: must be 0, 2, 3 or 4 on Ascend950 (got 5)")
