"""Turning the memory pool off for a block of a test: what the mock's checks of block bounds and of
freed memory see is then the exact aclrtMalloc block, freed by aclrtFree on close."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def pool_off(acl: Any) -> Iterator[None]:
    acl.set_allocator(None)
    try:
        yield
    finally:
        acl.set_allocator(acl.get_memory_pool())
