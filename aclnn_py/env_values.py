"""The environment variables aclnn-py and the mock read, each with the values it accepts. A value that
cannot be read is refused by name (:class:`~aclnn_py.errors.EnvironmentValueError`), never replaced by a
default: ``init()`` checks them before loading a backend (the mock's own ACLNN_MOCK_* when it loads the
mock), and the command line checks them before running a command. The mock's C libraries apply the same rules to the variables they read (mock/runtime/env.cpp),
so a C program gets the refusal as a status and ``aclGetRecentErrMsg``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

from . import socs
from .errors import EnvironmentValueError

_WHOLE = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
_POISON = ("0", "1", "on", "off", "true", "false", "yes", "no", "stripe")
MAX_BUFFSIZE_MIB = 1 << 20
MAX_MOCK_DEVICES = 1024


class Rule(NamedTuple):
    """What a variable accepts: `ok` decides on its value (surrounding blanks removed), `accepted`
    says what it takes, for the message."""

    ok: Callable[[str], bool]
    accepted: str


def _whole(lo: int, hi: int) -> Rule:
    return Rule(lambda v: bool(_WHOLE.fullmatch(v)) and lo <= int(v) <= hi, f"a whole number in [{lo}, {hi}]")


def _seconds(zero_ok: bool) -> Rule:
    def ok(v: str) -> bool:
        if not _DECIMAL.fullmatch(v):
            return False
        d = float(v)
        return math.isfinite(d) and (d > 0 or (zero_ok and d == 0))

    return Rule(ok, "a number of seconds >= 0 (0: no limit)" if zero_ok else "a number of seconds > 0")


def _one_of(*choices: str, case: bool = False) -> Rule:
    def ok(v: str) -> bool:
        return (v if case else v.lower()) in choices

    return Rule(ok, ", ".join(choices[:-1]) + " or " + choices[-1])


_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(?:[Rr][Cc])?\d+(?:\.[0-9A-Za-z]+)?$")


def cann_release(value: str) -> tuple[int, int] | None:
    """(major, minor) of a CANN release number (``8.3.RC1``, ``8.5.0``); None for "" or "newest" (the
    newest rules); ValueError for anything else."""
    if value == "" or value.lower() == "newest":
        return None
    m = _RELEASE.match(value)
    if not m or int(m.group(1)) < 1:
        raise ValueError(value)
    return int(m.group(1)), int(m.group(2))


def _release(v: str) -> bool:
    try:
        cann_release(v)
    except ValueError:
        return False
    return True


#: Every variable with a fixed grammar. ACLNN_PY_BACKEND, ACLNN_PY_MOCK_ROOT and the CANN paths name
#: places, and are checked where they are used (the loader).
RULES: Mapping[str, Rule] = {
    "HCCL_BUFFSIZE": _whole(1, MAX_BUFFSIZE_MIB),
    "HCCL_EXEC_TIMEOUT": _seconds(zero_ok=True),
    "HCCL_CONNECT_TIMEOUT": _seconds(zero_ok=False),
    "ACLNN_MOCK_DEVICE_COUNT": _whole(1, MAX_MOCK_DEVICES),
    "ACLNN_MOCK_POISON": _one_of(*_POISON),
    "ACLNN_MOCK_SOC": Rule(lambda v: socs.family_of(v) is not None, "a name beginning with " + socs.accepted()),
    "ACLNN_MOCK_CANN_VERSION": Rule(_release, "a CANN release such as 8.3.RC1 or 8.5.0, or newest"),
    "ACLNN_PY_POOL": _one_of("0", "1", case=True),
    "ACLNN_PY_SKIP_ABI_CHECK": _one_of("0", "1", case=True),
    "ACLNN_PY_ABI_CHECK": _one_of("warn", "strict"),
}


def problem(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """One line saying why variable `name` cannot be read, or None (unset and empty read as unset)."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    rule = RULES[name]
    if rule.ok(raw.strip()):
        return None
    return f"{name}={raw!r} cannot be read: give {rule.accepted}"


def check(environ: Mapping[str, str] | None = None, *, mock: bool = True) -> None:
    """Raise EnvironmentValueError for the first variable of RULES whose value cannot be read; with
    `mock` False the mock's own variables (ACLNN_MOCK_*), which only the mock reads, are left out."""
    for name in RULES:
        if not mock and name.startswith("ACLNN_MOCK_"):
            continue
        why = problem(name, environ)
        if why is not None:
            raise EnvironmentValueError(why, variable=name)


def flag(name: str, default: bool) -> bool:
    """A 0/1 variable's value; `default` when unset (or when it cannot be read: check() refuses that
    before anything uses the answer)."""
    raw = os.environ.get(name, "").strip()
    return default if raw not in ("0", "1") else raw == "1"


__all__ = ["MAX_BUFFSIZE_MIB", "MAX_MOCK_DEVICES", "RULES", "Rule", "check", "flag", "problem"]
