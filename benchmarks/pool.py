"""`pool.alloc_free`: what a device allocation costs through the memory pool against a plain
``aclrtMalloc`` + ``aclrtFree`` of the same sizes (``set_allocator(None)``), as ``Tensor.empty`` +
``close`` pairs on the mock."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .host_overhead import paired_ratio
from .progress import Progress
from .stats import summary_us

#: Bytes of the tensors allocated in turn: a count vector, scales, a mid-size output, a large
#: dispatch output (1024 rows × 7168 bf16).
SIZES = (256, 64 << 10, 1 << 20, 14 << 20)


def _pairs_us(calls: int) -> float:
    """µs per Tensor.empty + close pair over `calls` rounds of every size."""
    from aclnn_py import Tensor

    t0 = time.perf_counter()
    for _ in range(calls):
        for n in SIZES:
            Tensor.empty((n,), np.uint8).close()
    return (time.perf_counter() - t0) * 1e6 / (calls * len(SIZES))


def pool_alloc_free(calls: int, repeats: int, progress: Progress) -> dict[str, Any]:
    """Both allocators timed in each repeat (paired, like the host-overhead ratios)."""
    import aclnn_py as acl
    from aclnn_py import _mock

    acl.Device(0).set_current()
    pool = acl.get_memory_pool()
    progress(f"pool.alloc_free: {len(SIZES)} sizes × {calls} pairs × {repeats} repeats")
    # real CANN fills nothing on either path; the mock's poison fill of every new or reused block would
    # time memset instead of the allocators
    poison = _mock.poison()
    _mock.set_poison(False)
    pooled: list[float] = []
    plain: list[float] = []
    try:
        _pairs_us(1)  # the pool's blocks of these sizes exist from here on, as in a serving loop
        for _ in range(repeats):
            pooled.append(_pairs_us(calls))
            acl.set_allocator(None)
            try:
                plain.append(_pairs_us(calls))
            finally:
                acl.set_allocator(pool)
    finally:
        _mock.set_poison(poison)
    return {"sizes_bytes": list(SIZES), "pooled": summary_us(pooled), "aclrtmalloc_aclrtfree": summary_us(plain),
            "pooled_over_aclrtmalloc": paired_ratio(pooled, plain)}
