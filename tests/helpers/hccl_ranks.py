"""Rank functions and helpers of tests/test_hccl.py. A separate module, light to import (no
pytest), because every rank process of a test imports it to unpickle its function."""

from __future__ import annotations

import os
import signal
import struct
import time

import numpy as np

MIB = 1 << 20
CONTEXT_BYTES = 16400


def world_id_hex(root: bytes) -> str:
    """The mock's world id inside the root info (bytes 16..24), as it appears in /dev/shm names."""
    return f"{struct.unpack_from('<Q', root, 16)[0]:016x}"


def shm_segments(root: bytes) -> list[str]:
    wid = world_id_hex(root)
    return [n for n in os.listdir("/dev/shm") if n.startswith("aclmock_hccl_") and wid in n]


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def decode_context(raw: bytes) -> dict:
    """The context struct (docs/concepts.md), written out independently of aclnn_py.hccl.parse_context."""
    assert len(raw) == CONTEXT_BYTES
    rank, per_server = struct.unpack_from("<II", raw, 0)
    (kfc,) = struct.unpack_from("<Q", raw, 8)
    windows = struct.unpack_from("<1024Q", raw, 16)
    handles = struct.unpack_from("<1024Q", raw, 16 + 8 * 1024)
    return {"rank": rank, "per_server": per_server, "kfc": kfc, "windows": windows, "handles": handles}


def rank_world(rank: int, world_size: int, root: bytes) -> dict:
    """Everything a healthy world must do, run by every rank (thread or process)."""
    from aclnn_py import hccl, runtime
    from aclnn_py.dtypes import DataType

    out: dict = {"pid": os.getpid()}
    with hccl.Communicator(world_size, rank, root) as comm:
        assert comm.rank == rank and comm.world_size == world_size
        assert 0 < len(comm.name) < 128
        assert comm.window_size == 2 * int(os.environ["HCCL_BUFFSIZE"]) * MIB
        ctx, ccl = hccl.build_context(comm)
        assert ctx.shape == (4100,) and ctx.dtype == DataType.INT32
        assert ccl == comm.window_size
        c = decode_context(ctx.numpy().tobytes())
        assert c["rank"] == rank and c["per_server"] == 2
        assert c["kfc"] != 0
        assert all(w != 0 and w % 512 == 0 for w in c["windows"][:world_size])
        assert all(w == 0 for w in c["windows"][world_size:])
        assert all(h == 0 for h in c["handles"])
        assert c["windows"][rank] == comm.window_address
        for r in range(world_size):
            assert c["windows"][r] == comm.peer_window(r)[0]
        # the name finds this communicator; the op context is one per comm and op type
        ctx2, _ = hccl.build_context(comm)
        assert decode_context(ctx2.numpy().tobytes())["kfc"] == c["kfc"]
        # write into the next rank's window (data area, a slot per source) at the address taken
        # from the context tensor, barrier, and read what the previous rank wrote into ours
        dst, src = (rank + 1) % world_size, (rank - 1) % world_size
        payload = np.arange(16, dtype=np.int64) + 1000 * rank
        runtime.copy_to_device(c["windows"][dst] + MIB + 128 * rank, 128, payload)
        comm.barrier()
        got = np.empty(16, np.int64)
        runtime.copy_to_host(got, c["windows"][rank] + MIB + 128 * src, 128)
        np.testing.assert_array_equal(got, np.arange(16, dtype=np.int64) + 1000 * src)
        # a barrier on an explicit stream, then its synchronisation
        s = runtime.Device.current().create_stream()
        comm.barrier(s)
        s.synchronize()
        s.close()
        assert comm.async_error() == 0
        out.update(name=comm.name, windows=list(c["windows"][:world_size]), kfc=c["kfc"])
    return out


def never_join(rank, world_size, root, missing):
    from aclnn_py import hccl
    from aclnn_py.errors import HcclError

    if rank == missing:
        return None
    t0 = time.monotonic()
    try:
        hccl.Communicator(world_size, rank, root)
    except HcclError.Timeout as e:
        return {"code": e.code, "elapsed": time.monotonic() - t0, "message": e.message, "root": root}
    return {"code": 0}


def join_then_maybe_die(rank, world_size, root, victim):
    """A spawn rank: join, one barrier, then the victim SIGKILLs itself and the others wait for it
    in a second barrier. Returns (message, code, seconds waited, async error, pid)."""
    from aclnn_py import hccl, runtime
    from aclnn_py.errors import AclError

    comm = hccl.Communicator(world_size, rank, root)
    comm.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    s = runtime.Device.current().create_stream()
    comm.barrier(s)  # enqueued; the wait happens on the stream
    t0 = time.monotonic()
    try:
        s.synchronize()
        out = ("no error", 0, 0.0, 0, os.getpid())
    except AclError.Timeout as e:
        out = (e.message, e.code, time.monotonic() - t0, comm.async_error(), os.getpid())
    comm.close()
    return out


def wait_for_late_half(rank, world_size, root, late_s, last_dies=False):
    """A spawn rank: join and pass a barrier; then the upper half of the ranks sleeps `late_s` before
    the second barrier while the lower half waits in it (with `last_dies`, the last rank SIGKILLs
    itself instead). Returns (seconds waited in the second barrier, this process's liveness probes
    during it, the error message or None)."""
    from aclnn_py import _mock, hccl
    from aclnn_py.errors import AclError

    with hccl.Communicator(world_size, rank, root) as comm:
        comm.barrier()
        if last_dies and rank == world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank >= world_size // 2:
            time.sleep(late_s)
        probes = _mock.stats()["liveness_probes"]
        t0 = time.monotonic()
        message = None
        try:
            comm.barrier()
        except AclError as e:
            message = e.message
        return time.monotonic() - t0, _mock.stats()["liveness_probes"] - probes, message


def join_or_die(rank, world_size, root, victim, absent, pid_dir):
    """A spawn rank of a world that never forms: rank `absent` does not come; the victim joins and
    its own timer thread SIGKILLs it 0.5 s later, while everybody waits in the rendezvous. Returns
    (code, message, seconds) of the HcclError the others get."""
    import threading
    from pathlib import Path

    from aclnn_py import hccl
    from aclnn_py.errors import HcclError

    Path(pid_dir, f"rank{rank}").write_text(str(os.getpid()))
    if rank == absent:
        return None
    if rank == victim:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
    t0 = time.monotonic()
    try:
        hccl.Communicator(world_size, rank, root)
    except HcclError as e:
        return e.code, e.message, time.monotonic() - t0
    return 0, "joined", time.monotonic() - t0


def join_alone(root, environ):
    os.environ.update(environ)
    import aclnn_py
    from aclnn_py import hccl

    aclnn_py.init()
    aclnn_py.Device(0).set_current()
    hccl.Communicator(2, 0, root)  # waits for rank 1 until killed


def rss_kib() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssShmem", "VmSize"):
                out[k] = int(v.split()[0])
    return out


def rss_rank(rank, world_size, root):
    from aclnn_py import hccl

    before = rss_kib()
    with hccl.Communicator(world_size, rank, root) as comm:
        hccl.build_context(comm)
        comm.barrier()
        after = rss_kib()
        comm.barrier()
    return comm.window_size, after["VmRSS"] - before["VmRSS"], after.get("RssShmem", 0)


def sweep_in_a_new_process(rank, world_size, root):
    """A spawn rank that only makes a root info: HcclGetRootInfo sweeps /dev/shm from another process."""
    from aclnn_py import hccl

    return len(bytes(hccl.RootInfo.create()))
