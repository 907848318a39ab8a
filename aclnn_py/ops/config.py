"""MoeConfig: the attributes of dispatch and combine on one rank, made once and shared by
MoeDistributeBuffer, the operator wrappers and the plans (like nccl4py's NCCLConfig or cuda.core's
options objects).

It checks the types of its fields (naming the parameter), reads the SoC once, owns the numbers
derived from the attributes (local experts, rows a rank receives, window need) and remembers which
shapes passed the pre-checks, so a repeated call pays a set lookup instead of the rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .._binding.prototypes import RunLayout, name_key
from .._core import ConfigBase, PackedBase
from ..runtime import initialized, soc_name
from . import generations, sizing
from .profiles import SocProfile, profile_of

#: The integer attributes (checked as int64 when a config is made). Their order in a C call is the
#: prototype's: :meth:`MoeConfig.packed` lays them out by name.
_INT_FIELDS = ("ep_world_size", "ep_rank_id", "moe_expert_num", "ccl_buffer_size", "tp_world_size", "tp_rank_id",
               "expert_shard_type", "shared_expert_num", "shared_expert_rank_num", "zero_expert_num",
               "copy_expert_num", "const_expert_num", "global_bs", "quant_mode", "expert_token_nums_type",
               "comm_quant_mode", "out_dtype", "group_list_type")


@dataclass(frozen=True, eq=False)
class MoeConfig(ConfigBase):
    """The attributes of ``aclnnMoeDistributeDispatchV5`` / ``aclnnMoeDistributeCombineV5`` for one
    rank (names as the C parameters, in snake case). ``soc`` is read from the device when not given.
    The dispatch-only (``quant_mode``, ``expert_token_nums_type``) and combine-only
    (``comm_quant_mode``, ``out_dtype``, ``group_list_type``) attributes are ignored by the other op.
    Configs compare by identity; make one per model and reuse it.

    ``generation`` picks the operators' generation (docs/operators.md, "Group-string generations"): 0,
    the default, is the newest the loaded backend exports (read back as its number, e.g. 5); 1 … 4 are
    the group-string generations, which name the EP communicator by ``group_ep`` (and a TP domain of
    two ranks by ``group_tp``, ``tp_world_size=2``, ``tp_rank_id``) instead of a context tensor, and
    ignore ``ccl_buffer_size`` (pass 0). :class:`~aclnn_py.ops.generations.GenerationError` names what a
    generation lacks."""

    ep_world_size: int
    ep_rank_id: int
    moe_expert_num: int
    ccl_buffer_size: int
    tp_world_size: int = 0
    tp_rank_id: int = 0
    expert_shard_type: int = 0
    shared_expert_num: int = 1
    shared_expert_rank_num: int = 0
    zero_expert_num: int = 0
    copy_expert_num: int = 0
    const_expert_num: int = 0
    global_bs: int = 0
    comm_alg: str = ""
    quant_mode: int = 0
    expert_token_nums_type: int = 1
    comm_quant_mode: int = 0
    out_dtype: int = 0
    group_list_type: int = 0
    soc: str = ""
    generation: int = 0
    group_ep: str = ""
    group_tp: str = ""
    #: what passed the pre-checks: (op, BS, H, K) per shape, (op, -1, inputs) per set of inputs of an older
    #: generation (a typed field of ConfigBase)
    _passed: set[tuple[object, ...]] = field(default_factory=set, init=False, repr=False)
    #: the attributes laid out for each operator's run helper, by phase-2 name (:meth:`packed`; a typed
    #: field of ConfigBase)
    _packed: dict[str, PackedBase] = field(default_factory=dict, init=False, repr=False)
    #: the phase-2 functions of the generation this config's calls use (a typed field of ConfigBase)
    _operators: tuple[str, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if type(value) is not int:
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
                object.__setattr__(self, name, int(value))
            if not -(2**63) <= getattr(self, name) < 2**63:  # the C attributes are int64_t
                raise ValueError(f"{name}: must fit in int64 (got {getattr(self, name)})")
        for name in ("comm_alg", "group_ep", "group_tp"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name}: expected a str, got {type(value).__name__} {value!r}")
        if not isinstance(self.soc, str):
            raise TypeError(f"soc: expected a str, got {type(self.soc).__name__} {self.soc!r}")
        if not self.soc:
            object.__setattr__(self, "soc", soc_name())
        number = generations.resolve(self.generation)
        object.__setattr__(self, "generation", number)
        chosen = generations.GENERATIONS[generations.NEWEST - number]
        object.__setattr__(self, "_operators", (chosen.dispatch, chosen.combine))
        if chosen.group_strings and not self.group_ep:
            raise generations.GenerationError(
                f"group_ep: {chosen} names its EP communicator by group string: pass group_ep "
                "(Communicator.name), or use MoeDistributeBuffer, which does")

    def replace(self, **changes: int | str) -> MoeConfig:
        """A copy with some attributes changed (the SoC stays as read)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, int | str]) -> MoeConfig:
        """A config from keyword attributes (the operator wrappers' keyword form), cached by value and
        SoC so repeated calls reuse one config."""
        soc = soc_name()
        key = (soc, tuple(attrs.items()))
        cacheable = plain_key(attrs.values())
        cfg = _by_attrs.get(key) if cacheable else None
        if cfg is None:
            _check_attr_names(attrs)
            cfg = cls(soc=soc, **attrs)  # type: ignore[arg-type]
            if cacheable:
                if len(_by_attrs) > 256:
                    _by_attrs.clear()
                _by_attrs[key] = cfg
        return cfg

    # ---- derived numbers ----------------------------------------------------------------------------------
    def packed(self, layout: RunLayout) -> PackedBase:
        """The attributes as the operator's run helper reads them (made once per operator): each C
        attribute of `layout` is the field of the same name (``epWorldSize`` is ``ep_world_size``), in
        the prototype's order."""
        found = self._packed.get(layout.phase2)
        if found is None or found.layout is not layout:  # the extension's layouts are made once
            found = self._packed[layout.phase2] = PackedAttrs(self, layout)
        return found

    @cached_property
    def profile(self) -> SocProfile:
        return profile_of(self.soc)

    @cached_property
    def shared(self) -> int:
        """S as the kernels see it ((1, 0) is "no shared expert": 0)."""
        return sizing.normalized_shared(self.shared_expert_num, self.shared_expert_rank_num)

    @cached_property
    def is_shared_rank(self) -> bool:
        return self.ep_rank_id < self.shared_expert_rank_num

    @cached_property
    def moe_local_experts(self) -> int:
        """L = E / (W − R), the MoE experts on each MoE rank."""
        return sizing.moe_local_experts(self.ep_world_size, self.moe_expert_num, self.shared_expert_rank_num)

    @cached_property
    def local_experts(self) -> int:
        """The experts on this rank: 1 on a shared-expert rank, L on a MoE rank."""
        return 1 if self.is_shared_rank else self.moe_local_experts

    def max_bs(self, bs: int) -> int:
        """maxBs: global_bs / W, or this rank's BS when global_bs is 0."""
        return self.global_bs // self.ep_world_size if self.global_bs else bs

    def rows_capacity(self, bs: int, topk: int, elastic: bool = False) -> int:
        """A, the expand_x rows this rank can receive. With elastic_info (Ascend950) a rank may serve
        either role, so A is the larger of the two."""
        w, r = self.ep_world_size, self.shared_expert_rank_num
        if elastic and 0 <= r < w:
            moe = sizing.rows_capacity(w, w - 1, self.moe_expert_num, self.shared_expert_num, r, self.global_bs, bs,
                                       topk)
            shared = sizing.rows_capacity(w, 0, self.moe_expert_num, self.shared_expert_num, r, self.global_bs, bs,
                                          topk) if r > 0 else 0
            return max(moe, shared)
        return sizing.rows_capacity(w, self.ep_rank_id, self.moe_expert_num, self.shared_expert_num, r,
                                    self.global_bs, bs, topk)

    def window_need(self, bs: int, hidden: int, topk: int) -> int:
        """Window bytes a dispatch/combine of this shape needs beyond the 1 MiB status area."""
        return sizing.window_need(self.ep_world_size, self.moe_local_experts, self.max_bs(bs), hidden, topk,
                                  self.shared, self.comm_alg == "fullmesh_v2", self.profile.window_bytes_per_rank)


class PackedAttrs(PackedBase):
    """A config's attributes for one operator's run helper: ``ints`` (``int64_t[]``) and ``strings``
    (``const char *[]``) in the prototype's order; the compiled core reads them through the typed
    fields of PackedBase (their addresses)."""

    __slots__ = ("ints", "strings", "_keep")

    def __init__(self, config: MoeConfig, layout: RunLayout):
        ffi = initialized().ffi
        self.layout = layout
        self.ints = ffi.new("int64_t[]", [_field_value(config, layout, name) for name in layout.ints] or [0])
        self._keep = [ffi.new("char[]", str(_field_value(config, layout, name)).encode()) for name in layout.strings]
        self.strings = ffi.new("const char *[]", self._keep or [ffi.NULL])
        self.ints_address = int(ffi.cast("uintptr_t", self.ints))
        self.strings_address = int(ffi.cast("uintptr_t", self.strings))


def _field_value(config: MoeConfig, layout: RunLayout, c_name: str) -> int | str:
    """The field of `config` that the C attribute `c_name` of `layout` is."""
    name = _FIELD_BY_KEY.get(name_key(c_name))
    if name is None:
        raise TypeError(f"{layout.phase1}: MoeConfig has no field for the attribute {c_name}")
    value: int | str = getattr(config, name)
    return value


_ATTR_NAMES = frozenset(f.name for f in dataclasses.fields(MoeConfig) if f.init)
# by the key both spellings share (``epWorldSize`` and ``ep_world_size``): a rank's first call packs
# some thirty attributes, and a pairwise comparison with every field was a good part of its cost
_FIELD_BY_KEY = {name_key(f.name): f.name for f in dataclasses.fields(MoeConfig) if f.init and f.name != "soc"}
_by_attrs: dict[tuple[str, tuple[tuple[str, int | str], ...]], MoeConfig] = {}


def plain_key(values: Iterable[object]) -> bool:
    """Every value is exactly an int or a str: a config cache looks such keys up. Another type may equal
    a cached key (8.0, Decimal(8) and True equal 8) while MoeConfig refuses it, and a refusal must not
    depend on what was cached before."""
    return all(v.__class__ is int or v.__class__ is str for v in values)


def _check_attr_names(attrs: Mapping[str, object]) -> None:
    """TypeError naming the keywords of an operator call that are no MoeConfig attribute."""
    unknown = set(attrs) - _ATTR_NAMES
    if unknown:
        raise TypeError(f"unexpected attribute(s) {', '.join(sorted(unknown))}; MoeConfig takes "
                        f"{', '.join(sorted(_ATTR_NAMES))}")


def resolve_config(config: MoeConfig | None, attrs: Mapping[str, int | str]) -> MoeConfig:
    """The config of an operator call: `config`, or one made from keyword attributes (not both)."""
    if config is None:
        return MoeConfig.from_attrs(attrs)
    if attrs:
        _check_attr_names(attrs)  # a misspelt keyword is named as such, not as an attribute given twice
        raise TypeError(f"pass the attributes in config or as keywords, not both (got {', '.join(sorted(attrs))})")
    return config
