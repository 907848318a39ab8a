"""Pre-checks of the attribute, size and window rules that dispatch and combine share, raised before
any C call with the C side's exception class, status and wording (``<param>: <rule> (got <value>)``).

On real CANN the op tiling rejects bad parameters with terse inner errors; these checks make the
mistake readable there too (tests/test_prechecks.py asserts that every message equals the mock's for
the same input). Shapes that passed once are remembered on the MoeConfig, so a repeated call pays
one set lookup.
"""

from __future__ import annotations

from ..errors import AclnnParamInvalid, param_invalid
from . import sizing
from .config import MoeConfig

INT32_MAX = 2**31 - 1
FUNCS = {"dispatch": "aclnnMoeDistributeDispatchV5GetWorkspaceSize",
         "combine": "aclnnMoeDistributeCombineV5GetWorkspaceSize"}
#: the tensors whose dim 0 / dim 1 carry BS and H in each op
_BS_H_PARAMS = {"dispatch": ("x", "x"), "combine": ("expert_ids", "expand_x")}


def check(config: MoeConfig, op: str, bs: int, h: int, k: int) -> None:
    """Raise AclnnParamInvalid when `config` with BS `bs`, hidden `h` and top-k `k` breaks a rule of
    `op` ("dispatch" or "combine")."""
    key = (op, bs, h, k)
    if key in config._passed:
        return
    func = FUNCS[op]
    bs_param, h_param = _BS_H_PARAMS[op]
    _check_attrs(config, func)
    _check_sizes(config, func, bs, h, k, bs_param, h_param)
    _check_window(config, func, bs, h, k)
    if len(config._passed) > 4096:
        config._passed.clear()
    config._passed.add(key)


def _bad(func: str, param: str, rule: str) -> AclnnParamInvalid:
    return param_invalid(func, f"{param}: {rule}")


def _check_attrs(c: MoeConfig, func: str) -> None:
    w, r, soc = c.ep_world_size, c.ep_rank_id, c.soc
    wmax = c.profile.max_world_size
    if w < 2 or w > wmax:
        raise _bad(func, "ep_world_size", f"must be in [2, {wmax}] on {soc} (got {w})")
    if r < 0 or r >= w:
        raise _bad(func, "ep_rank_id", f"must be in [0, ep_world_size) (got {r} with ep_world_size {w})")
    if c.tp_world_size >= 2:
        raise _bad(func, "tp_world_size",
                   f"must be 0 or 1, tensor parallelism is not supported (got {c.tp_world_size})")
    if c.tp_rank_id != 0:
        raise _bad(func, "tp_rank_id", f"must be 0 without tensor parallelism (tp_world_size 0 or 1) (got {c.tp_rank_id})")
    if c.expert_shard_type != 0:
        raise _bad(func, "expert_shard_type", f"must be 0 (got {c.expert_shard_type})")
    s_attr, shared_ranks = c.shared_expert_num, c.shared_expert_rank_num
    if s_attr < 0 or s_attr > 4:
        raise _bad(func, "shared_expert_num", f"must be in [0, 4] (got {s_attr})")
    if shared_ranks < 0 or shared_ranks >= w:
        raise _bad(func, "shared_expert_rank_num",
                   f"must be in [0, ep_world_size) (got {shared_ranks} with ep_world_size {w})")
    s = c.shared
    if (s == 0) != (shared_ranks == 0):
        raise _bad(func, "shared_expert_rank_num",
                   "shared_expert_num and shared_expert_rank_num must both be 0 or both be non-zero, (1, 0) "
                   f"meaning no shared expert (got shared_expert_num {s_attr}, shared_expert_rank_num {shared_ranks})")
    if s > 0 and shared_ranks % s != 0:
        raise _bad(func, "shared_expert_rank_num", f"must be divisible by shared_expert_num (got {shared_ranks} % {s})")
    e = c.moe_expert_num
    if e <= 0 or e > 1024:
        raise _bad(func, "moe_expert_num", f"must be in [1, 1024] (got {e})")
    if e % (w - shared_ranks) != 0:
        raise _bad(func, "moe_expert_num",
                   f"must be divisible by ep_world_size - shared_expert_rank_num (got {e} % {w - shared_ranks})")
    l_ = c.moe_local_experts
    if l_ <= 0 or l_ * w > 2048:
        raise _bad(func, "moe_expert_num",
                   f"local experts per MoE rank × ep_world_size must be in [1, 2048] (got {l_} × {w} = {l_ * w})")
    z, cp, q = c.zero_expert_num, c.copy_expert_num, c.const_expert_num
    for name, v in (("zero_expert_num", z), ("copy_expert_num", cp), ("const_expert_num", q)):
        if v < 0:
            raise _bad(func, name, f"must be >= 0 (got {v})")
    if max(z, cp, q) > INT32_MAX or e + z + cp + q > INT32_MAX:
        raise _bad(func, "const_expert_num", "moe_expert_num + zero_expert_num + copy_expert_num + "
                   f"const_expert_num must be <= INT32_MAX (got {e} + {z} + {cp} + {q})")
    if c.comm_alg == "hierarchy":
        raise _bad(func, "comm_alg", '"hierarchy" is not supported with a context tensor (got "hierarchy")')
    if c.comm_alg not in ("", "fullmesh_v1", "fullmesh_v2"):
        raise _bad(func, "comm_alg", f'must be "", "fullmesh_v1" or "fullmesh_v2" (got "{c.comm_alg}")')


def _check_sizes(c: MoeConfig, func: str, bs: int, h: int, k: int, bs_param: str, h_param: str) -> None:
    w, e = c.ep_world_size, c.moe_expert_num
    experts = e + c.zero_expert_num + c.copy_expert_num + c.const_expert_num
    if bs < 1 or bs > 512:
        raise _bad(func, bs_param, f"dim 0 (BS) must be in [1, 512] (got {bs})")
    if h < 1024 or h > 8192:
        raise _bad(func, h_param, f"dim 1 (H) must be in [1024, 8192] (got {h})")
    if k < 1 or k > 16:
        raise _bad(func, "expert_ids", f"dim 1 (K) must be in [1, 16] (got {k})")
    if k > experts:
        raise _bad(func, "expert_ids", "dim 1 (K) must be <= moe_expert_num + zero_expert_num + copy_expert_num + "
                   f"const_expert_num (got {k} > {experts})")
    g = c.global_bs
    if g != 0 and (g < 0 or g % w != 0 or g < bs * w):
        raise _bad(func, "global_bs", "must be 0 or a multiple of ep_world_size that is >= BS * ep_world_size "
                   f"(got {g} with BS {bs}, ep_world_size {w})")
    if c.comm_alg == "fullmesh_v2":
        p = c.profile
        if bs > p.fullmesh_v2_max_bs:
            raise _bad(func, bs_param, f'dim 0 (BS) must be <= {p.fullmesh_v2_max_bs} with comm_alg "fullmesh_v2" '
                       f"on {c.soc} (got {bs})")
        if p.fullmesh_v2_max_topk is not None and k > p.fullmesh_v2_max_topk:
            raise _bad(func, "expert_ids", f'dim 1 (K) must be <= {p.fullmesh_v2_max_topk} with comm_alg '
                       f'"fullmesh_v2" on {c.soc} (got {k})')


def _check_window(c: MoeConfig, func: str, bs: int, h: int, k: int) -> None:
    w, ccl = c.ep_world_size, c.ccl_buffer_size
    max_bs = c.max_bs(bs)
    if max_bs > 1 << 31:
        raise _bad(func, "global_bs", "global_bs / ep_world_size (maxBs) must be <= 2^31, no HCCL window holds "
                   f"more (got {c.global_bs} with ep_world_size {w})")
    if ccl < 0:
        raise _bad(func, "ccl_buffer_size", f"must be >= 0 (got {ccl})")
    need = c.window_need(bs, h, k)
    avail = ccl - sizing.MIB if ccl > sizing.MIB else 0
    if need > avail or ccl < sizing.MIB:
        per_rank = c.profile.window_bytes_per_rank
        td, tc = sizing.token_slots(h, c.comm_alg == "fullmesh_v2")
        extra = w * per_rank
        window_mib = -(-(need + sizing.MIB) // sizing.MIB)
        buffsize = -(-window_mib // 2)  # HCCL gives each rank a window of 2 x HCCL_BUFFSIZE
        raise _bad(func, "ccl_buffer_size",
                   f"window too small: 2*(maxBs*Td*W*L + maxBs*Tc*(K+S)){f' + W*{per_rank}' if per_rank else ''} = "
                   f"2*({max_bs}*{td}*{w}*{c.moe_local_experts} + {max_bs}*{tc}*{k + c.shared})"
                   f"{f' + {extra}' if per_rank else ''} = {need} bytes must be <= ccl_buffer_size - 1 MiB; "
                   f"set HCCL_BUFFSIZE >= {buffsize} (MiB) (got {ccl} bytes)")
