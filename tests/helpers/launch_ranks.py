"""Rank functions of tests/test_launch.py (light to import: every rank process imports this module)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def identify(rank, world_size, root, tag):
    from aclnn_py import Device

    return {"rank": rank, "world_size": world_size, "root_len": len(root), "root": root,
            "device": Device.current().id, "pid": os.getpid(), "tag": tag}


def collection_reach(rank, world_size, root):
    """How many objects the rank's collector leaves out (frozen) and how many a full collection walks."""
    import gc

    return gc.get_freeze_count(), len(gc.get_objects())


def scheduling_policy(rank, world_size, root):
    return os.sched_getscheduler(0)


def fail_on(rank, world_size, root, bad_rank, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == bad_rank:
        raise ValueError(f"boom on rank {rank}")
    time.sleep(60)  # the launcher must kill us


def hccl_error_on(rank, world_size, root, bad_rank):
    from aclnn_py import hccl

    if rank == bad_rank:
        hccl.Communicator(2, 0, b"\0" * 4108)  # not a root info of this library: HCCL_E_PARA
    return rank


def die_on(rank, world_size, root, bad_rank, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def sleep_forever(rank, world_size, root, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    time.sleep(600)


def barrier_world(rank, world_size, root):
    from aclnn_py import hccl

    with hccl.Communicator(world_size, rank, root) as comm:
        comm.barrier()
        return comm.name


def mixed_outcomes(rank, world_size, root, pid_dir):
    """Rank 1 is killed by a signal, rank 2 raises, the others return their rank (slowly, so they
    are still running when the failures happen)."""
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 2:
        raise ValueError(f"boom on rank {rank}")
    time.sleep(0.5)
    return rank * 10


def rank0_without_root(conn):
    """Stands in for a rank 0 whose HcclGetRootInfo failed: reports an error, never a root info."""
    from aclnn_py.worlds import _pack_exception

    try:
        raise OSError("no root info on this rank")
    except OSError as exc:
        import traceback

        conn.send(("err", _pack_exception(exc), traceback.format_exc()))
    conn.close()
