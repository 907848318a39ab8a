"""Run under `mpiexec -n N python tests/helpers/mpi_world.py`: every rank bootstraps through MPI,
forms an HCCL world, builds its context and runs a barrier; rank 0 prints "MPI-OK <N>"."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("ACLNN_PY_BACKEND", "mock")
os.environ.setdefault("HCCL_BUFFSIZE", "2")

from mpi4py import MPI  # noqa: E402

from aclnn_py import hccl, worlds  # noqa: E402


def main() -> int:
    rank, size, root = worlds.mpi_bootstrap()
    assert len(root) == 4108
    with hccl.Communicator(size, rank, root) as comm:
        ctx, ccl = hccl.build_context(comm)
        assert ccl == comm.window_size
        assert hccl.parse_context(ctx)["ep_rank_id"] == rank
        comm.barrier()
        names = MPI.COMM_WORLD.gather(comm.name, root=0)
    if rank == 0:
        assert len(set(names)) == size
        print(f"MPI-OK {size}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
