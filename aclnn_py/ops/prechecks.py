"""Pre-checks of the attribute, mode, size and window rules of dispatch and combine, raised before
any C call with the C side's exception class, status and wording (``<param>: <rule> (got <value>)``).

On real CANN the op tiling rejects bad parameters with terse inner errors; these checks make the
mistake readable there too. A pre-check gives the C wording earlier, never a different answer: phase
1 checks the pointers and descriptors first, then the attributes and modes, then the token tensors'
types and ranks, then the sizes and the window, and a rule here is applied only when every check
phase 1 makes before it passes (:func:`verdict` looks at those without wording them; C words them).
tests/ops/test_prechecks.py and tests/ops/test_precheck_agreement.py hold the two to the same answers. Rules
that passed once are remembered on the MoeConfig, so a repeated call pays set lookups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from ..dtypes import DataType
from ..errors import AclnnParamInvalid, param_invalid
from ..tensor import Tensor
from . import prechecks_a2, releases, sizing
from .config import MoeConfig
from .generations import NEWEST

INT32_MAX = 2**31 - 1
FUNCS = {"dispatch": "aclnnMoeDistributeDispatchV5GetWorkspaceSize",
         "combine": "aclnnMoeDistributeCombineV5GetWorkspaceSize"}
#: the tensors whose dim 0 / dim 1 carry BS and H in each op
_BS_H_PARAMS = {"dispatch": ("x", "x"), "combine": ("expert_ids", "expand_x")}
#: how many leading inputs / outputs (C order) phase 1 requires to be non-NULL
_REQUIRED = {"dispatch": (3, 5), "combine": (6, 1)}
_HALF = frozenset({DataType.FLOAT16, DataType.BF16})
_X_LOW_PRECISION = frozenset({DataType.HIFLOAT8, DataType.FLOAT8_E4M3FN, DataType.FLOAT8_E5M2,
                              DataType.FLOAT4_E2M1, DataType.FLOAT4_E1M2})


class _CDecides:
    """Phase 1 refuses the call before the pre-checked rules: a NULL it needs, a closed or
    non-contiguous tensor, a token tensor of the wrong type or rank. C words it."""

    def __repr__(self) -> str:
        return "C_DECIDES"


C_DECIDES: Final = _CDecides()


def verdict(config: MoeConfig, op: str, inputs: Sequence[Tensor | None],
            outputs: Sequence[object] | None) -> AclnnParamInvalid | _CDecides | None:
    """What phase 1 of `op` ("dispatch" or "combine") will say about this call, as far as the
    pre-checked rules go: None (they pass), the error it returns, or C_DECIDES (it refuses the call at
    an earlier check). `inputs` in the C order (None: NULL); `outputs` in the C order (None: NULL, any
    other non-Tensor: one the wrapper allocates, correctly), or None when it allocates them all."""
    if config.generation != NEWEST:
        return None  # the pre-checks word the newest generation's rules; the others' are C's alone
    if not _structure_ok(op, inputs, outputs):
        return C_DECIDES
    func = FUNCS[op]
    # the A2 rules differ between CANN releases (ops.releases): what passed under one may not under another
    rules = releases.active() if config.profile.atlas_a2 else None
    attrs_key = (op, -1, -1, rules.name if rules else -1)
    if attrs_key not in config._passed:
        try:
            _check_attrs(config, func, rules)
            _check_modes(config, op, func)
        except AclnnParamInvalid as exc:
            return exc
        config._passed.add(attrs_key)  # the attributes and modes passed
    if not _tokens_ok(config, op, inputs):
        return C_DECIDES
    ids = inputs[2]
    assert ids is not None
    tokens = inputs[1]
    assert tokens is not None
    bs, h, k = ids.shape[0], tokens.shape[1], ids.shape[1]
    key = (op, bs, h, k)
    if key in config._passed:
        return None
    bs_param, h_param = _BS_H_PARAMS[op]
    try:
        _check_sizes(config, func, bs, h, k, bs_param, h_param)
        _check_window(config, func, bs, h, k)
    except AclnnParamInvalid as exc:
        return exc
    if len(config._passed) > 4096:
        config._passed.clear()
    config._passed.add(key)
    return None


def size_problem(config: MoeConfig, op: str, bs: int, h: int, k: int) -> AclnnParamInvalid | None:
    """The error phase 1 of `op` returns for tokens of BS rows, hidden size H and top-k K under
    `config`'s attributes (the size and attribute rules, not the window), or None; for a caller that
    wants to know before it makes any tensor or communicator (the demo, before starting ranks)."""
    func = FUNCS[op]
    bs_param, h_param = _BS_H_PARAMS[op]
    try:
        _check_attrs(config, func, releases.active() if config.profile.atlas_a2 else None)
        _check_modes(config, op, func)
        _check_sizes(config, func, bs, h, k, bs_param, h_param)
    except AclnnParamInvalid as exc:
        return exc
    return None


def shape_passed(config: MoeConfig, op: str, bs: int, h: int, k: int) -> bool:
    """Whether calls of `op` with this BS, H and K passed every pre-checked rule of `config` before
    (the rules :func:`verdict` remembers)."""
    return (op, bs, h, k) in config._passed


def _c_contiguous(t: Tensor) -> bool:
    """Phase 1's contiguity: row-major strides, dims of size 1 free, empty tensors always."""
    if t.is_contiguous:
        return True
    expect = 1
    for d, st in zip(reversed(t.shape), reversed(t.strides)):
        if d != 1 and st != expect:
            return math.prod(t.shape) == 0
        expect *= d
    return True


def _structure_ok(op: str, inputs: Sequence[Tensor | None], outputs: Sequence[object] | None) -> bool:
    """Phase 1's first checks pass: the required pointers are non-NULL, every tensor is open and
    contiguous, the context is 1-D int32."""
    n_in, n_out = _REQUIRED[op]
    if any(t is None for t in inputs[:n_in]):
        return False
    if outputs is not None and any(t is None for t in outputs[:n_out]):
        return False
    for group in (inputs, outputs or ()):
        for t in group:
            if isinstance(t, Tensor) and (not t._open or not _c_contiguous(t)):
                return False
    context = inputs[0]
    assert context is not None
    return context.dtype == DataType.INT32 and context.ndim == 1


def _tokens_ok(c: MoeConfig, op: str, inputs: Sequence[Tensor | None]) -> bool:
    """The token tensors pass phase 1's type and rank checks (dispatch: x, expert_ids and their BS
    agreeing; combine: expand_x, expert_ids), which it makes before the size rules."""
    tokens, ids = inputs[1], inputs[2]
    assert tokens is not None and ids is not None
    allowed = _HALF | _X_LOW_PRECISION if op == "dispatch" and c.profile.low_precision else _HALF
    if tokens.dtype not in allowed or tokens.ndim != 2 or ids.dtype != DataType.INT32 or ids.ndim != 2:
        return False
    return op != "dispatch" or ids.shape[0] == tokens.shape[0]


def _check_modes(c: MoeConfig, op: str, func: str) -> None:
    """Each op's own modes, which phase 1 checks right after the shared attributes."""
    p = c.profile
    soc = p.name
    if op == "dispatch":
        if c.quant_mode not in p.quant_modes:
            if p.low_precision:
                raise _bad(func, "quant_mode", f"must be in [0, 5] on {soc} (got {c.quant_mode})")
            static = ", static quant is not supported" if c.quant_mode == 1 else ""
            raise _bad(func, "quant_mode", f"must be 0 or 2 on {soc}{static} (got {c.quant_mode})")
        if c.expert_token_nums_type not in (0, 1):
            raise _bad(func, "expert_token_nums_type", f"must be 0 or 1 (got {c.expert_token_nums_type})")
        return
    if c.comm_quant_mode not in p.comm_quant_modes:
        allowed = sorted(p.comm_quant_modes)
        listed = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        raise _bad(func, "comm_quant_mode", f"must be {listed} on {soc} (got {c.comm_quant_mode})")
    if p.atlas_a2 and c.comm_quant_mode == 2 and c.comm_alg != "hierarchy":
        raise _bad(func, "comm_quant_mode", f'2 needs comm_alg "hierarchy" on Ascend910B (got comm_alg "{c.comm_alg}")')
    if c.out_dtype != 0:
        raise _bad(func, "out_dtype", f"is reserved and must be 0 (got {c.out_dtype})")
    # group_list_type is reserved and read by no CANN tiling: any value passes, as on CANN


def _bad(func: str, param: str, rule: str) -> AclnnParamInvalid:
    return param_invalid(func, f"{param}: {rule}")


def _check_attrs(c: MoeConfig, func: str, rules: releases.RuleSet | None) -> None:
    if rules is not None:
        prechecks_a2.check_attrs(c, func, _bad, rules)
        return
    w, r, soc = c.ep_world_size, c.ep_rank_id, c.profile.name
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
    if c.profile.atlas_a2:
        prechecks_a2.check_token_sizes(c, func, _bad, bs, h, bs_param, h_param)
    elif bs < 1 or bs > 512:
        raise _bad(func, bs_param, f"dim 0 (BS) must be in [1, 512] (got {bs})")
    elif h < 1024 or h > 8192:
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
                       f"on {p.name} (got {bs})")
        if p.fullmesh_v2_max_topk is not None and k > p.fullmesh_v2_max_topk:
            raise _bad(func, "expert_ids", f'dim 1 (K) must be <= {p.fullmesh_v2_max_topk} with comm_alg '
                       f'"fullmesh_v2" on {p.name} (got {k})')


def _check_window(c: MoeConfig, func: str, bs: int, h: int, k: int) -> None:
    w, ccl = c.ep_world_size, c.ccl_buffer_size
    max_bs = c.max_bs(bs)
    if max_bs > 1 << 31:
        raise _bad(func, "global_bs", "global_bs / ep_world_size (maxBs) must be <= 2^31, no HCCL window holds "
                   f"more (got {c.global_bs} with ep_world_size {w})")
    if ccl < 0:
        raise _bad(func, "ccl_buffer_size", f"must be >= 0 (got {ccl})")
    if c.profile.atlas_a2:
        prechecks_a2.check_window(c, func, _bad, max_bs, h, k)
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
