"""The Python half of examples/cpp_embed: a MoE layer served by a C++ process that owns the memory.

The server (server.cpp) creates the stream and allocates every input and output itself with
aclrtMalloc, then calls :meth:`Worker.forward` with raw device addresses and the stream handle.
aclnn-py borrows them (``Tensor.from_address``, ``Stream.from_handle``): nothing is copied and
nothing the server owns is freed here. ``forward`` runs dispatch → expert → combine, writing x_out
into the server's buffer, and returns without waiting for the stream: the server synchronises.
"""

from __future__ import annotations

import numpy as np

import aclnn_py as acl
from aclnn_py.buffer import MoeDistributeBuffer
from aclnn_py.dtypes import DataType, bfloat16
from aclnn_py.hccl import Communicator
from aclnn_py.ops import moe_distribute_combine


def expert(rank: int, expand_x: np.ndarray, expert_token_nums: np.ndarray) -> np.ndarray:
    """Local expert j of rank r: y = bf16(f32(x) * (1 + 0.25 j) + 0.125 r) (same as the C client)."""
    out = np.empty(expand_x.shape, np.float32)
    start = 0
    for j, n in enumerate(np.asarray(expert_token_nums, np.int64).tolist()):
        rows = expand_x[start:start + n].astype(np.float32)
        out[start:start + n] = rows * np.float32(1 + 0.25 * j) + np.float32(0.125 * rank)
        start += n
    return out[:start].astype(bfloat16)


class Worker:
    """One rank of the server: a communicator, the MoE buffer (context tensor) and a borrowed stream."""

    def __init__(self, rank: int, world_size: int, root: bytes, stream_handle: int, experts: int) -> None:
        acl.init()  # the server already called aclInit; the repeat is expected and ignored
        self.rank = rank
        self.experts = experts
        self.stream = acl.Stream.from_handle(stream_handle)
        self.comm = Communicator(world_size, rank, root, device=rank)
        self.buf = MoeDistributeBuffer(self.comm)

    def forward(self, x_ptr: int, ids_ptr: int, weights_ptr: int, out_ptr: int, tokens: int, hidden: int,
                topk: int) -> int:
        """One request: returns the number of rows this rank's experts processed."""
        x = acl.Tensor.from_address(x_ptr, (tokens, hidden), DataType.BF16)
        ids = acl.Tensor.from_address(ids_ptr, (tokens, topk), DataType.INT32)
        weights = acl.Tensor.from_address(weights_ptr, (tokens, topk), DataType.FLOAT)
        x_out = acl.Tensor.from_address(out_ptr, (tokens, hidden), DataType.BF16)

        d = self.buf.low_latency_dispatch(x, ids, self.experts, topk_weights=weights, stream=self.stream)
        self.stream.synchronize()  # the expert below runs on the host; releases the GIL while waiting
        n = int(d.ep_recv_counts.numpy()[-1])
        y = np.zeros(d.expand_x.shape, bfloat16)  # combine takes expand_x's (A, H) layout
        y[:n] = expert(self.rank, d.expand_x.numpy()[:n], d.expert_token_nums.numpy())
        moe_distribute_combine(
            self.buf.context, y, ids, d.assist_info_for_combine, d.ep_recv_counts, weights,
            ep_world_size=self.buf.world_size, ep_rank_id=self.buf.rank_id, moe_expert_num=self.experts,
            ccl_buffer_size=self.buf.ccl_buffer_size, x_out=x_out, stream=self.stream)
        return n

    def close(self) -> None:
        self.stream.synchronize()
        self.comm.close()
