"""Phase-1 checks of aclnnMoeDistributeDispatchV5 on the mock: one negative test per rule of SPEC §3
(and §9.3, §8, the 161001 cases), each asserting the status and the message
"<param>: <rule> (got <value>)" of SPEC §0. Each test starts from a valid call (rank 0 of a 2-rank
world, W=2, E=4, BS=4, H=1024, K=2) and breaks one rule."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.moe_calls import BF16, NULL, DispatchCall, RawDesc, World2

NULLPTR, INVALID = 161001, 161002
F32, F16, I8, I32, I64, BOOL, BF = 0, 1, 2, 3, 9, 12, 27
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


def test_valid_call_passes(world):
    ret, msg = DispatchCall(world).run()
    assert ret == 0, msg
    c = DispatchCall(world, quant=2, E=8, K=3, BS=16, global_bs=64)
    c.tensors["scales"] = np.ones((8, 1024), np.float32)
    c.tensors["expert_scales"] = np.ones((16, 3), np.float32)
    c.tensors["x_active_mask"] = np.ones((16, 3), bool)
    c.attrs["global_bs"] = 32
    assert c.run()[0] == 0


# ---- 161001: required pointers ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["context", "x", "expert_ids", "expand_x", "dynamic_scales",
                                  "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
                                  "workspaceSize", "executor"])
def test_null_required(world, name):
    c = DispatchCall(world)
    c.tensors[name] = NULL
    expect(c, NULLPTR, f"{name}: must not be NULL")


def test_null_expand_scales_with_expert_scales(world):
    c = DispatchCall(world)
    c.tensors["expert_scales"] = np.ones((4, 2), np.float32)
    c.tensors["expand_scales"] = NULL
    expect(c, NULLPTR, "expand_scales: must not be NULL when expert_scales is given")


# ---- descriptors: live, ND, contiguous -------------------------------------------------------------------
def test_destroyed_tensor(world):
    c = DispatchCall(world)
    c.tensors["x"] = RawDesc((4, 1024), BF, destroyed=True)
    expect(c, INVALID, "x: must be a live aclTensor")


@pytest.mark.parametrize("name,shape,dt", [("x", (4, 1024), BF), ("expand_x", (8, 1024), BF),
                                           ("expert_ids", (4, 2), I32)])
def test_fractal_nz_rejected(world, name, shape, dt):
    c = DispatchCall(world)
    c.tensors[name] = RawDesc(shape, dt, fmt=NZ)
    expect(c, INVALID, f"{name}: format must be ND", "(got FRACTAL_NZ)")


@pytest.mark.parametrize("fmt,name", [(0, "NCHW"), (1, "NHWC"), (30, "NCDHW"), (35, "NC"), (47, "NCL"),
                                      (3, "NC1HWC0"), (54, "format 54")])
@pytest.mark.parametrize("arg,shape,dt", [("x", (4, 1024), BF), ("expert_ids", (4, 2), I32),
                                          ("expand_x", (8, 1024), BF), ("ep_recv_counts", (4,), I32)])
def test_only_nd_format_accepted(world, fmt, name, arg, shape, dt):
    c = DispatchCall(world)
    c.tensors[arg] = RawDesc(shape, dt, fmt=fmt)
    expect(c, INVALID, f"{arg}: format must be ND (or UNDEFINED)", f"(got {name})")


def test_undefined_format_taken_as_nd(world):
    c = DispatchCall(world)
    c.tensors["x"] = RawDesc((4, 1024), BF, fmt=-1)
    c.tensors["expand_x"] = RawDesc((16, 1024), BF, fmt=-1)
    assert c.run()[0] == 0


def test_non_contiguous_rejected(world):
    c = DispatchCall(world)
    c.tensors["x"] = RawDesc((4, 1024), BF, strides=(1, 4))
    expect(c, INVALID, "x: must be contiguous")


# ---- context (SPEC §3.1, §8) -------------------------------------------------------------------------------
def test_context_dtype_and_rank(world):
    c = DispatchCall(world)
    c.tensors["context"] = np.zeros(4100, np.float32)
    expect(c, INVALID, "context: dtype must be ACL_INT32 (got ACL_FLOAT)")
    c = DispatchCall(world)
    c.tensors["context"] = np.zeros((2, 2050), np.int32)
    expect(c, INVALID, "context: must be 1-D (got shape (2, 2050))")


def test_context_not_a_live_op_resource_context(world):
    c = DispatchCall(world)
    c.tensors["context"] = np.zeros(4100, np.int32)
    expect(c, INVALID, "context: kfcContextAddr is not a live HCCL op-resource context (got 0x0)")


def test_context_too_short(world):
    c = DispatchCall(world)
    c.tensors["context"] = np.zeros(3, np.int32)
    expect(c, INVALID, "context: must hold the whole Mc2MoeContext struct, 16400 bytes (4100 int32) (got 12 bytes)")
    # a context cut after the window addresses of the world's ranks is still refused
    c = DispatchCall(world)
    c.tensors["context"] = world.ctx[0][0].numpy()[:4099]
    expect(c, INVALID, "context: must hold the whole Mc2MoeContext struct", "(got 16396 bytes)")


def _op_res_ctx(comm, op_type, engine):
    """HcclCreateOpResCtx on `comm` with op type and comm engine of our choosing (its address)."""
    b = __import__("aclnn_py").backend()
    ffi, lib = b.ffi, b.lib
    args = ffi.new("void **")
    assert lib.HcclKfcAllocOpArgs(args) == 0
    assert lib.HcclKfcOpArgsSetCommEngine(args[0], engine) == 0
    h = ffi.new("HcclComm *")
    assert lib.HcclCommGetHandleWithName(comm.name.encode(), h) == 0
    out = ffi.new("void **")
    assert lib.HcclCreateOpResCtx(h[0], op_type, args[0], out) == 0
    assert lib.HcclKfcFreeOpArgs(args[0]) == 0
    return int(ffi.cast("uintptr_t", out[0]))


def _with_kfc(ctx, addr):
    a = ctx.numpy().copy()
    a[2:4] = np.array([addr], np.uint64).view(np.int32)
    return a


def test_context_of_another_op_type(world):
    c = DispatchCall(world)
    c.tensors["context"] = _with_kfc(world.ctx[0][0], _op_res_ctx(world.comms[0], 7, 4))
    expect(c, INVALID, "context: kfcContextAddr must be an op-resource context of op type 8 (all-to-all)",
           "(got op type 7)")


def test_context_of_another_comm_engine(acl):
    # the engine is fixed when the communicator's all-to-all context is first created
    w = World2(before_context=lambda comm: _op_res_ctx(comm, 8, 3))
    try:
        expect(DispatchCall(w), INVALID, "context: kfcContextAddr's op-resource context must use comm engine 4 "
                                         "(AIV, HcclKfcOpArgsSetCommEngine) (got comm engine 3)")
    finally:
        w.close()


def test_context_of_another_rank(world):
    c = DispatchCall(world)
    c.tensors["context"] = world.ctx[1][0]
    expect(c, INVALID, "ep_rank_id: must equal this rank's id in the context's communicator (got 0, communicator rank 1)")


def test_context_rank_field_and_windows(world):
    good = world.ctx[0][0].numpy()
    bad = good.copy()
    bad[0] = 1                                     # epRankId
    c = DispatchCall(world)
    c.tensors["context"] = bad
    expect(c, INVALID, "context: epRankId field must equal ep_rank_id (got 1, ep_rank_id 0)")
    bad = good.copy()
    bad[4 + 2 * 1] += 4096                         # epHcclBuffer_[1]
    c = DispatchCall(world)
    c.tensors["context"] = bad
    expect(c, INVALID, "context: epHcclBuffer_[1] must be rank 1's window address")


def test_world_size_differs_from_communicator(world):
    expect(DispatchCall(world, W=4), INVALID,
           "ep_world_size: must equal the rank count of the context's communicator (got 4, communicator has 2)")


# ---- attributes (SPEC §3.2) -----------------------------------------------------------------------------
ATTR_CASES = [
    ("W<2", dict(W=1), "ep_world_size: must be in [2, 768] on Ascend910_93 (got 1)"),
    ("W>768", dict(W=769, E=769), "ep_world_size: must be in [2, 768] on Ascend910_93 (got 769)"),
    ("r<0", dict(r=-1), "ep_rank_id: must be in [0, ep_world_size) (got -1"),
    ("r>=W", dict(r=2), "ep_rank_id: must be in [0, ep_world_size) (got 2"),
    ("tp>=2", dict(tp_world=2), "tp_world_size: must be 0 or 1, tensor parallelism is not supported (got 2)"),
    ("shard", dict(shard=1), "expert_shard_type: must be 0 (got 1)"),
    ("S>4", dict(S=5), "shared_expert_num: must be in [0, 4] (got 5)"),
    ("S<0", dict(S=-1), "shared_expert_num: must be in [0, 4] (got -1)"),
    ("R>=W", dict(R=2), "shared_expert_rank_num: must be in [0, ep_world_size) (got 2"),
    ("R<0", dict(R=-1), "shared_expert_rank_num: must be in [0, ep_world_size) (got -1"),
    ("S=0,R>0", dict(W=4, S=0, R=1, E=3), "must both be 0 or both be non-zero"),
    ("S>1,R=0", dict(S=2, R=0), "must both be 0 or both be non-zero"),
    ("R%S", dict(W=8, S=2, R=3, E=5), "shared_expert_rank_num: must be divisible by shared_expert_num (got 3 % 2)"),
    ("E=0", dict(E=0), "moe_expert_num: must be in [1, 1024] (got 0)"),
    ("E>1024", dict(E=1026), "moe_expert_num: must be in [1, 1024] (got 1026)"),
    ("E%(W-R)", dict(W=8, S=1, R=1, E=30),
     "moe_expert_num: must be divisible by ep_world_size - shared_expert_rank_num (got 30 % 7)"),
    ("L*W>2048", dict(W=8, S=2, R=6, E=1024), "local experts per MoE rank × ep_world_size must be in [1, 2048] "
                                                "(got 512 × 8 = 4096)"),
    ("Z<0", dict(Z=-1), "zero_expert_num: must be >= 0 (got -1)"),
    ("C<0", dict(C=-1), "copy_expert_num: must be >= 0 (got -1)"),
    ("Q<0", dict(Q=-1), "const_expert_num: must be >= 0 (got -1)"),
    ("ZCQE>INT32", dict(Z=2**31 - 4, C=1), "must be <= INT32_MAX"),
    ("quant=1", dict(quant=1), "quant_mode: must be 0 or 2 on Ascend910_93, static quant is not supported (got 1)"),
    ("quant=3", dict(quant=3), "quant_mode: must be 0 or 2 on Ascend910_93 (got 3)"),
    ("quant=-1", dict(quant=-1), "quant_mode: must be 0 or 2 on Ascend910_93 (got -1)"),
    ("ent_type", dict(ent_type=2), "expert_token_nums_type: must be 0 or 1 (got 2)"),
    ("hierarchy", dict(comm_alg="hierarchy"), 'comm_alg: "hierarchy" is not supported with a context tensor'),
    ("comm_alg", dict(comm_alg="ring"), 'comm_alg: must be "", "fullmesh_v1" or "fullmesh_v2" (got "ring")'),
    ("BS=0", dict(BS=0), "x: dim 0 (BS) must be in [1, 512] (got 0)"),
    ("BS>512", dict(BS=513), "x: dim 0 (BS) must be in [1, 512] (got 513)"),
    ("H<1024", dict(H=1000), "x: dim 1 (H) must be in [1024, 8192] (got 1000)"),
    ("H>8192", dict(H=8200), "x: dim 1 (H) must be in [1024, 8192] (got 8200)"),
    ("K=0", dict(K=0), "expert_ids: dim 1 (K) must be in [1, 16] (got 0)"),
    ("K>16", dict(K=17, E=32), "expert_ids: dim 1 (K) must be in [1, 16] (got 17)"),
    ("K>E+Z+C+Q", dict(E=2, K=3, Z=0), "expert_ids: dim 1 (K) must be <= moe_expert_num + zero_expert_num + "
                                       "copy_expert_num + const_expert_num (got 3 > 2)"),
    ("gbs%W", dict(global_bs=9), "global_bs: must be 0 or a multiple of ep_world_size that is >= BS * "
                                 "ep_world_size (got 9 with BS 4, ep_world_size 2)"),
    ("gbs<BS*W", dict(global_bs=6), "global_bs: must be 0 or a multiple of ep_world_size that is >= BS"),
    ("v2 BS>256", dict(comm_alg="fullmesh_v2", BS=257),
     'x: dim 0 (BS) must be <= 256 with comm_alg "fullmesh_v2" on Ascend910_93 (got 257)'),
    ("v2 K>12", dict(comm_alg="fullmesh_v2", K=13, E=16),
     'expert_ids: dim 1 (K) must be <= 12 with comm_alg "fullmesh_v2" on Ascend910_93 (got 13)'),
]


@pytest.mark.parametrize("kw,text", [pytest.param(kw, t, id=i) for i, kw, t in ATTR_CASES])
def test_attribute_rule(world, kw, text):
    expect(DispatchCall(world, **kw), INVALID, text)


def test_comm_alg_null_means_empty(world):
    assert DispatchCall(world, comm_alg=None).run()[0] == 0


# ---- input tensors (SPEC §3.1) -----------------------------------------------------------------------------
def _c(world, **tensors):
    c = DispatchCall(world)
    c.tensors.update(tensors)
    return c


TENSOR_CASES = [
    ("x f32", dict(x=np.zeros((4, 1024), np.float32)),
     "x: dtype must be ACL_FLOAT16 or ACL_BF16 on Ascend910_93 (got ACL_FLOAT)"),
    ("x fp8", dict(x=RawDesc((4, 1024), 36)), "x: dtype must be ACL_FLOAT16 or ACL_BF16 on Ascend910_93"),
    ("x 3-D", dict(x=np.zeros((4, 1024, 1), BF16)), "x: must be 2-D (got shape (4, 1024, 1))"),
    ("ids i64", dict(expert_ids=np.zeros((4, 2), np.int64)), "expert_ids: dtype must be ACL_INT32 (got ACL_INT64)"),
    ("ids 1-D", dict(expert_ids=np.zeros(8, np.int32)), "expert_ids: must be 2-D (got shape (8,))"),
    ("ids dim0", dict(expert_ids=np.zeros((3, 2), np.int32)), "expert_ids: dim 0 must equal x dim 0 (BS = 4) (got 3)"),
    ("scales quant0", dict(scales=np.ones((4, 1024), np.float32)), "scales: must be NULL when quant_mode is 0"),
    ("mask i8", dict(x_active_mask=np.ones(4, np.int8)), "x_active_mask: dtype must be ACL_BOOL (got ACL_INT8)"),
    ("mask len", dict(x_active_mask=np.ones(5, bool)), "x_active_mask: 1-D mask must have shape (BS,) = (4,) (got (5,))"),
    ("mask K", dict(x_active_mask=np.ones((4, 3), bool)), "x_active_mask: 2-D mask must have shape (BS, K) = (4, 2)"),
    ("mask 3-D", dict(x_active_mask=np.ones((4, 2, 1), bool)), "x_active_mask: must be 1-D (BS,) or 2-D (BS, K)"),
    ("es shape", dict(expert_scales=np.ones((4, 3), np.float32)), "expert_scales: shape must be (BS, K) = (4, 2)"),
    ("es f16", dict(expert_scales=np.ones((4, 2), np.float16)), "expert_scales: dtype must be ACL_FLOAT (got ACL_FLOAT16)"),
    ("elastic", dict(elastic_info=np.zeros(8, np.int32)), "elastic_info: is reserved on Ascend910_93 and must be NULL"),
    ("perf", dict(performance_info=np.zeros(2, np.int64)),
     "performance_info: is reserved on Ascend910_93 and must be NULL"),
]


@pytest.mark.parametrize("tensors,text", [pytest.param(t, m, id=i) for i, t, m in TENSOR_CASES])
def test_input_tensor_rule(world, tensors, text):
    expect(_c(world, **tensors), INVALID, text)


def test_mask_with_uneven_bs(world):
    c = DispatchCall(world, global_bs=16)
    c.tensors["x_active_mask"] = np.ones(4, bool)
    expect(c, INVALID, "x_active_mask: is not supported with uneven BS, i.e. global_bs > BS * ep_world_size "
                       "(got global_bs 16 > 4 * 2)")


def test_empty_expert_scales_counts_as_absent(world):
    c = _c(world, expert_scales=np.zeros((0, 2), np.float32), expand_scales=NULL)
    assert c.run()[0] == 0


def test_smooth_scales_rules(world):
    c = DispatchCall(world, quant=2)
    c.tensors["scales"] = np.ones((4, 512), np.float32)
    expect(c, INVALID, "scales: shape must be (moe_expert_num, H) = (4, 1024) (got (4, 512))")
    c = DispatchCall(world, quant=2, W=2, S=1, R=1, E=4)
    c.tensors["scales"] = np.ones((4, 1024), np.float32)
    expect(c, INVALID, "scales: shape must be (moe_expert_num + shared_expert_num, H) = (5, 1024) (got (4, 1024))")
    c = DispatchCall(world, quant=2)
    c.tensors["scales"] = np.ones((4, 1024), np.float16)
    expect(c, INVALID, "scales: dtype must be ACL_FLOAT (got ACL_FLOAT16)")
    c = DispatchCall(world, quant=2)
    c.tensors["scales"] = np.ones((4 * 1024,), np.float32)
    expect(c, INVALID, "scales: must be 2-D")


# ---- outputs (SPEC §2, §3.2 output shape minimums); A = 8*min(2,2) = 16 here ---------------------------------
OUT_CASES = [
    ("expand_x dtype q0", {}, dict(expand_x=np.zeros((16, 1024), np.int8)),
     "expand_x: dtype must be ACL_BF16 (x's dtype with quant_mode 0) (got ACL_INT8)"),
    ("expand_x dtype q2", dict(quant=2), dict(expand_x=np.zeros((16, 1024), BF16)),
     "expand_x: dtype must be ACL_INT8 with quant_mode 2 (got ACL_BF16)"),
    ("expand_x rows", {}, dict(expand_x=np.zeros((15, 1024), BF16)),
     "expand_x: shape must be (>= A, H) = (>= 16, 1024) (got (15, 1024))"),
    ("expand_x H", {}, dict(expand_x=np.zeros((16, 2048), BF16)), "expand_x: shape must be (>= A, H)"),
    ("expand_x 1-D", {}, dict(expand_x=np.zeros((16 * 1024,), BF16)), "expand_x: must be 2-D"),
    ("dyn dtype", dict(quant=2), dict(dynamic_scales=np.zeros(16, np.float16)),
     "dynamic_scales: dtype must be ACL_FLOAT with quant_mode 2 (got ACL_FLOAT16)"),
    ("dyn rows", dict(quant=2), dict(dynamic_scales=np.zeros(15, np.float32)),
     "dynamic_scales: dim 0 must be >= A = 16 (got 15)"),
    ("dyn 2-D", dict(quant=2), dict(dynamic_scales=np.zeros((16, 1), np.float32)), "dynamic_scales: must be 1-D"),
    ("assist dtype", {}, dict(assist_info_for_combine=np.zeros(2048, np.int64)),
     "assist_info_for_combine: dtype must be ACL_INT32 (got ACL_INT64)"),
    ("assist size", {}, dict(assist_info_for_combine=np.zeros(2047, np.int32)),
     "assist_info_for_combine: dim 0 must be >= A * 128 = 2048 (got 2047)"),
    ("tok dtype", {}, dict(expert_token_nums=np.zeros(2, np.int32)),
     "expert_token_nums: dtype must be ACL_INT64 (got ACL_INT32)"),
    ("tok size", {}, dict(expert_token_nums=np.zeros(3, np.int64)),
     "expert_token_nums: dim 0 must be the local expert count L = 2 (got 3)"),
    ("recv dtype", {}, dict(ep_recv_counts=np.zeros(4, np.int64)),
     "ep_recv_counts: dtype must be ACL_INT32 (got ACL_INT64)"),
    ("recv size", {}, dict(ep_recv_counts=np.zeros(3, np.int32)),
     "ep_recv_counts: dim 0 must be >= ep_world_size * L = 4 (got 3)"),
    ("tp dtype", {}, dict(tp_recv_counts=np.zeros(0, np.int64)), "tp_recv_counts: dtype must be ACL_INT32"),
    ("exp scales size", {}, dict(expert_scales=np.ones((4, 2), np.float32), expand_scales=np.zeros(15, np.float32)),
     "expand_scales: dim 0 must be >= A = 16 (got 15)"),
    ("exp scales dtype", {}, dict(expert_scales=np.ones((4, 2), np.float32), expand_scales=np.zeros(16, np.float16)),
     "expand_scales: dtype must be ACL_FLOAT"),
]


@pytest.mark.parametrize("attrs,tensors,text", [pytest.param(a, t, m, id=i) for i, a, t, m in OUT_CASES])
def test_output_rule(world, attrs, tensors, text):
    c = DispatchCall(world, **attrs)
    c.tensors.update(tensors)
    expect(c, INVALID, text)


def test_shared_rank_output_minimums(world):
    # rank 1 of W=2 with R=1: a MoE rank; use rank 0 (< R) for the shared-rank rules
    c = DispatchCall(world, S=1, R=1, E=2)
    c.tensors["expert_token_nums"] = np.zeros(2, np.int64)
    expect(c, INVALID, "expert_token_nums: dim 0 must be 1 on a shared-expert rank = 1 (got 2)")
    c = DispatchCall(world, S=1, R=1, E=2)
    c.tensors["ep_recv_counts"] = np.zeros(1, np.int32)
    expect(c, INVALID, "ep_recv_counts: dim 0 must be >= ep_world_size on a shared-expert rank = 2 (got 1)")
    c = DispatchCall(world, S=1, R=1, E=2)         # A = maxBs * ceil(W / (R/S)) = 4 * 2
    c.tensors["expand_x"] = np.zeros((7, 1024), BF16)
    expect(c, INVALID, "expand_x: shape must be (>= A, H) = (>= 8, 1024)")


# ---- window (SPEC §9.3) ------------------------------------------------------------------------------------
def test_window_too_small(world):
    msg = expect(DispatchCall(world, ccl=(1 << 20) + 1000), INVALID, "ccl_buffer_size: window too small",
                 "must be <= ccl_buffer_size - 1 MiB", "set HCCL_BUFFSIZE >= 1 (MiB)", f"(got {(1 << 20) + 1000} bytes)")
    assert "2*(4*2560*2*2 + 4*2048*2)" in msg


def test_window_exact_boundary(world):
    # need = 2*(maxBs*Td*W*L + maxBs*Tc*(K+S)) = 2*(4*2560*2*2 + 4*2048*2) = 98304
    need = 2 * (4 * 2560 * 2 * 2 + 4 * 2048 * 2)
    assert DispatchCall(world, ccl=need + (1 << 20)).run()[0] == 0
    expect(DispatchCall(world, ccl=need + (1 << 20) - 1), INVALID, "ccl_buffer_size: window too small")


def test_window_fullmesh_v2_uses_its_token_size(world):
    # v2: Td = ceil((2048+32+44)/480)*512 = 5*512 = 2560 here too; H=1536: tal=3148 → v1 3584, v2 3584;
    # H=2000: tal = 4000+44=4044 → v1 4096, v2 ceil(4044/480)=9 → 4608
    need_v1 = 2 * (4 * 4096 * 2 * 2 + 4 * 4096 * 2)
    c = DispatchCall(world, H=2000, comm_alg="fullmesh_v2", ccl=need_v1 + (1 << 20))
    expect(c, INVALID, "ccl_buffer_size: window too small", "4*4608*2*2")
    assert DispatchCall(world, H=2000, comm_alg="fullmesh_v1", ccl=need_v1 + (1 << 20)).run()[0] == 0


def test_window_negative_and_larger_than_real(world):
    expect(DispatchCall(world, ccl=-1), INVALID, "ccl_buffer_size: must be >= 0 (got -1)")
    real = world.ctx[0][1]
    expect(DispatchCall(world, ccl=real + 1), INVALID,
           f"ccl_buffer_size: must not exceed the window of the context's communicator ({real} bytes) (got {real + 1})")


# ---- the Ascend950 profile ------------------------------------------------------------------------------------
@pytest.fixture
def soc950(mock):
    mock.set_soc("Ascend950")
    yield
    mock.set_soc("Ascend910_93")


# every 950-only rule and every A3 refusal of a 950 feature: tests/test_moe_checks_950.py


def test_950_limits(world, soc950):
    expect(DispatchCall(world, W=1025, E=1025), INVALID, "ep_world_size: must be in [2, 1024] on Ascend950 (got 1025)")
    # W = 1000 passes the range (then fails against the 2-rank communicator)
    expect(DispatchCall(world, W=1000, E=1000), INVALID, "ep_world_size: must equal the rank count")
    # fullmesh_v2 allows BS up to 512 and K > 12 on the 950
    expect(DispatchCall(world, comm_alg="fullmesh_v2", BS=513), INVALID, "x: dim 0 (BS) must be in [1, 512]")
    assert DispatchCall(world, comm_alg="fullmesh_v2", BS=300, K=13, E=16).run()[0] == 0
    # the window check adds W*1024 bytes
    need = 2 * (4 * 2560 * 2 * 2 + 4 * 2048 * 2)
    expect(DispatchCall(world, ccl=need + (1 << 20)), INVALID, "+ W*1024", "+ 2048")
    assert DispatchCall(world, ccl=need + 2048 + (1 << 20)).run()[0] == 0
