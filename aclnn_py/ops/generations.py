"""The generations of CANN's dispatch / combine operators, and which one a call uses.

CANN has shipped the same two operators under five pairs of entry points (docs/operators.md,
"Group-string generations"): ``aclnnMoeDistributeDispatch`` / ``Combine`` (generation 1) and ``…V2``,
``…V3``, ``…V4``, which name their communicators by group strings and may have a TP domain, and
``…V5``, which takes a context tensor and ``cclBufferSize``. An install has some of them. A
:class:`~aclnn_py.ops.MoeConfig` names the generation its calls use (``generation=``); left at 0 it is
the newest the loaded backend exports both operators of. Every generation runs through the same
operator functions, plans, ``prepare_*`` and buffer methods, and the same compiled launch: what differs
is the C function, its argument list (read from its prototype) and the attributes it has.

A call that uses something its generation has no argument for — a special expert before V3,
``performance_info`` before V4, a TP domain or group strings on V5, … — raises
:class:`GenerationError` naming the generation and the parameter, before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .._binding.prototypes import RunLayout, same_name
from ..runtime import initialized

if TYPE_CHECKING:
    from .._binding.loader import Backend

#: The generation of the context + cclBufferSize entry points.
NEWEST = 5


class GenerationConfig(Protocol):
    """What the generation rules read of a config (:class:`~aclnn_py.ops.MoeConfig` is one; a Protocol,
    so that the config module, which resolves its generation here, is not imported back)."""

    @property
    def generation(self) -> int: ...

    @property
    def tp_world_size(self) -> int: ...


class GenerationError(ValueError):
    """A call or config that the chosen operator generation cannot express, or a generation the
    loaded backend does not export."""


@dataclass(frozen=True)
class Generation:
    """One pair of dispatch / combine entry points."""

    number: int

    @property
    def suffix(self) -> str:
        return "" if self.number == 1 else f"V{self.number}"

    @property
    def dispatch(self) -> str:
        """The dispatch phase-2 function (its phase 1 adds ``GetWorkspaceSize``)."""
        return f"aclnnMoeDistributeDispatch{self.suffix}"

    @property
    def combine(self) -> str:
        return f"aclnnMoeDistributeCombine{self.suffix}"

    @property
    def group_strings(self) -> bool:
        """Communicators named by ``groupEp`` / ``groupTp`` (generations 1-4), not a context tensor."""
        return self.number < NEWEST

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(n + p for n in (self.dispatch, self.combine) for p in ("GetWorkspaceSize", ""))

    def phase2(self, op: str) -> str:
        """The phase-2 function of `op` ("dispatch" or "combine")."""
        return self.dispatch if op == "dispatch" else self.combine

    def __str__(self) -> str:
        return f"generation {self.number} ({self.dispatch} / {self.combine})"


#: Every generation, newest first.
GENERATIONS: tuple[Generation, ...] = tuple(Generation(n) for n in range(NEWEST, 0, -1))


#: The last backend asked about and its answer: a backend's symbols are fixed once it is loaded, and
#: every MoeDistributeBuffer asks (a thread world makes hundreds while its ranks start).
_last_exported: tuple[Backend, tuple[Generation, ...]] | None = None


def exported(backend: Backend | None = None) -> tuple[Generation, ...]:
    """The generations whose four entry points `backend` (default: the loaded one) exports, newest
    first."""
    global _last_exported
    b = backend if backend is not None else initialized()
    last = _last_exported
    if last is not None and last[0] is b:
        return last[1]
    present = tuple(g for g in GENERATIONS if all(b.symbols.get(s) for s in g.symbols))
    _last_exported = (b, present)
    return present


def resolve(requested: int) -> int:
    """The generation a config asking for `requested` uses: the newest exported for 0, else
    `requested` if the loaded backend exports it; GenerationError otherwise."""
    if isinstance(requested, bool) or not isinstance(requested, int):
        raise TypeError(f"generation: expected an int (0 = the newest exported, or 1-{NEWEST}), got "
                        f"{type(requested).__name__} {requested!r}")
    if not 0 <= requested <= NEWEST:
        raise GenerationError(f"generation: must be 0 (the newest the backend exports) or 1 … {NEWEST} "
                              f"(got {requested})")
    b = initialized()
    present = exported(b)
    if requested == 0:
        if not present:
            raise GenerationError(f"generation: the {b.kind} backend at {b.root} exports no generation of the "
                                  "MoE dispatch / combine operators (each needs its four entry points)")
        return present[0].number
    if all(g.number != requested for g in present):
        g = GENERATIONS[NEWEST - requested]
        missing = [s for s in g.symbols if not b.symbols.get(s)]
        have = ", ".join(str(p.number) for p in present) or "none"
        raise GenerationError(f"generation: the {b.kind} backend at {b.root} does not export {g} (missing "
                              f"{', '.join(missing)}); it exports generation(s) {have}")
    return requested


def layout(number: int, op: str) -> RunLayout:
    """The argument list of generation `number`'s `op`, from the prototype the extension was built
    with."""
    from ._layout import compiled_layouts  # the prototypes the extension was built from

    name = GENERATIONS[NEWEST - number].phase2(op)
    found = compiled_layouts().get(name)
    if found is None:
        raise GenerationError(f"{name}: the compiled extension has no run helper for it")
    return found


#: Attributes that only name a communicator the way one generation does; never a feature.
_COMMUNICATOR_ATTRS = frozenset({"ccl_buffer_size", "group_ep", "group_tp"})
#: What an attribute holds when the call does not use it (its default).
_UNUSED: Mapping[str, tuple[object, ...]] = {"tp_world_size": (0, 1), "tp_rank_id": (0,), "zero_expert_num": (0,),
                                 "copy_expert_num": (0,), "const_expert_num": (0,), "comm_alg": ("",),
                                 "expert_shard_type": (0,), "out_dtype": (0,), "group_list_type": (0,)}


def refuse_unsupported(cfg: GenerationConfig, op: str, given: Iterable[str]) -> None:
    """GenerationError when the call of `op` with `cfg` and the inputs named in `given` (the ones not
    None) needs an argument the config's generation has not got."""
    number = cfg.generation
    lay = layout(number, op)
    for name in given:
        if name != "context" and not _names(lay.inputs, name):
            raise GenerationError(_lacks(number, op, name, "input"))
    c_attrs = lay.ints + lay.strings
    for name, unused in _UNUSED.items():
        if getattr(cfg, name) not in unused and not any(same_name(c, name) for c in c_attrs):
            raise GenerationError(_lacks(number, op, name, "attribute") + f" (got {getattr(cfg, name)!r})")
    if number == NEWEST and cfg.tp_world_size >= 2:
        raise GenerationError(f"tp_world_size: {GENERATIONS[0]} has no TP domain; a TP domain needs generation "
                              f"1-4 and a tp communicator (got {cfg.tp_world_size})")


def _lacks(number: int, op: str, name: str, kind: str) -> str:
    having = [g.number for g in GENERATIONS if _has(g.number, op, name)]
    where = f"generation(s) {', '.join(map(str, having))} have it" if having else "no generation has it"
    return (f"{name}: {GENERATIONS[NEWEST - number].phase2(op)} (generation {number}) has no {kind} {name}; "
            f"{where}")


def _has(number: int, op: str, name: str) -> bool:
    try:
        lay = layout(number, op)
    except GenerationError:
        return False
    return _names(lay.inputs + lay.ints + lay.strings, name)


def _names(c_names: tuple[str, ...], name: str) -> bool:
    """One of `c_names` is the argument aclnn-py calls `name` (see :func:`argument_names`)."""
    return any(same_name(c, name) or (name == _ROUTING and same_name(c, "expand_idx")) for c in c_names)


#: Where the first generation's expandIdx travels.
_ROUTING = "assist_info_for_combine"


def argument_names(number: int, op: str, inputs: tuple[str, ...],
                   outputs: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(inputs, outputs) of generation `number`'s `op` in its prototype's order, by the names of the
    operator function (`inputs` / `outputs`: the newest generation's, which has them all). Generation
    1's ``expandIdx`` travels where the later ones have ``assist_info_for_combine`` (dispatch's output,
    combine's input), so it takes that name."""
    lay = layout(number, op)
    return (tuple(_our_name(c, inputs, lay) for c in lay.inputs),
            tuple(_our_name(c, outputs, lay) for c in lay.outputs))


def _our_name(c_name: str, ours: tuple[str, ...], lay: RunLayout) -> str:
    if same_name(c_name, "expand_idx"):
        return _ROUTING
    for name in ours:
        if same_name(c_name, name):
            return name
    raise GenerationError(f"{lay.phase1}: aclnn-py has no argument for its parameter {c_name}")


def given_inputs(names: tuple[str, ...], inputs: Sequence[object]) -> list[str]:
    """The names of the inputs given (not None)."""
    return [n for n, v in zip(names, inputs) if v is not None]
