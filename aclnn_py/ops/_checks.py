"""Python pre-checks of the attribute and size rules shared by dispatch and combine (SPEC §3.2, §5,
§9.3), raised before any C call with the same exception class, code and wording as the C side
(``<param>: <rule> (got <value>)``, SPEC §0).

On real CANN the tiling rejects bad parameters with terse inner errors; these checks make the
mistake readable there too. tests/test_prechecks.py asserts that every message here equals the
mock's for the same input. A rule set that passed once is remembered, so repeated calls with the
same attributes and sizes pay one dictionary lookup.
"""

from __future__ import annotations

from typing import Any

from ..errors import param_invalid

INT32_MAX = 2**31 - 1
MIB = 1 << 20

_passed: set[tuple[Any, ...]] = set()


def _align(v: int, b: int) -> int:
    return -(-v // b) * b


def window_bytes(w: int, l_: int, max_bs: int, h: int, k: int, s: int, fullmesh_v2: bool) -> tuple[int, int, int]:
    """(Td, Tc, bytes) of the §9.3 left-hand side ``2*(maxBs*Td*W*L + maxBs*Tc*(K+S))``."""
    tal = _align(h * 2, 32) + 44
    td = -(-tal // 480) * 512 if fullmesh_v2 else _align(tal, 512)
    tc = _align(h * 2, 512)
    return td, tc, 2 * (max_bs * td * w * l_ + max_bs * tc * (k + s))


def check_common(func: str, soc: str, *, w: int, r: int, e: int, ccl: int, tp_world: int, shard: int, s_attr: int,
                 shared_ranks: int, global_bs: int, z: int, c: int, q: int, comm_alg: str, bs: int, h: int, k: int,
                 bs_param: str, h_param: str) -> None:
    """The rules of moe_checks.cpp's check_attrs, check_sizes and check_window (SPEC §3.2, §9.3)."""
    key = (func, soc, w, r, e, ccl, tp_world, shard, s_attr, shared_ranks, global_bs, z, c, q, comm_alg, bs, h, k,
           bs_param, h_param)
    if key in _passed:
        return

    def bad(param: str, rule: str) -> Exception:
        return param_invalid(func, f"{param}: {rule}")

    soc950 = soc == "Ascend950"
    wmax = 1024 if soc950 else 768
    if w < 2 or w > wmax:
        raise bad("ep_world_size", f"must be in [2, {wmax}] on {soc} (got {w})")
    if r < 0 or r >= w:
        raise bad("ep_rank_id", f"must be in [0, ep_world_size) (got {r} with ep_world_size {w})")
    if tp_world >= 2:
        raise bad("tp_world_size", f"must be 0 or 1, tensor parallelism is not supported (got {tp_world})")
    if shard != 0:
        raise bad("expert_shard_type", f"must be 0 (got {shard})")
    if s_attr < 0 or s_attr > 4:
        raise bad("shared_expert_num", f"must be in [0, 4] (got {s_attr})")
    if shared_ranks < 0 or shared_ranks >= w:
        raise bad("shared_expert_rank_num", f"must be in [0, ep_world_size) (got {shared_ranks} with ep_world_size {w})")
    s = 0 if (shared_ranks == 0 and s_attr == 1) else s_attr
    if (s == 0) != (shared_ranks == 0):
        raise bad("shared_expert_rank_num",
                  "shared_expert_num and shared_expert_rank_num must both be 0 or both be non-zero, (1, 0) meaning "
                  f"no shared expert (got shared_expert_num {s_attr}, shared_expert_rank_num {shared_ranks})")
    if s > 0 and shared_ranks % s != 0:
        raise bad("shared_expert_rank_num", f"must be divisible by shared_expert_num (got {shared_ranks} % {s})")
    if e <= 0 or e > 1024:
        raise bad("moe_expert_num", f"must be in [1, 1024] (got {e})")
    if e % (w - shared_ranks) != 0:
        raise bad("moe_expert_num",
                  f"must be divisible by ep_world_size - shared_expert_rank_num (got {e} % {w - shared_ranks})")
    l_ = e // (w - shared_ranks)
    if l_ <= 0 or l_ * w > 2048:
        raise bad("moe_expert_num",
                  f"local experts per MoE rank × ep_world_size must be in [1, 2048] (got {l_} × {w} = {l_ * w})")
    for name, v in (("zero_expert_num", z), ("copy_expert_num", c), ("const_expert_num", q)):
        if v < 0:
            raise bad(name, f"must be >= 0 (got {v})")
    if max(z, c, q) > INT32_MAX or e + z + c + q > INT32_MAX:
        raise bad("const_expert_num", "moe_expert_num + zero_expert_num + copy_expert_num + const_expert_num must "
                  f"be <= INT32_MAX (got {e} + {z} + {c} + {q})")
    if comm_alg == "hierarchy":
        raise bad("comm_alg", '"hierarchy" is not supported with a context tensor (got "hierarchy")')
    if comm_alg not in ("", "fullmesh_v1", "fullmesh_v2"):
        raise bad("comm_alg", f'must be "", "fullmesh_v1" or "fullmesh_v2" (got "{comm_alg}")')
    fullmesh_v2 = comm_alg == "fullmesh_v2"
    if bs < 1 or bs > 512:
        raise bad(bs_param, f"dim 0 (BS) must be in [1, 512] (got {bs})")
    if h < 1024 or h > 8192:
        raise bad(h_param, f"dim 1 (H) must be in [1024, 8192] (got {h})")
    if k < 1 or k > 16:
        raise bad("expert_ids", f"dim 1 (K) must be in [1, 16] (got {k})")
    if k > e + z + c + q:
        raise bad("expert_ids", "dim 1 (K) must be <= moe_expert_num + zero_expert_num + copy_expert_num + "
                  f"const_expert_num (got {k} > {e + z + c + q})")
    if global_bs != 0 and (global_bs < 0 or global_bs % w != 0 or global_bs < bs * w):
        raise bad("global_bs", "must be 0 or a multiple of ep_world_size that is >= BS * ep_world_size "
                  f"(got {global_bs} with BS {bs}, ep_world_size {w})")
    if fullmesh_v2:
        bsmax = 512 if soc950 else 256
        if bs > bsmax:
            raise bad(bs_param, f'dim 0 (BS) must be <= {bsmax} with comm_alg "fullmesh_v2" on {soc} (got {bs})')
        if not soc950 and k > 12:
            raise bad("expert_ids", f'dim 1 (K) must be <= 12 with comm_alg "fullmesh_v2" on {soc} (got {k})')
    g = global_bs if global_bs else bs * w
    max_bs = g // w
    if max_bs > 1 << 31:
        raise bad("global_bs", "global_bs / ep_world_size (maxBs) must be <= 2^31, no HCCL window holds more "
                  f"(got {global_bs} with ep_world_size {w})")
    if ccl < 0:
        raise bad("ccl_buffer_size", f"must be >= 0 (got {ccl})")
    td, tc, need = window_bytes(w, l_, max_bs, h, k, s, fullmesh_v2)
    extra = w * 1024 if soc950 else 0
    need += extra
    avail = ccl - MIB if ccl > MIB else 0
    if need > avail or ccl < MIB:
        mib = -(-(need + MIB) // MIB)
        buffsize = -(-mib // 2)
        raise bad("ccl_buffer_size",
                  f"window too small: 2*(maxBs*Td*W*L + maxBs*Tc*(K+S)){' + W*1024' if soc950 else ''} = "
                  f"2*({max_bs}*{td}*{w}*{l_} + {max_bs}*{tc}*{k + s}){f' + {extra}' if soc950 else ''} = {need} "
                  f"bytes must be <= ccl_buffer_size - 1 MiB; set HCCL_BUFFSIZE >= {buffsize} (MiB) (got {ccl} bytes)")
    if len(_passed) > 4096:
        _passed.clear()
    _passed.add(key)
