"""The examples are built and run against the mock CANN root, like a user would on real CANN:

* examples/c_client: a plain C99 program (CMake, pthreads) that finds CANN through ASCEND_HOME_PATH,
  builds the context tensor itself through HCCL's KFC calls and runs dispatch → expert → combine on
  W thread ranks; its .npy outputs must equal :mod:`aclnn_py.golden` bit for bit.
* examples/cpp_embed: a C++ server that owns device memory and a stream, embeds Python and hands raw
  addresses / the stream handle to aclnn-py from two serving threads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from conftest import package_pythonpath
from helpers.toolchain import c_compiler, cmake, cxx_compiler

import aclnn_py
from aclnn_py import golden
from aclnn_py.dtypes import bfloat16

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _need_toolchain(cxx: bool = False) -> None:
    cmake()
    if cxx:
        cxx_compiler()
    else:
        c_compiler()


def _cmake(src: Path, build: Path, *defs: str, env: dict[str, str] | None = None) -> None:
    cmd = ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *defs]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True, env=env,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def _cann_env() -> dict[str, str]:
    """The environment a CANN program sees after `source set_env.sh`, with the mock as the root."""
    root = str(aclnn_py.mock_root())
    env = dict(os.environ, ASCEND_HOME_PATH=root, ASCEND_OPP_PATH=f"{root}/opp")
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [f"{root}/lib64", env.get("LD_LIBRARY_PATH")]))
    env.pop("ACLNN_MOCK_POISON", None)
    return env


# ------------------------------------------------------------------------------------------ C client

@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_toolchain()
    build = tmp_path_factory.mktemp("c_client")
    # no -DASCEND_HOME_PATH: CMakeLists.txt finds CANN from the environment, as for a real install
    _cmake(EXAMPLES / "c_client", build, env=_cann_env())
    return build / "moe_round"


def expert_reference(rank: int, expand_x: np.ndarray, expert_token_nums: np.ndarray) -> np.ndarray:
    """The C client's expert: y = bf16(f32(x) * (1 + 0.25 j) + 0.125 r) for local expert j."""
    out = np.empty(expand_x.shape, np.float32)
    start = 0
    for j, n in enumerate(np.asarray(expert_token_nums, np.int64).tolist()):
        rows = expand_x[start:start + n].astype(np.float32)
        out[start:start + n] = rows * np.float32(1 + 0.25 * j) + np.float32(0.125 * rank)
        start += n
    return out[:start].astype(bfloat16)


def _load(out: Path, rank: int, name: str) -> np.ndarray:
    a = np.load(out / f"rank{rank}_{name}.npy")
    return a.view(bfloat16) if a.dtype == np.uint16 else a


@pytest.mark.parametrize(("world", "tokens", "hidden", "topk", "experts", "seed"),
                         [(4, 8, 1024, 4, 8, 0), (2, 5, 2048, 3, 6, 7), (8, 16, 1024, 8, 16, 3)])
def test_c_client_matches_golden(c_client: Path, tmp_path: Path, world: int, tokens: int, hidden: int,
                                 topk: int, experts: int, seed: int) -> None:
    env = _cann_env()
    # like a deployed CANN program: libraries from LD_LIBRARY_PATH / the op library's own directory
    args = [str(c_client), str(tmp_path), str(world), str(tokens), str(hidden), str(topk), str(experts), str(seed)]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == f"OK {world} ranks"

    xs = [_load(tmp_path, r, "x") for r in range(world)]
    ids = [_load(tmp_path, r, "expert_ids") for r in range(world)]
    ws = [_load(tmp_path, r, "weights") for r in range(world)]
    for r in range(world):
        assert xs[r].shape == (tokens, hidden) and ids[r].shape == (tokens, topk)
        assert all(len(set(row)) == topk for row in ids[r].tolist())

    def fn(rank: int, d: golden.DispatchResult) -> np.ndarray:
        return expert_reference(rank, d.expand_x, d.expert_token_nums)

    g_disp, g_comb = golden.round_trip(xs, ids, fn, moe_expert_num=experts, expert_scales=ws)
    for r in range(world):
        gd, gc = g_disp[r], g_comb[r]
        assert _load(tmp_path, r, "ep_recv_counts").tobytes() == gd.ep_recv_counts.tobytes()
        assert _load(tmp_path, r, "expert_token_nums").tobytes() == gd.expert_token_nums.tobytes()
        assert _load(tmp_path, r, "assist_info").tobytes() == gd.assist_info_for_combine.tobytes()
        assert _load(tmp_path, r, "expand_x").tobytes() == gd.expand_x.tobytes()
        # the C expert equals its Python mirror, and combine equals the golden, bit for bit
        c_expert = _load(tmp_path, r, "expert_out")
        assert c_expert.tobytes() == fn(r, gd).tobytes()
        assert gc.written.all()
        assert _load(tmp_path, r, "x_out").tobytes() == gc.x_out.tobytes()


def test_c_client_reports_bad_configuration(c_client: Path, tmp_path: Path) -> None:
    res = subprocess.run([str(c_client), str(tmp_path), "4", "8", "1024", "4", "6"], capture_output=True,
                         text=True, timeout=60, env=_cann_env(), check=False)
    assert res.returncode == 2 and "multiple of world_size" in res.stderr


def test_c_client_creates_its_output_folder(c_client: Path, tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    res = subprocess.run([str(c_client), str(out), "2"], capture_output=True, text=True, timeout=60,
                         env=_cann_env(), check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (out / "rank1_x_out.npy").is_file()


def test_c_client_names_an_output_folder_it_cannot_create(c_client: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    res = subprocess.run([str(c_client), str(tmp_path / "file" / "out"), "2"], capture_output=True, text=True,
                         timeout=60, env=_cann_env(), check=False)
    assert res.returncode == 2
    assert f"cannot create the output folder {tmp_path / 'file' / 'out'}" in res.stderr
    assert "Not a directory" in res.stderr


def test_c_client_reports_op_errors(c_client: Path, tmp_path: Path) -> None:
    """H outside [1024, 8192]: phase 1 refuses, and the C program prints CANN's message."""
    res = subprocess.run([str(c_client), str(tmp_path), "2", "4", "512", "2", "4"], capture_output=True,
                         text=True, timeout=60, env=_cann_env(), check=False)
    assert res.returncode == 1
    assert "aclnnMoeDistributeDispatchV5GetWorkspaceSize" in res.stderr and "161002" in res.stderr


# ------------------------------------------------------------------------------------------ C++ server


@pytest.fixture(scope="module")
def cpp_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_toolchain(cxx=True)
    build = tmp_path_factory.mktemp("cpp_embed")
    env = _cann_env()
    cmd = ["cmake", "-S", str(EXAMPLES / "cpp_embed"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
           f"-DPython3_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0 and "Development.Embed" in res.stdout + res.stderr:
        pytest.skip(f"this Python has no embeddable libpython ({sysconfig.get_config_var('LDLIBRARY')})")
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True, env=env,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return build / "cpp_embed_server"


def test_cpp_server_two_threads_match_golden(cpp_server: Path, tmp_path: Path) -> None:
    """Two serving threads (= ranks 0 and 1) each run 3 requests through the embedded interpreter on
    memory and streams the server allocated; every x_out equals the golden bit for bit."""
    requests, world, experts = 3, 2, 8
    env = _cann_env()
    env["PYTHONPATH"] = package_pythonpath(env)
    res = subprocess.run([str(cpp_server), str(tmp_path), str(requests)], capture_output=True, text=True,
                         timeout=180, env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == f"OK {requests * world} requests"
    assert len([ln for ln in lines if ln.startswith("request ")]) == requests * world

    def load(req: int, rank: int, name: str) -> np.ndarray:
        a = np.load(tmp_path / f"req{req}_rank{rank}_{name}.npy")
        return a.view(bfloat16) if a.dtype == np.uint16 else a

    for req in range(requests):
        xs = [load(req, r, "x") for r in range(world)]
        ids = [load(req, r, "expert_ids") for r in range(world)]
        ws = [load(req, r, "weights") for r in range(world)]
        _, g_comb = golden.round_trip(xs, ids, lambda r, d: expert_reference(r, d.expand_x, d.expert_token_nums),
                                      moe_expert_num=experts, expert_scales=ws)
        for r in range(world):
            assert load(req, r, "x_out").tobytes() == g_comb[r].x_out.tobytes(), (req, r)
    # requests differ (the inputs are a function of the request number)
    assert load(0, 0, "x_out").tobytes() != load(1, 0, "x_out").tobytes()


def test_cpp_server_reports_python_errors(cpp_server: Path, tmp_path: Path) -> None:
    """A model module that fails to import is reported by the server, not a crash."""
    (tmp_path / "moe_model.py").write_text("raise RuntimeError('model failed to load')\n")
    env = _cann_env()
    env["PYTHONPATH"] = package_pythonpath(env)
    res = subprocess.run([str(cpp_server), str(tmp_path), "1", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env=env, check=False)
    assert res.returncode == 1 and "model failed to load" in res.stderr


# ------------------------------------------------------------------------------------------ README

def test_readme_example(tmp_path: Path) -> None:
    """The README's runnable round, as a user would paste it into a file."""
    import re

    text = (REPO / "README.md").read_text()
    m = re.search(r"<!-- tested by tests/test_examples.py::test_readme_example -->\n```python\n(.*?)```", text, re.S)
    assert m, "the README lost its tested example"
    script = tmp_path / "readme_example.py"
    script.write_text(m.group(1))
    env = dict(os.environ)
    env["PYTHONPATH"] = package_pythonpath(env)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 2 and all(ln.endswith("combine gives x * sum(weights): True") for ln in lines), lines
