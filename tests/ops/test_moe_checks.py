"""Phase-1 checks of aclnnMoeDistributeDispatchV5 / CombineV5 on the mock: one negative test per rule,
each asserting the status (161001 for a NULL required argument, 161002 for every other rule) and the
message "<param>: <rule> (got <value>)"; the rules common to both SoC profiles run on both, the A3
refusals of every 950 feature on Ascend910_93, every 950-only rule on Ascend950. Each test starts from
a valid call of rank 0 in a 2-rank world (W=2, E=4, BS=4, H=1024, K=2, so A=16) and breaks one rule."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers.moe_calls import BF16, NULL, CombineCall, DispatchCall, RawDesc, World2, expect
from helpers.moe_cases import A3, A950, on_profile

NULLPTR, INVALID = 161001, 161002
F32, F16, I8, I32, U8, I64, BOOL, BF = 0, 1, 2, 3, 4, 9, 12, 27
HIF8, E5M2, E4M3, E8M0, E2M1, E1M2 = 34, 35, 36, 37, 40, 41
NZ = 29
NP = {E4M3: np.dtype(ml_dtypes.float8_e4m3fn), E5M2: np.dtype(ml_dtypes.float8_e5m2), I8: np.dtype(np.int8),
      F32: np.dtype(np.float32), U8: np.dtype(np.uint8), E8M0: np.dtype(ml_dtypes.float8_e8m0fnu)}


@pytest.fixture(scope="module")
def world(acl):
    w = World2()
    yield w
    w.close()


# =================================================================================================================
# dispatch
# =================================================================================================================

def test_dispatch_valid_call_passes(world, profile):
    ret, msg = DispatchCall(world).run()
    assert ret == 0, msg
    c = DispatchCall(world, quant=2, E=8, K=3, BS=16, global_bs=64)
    c.tensors["scales"] = np.ones((8, 1024), np.float32)
    c.tensors["expert_scales"] = np.ones((16, 3), np.float32)
    c.tensors["x_active_mask"] = np.ones((16, 3), bool)
    c.attrs["global_bs"] = 32
    assert c.run()[0] == 0


# ---- 161001: required pointers -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["context", "x", "expert_ids", "expand_x", "dynamic_scales",
                                  "assist_info_for_combine", "expert_token_nums", "ep_recv_counts",
                                  "workspaceSize", "executor"])
def test_dispatch_null_required(world, profile, name):
    c = DispatchCall(world)
    c.tensors[name] = NULL
    expect(c, NULLPTR, f"{name}: must not be NULL")


def test_dispatch_null_expand_scales_with_expert_scales(world, profile):
    c = DispatchCall(world)
    c.tensors["expert_scales"] = np.ones((4, 2), np.float32)
    c.tensors["expand_scales"] = NULL
    expect(c, NULLPTR, "expand_scales: must not be NULL when expert_scales is given")


# ---- descriptors: live, ND, contiguous -----------------------------------------------------------------------
def test_dispatch_destroyed_tensor(world, profile):
    c = DispatchCall(world)
    c.tensors["x"] = RawDesc((4, 1024), BF, destroyed=True)
    expect(c, INVALID, "x: must be a live aclTensor")


@pytest.mark.parametrize("name,shape,dt", [("x", (4, 1024), BF), ("expand_x", (8, 1024), BF),
                                           ("expert_ids", (4, 2), I32)])
def test_dispatch_fractal_nz_rejected(world, profile, name, shape, dt):
    c = DispatchCall(world)
    c.tensors[name] = RawDesc(shape, dt, fmt=NZ)
    expect(c, INVALID, f"{name}: format must be ND", "(got FRACTAL_NZ)")


@pytest.mark.parametrize("fmt,name", [(0, "NCHW"), (1, "NHWC"), (30, "NCDHW"), (35, "NC"), (47, "NCL"),
                                      (3, "NC1HWC0"), (54, "format 54")])
@pytest.mark.parametrize("arg,shape,dt", [("x", (4, 1024), BF), ("expert_ids", (4, 2), I32),
                                          ("expand_x", (8, 1024), BF), ("ep_recv_counts", (4,), I32)])
def test_dispatch_only_nd_format_accepted(world, profile, fmt, name, arg, shape, dt):
    c = DispatchCall(world)
    c.tensors[arg] = RawDesc(shape, dt, fmt=fmt)
    expect(c, INVALID, f"{arg}: format must be ND (or UNDEFINED)", f"(got {name})")


def test_dispatch_undefined_format_taken_as_nd(world, profile):
    c = DispatchCall(world)
    c.tensors["x"] = RawDesc((4, 1024), BF, fmt=-1)
    c.tensors["expand_x"] = RawDesc((16, 1024), BF, fmt=-1)
    assert c.run()[0] == 0


def test_dispatch_non_contiguous_rejected(world, profile):
    c = DispatchCall(world)
    c.tensors["x"] = RawDesc((4, 1024), BF, strides=(1, 4))
    expect(c, INVALID, "x: must be contiguous")


# ---- context -------------------------------------------------------------------------------------------------
def test_dispatch_context_dtype_and_rank(world, profile):
    c = DispatchCall(world)
    c.tensors["context"] = np.zeros(4100, np.float32)
    expect(c, INVALID, "context: dtype must be ACL_INT32 (got ACL_FLOAT)")
    c = DispatchCall(world)
    c.tensors["context"] = np.zeros((2, 2050), np.int32)
    expect(c, INVALID, "context: must be 1-D (got shape (2, 2050))")


def test_dispatch_context_not_a_live_op_resource_context(world, profile):
    c = DispatchCall(world)
    c.tensors["context"] = np.zeros(4100, np.int32)
    expect(c, INVALID, "context: kfcContextAddr is not a live HCCL op-resource context (got 0x0)")


def test_dispatch_context_of_a_destroyed_communicator(world, profile):
    # the last context this thread verified, its communicator destroyed since: refused, not remembered
    other = World2()
    try:
        assert DispatchCall(other).run()[0] == 0
        words = other.ctx[0][0].numpy()
    finally:
        other.close()
    c = DispatchCall(world)
    c.tensors["context"] = words
    expect(c, INVALID, "context: kfcContextAddr is not a live HCCL op-resource context (got 0x")


def test_dispatch_context_too_short(world, profile):
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


def test_dispatch_context_of_another_op_type(world, profile):
    c = DispatchCall(world)
    c.tensors["context"] = _with_kfc(world.ctx[0][0], _op_res_ctx(world.comms[0], 7, 4))
    expect(c, INVALID, "context: kfcContextAddr must be an op-resource context of op type 8 (all-to-all)",
           "(got op type 7)")


def test_dispatch_context_of_another_comm_engine(acl):
    # the engine is fixed when the communicator's all-to-all context is first created
    w = World2(before_context=lambda comm: _op_res_ctx(comm, 8, 3))
    try:
        expect(DispatchCall(w), INVALID, "context: kfcContextAddr's op-resource context must use comm engine 4 "
                                         "(AIV, HcclKfcOpArgsSetCommEngine) (got comm engine 3)")
    finally:
        w.close()


def test_dispatch_context_of_another_rank(world, profile):
    c = DispatchCall(world)
    c.tensors["context"] = world.ctx[1][0]
    expect(c, INVALID, "ep_rank_id: must equal this rank's id in the context's communicator (got 0, communicator rank 1)")


def test_dispatch_context_rank_field_and_windows(world, profile):
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


def test_dispatch_world_size_differs_from_communicator(world, profile):
    expect(DispatchCall(world, W=4), INVALID,
           "ep_world_size: must equal the rank count of the context's communicator (got 4, communicator has 2)")


# ---- attributes ----------------------------------------------------------------------------------------------
D_ATTR_CASES = [
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


@pytest.mark.parametrize("kw,text", [pytest.param(kw, t, id=i) for i, kw, t in D_ATTR_CASES])
def test_dispatch_attribute_rule(world, kw, text):
    expect(DispatchCall(world, **kw), INVALID, text)


def test_dispatch_comm_alg_null_means_empty(world, profile):
    assert DispatchCall(world, comm_alg=None).run()[0] == 0


# ---- input tensors -------------------------------------------------------------------------------------------
def _d(world, **tensors):
    c = DispatchCall(world)
    c.tensors.update(tensors)
    return c


D_TENSOR_CASES = [
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


@pytest.mark.parametrize("tensors,text", [pytest.param(t, m, id=i) for i, t, m in D_TENSOR_CASES])
def test_dispatch_input_tensor_rule(world, tensors, text):
    expect(_d(world, **tensors), INVALID, text)


def test_dispatch_mask_with_uneven_bs(world, profile):
    c = DispatchCall(world, global_bs=16)
    c.tensors["x_active_mask"] = np.ones(4, bool)
    expect(c, INVALID, "x_active_mask: is not supported with uneven BS, i.e. global_bs > BS * ep_world_size "
                       "(got global_bs 16 > 4 * 2)")


def test_dispatch_empty_expert_scales_counts_as_absent(world, profile):
    c = _d(world, expert_scales=np.zeros((0, 2), np.float32), expand_scales=NULL)
    assert c.run()[0] == 0


def test_dispatch_smooth_scales_rules(world, profile):
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


# ---- outputs (A = 8*min(2,2) = 16 here) ----------------------------------------------------------------------
D_OUT_CASES = [
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


@pytest.mark.parametrize("attrs,tensors,text", [pytest.param(a, t, m, id=i) for i, a, t, m in D_OUT_CASES])
def test_dispatch_output_rule(world, attrs, tensors, text):
    c = DispatchCall(world, **attrs)
    c.tensors.update(tensors)
    expect(c, INVALID, text)


def test_dispatch_shared_rank_output_minimums(world, profile):
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


# ---- window --------------------------------------------------------------------------------------------------
def test_dispatch_window_too_small(world):
    msg = expect(DispatchCall(world, ccl=(1 << 20) + 1000), INVALID, "ccl_buffer_size: window too small",
                 "must be <= ccl_buffer_size - 1 MiB", "set HCCL_BUFFSIZE >= 1 (MiB)", f"(got {(1 << 20) + 1000} bytes)")
    assert "2*(4*2560*2*2 + 4*2048*2)" in msg


def test_dispatch_window_exact_boundary(world):
    # need = 2*(maxBs*Td*W*L + maxBs*Tc*(K+S)) = 2*(4*2560*2*2 + 4*2048*2) = 98304
    need = 2 * (4 * 2560 * 2 * 2 + 4 * 2048 * 2)
    assert DispatchCall(world, ccl=need + (1 << 20)).run()[0] == 0
    expect(DispatchCall(world, ccl=need + (1 << 20) - 1), INVALID, "ccl_buffer_size: window too small")


def test_dispatch_window_fullmesh_v2_uses_its_token_size(world):
    # v2: Td = ceil((2048+32+44)/480)*512 = 5*512 = 2560 here too; H=1536: tal=3148 → v1 3584, v2 3584;
    # H=2000: tal = 4000+44=4044 → v1 4096, v2 ceil(4044/480)=9 → 4608
    need_v1 = 2 * (4 * 4096 * 2 * 2 + 4 * 4096 * 2)
    c = DispatchCall(world, H=2000, comm_alg="fullmesh_v2", ccl=need_v1 + (1 << 20))
    expect(c, INVALID, "ccl_buffer_size: window too small", "4*4608*2*2")
    assert DispatchCall(world, H=2000, comm_alg="fullmesh_v1", ccl=need_v1 + (1 << 20)).run()[0] == 0


def test_dispatch_window_negative_and_larger_than_real(world):
    expect(DispatchCall(world, ccl=-1), INVALID, "ccl_buffer_size: must be >= 0 (got -1)")
    real = world.ctx[0][1]
    expect(DispatchCall(world, ccl=real + 1), INVALID,
           f"ccl_buffer_size: must not exceed the window of the context's communicator ({real} bytes) (got {real + 1})")


@on_profile(A950)
def test_dispatch_950_limits(world, profile):
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

# =================================================================================================================
# combine
# =================================================================================================================

def _c(world, attrs=None, **tensors):
    c = CombineCall(world, **(attrs or {}))
    c.tensors.update(tensors)
    return c


def test_combine_valid_calls_pass(world, profile):
    assert CombineCall(world).run()[0] == 0
    c = _c(world, dict(C=1, Q=2, Z=1, comm_quant=2), expert_scales=np.ones((4, 2), np.float32),
           x_active_mask=np.ones((4, 2), bool), shared_expert_x=np.zeros((2, 2, 1024), BF16),
           expand_scales=np.zeros(16, np.float32))
    assert c.run()[0] == 0
    assert _c(world, dict(S=1, R=1, E=2)).run()[0] == 0          # shared rank


@pytest.mark.parametrize("name", ["context", "expand_x", "expert_ids", "assist_info_for_combine",
                                  "ep_send_counts", "expert_scales", "x_out", "workspaceSize", "executor"])
def test_combine_null_required(world, profile, name):
    expect(_c(world, **{name: NULL}), NULLPTR, f"{name}: must not be NULL")


def test_combine_ori_x_and_const_tensors_required(world, profile):
    expect(_c(world, dict(C=1), ori_x=NULL), NULLPTR,
           "ori_x: must not be NULL when copy_expert_num or const_expert_num is > 0 (got 1, 0)")
    expect(_c(world, dict(Q=1), ori_x=NULL), NULLPTR, "ori_x: must not be NULL")
    for n in ("const_expert_alpha_1", "const_expert_alpha_2", "const_expert_v"):
        expect(_c(world, dict(Q=2), **{n: NULL}), NULLPTR, f"{n}: must not be NULL when const_expert_num is > 0 (got 2)")


def test_combine_descriptor_rules(world, profile):
    expect(_c(world, expand_x=RawDesc((16, 1024), 27, destroyed=True)), INVALID, "expand_x: must be a live aclTensor")
    expect(_c(world, expand_x=RawDesc((16, 1024), 27, fmt=NZ)), INVALID, "expand_x: format must be ND", "FRACTAL_NZ")
    expect(_c(world, x_out=RawDesc((4, 1024), 27, fmt=NZ)), INVALID, "x_out: format must be ND")
    expect(_c(world, expand_x=RawDesc((16, 1024), 27, strides=(1, 16))), INVALID, "expand_x: must be contiguous")


@pytest.mark.parametrize("fmt,name", [(0, "NCHW"), (1, "NHWC"), (35, "NC"), (47, "NCL"), (29, "FRACTAL_NZ")])
@pytest.mark.parametrize("arg,shape,dt", [("expand_x", (16, 1024), 27), ("assist_info_for_combine", (2048,), 3),
                                          ("ep_send_counts", (4,), 3), ("x_out", (4, 1024), 27)])
def test_combine_only_nd_format_accepted(world, profile, fmt, name, arg, shape, dt):
    expect(_c(world, **{arg: RawDesc(shape, dt, fmt=fmt)}), INVALID, f"{arg}: format must be ND (or UNDEFINED)",
           f"(got {name})")


def test_combine_undefined_format_taken_as_nd(world, profile):
    assert _c(world, expand_x=RawDesc((16, 1024), 27, fmt=-1), x_out=RawDesc((4, 1024), 27, fmt=-1)).run()[0] == 0


def test_combine_context_rules(world, profile):
    expect(_c(world, context=np.zeros(4100, np.int64)), INVALID, "context: dtype must be ACL_INT32")
    expect(_c(world, context=np.zeros(4100, np.int32)), INVALID, "context: kfcContextAddr is not a live")
    expect(_c(world, context=world.ctx[1][0]), INVALID, "ep_rank_id: must equal this rank's id")


C_ATTR_CASES = [
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


@pytest.mark.parametrize("kw,text", [pytest.param(kw, t, id=i) for i, kw, t in C_ATTR_CASES])
def test_combine_attribute_rule(world, kw, text):
    expect(CombineCall(world, **kw), INVALID, text)


def test_combine_ccl_larger_than_the_real_window(world, profile):
    real = world.ctx[0][1]
    expect(CombineCall(world, ccl=real + 1), INVALID, "ccl_buffer_size: must not exceed the window")


C_TENSOR_CASES = [
    ("expand_x f32", {}, dict(expand_x=np.zeros((16, 1024), np.float32)),
     "expand_x: dtype must be ACL_FLOAT16 or ACL_BF16 (got ACL_FLOAT)"),
    ("expand_x i32", {}, dict(expand_x=np.zeros((16, 1024), np.int32)),
     "expand_x: dtype must be ACL_FLOAT16 or ACL_BF16 (got ACL_INT32)"),
    ("expand_x 1-D", {}, dict(expand_x=np.zeros(16 * 1024, BF16)), "expand_x: must be 2-D"),
    ("expand_x rows", {}, dict(expand_x=np.zeros((15, 1024), BF16)),
     "expand_x: dim 0 must be >= A = 16 (got 15): pass all A rows of dispatch's expand_x; rows >= N are not read "
     "(N = the rows this rank received, the last running total of ep_send_counts)"),
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


@pytest.mark.parametrize("attrs,tensors,text", [pytest.param(a, t, m, id=i) for i, a, t, m in C_TENSOR_CASES])
def test_combine_tensor_rule(world, attrs, tensors, text):
    expect(_c(world, attrs, **tensors), INVALID, text)


def test_combine_empty_weights_accepted(world, profile):
    assert _c(world, expert_scales=np.zeros((0, 2), np.float32)).run()[0] == 0


def test_combine_tp_send_counts_without_tp_ignored(world, profile):
    """CANN's tilings do not read tp_send_counts without a TP domain: any tensor passes; the nearest
    refused neighbour, a TP domain on the context generation, keeps its 161002."""
    for t in (np.zeros(2, np.int32), np.zeros(0, np.int32), np.zeros((3, 3), np.float32)):
        assert _c(world, tp_send_counts=t).run()[0] == 0
    expect(CombineCall(world, tp_world=2), INVALID, "tp_world_size: must be 0 or 1")


def test_combine_group_list_type_reserved_and_unread(world, profile):
    """No CANN tiling reads group_list_type (its CombineV2 sample passes 1): every value passes; the
    nearest refused neighbour, the other reserved attribute out_dtype, keeps its 161002."""
    for v in (1, 2, -1):
        assert CombineCall(world, group_list_type=v).run()[0] == 0
    expect(CombineCall(world, out_dtype=1), INVALID, "out_dtype: is reserved and must be 0 (got 1)")


@on_profile(A950)
def test_combine_950_comm_quant_modes(world, profile):
    # comm quant 3 / 4 (MXFP8) exist on the 950
    for q in (0, 2, 3, 4):
        assert CombineCall(world, comm_quant=q).run()[0] == 0
    expect(CombineCall(world, comm_quant=5), INVALID, "comm_quant_mode: must be 0, 2, 3 or 4 on Ascend950 (got 5)")

# =================================================================================================================
# the Ascend950 profile: every 950-only rule, and the A3 refusal of every 950 feature
# =================================================================================================================

def arr(shape, dt):
    """A tensor argument of aclDataType `dt` (numpy when numpy holds it, else a raw descriptor)."""
    if dt in NP:
        return np.zeros(shape, NP[dt])
    return RawDesc(tuple(shape), dt)


AUTO = object()


def d950(world, quant=0, y=None, x=None, scales=AUTO, dyn=AUTO, **attrs):
    """A valid 950 dispatch call of `quant` with expand_x type `y` (or a low-precision `x` type)."""
    c = DispatchCall(world, quant=quant, **attrs)
    a = c.attrs
    A, H, BS = c.sizes()["A"], a["H"], a["BS"]
    if x is not None:
        c.tensors["x"] = arr((BS, H), x)
        c.tensors["expand_x"] = arr((A, H), x)
        if scales is AUTO:
            scales = np.zeros((BS, 4), np.float32)
        if dyn is AUTO:
            dyn = arr((A, scales.shape[1]), F32 if scales.dtype == np.float32 else U8)
    elif quant:
        c.tensors["expand_x"] = arr((A, H), y)
        if scales is AUTO:
            scales = np.ones((1,), np.float32) if quant == 1 else None
        if dyn is AUTO:
            dyn = {1: arr((A,), F32), 2: arr((A,), F32), 3: arr((A, -(-H // 128)), F32),
                   4: arr((A, (-(-H // 32) + 1) // 2 * 2), E8M0), 5: arr((A, (-(-H // 32) + 1) // 2 * 2), U8)}[quant]
    else:
        scales = None if scales is AUTO else scales
    if scales is not None:
        c.tensors["scales"] = scales
    if dyn is not None and dyn is not AUTO:
        c.tensors["dynamic_scales"] = dyn
    return c


# ---- valid 950 calls -----------------------------------------------------------------------------------------
VALID = [
    ("q1 int8 scalar", dict(quant=1, y=I8)),
    ("q1 int8 row", dict(quant=1, y=I8, scales=np.ones(1024, np.float32))),
    ("q1 int8 per expert", dict(quant=1, y=I8, scales=np.ones((4, 1024), np.float32))),
    ("q1 hif8", dict(quant=1, y=HIF8)),
    ("q2 int8", dict(quant=2, y=I8)),
    ("q2 e4m3", dict(quant=2, y=E4M3)),
    ("q2 e5m2 smooth", dict(quant=2, y=E5M2, scales=np.ones((4, 1024), np.float32))),
    ("q3 e4m3", dict(quant=3, y=E4M3)),
    ("q3 e5m2 smooth", dict(quant=3, y=E5M2, scales=np.ones((4, 1024), np.float32))),
    ("q4 e4m3", dict(quant=4, y=E4M3)), ("q4 e5m2", dict(quant=4, y=E5M2)),
    ("q4 e2m1", dict(quant=4, y=E2M1)), ("q4 e1m2", dict(quant=4, y=E1M2)),
    ("q4 odd blocks", dict(quant=4, y=E4M3, H=1056)),
    ("q5 e4m3", dict(quant=5, y=E4M3)), ("q5 e5m2", dict(quant=5, y=E5M2)),
    ("x hif8", dict(x=HIF8)), ("x e4m3", dict(x=E4M3)), ("x e5m2", dict(x=E5M2)),
    ("x e2m1", dict(x=E2M1)), ("x e1m2 e8m0 scales", dict(x=E1M2, scales=np.zeros((4, 32), np.uint8))),
    ("x e4m3 scales at the fit limit", dict(x=E4M3, scales=np.zeros((4, 256), np.float32))),
    ("x e2m1 scales at the fit limit", dict(x=E2M1, scales=np.zeros((4, 384), np.float32))),
    ("x hif8 e8m0 scales dim1 = H", dict(x=HIF8, scales=np.zeros((4, 1024), np.uint8))),
    ("x e5m2 scales dim1 = 1", dict(x=E5M2, scales=np.zeros((4, 1), np.float32))),
]


@pytest.mark.parametrize("kw", [pytest.param(kw, id=i) for i, kw in VALID])
@on_profile(A950)
def test_valid_950_calls_pass(world, profile, kw):
    ret, msg = d950(world, **kw).run()
    assert ret == 0, msg


@on_profile(A950)
def test_valid_elastic_and_performance_info(world, profile):
    c = d950(world)
    c.tensors["elastic_info"] = np.zeros(8, np.int32)
    c.tensors["performance_info"] = np.zeros(2, np.int64)
    assert c.run()[0] == 0
    # a shared rank (R = 1) with elastic_info: A, expert_token_nums and ep_recv_counts of the larger role
    c = DispatchCall(world, R=1, S=1, E=2)
    c.tensors.update(elastic_info=np.zeros(8, np.int32), expand_x=np.zeros((16, 1024), BF16),
                     assist_info_for_combine=np.zeros(16 * 128, np.int32), expert_token_nums=np.zeros(2, np.int64),
                     ep_recv_counts=np.zeros(4, np.int32))
    assert c.run()[0] == 0
    c = CombineCall(world, R=1, S=1, E=2)
    c.tensors.update(elastic_info=np.zeros(8, np.int32), performance_info=np.zeros(2, np.int64),
                     expand_x=np.zeros((16, 1024), BF16), assist_info_for_combine=np.zeros(16 * 128, np.int32),
                     ep_send_counts=np.zeros(4, np.int32))
    assert c.run()[0] == 0


# ---- every 950-only dispatch rule ----------------------------------------------------------------------------
S4 = np.ones((4, 1024), np.float32)
RULES = [
    ("quant range", dict(quant=6, y=I8, dyn=None), INVALID, "quant_mode: must be in [0, 5] on Ascend950 (got 6)"),
    ("x dtype", dict(x=I8), INVALID, "x: dtype must be ACL_FLOAT16, ACL_BF16, ACL_HIFLOAT8, ACL_FLOAT8_E4M3FN, "
     "ACL_FLOAT8_E5M2, ACL_FLOAT4_E2M1 or ACL_FLOAT4_E1M2 on Ascend950 (got ACL_INT8)"),
    ("low-precision x needs quant 0", dict(x=E4M3, quant=2), INVALID,
     "x: a ACL_FLOAT8_E4M3FN input needs quant_mode 0 (got quant_mode 2)"),
    ("fp4 x H even", dict(x=E2M1, H=1025), INVALID, "x: dim 1 (H) must be even for a packed fp4 input (got 1025)"),
    ("low-precision x needs scales", dict(x=HIF8, scales=None, dyn=arr((16, 4), F32)), NULLPTR,
     "scales: must not be NULL for a ACL_HIFLOAT8 x"),
    ("per-token scales dtype", dict(x=HIF8, scales=np.zeros((4, 4), np.float16), dyn=arr((16, 4), F32)), INVALID,
     "scales: dtype must be ACL_FLOAT, ACL_UINT8 or ACL_FLOAT8_E8M0 for a low-precision x (got ACL_FLOAT16)"),
    ("per-token scales 2-D", dict(x=E5M2, scales=np.zeros(4, np.float32), dyn=arr((16, 4), F32)), INVALID,
     "scales: must be 2-D (got shape (4,))"),
    ("per-token scales dim 0", dict(x=E5M2, scales=np.zeros((3, 4), np.float32)), INVALID,
     "scales: shape must be (BS, dim1) = (4, 1..1024) for a low-precision x (got (3, 4))"),
    ("per-token scales dim 1 > H", dict(x=E2M1, scales=np.zeros((4, 1025), np.uint8)), INVALID,
     "scales: shape must be (BS, dim1) = (4, 1..1024) for a low-precision x (got (4, 1025))"),
    ("per-token scales dim 1 = 0", dict(x=E2M1, scales=np.zeros((4, 0), np.uint8), dyn=arr((16, 1), U8)), INVALID,
     "scales: shape must be (BS, dim1) = (4, 1..1024) for a low-precision x (got (4, 0))"),
    ("per-token scales fit the window row", dict(x=E4M3, scales=np.zeros((4, 257), np.float32)), INVALID,
     "scales: one row of per-token scales must fit in the token's window row: dim1 * 4 bytes <= align(2H, 32) - "
     "1024 bytes of x = 1024 (got dim1 257, 1028 bytes)"),
    ("per-token scales fit, fp4 x", dict(x=E2M1, scales=np.zeros((4, 385), np.float32)), INVALID,
     "dim1 * 4 bytes <= align(2H, 32) - 512 bytes of x = 1536 (got dim1 385, 1540 bytes)"),
    ("fp16 x with scales and quant 0", dict(scales=S4), INVALID, "scales: must be NULL when quant_mode is 0"),
    ("MX without scales", dict(quant=4, y=E4M3, scales=S4), INVALID,
     "scales: must be NULL with MX quant_mode 4 (got a (4, 1024) tensor)"),
    ("MX clip without scales", dict(quant=5, y=E5M2, scales=S4), INVALID, "scales: must be NULL with MX quant_mode 5"),
    ("static needs scales", dict(quant=1, y=I8, scales=None), NULLPTR,
     "scales: must not be NULL with static quant_mode 1"),
    ("static scales shape", dict(quant=1, y=I8, scales=np.ones(2, np.float32)), INVALID,
     "scales: shape must be (1,), (H,) = (1024,) or (moe_expert_num, H) = (4, 1024) with quant_mode 1 (got (2,))"),
    ("static scales dtype", dict(quant=1, y=I8, scales=np.ones(1, np.float16)), INVALID,
     "scales: dtype must be ACL_FLOAT (got ACL_FLOAT16)"),
    ("static hifloat8 scalar only", dict(quant=1, y=HIF8, scales=np.ones(1024, np.float32)), INVALID,
     "scales: must be a scalar (1,) with quant_mode 1 and a hifloat8 expand_x (got (1024,))"),
    ("per-group smooth scales shape", dict(quant=3, y=E4M3, scales=np.ones((3, 1024), np.float32)), INVALID,
     "scales: shape must be (moe_expert_num, H) = (4, 1024) (got (3, 1024))"),
    ("y q1", dict(quant=1, y=E4M3), INVALID,
     "expand_x: dtype must be ACL_INT8 or ACL_HIFLOAT8 with quant_mode 1 on Ascend950 (got ACL_FLOAT8_E4M3FN)"),
    ("y q2", dict(quant=2, y=HIF8), INVALID, "expand_x: dtype must be ACL_INT8, ACL_FLOAT8_E4M3FN or ACL_FLOAT8_E5M2 "
     "with quant_mode 2 on Ascend950 (got ACL_HIFLOAT8)"),
    ("y q3", dict(quant=3, y=I8), INVALID,
     "expand_x: dtype must be ACL_FLOAT8_E4M3FN or ACL_FLOAT8_E5M2 with quant_mode 3 on Ascend950 (got ACL_INT8)"),
    ("y q4", dict(quant=4, y=HIF8), INVALID, "expand_x: dtype must be ACL_FLOAT8_E4M3FN, ACL_FLOAT8_E5M2, "
     "ACL_FLOAT4_E2M1 or ACL_FLOAT4_E1M2 with quant_mode 4 on Ascend950 (got ACL_HIFLOAT8)"),
    ("y q5 no fp4", dict(quant=5, y=E2M1), INVALID,
     "expand_x: dtype must be ACL_FLOAT8_E4M3FN or ACL_FLOAT8_E5M2 with quant_mode 5 on Ascend950 (got ACL_FLOAT4_E2M1)"),
    ("fp4 expand_x H even", dict(quant=4, y=E1M2, H=1025), INVALID,
     "x: dim 1 (H) must be even for a packed fp4 expand_x (got 1025)"),
    ("q2 fp8 scales 1-D", dict(quant=2, y=E4M3, dyn=arr((16, 1), F32)), INVALID,
     "dynamic_scales: must be 1-D (got shape (16, 1))"),
    ("q3 scales dtype", dict(quant=3, y=E4M3, dyn=arr((16, 8), U8)), INVALID,
     "dynamic_scales: dtype must be ACL_FLOAT with quant_mode 3 (got ACL_UINT8)"),
    ("q3 scales 2-D", dict(quant=3, y=E4M3, dyn=arr((16,), F32)), INVALID, "dynamic_scales: must be 2-D (got shape (16,))"),
    ("q3 scales columns", dict(quant=3, y=E5M2, dyn=arr((16, 9), F32)), INVALID,
     "dynamic_scales: shape must be (>= A, ceil(H/128)) = (>= 16, 8) (got (16, 9))"),
    ("q3 scales rows", dict(quant=3, y=E5M2, dyn=arr((15, 8), F32)), INVALID,
     "dynamic_scales: shape must be (>= A, ceil(H/128)) = (>= 16, 8) (got (15, 8))"),
    ("q4 scales dtype", dict(quant=4, y=E4M3, dyn=arr((16, 32), F32)), INVALID,
     "dynamic_scales: dtype must be ACL_FLOAT8_E8M0 or ACL_UINT8 with quant_mode 4 (got ACL_FLOAT)"),
    ("q4 scales columns align2", dict(quant=4, y=E2M1, H=1056, dyn=arr((16, 33), E8M0)), INVALID,
     "dynamic_scales: shape must be (>= A, align2(ceil(H/32))) = (>= 16, 34) (got (16, 33))"),
    ("q5 scales rows", dict(quant=5, y=E4M3, dyn=arr((8, 32), U8)), INVALID,
     "dynamic_scales: shape must be (>= A, align2(ceil(H/32))) = (>= 16, 32) (got (8, 32))"),
    ("forwarded scales dtype", dict(x=E4M3, dyn=arr((16, 4), U8)), INVALID,
     "dynamic_scales: dtype must be ACL_FLOAT (scales' dtype for a low-precision x) (got ACL_UINT8)"),
    ("forwarded scales columns", dict(x=E4M3, dyn=arr((16, 5), F32)), INVALID,
     "dynamic_scales: shape must be (>= A, scales dim 1) = (>= 16, 4) (got (16, 5))"),
]


@pytest.mark.parametrize("kw,code,text", [pytest.param(kw, c, t, id=i) for i, kw, c, t in RULES])
@on_profile(A950)
def test_950_dispatch_rule(world, profile, kw, code, text):
    expect(d950(world, **kw), code, text)


@on_profile(A950)
def test_950_expand_x_of_a_low_precision_x(world, profile):
    c = d950(world, x=HIF8)
    c.tensors["expand_x"] = arr((16, 1024), E4M3)
    expect(c, INVALID, "expand_x: dtype must be ACL_HIFLOAT8 (x's dtype with quant_mode 0) (got ACL_FLOAT8_E4M3FN)")


@pytest.mark.parametrize("name,value,text", [
    ("elastic_info", np.zeros(8, np.int64), "elastic_info: dtype must be ACL_INT32 (got ACL_INT64)"),
    ("elastic_info", np.zeros(7, np.int32), "elastic_info: shape must be (4 + 2 * ep_world_size,) = (8,) (got (7,))"),
    ("elastic_info", np.zeros((2, 4), np.int32), "elastic_info: shape must be (4 + 2 * ep_world_size,) = (8,)"),
    ("performance_info", np.zeros(2, np.int32), "performance_info: dtype must be ACL_INT64 (got ACL_INT32)"),
    ("performance_info", np.zeros(3, np.int64), "performance_info: shape must be (ep_world_size,) = (2,) (got (3,))"),
])
@pytest.mark.parametrize("op", ["dispatch", "combine"])
@on_profile(A950)
def test_950_elastic_and_performance_info_rules(world, profile, op, name, value, text):
    c = DispatchCall(world) if op == "dispatch" else CombineCall(world)
    c.tensors[name] = value
    expect(c, INVALID, text)


@on_profile(A950)
def test_950_elastic_info_sizes_outputs_for_either_role(world, profile):
    # rank 0 is the shared rank (W=2, R=1, S=1, E=2, L=2): alone it needs A=8, 1 expert count, 2 recv
    # counts; with elastic_info it may serve the MoE role: A=16, 2 and 4
    base = dict(R=1, S=1, E=2)
    ok = dict(elastic_info=np.zeros(8, np.int32), expand_x=np.zeros((16, 1024), BF16),
              assist_info_for_combine=np.zeros(16 * 128, np.int32), expert_token_nums=np.zeros(2, np.int64),
              ep_recv_counts=np.zeros(4, np.int32))
    for name, value, text in [
        ("expand_x", np.zeros((8, 1024), BF16), "expand_x: shape must be (>= A, H) = (>= 16, 1024) (got (8, 1024))"),
        ("expert_token_nums", np.zeros(1, np.int64),
         "expert_token_nums: dim 0 must be max(L, 1) with elastic_info = 2 (got 1)"),
        ("ep_recv_counts", np.zeros(2, np.int32), "ep_recv_counts: dim 0 must be >= ep_world_size * L = 4 (got 2)"),
    ]:
        c = DispatchCall(world, **base)
        c.tensors.update(ok)
        c.tensors[name] = value
        expect(c, INVALID, text)
    for name, value, text in [
        ("expand_x", np.zeros((8, 1024), BF16), "expand_x: dim 0 must be >= A = 16 (got 8)"),
        ("ep_send_counts", np.zeros(2, np.int32), "ep_send_counts: dim 0 must be >= ep_world_size * L = 4 (got 2)"),
    ]:
        c = CombineCall(world, **base)
        c.tensors.update(elastic_info=np.zeros(8, np.int32), expand_x=np.zeros((16, 1024), BF16),
                         assist_info_for_combine=np.zeros(16 * 128, np.int32), ep_send_counts=np.zeros(4, np.int32))
        c.tensors[name] = value
        expect(c, INVALID, text)


@on_profile(A950)
def test_950_world_size_limit(world, profile):
    expect(DispatchCall(world, W=1025, E=1025), INVALID, "ep_world_size: must be in [2, 1024] on Ascend950 (got 1025)")
    expect(CombineCall(world, W=1025, E=1025), INVALID, "ep_world_size: must be in [2, 1024] on Ascend950 (got 1025)")
    # W = 1024 passes the range rule (and then fails against the 2-rank communicator)
    expect(DispatchCall(world, W=1024, E=1024), INVALID, "ep_world_size: must equal the rank count")
    expect(CombineCall(world, W=1024, E=1024), INVALID, "ep_world_size: must equal the rank count")


@on_profile(A950)
def test_950_combine_comm_quant_range(world, profile):
    expect(CombineCall(world, comm_quant=1), INVALID, "comm_quant_mode: must be 0, 2, 3 or 4 on Ascend950 (got 1)")
    expect(CombineCall(world, comm_quant=5), INVALID, "comm_quant_mode: must be 0, 2, 3 or 4 on Ascend950 (got 5)")


# ---- the A3 profile refuses every 950 feature with the A3 rule's message -------------------------------------
A3_DISPATCH = [
    ("static quant", dict(quant=1), "quant_mode: must be 0 or 2 on Ascend910_93, static quant is not supported (got 1)"),
    ("per-group quant", dict(quant=3), "quant_mode: must be 0 or 2 on Ascend910_93 (got 3)"),
    ("MX quant", dict(quant=4), "quant_mode: must be 0 or 2 on Ascend910_93 (got 4)"),
    ("MX clip quant", dict(quant=5), "quant_mode: must be 0 or 2 on Ascend910_93 (got 5)"),
]


@pytest.mark.parametrize("attrs,text", [pytest.param(a, t, id=i) for i, a, t in A3_DISPATCH])
def test_a3_refuses_950_quant_modes(world, attrs, text):
    expect(DispatchCall(world, **attrs), INVALID, text)


@pytest.mark.parametrize("x", [HIF8, E4M3, E5M2, E2M1, E1M2])
def test_a3_refuses_low_precision_x(world, x):
    c = DispatchCall(world)
    c.tensors["x"] = arr((4, 1024), x)
    c.tensors["scales"] = np.zeros((4, 4), np.float32)
    name = {HIF8: "ACL_HIFLOAT8", E4M3: "ACL_FLOAT8_E4M3FN", E5M2: "ACL_FLOAT8_E5M2", E2M1: "ACL_FLOAT4_E2M1",
            E1M2: "ACL_FLOAT4_E1M2"}[x]
    expect(c, INVALID, f"x: dtype must be ACL_FLOAT16 or ACL_BF16 on Ascend910_93 (got {name})")


@pytest.mark.parametrize("y", [E4M3, E5M2])
def test_a3_refuses_fp8_expand_x(world, y):
    c = DispatchCall(world, quant=2)
    c.tensors["expand_x"] = arr((16, 1024), y)
    expect(c, INVALID, "expand_x: dtype must be ACL_INT8 with quant_mode 2 (got ACL_FLOAT8_E")


def test_a3_refuses_2d_dynamic_scales(world):
    c = DispatchCall(world, quant=2)
    c.tensors["dynamic_scales"] = np.zeros((16, 8), np.float32)
    expect(c, INVALID, "dynamic_scales: must be 1-D (got shape (16, 8))")


@pytest.mark.parametrize("op", ["dispatch", "combine"])
@pytest.mark.parametrize("name,value", [("elastic_info", np.zeros(8, np.int32)),
                                        ("performance_info", np.zeros(2, np.int64))])
def test_a3_refuses_elastic_and_performance_info(world, op, name, value):
    c = DispatchCall(world) if op == "dispatch" else CombineCall(world)
    c.tensors[name] = value
    expect(c, INVALID, f"{name}: is reserved on Ascend910_93 and must be NULL (got a (")


@pytest.mark.parametrize("q", [3, 4])
def test_a3_refuses_mxfp8_comm_quant(world, q):
    expect(CombineCall(world, comm_quant=q), INVALID, f"comm_quant_mode: must be 0 or 2 on Ascend910_93 (got {q})")


def test_a3_world_size_limit(world):
    expect(DispatchCall(world, W=1000, E=1000), INVALID, "ep_world_size: must be in [2, 768] on Ascend910_93 (got 1000)")
    expect(CombineCall(world, W=769, E=769), INVALID, "ep_world_size: must be in [2, 768] on Ascend910_93 (got 769)")


def test_a3_window_has_no_950_term(world):
    need = 2 * (4 * 2560 * 2 * 2 + 4 * 2048 * 2)
    assert DispatchCall(world, ccl=need + (1 << 20)).run()[0] == 0   # the 950 needs W*1024 bytes more


@on_profile(A950)
def test_null_expand_x_still_nullptr_on_950(world, profile):
    c = d950(world, quant=4, y=E4M3)
    c.tensors["expand_x"] = NULL
    expect(c, NULLPTR, "expand_x: must not be NULL")


# =================================================================================================================
# SoC names by family: a suffixed name selects its family's profile (aclrtGetSocName: tests/mock/test_soc_profiles.py)
# =================================================================================================================

def _mx_call(world):
    """A dispatch with quant mode 4 (MX, Ascend950 only)."""
    c = DispatchCall(world, quant=4)
    c.tensors["expand_x"] = RawDesc((16, 1024), E4M3)
    c.tensors["dynamic_scales"] = np.zeros((16, 32), np.uint8)
    return c


@on_profile(A3)
@pytest.mark.parametrize("name", ["Ascend910_93", "Ascend910_9391", "Ascend910_9392", "ascend910_9391"])
def test_soc_name_of_the_a3_family(acl, mock, world, profile, name):
    mock.set_soc(name)
    assert acl.soc_name() == name                 # reported exactly as given
    assert mock.soc() == "Ascend910_93"           # the profile
    expect(_mx_call(world), INVALID, "quant_mode: must be 0 or 2 on Ascend910_93 (got 4)")
    expect(DispatchCall(world, W=769, E=769), INVALID, "ep_world_size: must be in [2, 768] on Ascend910_93")


@on_profile(A950)
@pytest.mark.parametrize("name", ["Ascend950", "Ascend950PR_9599", "ASCEND950DT"])
def test_soc_name_of_the_950_family(acl, mock, world, profile, name):
    mock.set_soc(name)
    assert acl.soc_name() == name
    assert mock.soc() == "Ascend950"
    ret, msg = _mx_call(world).run()
    assert ret == 0, msg
    expect(DispatchCall(world, W=1025, E=1025), INVALID, "ep_world_size: must be in [2, 1024] on Ascend950 (got 1025)")
