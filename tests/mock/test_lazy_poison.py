"""The mock's poison costs memory and time only where something writes: a block of 64 KiB to 64 MiB
reads as poison without its pages being filled, each block records the range written since it last
held the poison throughout (copies, memsets, kernels, host views), and a refill restores only that
range."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
from helpers.root_copies import run_python

POISON = 0xA5
MIB = 1 << 20


def malloc(ffi, lib, size):
    cell = ffi.new("void **")
    assert lib.aclrtMalloc(cell, size, lib.ACL_MEM_MALLOC_HUGE_FIRST) == 0
    return cell[0]


def download(ffi, lib, ptr, offset, n):
    host = np.empty(n, np.uint8)
    assert lib.aclrtMemcpy(ffi.cast("void *", host.ctypes.data), n, ffi.cast("char *", ptr) + offset, n,
                           lib.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    return host


def upload(ffi, lib, ptr, offset, data):
    assert lib.aclrtMemcpy(ffi.cast("char *", ptr) + offset, data.nbytes, ffi.cast("void *", data.ctypes.data),
                           data.nbytes, lib.ACL_MEMCPY_HOST_TO_DEVICE) == 0


def addr(ffi, ptr) -> int:
    return int(ffi.cast("uintptr_t", ptr))


def test_a_new_block_reads_as_poison_and_records_what_is_written(raw, mock):
    ffi, lib = raw
    p = malloc(ffi, lib, MIB)
    try:
        w = mock.written_extent(addr(ffi, p))
        assert w["lazy"] and w["poison_outside"] and w["lo"] >= w["hi"]
        assert (download(ffi, lib, p, 0, MIB) == POISON).all()
        upload(ffi, lib, p, 4096, np.arange(100, dtype=np.uint8))
        assert lib.aclrtMemset(ffi.cast("char *", p) + 9000, 100, 0, 50) == 0
        w = mock.written_extent(addr(ffi, p))
        assert (w["lo"], w["hi"]) == (4096, 9050)
        got = download(ffi, lib, p, 0, MIB)
        assert (got[4096:4196] == np.arange(100)).all() and (got[9000:9050] == 0).all()
        assert (got[:4096] == POISON).all() and (got[9050:] == POISON).all()
    finally:
        assert lib.aclrtFree(p) == 0


def test_a_refill_restores_the_written_range_and_forgets_it(raw, mock):
    ffi, lib = raw
    p = malloc(ffi, lib, MIB)
    try:
        upload(ffi, lib, p, 100_000, np.zeros(5000, np.uint8))
        mock.refill_poison(addr(ffi, p) + 200_000, 1000)  # misses the written range: it stays recorded
        w = mock.written_extent(addr(ffi, p))
        assert (w["lo"], w["hi"]) == (100_000, 105_000)
        mock.refill_poison(addr(ffi, p), MIB)
        w = mock.written_extent(addr(ffi, p))
        assert w["lo"] >= w["hi"] and w["poison_outside"]
        assert (download(ffi, lib, p, 0, MIB) == POISON).all()
    finally:
        assert lib.aclrtFree(p) == 0


def test_async_copies_and_memsets_record_their_range_when_they_have_run(raw, mock, device0):
    ffi, lib = raw
    p = malloc(ffi, lib, 256 << 10)
    stream = device0.create_stream()
    try:
        src = np.ones(64, np.uint8)
        host = ffi.new("void **")
        assert lib.aclrtMallocHost(host, 64) == 0
        ffi.memmove(host[0], src.tobytes(), 64)
        assert lib.aclrtMemcpyAsync(ffi.cast("char *", p) + 1024, 64, host[0], 64, lib.ACL_MEMCPY_HOST_TO_DEVICE,
                                    stream._cdata) == 0
        assert lib.aclrtMemsetAsync(ffi.cast("char *", p) + 70_000, 10, 3, 10, stream._cdata) == 0
        stream.synchronize()
        w = mock.written_extent(addr(ffi, p))
        assert (w["lo"], w["hi"]) == (1024, 70_010)
        assert lib.aclrtFreeHost(host[0]) == 0
    finally:
        stream.close()
        assert lib.aclrtFree(p) == 0


def test_a_block_made_with_the_fill_off_is_filled_whole_by_its_first_refill(raw, mock):
    ffi, lib = raw
    mock.set_poison(False)
    try:
        p = malloc(ffi, lib, MIB)
    finally:
        mock.set_poison(True)
    try:
        w = mock.written_extent(addr(ffi, p))
        assert not w["lazy"] and not w["poison_outside"]
        mock.refill_poison(addr(ffi, p), w["size"])
        assert mock.written_extent(addr(ffi, p))["poison_outside"]
        assert (download(ffi, lib, p, 0, MIB) == POISON).all()
    finally:
        assert lib.aclrtFree(p) == 0


def test_blocks_outside_the_lazy_sizes_are_filled(raw, mock):
    ffi, lib = raw
    small, large = malloc(ffi, lib, 4096), malloc(ffi, lib, 65 * MIB)
    try:
        for p in (small, large):
            w = mock.written_extent(addr(ffi, p))
            assert not w["lazy"] and w["poison_outside"]
        assert (download(ffi, lib, large, 65 * MIB - 4096, 4096) == POISON).all()
    finally:
        assert lib.aclrtFree(small) == 0 and lib.aclrtFree(large) == 0


def test_a_host_view_counts_its_whole_block_as_written_when_it_goes(acl, mock):
    t = acl.Tensor.empty((256, 1024), acl.DataType.UINT8)
    try:
        view = t.numpy_view()
        view[200:202] = 7   # behind the mock's back
        w = mock.written_extent(t.ptr)
        assert w["lo"] >= w["hi"]   # not known yet: the view still lives
        del view
        gc.collect()
        w = mock.written_extent(t.ptr)
        assert w["lo"] <= t.ptr - w["base"] and w["hi"] >= t.ptr - w["base"] + t.nbytes
        mock.refill_poison(t.ptr, t.nbytes)
        assert (t.numpy() == POISON).all()   # the rows the view wrote got their poison back
    finally:
        t.close()


def test_unwritten_pages_take_no_memory():
    """A hundred 1 MiB blocks with one row written each: the process grows by the written pages, not by
    100 MiB (measured in a process of its own)."""
    code = """
import json, numpy as np
import aclnn_py as acl
from aclnn_py import _mock
from aclnn_py._binding.loader import backend
acl.init("mock")
acl.Device(0).set_current()
b = backend()
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) * 1024
before = rss()
cells, row = [], np.ones(2048, np.uint8)
for _ in range(100):
    c = b.ffi.new("void **")
    assert b.lib.aclrtMalloc(c, 1 << 20, 0) == 0
    assert b.lib.aclrtMemcpy(c[0], 2048, b.ffi.cast("void *", row.ctypes.data), 2048, 1) == 0
    cells.append(c)
grown = rss() - before
for c in cells:
    assert b.lib.aclrtFree(c[0]) == 0
print(json.dumps({"grown": grown}))
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    grown = json.loads(r.stdout.strip().splitlines()[-1])["grown"]
    assert grown < 20 * MIB, f"100 one-row blocks of 1 MiB grew the process by {grown / MIB:.1f} MiB"


@pytest.mark.parametrize("poison", ["0"])
def test_with_the_fill_off_nothing_is_mapped_lazily(poison):
    code = """
import json
import aclnn_py as acl
from aclnn_py import _mock
from aclnn_py._binding.loader import backend
acl.init("mock")
acl.Device(0).set_current()
b = backend()
c = b.ffi.new("void **")
assert b.lib.aclrtMalloc(c, 1 << 20, 0) == 0
w = _mock.written_extent(int(b.ffi.cast("uintptr_t", c[0])))
print(json.dumps({"lazy": w["lazy"], "poison_outside": w["poison_outside"]}))
"""
    r = run_python(code, ACLNN_MOCK_POISON=poison)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"lazy": False, "poison_outside": False}


@pytest.mark.parametrize("poison", ["1", "0"])
def test_opening_a_device_makes_the_poison_file(poison):
    # The first large allocation of a process then only maps it: a world's first round does not fill
    # one poison file per rank process at the same moment.
    code = """
import json, os
import aclnn_py as acl
acl.init("mock")

def poison_files():
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:aclnn-mock-poison")
               for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))

before = poison_files()
acl.Device(0).set_current()
print(json.dumps({"before": before, "after": poison_files()}))
"""
    r = run_python(code, ACLNN_MOCK_POISON=poison)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"before": 0, "after": int(poison == "1")}
