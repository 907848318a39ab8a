"""Status codes → typed exceptions."""

from __future__ import annotations

import pickle

import pytest

from aclnn_py import errors


@pytest.mark.parametrize("code,cls,name", [
    (161001, errors.AclnnError.ParamNullptr, "ACLNN_ERR_PARAM_NULLPTR"),
    (161002, errors.AclnnError.ParamInvalid, "ACLNN_ERR_PARAM_INVALID"),
    (361001, errors.AclnnError.RuntimeError, "ACLNN_ERR_RUNTIME_ERROR"),
    (561103, errors.AclnnError.InnerError, "ACLNN_ERR_INNER_NULLPTR"),
])
def test_aclnn_codes(code, cls, name):
    e = errors.aclnn_error(code, "aclnnX", "why")
    assert type(e) is cls and isinstance(e, errors.AclnnError)
    assert (e.code, e.name, e.func, e.message) == (code, name, "aclnnX", "why")
    assert str(e) == f"aclnnX failed with {name} ({code}): why"


def test_param_invalid_is_a_value_error():
    assert isinstance(errors.param_invalid("f", "m"), ValueError)


def test_runtime_code_from_an_op_launch_becomes_acl_timeout():
    e = errors.aclnn_error(507014, "aclrtSynchronizeStream", "peers [3] never arrived")
    assert isinstance(e, errors.AclError.Timeout) and e.name == "ACL_ERROR_RT_AICORE_TIMEOUT"


def test_hccl_timeout_class():
    e = errors.hccl_error(9, "HcclCommInitRootInfo", "ranks [1] never joined")
    assert isinstance(e, errors.HcclError.Timeout) and isinstance(e, TimeoutError)
    assert e.name == "HCCL_E_TIMEOUT"


def test_unknown_codes_keep_the_number():
    assert errors.acl_error(123456, "f", "").name == "ACL_ERROR_123456"
    assert errors.hccl_error(777, "f", "").name == "HCCL_E_777"


@pytest.mark.parametrize("exc", [
    errors.aclnn_error(161002, "aclnnMoeDistributeDispatchV5GetWorkspaceSize", "moe_expert_num: bad"),
    errors.acl_error(507046, "aclrtSynchronizeStreamWithTimeout", "timed out"),
    errors.hccl_error(9, "HcclCommInitRootInfo", "ranks [2] never joined"),
])
def test_errors_pickle_with_type_and_text(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert (back.code, back.name, back.func, back.message, str(back)) == (
        exc.code, exc.name, exc.func, exc.message, str(exc))


def test_check_functions_pass_zero_and_raise_otherwise():
    errors.check_acl(0, "f")
    errors.check_aclnn(0, "f")
    errors.check_hccl(0, "f")
    with pytest.raises(errors.AclError):
        errors.check_acl(100000, "f")
    with pytest.raises(errors.HcclError):
        errors.check_hccl(1, "f")
