"""ACLNN_MOCK_CANN_VERSION: the mock answers as an older CANN release where the published rules differ
(docs/testing_with_the_mock.md, "The CANN release"). The value is read like the other settings (the
environment at first use, aclnn_py._mock.set_cann_version in a process); the Python pre-checks and
the C side parse it alike; a value that is no release stops aclInit with one line naming the variable
and the accepted values; doctor prints the active rule set. Each rule that differs is tested under both
settings where it lives (tests/ops/test_a2_profile.py, tests/test_a2_readme.py)."""

from __future__ import annotations

import pytest
from helpers.root_copies import run_cli, run_python

from aclnn_py.ops import releases

ACCEPTED = ["8.3.RC1", "8.2.RC1", "8.0.0", "7.7.0", "8.3.rc2", "8.5.0", "8.5.0.alpha001", "9.0.0", "10.1.RC3",
            "newest", "NEWEST", ""]
REFUSED = ["abc", "8", "8.3", "8.3.", "8.3.RCx", "-5", "1.5", "0.1.0", "8..0", "8.3.RC1.", " 8.3.RC1", "8.+3.0"]


@pytest.mark.parametrize("value", ACCEPTED)
def test_release_values_accepted_alike(mock, value):
    want = releases.rules_of(value)
    mock.set_cann_version(value)
    try:
        assert mock.cann_rules() == want.name
        assert releases.active() is want
    finally:
        mock.set_cann_version("")
    assert want is (releases.R8_3 if value[:1] in ("7",) or value.startswith(("8.0", "8.2", "8.3")) else releases.NEWEST)


@pytest.mark.parametrize("value", REFUSED)
def test_unreadable_values_refused_alike(mock, value):
    with pytest.raises(ValueError) as py:
        releases.rules_of(value)
    with pytest.raises(ValueError) as c:
        mock.set_cann_version(value)
    text = f"ACLNN_MOCK_CANN_VERSION='{value}' is refused: must be a CANN release such as 8.3.RC1 or 8.5.0"
    assert text in str(py.value) and text in str(c.value)
    assert mock.cann_rules() == "newest"   # a refused value changes nothing
    from aclnn_py import (
        env_values,  # init() refuses it before the mock loads, in the same words as the others
    )

    refused = env_values.problem("ACLNN_MOCK_CANN_VERSION", {"ACLNN_MOCK_CANN_VERSION": value}) is not None
    assert refused == (value == value.strip())  # an environment value is read between its blanks


def test_environment_selects_the_rules_on_the_c_path():
    """Under ACLNN_MOCK_CANN_VERSION=8.3.RC1 a C caller meets that release's A2 world sizes; by default
    the newest ones (the rule passes; only the communicator's size differs)."""
    code = ("import aclnn_py as acl\n"
            "from aclnn_py import _mock\n"
            "acl.init('mock')\n"
            "print(_mock.cann_rules(), _mock.cann_version())\n")
    assert run_python(code).stdout.split() == ["newest"]
    assert run_python(code, ACLNN_MOCK_CANN_VERSION="8.3.RC1").stdout.split() == ["8.3.RC1", "8.3.RC1"]
    assert run_python(code, ACLNN_MOCK_CANN_VERSION="8.5.0").stdout.split() == ["newest", "8.5.0"]


def test_unreadable_environment_value_is_one_line_and_a_typed_error():
    code = ("import aclnn_py as acl\n"
            "try:\n"
            "    acl.init('mock')\n"
            "except acl.errors.EnvironmentValueError as e:\n"
            "    print(type(e).__name__)\n"
            "    print(str(e))\n")
    out = run_python(code, ACLNN_MOCK_CANN_VERSION="abc").stdout.splitlines()
    assert out == ["EnvironmentValueError", "ACLNN_MOCK_CANN_VERSION='abc' cannot be read: give a CANN release such "
                   "as 8.3.RC1 or 8.5.0, or newest"]


def test_doctor_prints_the_active_rule_set():
    out = run_cli("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rules      newest (ACLNN_MOCK_CANN_VERSION unset: the default;" in out.stdout
    old = run_cli("doctor", ACLNN_MOCK_CANN_VERSION="8.3.RC1")
    assert "rules      8.3.RC1 (ACLNN_MOCK_CANN_VERSION=8.3.RC1; the aclnnMoeDistribute*.md of CANN 8.3.RC1" \
        in old.stdout
    bad = run_cli("doctor", ACLNN_MOCK_CANN_VERSION="8.3")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == ("aclnn-py doctor: error: ACLNN_MOCK_CANN_VERSION='8.3' cannot be read: give a CANN "
                          "release such as 8.3.RC1 or 8.5.0, or newest\n")
