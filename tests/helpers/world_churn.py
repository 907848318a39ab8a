"""Keep forming mock HCCL worlds until killed, as other jobs on a shared machine do (.ci/stress.sh).

Alternates a 4-rank threads world and a 2-rank processes world (aclnn_py.worlds.spawn), each rank
joining, running one barrier and leaving; every HcclGetRootInfo / HcclCommInitRootInfo also sweeps
/dev/shm. Exits non-zero at the first failure; on SIGTERM prints how many worlds it formed and
exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def rank_body(rank: int, world_size: int, root: bytes) -> str:
    from aclnn_py import hccl

    with hccl.Communicator(world_size, rank, root) as comm:
        comm.barrier()
        return comm.name


def main() -> int:
    os.environ.setdefault("HCCL_BUFFSIZE", "2")
    from aclnn_py import worlds

    formed = 0
    start = time.monotonic()

    def stop(signum: int, frame: object) -> None:
        print(f"world_churn: {formed} worlds in {time.monotonic() - start:.0f} s", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        names = worlds.run_threads(rank_body, 4, timeout=120)
        names += worlds.spawn(rank_body, 2, timeout=120)
        if len(set(names)) != 6:
            print(f"world_churn: unexpected communicator names {names}", flush=True)
            return 1
        formed += 2


if __name__ == "__main__":
    # the functions of a spawn world are pickled by reference: make this file importable as a module
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import world_churn

    sys.exit(world_churn.main())
