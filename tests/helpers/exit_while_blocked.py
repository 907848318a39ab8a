"""Child interpreter of tests/runtime/test_interrupt.py: block a thread in the mock, then end the main thread.

    exit_while_blocked.py join|kernel "sys.exit"|"main ends"

join: a daemon thread waits in HcclCommInitRootInfo for a peer that never comes. kernel: a 2-rank
threads world forms and rank 0 queues an HcclBarrier that rank 1 never enters. Prints the world id
(as in /dev/shm names) and "blocked", then leaves through sys.exit(0) or by falling off the end.
Only the raw cffi layer is used, so no Python object tries to clean up at exit.
"""

from __future__ import annotations

import struct
import sys
import threading
import time

import aclnn_py

blocked_in, how = sys.argv[1], sys.argv[2]
aclnn_py.init("mock")
b = aclnn_py.backend()
ffi, lib = b.ffi, b.lib
assert lib.aclrtSetDevice(0) == 0
root = ffi.new("HcclRootInfo *")
assert lib.HcclGetRootInfo(root) == 0
world = f"{struct.unpack_from('<Q', ffi.buffer(root), 16)[0]:016x}"

if blocked_in == "join":
    out = ffi.new("HcclComm *")
    threading.Thread(target=lambda: lib.HcclCommInitRootInfo(2, root, 0, out), daemon=True).start()
    time.sleep(0.3)
else:
    comms = [ffi.new("HcclComm *") for _ in range(2)]

    def join(rank: int) -> None:
        assert lib.aclrtSetDevice(rank) == 0
        assert lib.HcclCommInitRootInfo(2, root, rank, comms[rank]) == 0

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stream = ffi.new("aclrtStream *")
    assert lib.aclrtCreateStream(stream) == 0
    assert lib.HcclBarrier(comms[0][0], stream[0]) == 0
    assert lib.aclrtSynchronizeStreamWithTimeout(stream[0], 100) == 507046

print(f"world {world}\nblocked", flush=True)
if how == "sys.exit":
    sys.exit(0)
