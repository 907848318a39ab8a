"""The build tools the tests that compile C and C++ use: the compiler named by CC / CXX, else the usual
names, and cmake. A machine without one skips those tests, saying which tool is missing; .ci/run sets
ACLNN_PY_TESTS_NEED_TOOLCHAIN=1, which turns that skip into a failure, so CI cannot pass by skipping
them."""

from __future__ import annotations

import os
import shutil

import pytest


def missing(reason: str) -> None:
    """Skip (or, where the toolchain is required, fail) the calling test for a missing tool."""
    if os.environ.get("ACLNN_PY_TESTS_NEED_TOOLCHAIN") == "1":
        pytest.fail(f"{reason}, and ACLNN_PY_TESTS_NEED_TOOLCHAIN=1 requires it")
    pytest.skip(reason)


def _first(what: str, names: tuple[str, ...]) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    missing(f"no {what} (looked for {', '.join(names)})")
    raise AssertionError("unreachable")


def c_compiler() -> str:
    """The C compiler's path: $CC, else cc, gcc, clang."""
    return _first("C compiler", (os.environ.get("CC", "cc"), "gcc", "clang"))


def cxx_compiler() -> str:
    """The C++ compiler's path: $CXX, else c++, g++, clang++."""
    return _first("C++ compiler", (os.environ.get("CXX", "c++"), "g++", "clang++"))


def cmake() -> str:
    """cmake's path."""
    return _first("cmake", ("cmake",))
