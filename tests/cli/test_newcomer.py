"""What a newcomer meets first: demo --json refusals as JSON, a model the operators refuse refused
before any rank starts, moe_round's arguments, acl.dtypes typed for a type checker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.root_copies import run_cli
from helpers.toolchain import c_compiler


@pytest.mark.parametrize(("argv", "error"), [
    (("demo", "--json", "--hidden", "100"),
     "aclnn-py demo: error: the operator rejects this model: x: dim 1 (H) must be in [1024, 8192] (got 100)"),
    (("demo", "--json", "--seed", "-1"),
     "aclnn-py demo: error: argument --seed: must be >= 0 (got -1) (see aclnn-py demo --help)"),
    (("demo", "--json", "--soc", "Ascend310P3"), "aclnn-py demo: error: --soc 'Ascend310P3' is of no known SoC family"),
    (("doctor", "--json", "--no-such-option"), "aclnn-py: error: unrecognized arguments: --no-such-option"),
])
def test_json_refusals_are_one_json_document(argv, error):
    done = run_cli(*argv)
    assert done.returncode == 2 and done.stderr == "", done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["result"] == "USAGE_ERROR" and doc["exit_code"] == 2
    assert doc["error"].startswith(error), doc["error"]


def test_text_refusal_unchanged_without_json():
    done = run_cli("demo", "--hidden", "100")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("aclnn-py demo: error: the operator rejects this model: x: dim 1 (H) must be in "
                           "[1024, 8192] (got 100)\n")


def test_a_refused_size_starts_no_rank():
    done = run_cli("demo", "--hidden", "100", "--world-size", "2", "--experts", "4", "--topk", "2")
    assert done.returncode == 2
    assert "starting" not in done.stderr and "joining the communicator" not in done.stderr, done.stderr


def test_a2_size_rule_is_checked_before_ranks_too():
    done = run_cli("demo", "--hidden", "100", ACLNN_MOCK_SOC="Ascend910B3")
    assert done.returncode == 2
    assert done.stderr.startswith("aclnn-py demo: error: the operator rejects this model: x: dim 1 (H) must be a "
                                  "multiple of 32 in [32, 7168] on Ascend910B"), done.stderr


def test_dtypes_are_typed_for_a_type_checker(tmp_path: Path):
    pytest.importorskip("mypy")
    src = tmp_path / "use.py"
    src.write_text("import aclnn_py as acl\nreveal_type(acl.dtypes.bfloat16)\nreveal_type(acl.dtypes.float8_e4m3fn)\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", str(src)], capture_output=True,
                          text=True, cwd=tmp_path, check=False)
    notes = [ln for ln in done.stdout.splitlines() if "Revealed type" in ln]
    assert notes and all('"numpy.dtype[Any]"' in ln for ln in notes), done.stdout


def test_moe_round_arguments(tmp_path: Path):
    import aclnn_py

    cc = c_compiler()
    root = Path(aclnn_py.mock_root()).resolve()
    ops = root / "opp" / "vendors" / "custom_transformer" / "op_api" / "lib"
    src = Path(__file__).resolve().parents[2] / "examples" / "c_client" / "moe_round.c"
    exe = tmp_path / "moe_round"
    built = subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{root}/include", str(src), f"-L{root}/lib64",
                            f"-L{ops}", "-lcust_opapi", "-lnnopbase", "-lhccl", "-lascendcl", "-pthread", "-o", str(exe)],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    env = {"LD_LIBRARY_PATH": f"{root}/lib64:{ops}", "PATH": "/usr/bin:/bin"}
    work = tmp_path / "cwd"
    work.mkdir()
    bare = subprocess.run([str(exe)], capture_output=True, text=True, cwd=work, env=env, check=False, timeout=60)
    assert bare.returncode == 2 and list(work.iterdir()) == []
    assert bare.stderr.startswith("moe_round: name the output folder (out_dir)\nusage: moe_round out_dir"), bare.stderr
    word = subprocess.run([str(exe), "out", "abc"], capture_output=True, text=True, cwd=work, env=env, check=False,
                          timeout=60)
    assert word.returncode == 2 and not (work / "out").exists()
    assert word.stderr.startswith("moe_round: world_size must be a whole number in [2, 1024] (got 'abc')")
    ok = subprocess.run([str(exe), "out", "2", "8", "1024", "2", "4"], capture_output=True, text=True, cwd=work,
                        env=env, check=False, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == "OK 2 ranks", ok.stdout + ok.stderr
    assert len(list((work / "out").glob("*.npy"))) == 18
