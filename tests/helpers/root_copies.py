"""Helpers for tests that treat a copy of the mock root as a real CANN root, in child interpreters
(one backend per process)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import package_pythonpath

OP_INCLUDE = "opp/vendors/custom_transformer/op_api/include"
DISPATCH_HEADER = "aclnn_moe_distribute_dispatch_v5.h"
COMBINE_HEADER = "aclnn_moe_distribute_combine_v5.h"


def copy_mock_root(dest: Path) -> Path:
    """A full copy of the package's mock root (libraries, headers, version file) at `dest`."""
    from aclnn_py._binding import loader as _loader

    shutil.copytree(_loader.mock_root(), dest, symlinks=False)
    return dest


def group_string_dispatch(text: str) -> str:
    """The draft V5 dispatch header shape: ``groupEp`` after performanceInfoOptional and ``groupTp``
    in place of ``cclBufferSize``."""
    out = re.sub(r"(const aclTensor \*performanceInfoOptional,)", r"\1 const char *groupEp,", text, count=1)
    out = out.replace("int64_t cclBufferSize", "const char *groupTp", 1)
    assert out != text and "groupEp" in out and "groupTp" in out
    return out


def unclosed_extern_c(text: str) -> str:
    """The header with its ``#ifdef __cplusplus`` / ``extern "C" {`` block left without its ``#endif``:
    the rest of the file reads as C++-only, so its C declarations are hidden."""
    opening = '#ifdef __cplusplus\nextern "C" {\n#endif\n'
    assert opening in text
    return text.replace(opening, '#ifdef __cplusplus\nextern "C" {\n', 1)


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("ACLNN_PY_BACKEND", "ACLNN_PY_SKIP_ABI_CHECK", "ACLNN_PY_ABI_CHECK"):
        env.pop(name, None)
    env.update(extra)
    env["PYTHONPATH"] = package_pythonpath(env)
    return env


def run_python(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=child_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def run_cli(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m aclnn_py <args>`` as a user runs it (the console script is the same entry point)."""
    return subprocess.run([sys.executable, "-m", "aclnn_py", *args], env=child_env(**env), capture_output=True,
                          text=True, timeout=timeout)
