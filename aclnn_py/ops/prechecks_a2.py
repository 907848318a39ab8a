"""The Atlas A2 (``Ascend910B``) pre-checks: the rules CANN documents for A2 (docs/operators.md,
"Atlas A2"), in the order and wording of the mock's mock/ops/profile_a2.cpp. :mod:`.prechecks` calls
them at the same places as phase 1 does."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import AclnnParamInvalid
from . import sizing
from .config import MoeConfig
from .profiles import A2_LIMITS as LIM
from .releases import R8_3, RuleSet

Bad = Callable[[str, str, str], AclnnParamInvalid]


def check_attrs(c: MoeConfig, func: str, bad: Bad, rules: RuleSet) -> None:
    """The whole attribute block on A2 (in place of the A3 / 950 one), under a release's rules."""
    w, r = c.ep_world_size, c.ep_rank_id
    if w not in rules.a2_fullmesh_world_sizes:
        raise bad(func, "ep_world_size", f"must be {rules.a2_world_sizes_text()} on Ascend910B (got {w})")
    if r < 0 or r >= w:
        raise bad(func, "ep_rank_id", f"must be in [0, ep_world_size) (got {r} with ep_world_size {w})")
    if c.tp_world_size >= 2:
        raise bad(func, "tp_world_size",
                  f"must be 0 or 1, tensor parallelism is not supported (got {c.tp_world_size})")
    if c.tp_rank_id != 0:
        raise bad(func, "tp_rank_id",
                  f"must be 0 without tensor parallelism (tp_world_size 0 or 1) (got {c.tp_rank_id})")
    if c.expert_shard_type != 0:
        raise bad(func, "expert_shard_type", f"must be 0 (got {c.expert_shard_type})")
    if c.shared_expert_num not in (0, 1):
        raise bad(func, "shared_expert_num",
                  f"must be 0 or 1 on Ascend910B, shared experts are not supported (got {c.shared_expert_num})")
    _zero(func, bad, "shared_expert_rank_num", c.shared_expert_rank_num, "shared experts")
    hierarchy = c.comm_alg == "hierarchy"
    if c.comm_alg not in LIM.comm_algs:
        raise bad(func, "comm_alg", f'must be "", "fullmesh" or "hierarchy" on Ascend910B (got "{c.comm_alg}")')
    if hierarchy and w not in LIM.hierarchy_world_sizes:
        raise bad(func, "ep_world_size", f'must be 16, 32 or 64 with comm_alg "hierarchy" on Ascend910B (got {w})')
    e = c.moe_expert_num
    max_e = LIM.max_experts if hierarchy else rules.a2_fullmesh_max_experts
    tag = " (the CANN 8.3.RC1 rules)" if rules is R8_3 else ""
    if e <= 0 or e > max_e:
        raise bad(func, "moe_expert_num",
                  f'must be in [1, {max_e}] on Ascend910B with comm_alg "{c.comm_alg}"{tag} (got {e})')
    if e % w:
        raise bad(func, "moe_expert_num",
                  f"must be divisible by ep_world_size - shared_expert_rank_num (got {e} % {w})")
    max_l = rules.a2_fullmesh_max_local
    if not hierarchy and max_l is not None and e // w > max_l:
        raise bad(func, "moe_expert_num",
                  f"local experts per rank (moe_expert_num / ep_world_size) must be <= {max_l} on "
                  f'Ascend910B unless comm_alg is "hierarchy"{tag} (got {e} / {w} = {e // w})')
    _zero(func, bad, "zero_expert_num", c.zero_expert_num, "zero experts")
    _zero(func, bad, "copy_expert_num", c.copy_expert_num, "copy experts")
    _zero(func, bad, "const_expert_num", c.const_expert_num, "const experts")


def _zero(func: str, bad: Bad, param: str, value: int, what: str) -> None:
    if value != 0:
        raise bad(func, param, f"must be 0 on Ascend910B, {what} are not supported (got {value})")


def check_token_sizes(c: MoeConfig, func: str, bad: Bad, bs: int, h: int, bs_param: str, h_param: str) -> None:
    """BS and H on A2 (in place of the A3 / 950 ranges)."""
    if bs < 1 or bs > LIM.max_bs:
        raise bad(func, bs_param, f"dim 0 (BS) must be in [1, {LIM.max_bs}] on Ascend910B (got {bs})")
    hmax = LIM.max_h_hierarchy if c.comm_alg == "hierarchy" else LIM.max_h_fullmesh
    if h < LIM.h_align or h > hmax or h % LIM.h_align:
        raise bad(func, h_param, f"dim 1 (H) must be a multiple of {LIM.h_align} in [{LIM.h_align}, {hmax}] on "
                  f'Ascend910B with comm_alg "{c.comm_alg}" (got {h})')


def check_window(c: MoeConfig, func: str, bad: Bad, max_bs: int, h: int, k: int) -> None:
    """A2's documented window formula, before the mock's own layout rule."""
    need, how = sizing.a2_window_need(c.ep_world_size, max_bs, h, c.moe_expert_num, k, c.comm_alg)
    if need <= c.ccl_buffer_size:
        return
    need_mib = -(-need // (1 << 20))
    buffsize = -(-need_mib // 2)   # the window is 2 x HCCL_BUFFSIZE MiB
    raise bad(func, "ccl_buffer_size", f'window too small for comm_alg "{c.comm_alg}" on Ascend910B: {how} = {need} '
              f"bytes must be <= ccl_buffer_size; set HCCL_BUFFSIZE >= {buffsize} (MiB) (got {c.ccl_buffer_size} bytes)")


def recv_counts_extra(c: MoeConfig, bs: int, k: int) -> int:
    """ep_recv_counts entries A2's "hierarchy" algorithm writes after the W * L counts (its reduce
    information): 2 * G * K * (W / 8) (aclnnMoeDistributeDispatchV2.md); 0 for "fullmesh", which writes
    the counts only, and on other profiles."""
    if not c.profile.atlas_a2 or c.comm_alg != "hierarchy":
        return 0
    w = c.ep_world_size
    g = c.global_bs if c.global_bs else bs * w
    return 2 * g * k * (w // LIM.server_ranks)
