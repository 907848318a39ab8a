"""The CANN-style op samples of examples/cann_samples, compiled with one compiler line against the mock
root (only -I and -L flags and CANN's library names) and run on it unmodified, as a user would build
them against a CANN install: the V5 sample (EP 8, contexts + HcclCommInitAll) and the V2 sample
(EP 8 x TP 2 = 16 threads, group names), the V3 sample of a dynamic shrink on Atlas A3 (EP 4, one device
taken out after HcclCommInitAll) and the V4 sample on Atlas A2 (a rank table, HcclCommInitClusterInfo,
performanceInfo; a one-server world the newest rules accept and CANN 8.3.RC1's refuse)."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

from helpers.toolchain import cxx_compiler

import aclnn_py

SAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cann_samples"


def _root() -> Path:
    return Path(aclnn_py.mock_root())


def _op_lib_dir(root: Path) -> Path:
    found = sorted(root.glob("opp/vendors/*/op_api/lib/libcust_opapi.so"))
    assert found, f"no op library under {root}/opp/vendors"
    return found[0].parent


def _cann_env(root: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, ASCEND_HOME_PATH=str(root), **extra)
    env["LD_LIBRARY_PATH"] = ":".join(
        filter(None, [f"{root}/lib64", str(_op_lib_dir(root)), env.get("LD_LIBRARY_PATH")]))
    for var in ("ACLNN_MOCK_DEVICE_COUNT", "ACLNN_MOCK_SOC", "ACLNN_MOCK_POISON", "ACLNN_MOCK_CANN_VERSION"):
        if var not in extra:
            env.pop(var, None)
    return env


def _build(source: str, tmp_path: Path) -> Path:
    cxx = cxx_compiler()
    root = _root()
    exe = tmp_path / Path(source).stem
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{root}/include", str(SAMPLES / source),
           f"-L{root}/lib64", f"-L{_op_lib_dir(root)}", "-lcust_opapi", "-lnnopbase", "-lhccl", "-lascendcl",
           "-pthread", "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, " ".join(cmd) + "\n" + res.stderr
    return exe


def _run(exe: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=240, env=_cann_env(_root(), **env),
                          check=False)


def test_v5_sample_runs_unmodified_on_the_mock_root(tmp_path: Path) -> None:
    res = _run(_build("moe_dispatch_combine_v5.cpp", tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "[INFO] all 8 ranks passed"
    matched = sorted(int(ln.split()[2].rstrip(":")) for ln in lines if "match the host" in ln)
    assert matched == list(range(8))


def test_v5_sample_reports_a_missing_device(tmp_path: Path) -> None:
    """With 4 devices the sample's aclrtSetDevice(4) fails: the program prints the call and CANN's
    message and exits non-zero, without a hang."""
    res = _run(_build("moe_dispatch_combine_v5.cpp", tmp_path), ACLNN_MOCK_DEVICE_COUNT="4")
    assert res.returncode != 0
    assert "aclrtSetDevice" in res.stdout and "deviceId must be in [0, 4) (got 4)" in res.stdout, res.stdout


def _v2_missing_reason(root: Path) -> str | None:
    """What the mock root lacks of the V2 generation, or None."""
    headers = [root / "include" / "aclnnop" / f"aclnn_moe_distribute_{op}_v2.h" for op in ("dispatch", "combine")]
    absent = [h.name for h in headers if not h.is_file()]
    if absent:
        return f"the mock root has no {', '.join(absent)} (the V2 generation is not in this build)"
    lib = ctypes.CDLL(str(_op_lib_dir(root) / "libcust_opapi.so"))
    symbols = ["aclnnMoeDistributeDispatchV2GetWorkspaceSize", "aclnnMoeDistributeCombineV2GetWorkspaceSize"]
    missing = [s for s in symbols if not hasattr(lib, s)]
    if missing:
        return f"libcust_opapi.so of the mock root does not export {', '.join(missing)}"
    return None


def test_v2_sample_ep8_tp2_runs_unmodified_on_the_mock_root(tmp_path: Path) -> None:
    # every build has the V2 generation: its absence is a failure, not a reason to skip
    missing = _v2_missing_reason(_root())
    assert missing is None, missing
    res = _run(_build("moe_dispatch_combine_v2.cpp", tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "[INFO] all 16 ranks passed"
    matched = sorted(int(ln.split()[2]) for ln in lines if "match the host" in ln)
    assert matched == list(range(16))


def test_v3_shrink_sample_runs_on_the_live_ranks(tmp_path: Path) -> None:
    res = _run(_build("moe_dispatch_combine_v3_shrink.cpp", tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "[INFO] all 3 live ranks passed"
    matched = sorted(int(ln.split()[2].rstrip(":")) for ln in lines if "match the host" in ln)
    assert matched == [0, 1, 2]


def _rank_table(tmp_path: Path, ranks: int) -> Path:
    import json

    devices = [{"device_id": str(r), "device_ip": f"192.168.1.{r}", "rank_id": str(r)} for r in range(ranks)]
    table = tmp_path / "rank_table.json"
    table.write_text(json.dumps({"version": "1.0", "server_count": "1", "status": "completed",
                                 "server_list": [{"server_id": "10.0.0.1", "device": devices}]}))
    return table


def test_v4_a2_sample_under_both_rule_sets(tmp_path: Path) -> None:
    """Atlas A2, EP 4 on one server: the newest rules accept it and every rank reaches its success line;
    as CANN 8.3.RC1 phase 1 refuses it with 161002 and the message the program prints."""
    exe = _build("moe_dispatch_combine_v4_a2.cpp", tmp_path)
    env = dict(ACLNN_MOCK_SOC="Ascend910B2", RANK_TABLE_FILE=str(_rank_table(tmp_path, 4)), FIRST_RANK_ID="0")
    res = _run(exe, **env)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "[INFO] all 4 ranks passed"
    assert sorted(int(ln.split()[2].rstrip(":")) for ln in lines if "match the host" in ln) == [0, 1, 2, 3]
    old = _run(exe, ACLNN_MOCK_CANN_VERSION="8.3.RC1", **env)
    assert old.returncode == 1
    assert ("ret = 161002: ep_world_size: must be 16, 32, 64, 128 or 256 (the CANN 8.3.RC1 rules) on Ascend910B "
            "(got 4)") in old.stdout
    assert old.stdout.strip().splitlines()[-1] == "[ERROR] 4 of 4 ranks failed"
