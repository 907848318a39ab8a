"""The public API as a user meets it: everything reachable from ``import aclnn_py as acl``, typed so
that a user's type checker catches mistakes, with conversions numpy users expect."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

PUBLIC = ("MoeDistributeBuffer", "MoeConfig", "LowLatencyDispatchResult", "hccl", "worlds", "ops", "golden",
          "AclnnParamInvalid", "AclnnParamNullptr", "AclTimeoutError", "HcclTimeoutError", "ClosedError",
          "Stream", "StreamLike", "current_stream", "Tensor", "Device", "DeviceMemory", "Event", "DataType",
          "__version__")


def test_everything_is_reachable_from_the_package(acl: Any) -> None:
    for name in PUBLIC:
        assert name in acl.__all__ and name in dir(acl), name
        assert getattr(acl, name) is not None
    for name in acl.__all__:
        assert hasattr(acl, name), name


def test_small_conveniences(acl: Any, device0: Any) -> None:
    t = acl.Tensor.from_numpy(np.zeros(3, ml_dtypes.bfloat16))
    assert np.dtype(t.dtype) == ml_dtypes.bfloat16 and np.dtype(acl.DataType.FLOAT) == np.float32
    b = acl.init()
    assert len(repr(b)) < 200 and "mock" in repr(b)
    assert issubclass(acl.AclTimeoutError, TimeoutError) and issubclass(acl.HcclTimeoutError, TimeoutError)
    assert issubclass(acl.AclnnParamInvalid, ValueError) and issubclass(acl.ClosedError, ValueError)
    with device0.create_stream() as s:
        assert int(s.handle) == s.handle
    assert acl.__version__.count(".") >= 2


def _int_ids_body(rank: int, world_size: int, root: bytes) -> list[str]:
    import aclnn_py as acl

    msgs = []
    with acl.hccl.Communicator(world_size, rank, root) as comm, acl.MoeDistributeBuffer(comm) as buf:
        x = np.ones((2, 1024), ml_dtypes.bfloat16)
        for ids in (np.array([[0], [1]], np.int64), np.array([[0], [1]], np.uint8)):  # safe integer types
            out = buf.low_latency_dispatch(x, ids, 2)
            msgs.append(str(out.ep_recv_counts.numpy().tolist()))
        for ids in (np.array([[0], [2**40]], np.int64), np.array([[0.0], [1.0]])):
            try:
                buf.low_latency_dispatch(x, ids, 2)
            except (acl.AclnnParamInvalid, TypeError) as e:
                msgs.append(f"{type(e).__name__}: {e}")
        comm.barrier()
    return msgs


def test_host_ids_of_any_safe_integer_type(acl: Any) -> None:
    msgs = acl.worlds.run_threads(_int_ids_body, 2)[0]
    assert msgs[:2] == ["[1, 2]", "[1, 2]"]
    # the buffer names its own parameter (topk_idx), with the operator's class and rule
    assert msgs[2].startswith("AclnnParamInvalid: ") and "topk_idx: values must fit in int32" in msgs[2]
    assert msgs[3] == "TypeError: topk_idx: expected an integer array, got dtype float64"


USER_SCRIPT = '''
import numpy as np
import aclnn_py as acl

def rank_main(rank: int, world_size: int, root: bytes) -> None:
    with acl.hccl.Communicator(world_size, rank, root) as comm:
        buf = acl.MoeDistributeBuffer(comm)
        x = np.zeros((8, 1024), np.float16)
        ids = np.zeros((8, 2), np.int32)
        out = buf.low_latency_dispatch(x, ids, "8")                          # E1: a str for an int
        rows: int = out.expand_xx.shape[0]                                   # E2: a misspelt field
        buf.low_latency_dispach(x, ids, 8)                                   # E3: a misspelt method
        y: int = buf.low_latency_combine(out.expand_x, ids, None,            # E4: a wrong annotation
                                         out.assist_info_for_combine, out.ep_recv_counts, num_experts=8)
        s: acl.Stream = acl.Device(rank).create_stream()
        s.synchronise()                                                      # E5: a misspelt method
        acl.Tensor.from_numpy(x, stream=3.5)                                 # E6: not a stream
'''


def _mypy(acl: Any, tmp_path: Path, script_text: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """mypy, as a user runs it, on `script_text` saved as a script that imports this aclnn_py."""
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(script_text))
    where = Path(acl.__file__).resolve().parents[1]
    env = dict(os.environ)
    # mypy finds an installed package (it ships py.typed) by itself and refuses site-packages on MYPYPATH;
    # only a source tree needs pointing at.
    if where.name not in ("site-packages", "dist-packages"):
        env["MYPYPATH"] = str(where)
    return subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
                           "--follow-imports=silent", *flags, str(script)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)


def test_a_users_type_checker_catches_mistakes(acl: Any, tmp_path: Path) -> None:
    r = _mypy(acl, tmp_path, USER_SCRIPT)
    assert "error:" in r.stdout, f"mypy did not check the script:\n{r.stdout}\n{r.stderr}"
    lines = {int(line.split(":")[1]) for line in r.stdout.splitlines() if ": error:" in line}
    marked = {i + 1 for i, text in enumerate(textwrap.dedent(USER_SCRIPT).splitlines()) if "# E" in text}
    assert marked <= lines, f"mypy missed lines {sorted(marked - lines)}:\n{r.stdout}"


INTEROP_SCRIPT = '''
import numpy as np
import numpy.typing as npt
import aclnn_py as acl

def download(t: acl.Tensor) -> npt.NDArray[np.generic]:
    device_type, device_id = t.__dlpack_device__()
    return np.from_dlpack(t)
'''


def test_numpy_from_dlpack_of_a_tensor_passes_mypy_strict(acl: Any, tmp_path: Path) -> None:
    """A Tensor satisfies the DLPack protocol type numpy's stubs ask of np.from_dlpack's argument."""
    r = _mypy(acl, tmp_path, INTEROP_SCRIPT, "--strict")
    assert r.returncode == 0 and r.stdout == "", f"{r.stdout}\n{r.stderr}"
