"""Phase-1 checks of the Ascend950 profile (SPEC §3 950 notes, §4.6, §4.7, §5, §11): every 950-only rule
of the mock's dispatch and combine has a negative test asserting status and message, every 950
feature requested on the A3 profile is refused with the A3 rule's message, and the valid 950 calls
pass. Starting point as in test_dispatch_checks.py: rank 0 of a 2-rank world, W=2, E=4, BS=4,
H=1024, K=2 (A=16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers.moe_calls import BF16, NULL, CombineCall, DispatchCall, RawDesc, World2

NULLPTR, INVALID = 161001, 161002
F32, F16, I8, I32, U8, I64, BF = 0, 1, 2, 3, 4, 9, 27
HIF8, E5M2, E4M3, E8M0, E2M1, E1M2 = 34, 35, 36, 37, 40, 41
NP = {E4M3: np.dtype(ml_dtypes.float8_e4m3fn), E5M2: np.dtype(ml_dtypes.float8_e5m2), I8: np.dtype(np.int8),
      F32: np.dtype(np.float32), U8: np.dtype(np.uint8), E8M0: np.dtype(ml_dtypes.float8_e8m0fnu)}


@pytest.fixture(scope="module")
def world(acl):
    w = World2()
    yield w
    w.close()


@pytest.fixture
def soc950(mock):
    mock.set_soc("Ascend950")
    yield
    mock.set_soc("Ascend910_93")


def expect(call, code, *texts):
    ret, msg = call.run()
    assert ret == code, f"status {ret}, message {msg!r}"
    for t in texts:
        assert t in msg, f"{t!r} not in {msg!r}"
    return msg


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


# ---- valid 950 calls --------------------------------------------------------------------------------------------
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
def test_valid_950_calls_pass(world, soc950, kw):
    ret, msg = d950(world, **kw).run()
    assert ret == 0, msg


def test_valid_elastic_and_performance_info(world, soc950):
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


# ---- every 950-only dispatch rule --------------------------------------------------------------------------------
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
def test_950_dispatch_rule(world, soc950, kw, code, text):
    expect(d950(world, **kw), code, text)


def test_950_expand_x_of_a_low_precision_x(world, soc950):
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
def test_950_elastic_and_performance_info_rules(world, soc950, op, name, value, text):
    c = DispatchCall(world) if op == "dispatch" else CombineCall(world)
    c.tensors[name] = value
    expect(c, INVALID, text)


def test_950_elastic_info_sizes_outputs_for_either_role(world, soc950):
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


def test_950_world_size_limit(world, soc950):
    expect(DispatchCall(world, W=1025, E=1025), INVALID, "ep_world_size: must be in [2, 1024] on Ascend950 (got 1025)")
    expect(CombineCall(world, W=1025, E=1025), INVALID, "ep_world_size: must be in [2, 1024] on Ascend950 (got 1025)")
    # W = 1024 passes the range rule (and then fails against the 2-rank communicator)
    expect(DispatchCall(world, W=1024, E=1024), INVALID, "ep_world_size: must equal the rank count")
    expect(CombineCall(world, W=1024, E=1024), INVALID, "ep_world_size: must equal the rank count")


def test_950_combine_comm_quant_range(world, soc950):
    expect(CombineCall(world, comm_quant=1), INVALID, "comm_quant_mode: must be 0, 2, 3 or 4 on Ascend950 (got 1)")
    expect(CombineCall(world, comm_quant=5), INVALID, "comm_quant_mode: must be 0, 2, 3 or 4 on Ascend950 (got 5)")


# ---- the A3 profile refuses every 950 feature with the A3 rule's message ----------------------------------------
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


def test_null_expand_x_still_nullptr_on_950(world, soc950):
    c = d950(world, quant=4, y=E4M3)
    c.tensors["expand_x"] = NULL
    expect(c, NULLPTR, "expand_x: must not be NULL")
