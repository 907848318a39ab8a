"""Contexts, aclrtResetDevice, HcclCommInitAll and HcclCommInitClusterInfo from a plain C program
(tests/c/test_contexts_comms.c) compiled against the mock root with one compiler line: only -I and
-L flags and CANN's library names, as a user's program would be built against a CANN install."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers.toolchain import c_compiler

import aclnn_py

SRC = Path(__file__).resolve().parent / "c"


def _cann_env(root: Path) -> dict[str, str]:
    env = dict(os.environ, ASCEND_HOME_PATH=str(root))
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [f"{root}/lib64", env.get("LD_LIBRARY_PATH")]))
    for var in ("ACLNN_MOCK_DEVICE_COUNT", "ACLNN_MOCK_SOC", "ACLNN_MOCK_POISON"):
        env.pop(var, None)
    return env


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(aclnn_py.mock_root())
    exe = tmp_path_factory.mktemp("contexts_comms") / "test_contexts_comms"
    cmd = [c_compiler(), "-std=c99", "-O1", "-Wall", "-Werror", f"-I{root}/include", f"-I{SRC}",
           str(SRC / "test_contexts_comms.c"), f"-L{root}/lib64", "-lhccl", "-lascendcl", "-pthread",
           "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, " ".join(cmd) + "\n" + res.stderr
    return exe


def test_contexts_and_communicators_from_c(program: Path, tmp_path: Path) -> None:
    root = Path(aclnn_py.mock_root())
    res = subprocess.run([str(program), str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env=_cann_env(root), check=False)
    lines = res.stdout.strip().splitlines()
    assert lines, res.stderr
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", lines[-1])
    assert m and m.group(2) == "0" and res.returncode == 0, res.stdout + res.stderr
    assert int(m.group(1)) > 80


def test_rank_table_world_of_separate_processes(program: Path, tmp_path: Path) -> None:
    """Three processes given the same rank table meet in one world, each as the rank it names."""
    table = tmp_path / "rank_table.json"
    devices = [{"device_id": str(d), "device_ip": f"192.168.1.{d}", "rank_id": str(r)}
               for r, d in enumerate((4, 2, 7))]
    table.write_text(json.dumps({"version": "1.0", "server_count": "1", "status": "completed",
                                 "server_list": [{"server_id": "10.0.0.1", "device": devices}]}, indent=2))
    env = dict(_cann_env(Path(aclnn_py.mock_root())), HCCL_CONNECT_TIMEOUT="20")   # a world that never forms fails
    procs = [subprocess.Popen([str(program), "--table-rank", str(table), str(r), d["device_id"]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r, d in enumerate(devices)]
    outs = [p.communicate(timeout=60) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err
        assert out.strip() == f"rank {r} of 3"
