"""C prototypes as aclnn-py compares and calls them, in a canonical form that says how each argument is
passed: typedefs expanded (``aclrtStream`` is ``void *``), fixed-width integers reduced to size and
signedness (``int64_t`` and ``long`` are the same on LP64), enums as ``i32``, qualifiers and parameter
names ignored, a parameter array as a pointer; pointee types are kept (``const char *`` is not
``const aclTensor *``).

This module imports only the standard library: ``build_abi.py`` (the build-time header parser, which
does not ship) loads it from its file to describe the project's ``include/``, and the run time reads the
table it produced (:class:`CompiledAbi`) and the layouts of the operators' run helpers from it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_DEFINE_RE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+(-?(?:0x[0-9A-Fa-f]+|\d+))[uUlL]*\s*$")
_CPLUSPLUS_IF = re.compile(r"^(ifdef\s+__cplusplus\b|if\s+defined\s*\(?\s*__cplusplus\b|if\s+__cplusplus\b)")
_CPLUSPLUS_IFNOT = re.compile(r"^(ifndef\s+__cplusplus\b|if\s+!\s*defined\s*\(?\s*__cplusplus\b)")


# ---- header text ----------------------------------------------------------------------------------
def strip_header(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Remove comments and preprocessor lines, and the C++-only branches of ``__cplusplus``
    conditionals (other conditionals keep every branch); return (declarations, integer #defines)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"\\\n", " ", text)  # continued preprocessor lines are one directive
    out: list[str] = []
    defines: list[tuple[str, str]] = []
    # One entry per open #if: True = this branch is C++-only (skipped), False = the C branch of a
    # __cplusplus test, None = a conditional on anything else (all of its branches are kept).
    frames: list[bool | None] = []
    for line in text.splitlines():
        s = line.strip()
        skipping = any(f is True for f in frames)
        if not s.startswith("#"):
            if not skipping:
                out.append(line)
            continue
        directive = s[1:].strip()
        if _CPLUSPLUS_IF.match(directive):
            frames.append(True)
        elif _CPLUSPLUS_IFNOT.match(directive):
            frames.append(False)
        elif directive.startswith("if"):
            frames.append(None)
        elif directive.startswith(("else", "elif")) and frames:
            if frames[-1] is not None:
                frames[-1] = not frames[-1]
        elif directive.startswith("endif") and frames:
            frames.pop()
        elif not skipping:
            m = _DEFINE_RE.match(s)
            if m:
                defines.append((m.group(1), m.group(2)))
    return "\n".join(out), defines


# ---- canonical types --------------------------------------------------------------------------------
_BASE_TYPES = {
    "char": "char", "signed char": "i8", "unsigned char": "u8",
    "short": "i16", "unsigned short": "u16",
    "int": "i32", "unsigned": "u32",
    "long": "i64", "unsigned long": "u64",  # LP64
    "long long": "i64", "unsigned long long": "u64",
    "_Bool": "bool", "bool": "bool", "float": "f32", "double": "f64", "void": "void",
    "int8_t": "i8", "uint8_t": "u8", "int16_t": "i16", "uint16_t": "u16", "int32_t": "i32",
    "uint32_t": "u32", "int64_t": "i64", "uint64_t": "u64", "size_t": "u64", "uintptr_t": "u64",
    "intptr_t": "i64", "ssize_t": "i64", "ptrdiff_t": "i64",
}


def base_type(names: list[str]) -> str:
    """The canonical form of a type spelled with C's own words (``unsigned long int``)."""
    words = [w for w in names if w not in ("signed", "int")] if len(names) > 1 else list(names)
    if "signed" in names and words == ["char"]:
        return "i8"
    if "unsigned" in words and len(words) == 1:
        return "u32"
    key = " ".join(words) if words else "int"
    return _BASE_TYPES.get(key, key)


_STDINT_NAMES = frozenset("""int8_t uint8_t int16_t uint16_t int32_t uint32_t int64_t uint64_t size_t uintptr_t
    intptr_t ssize_t ptrdiff_t bool""".split())


def known_base_type(name: str) -> str | None:
    """The canonical form of a type name from <stdint.h>, <stddef.h> or <stdbool.h>, else None."""
    return _BASE_TYPES[name] if name in _STDINT_NAMES else None



# ---- prototypes -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """One parameter: its declaration as written (``const aclTensor *x``), its name, its canonical type."""

    decl: str
    name: str
    canon: str


@dataclass(frozen=True)
class Prototype:
    """A C function prototype with its return and parameter types in canonical form."""

    name: str
    decl: str      # the whole prototype as C text, without the trailing ';'
    ret: str       # return type as C text
    ret_canon: str
    params: tuple[Param, ...]

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "decl": self.decl, "ret": self.ret, "ret_canon": self.ret_canon,
                "params": [[p.decl, p.name, p.canon] for p in self.params]}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Prototype:
        params = tuple(Param(str(a), str(b), str(c)) for a, b, c in d["params"])  # type: ignore[attr-defined]
        return cls(str(d["name"]), str(d["decl"]), str(d["ret"]), str(d["ret_canon"]), params)


@dataclass(frozen=True)
class CompiledAbi:
    """The prototypes the cffi module was generated from."""

    functions: dict[str, Prototype]
    typedefs: dict[str, str]

    @classmethod
    def from_json(cls, text: str) -> CompiledAbi:
        d = json.loads(text)
        return cls({f["name"]: Prototype.from_json(f) for f in d["functions"]}, dict(d["typedefs"]))


def compiled_abi(module: object) -> CompiledAbi | None:
    """The prototype table embedded in the compiled cffi module, or None for a module built before it."""
    lib = getattr(module, "lib", None)
    fn = getattr(lib, "aclnnpy_prototypes", None)
    if fn is None:
        return None
    ffi = getattr(module, "ffi")  # noqa: B009 - the cffi module's ffi object
    return CompiledAbi.from_json(ffi.string(fn()).decode())


# ---- the operators' run helpers ------------------------------------------------------------------
PHASE1_SUFFIX = "GetWorkspaceSize"
_INT_CANON = re.compile(r"^[iu](8|16|32|64)$")


@dataclass(frozen=True)
class RunLayout:
    """How an operator's generated run helper (``aclnnpy_run_<phase 2>``, csrc/aclnnpy.h) passes the
    phase-1 prototype's parameters: tensors as one array (the inputs, then the outputs), integer
    attributes as one ``int64_t`` array and string attributes as one ``const char *`` array, each in
    the prototype's order. ``call`` is, per phase-1 parameter before the workspace size, the array
    (``"t"``, ``"a"``, ``"s"``) and the index it is read from."""

    phase1: str
    phase2: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ints: tuple[str, ...]
    strings: tuple[str, ...]
    call: tuple[tuple[str, int], ...]

    @property
    def helper(self) -> str:
        return f"aclnnpy_run_{self.phase2}"


def run_layout(phase1: Prototype) -> RunLayout:
    """The run helper's layout of an operator whose phase 1 is `phase1` (``...GetWorkspaceSize``, ending
    with ``uint64_t *workspaceSize, aclOpExecutor **executor``); ValueError for a parameter type the
    helpers cannot pass."""
    params = phase1.params
    if len(params) < 2 or params[-2].canon != "u64*" or params[-1].canon != "struct aclOpExecutor**":
        raise ValueError(f"{phase1.name}: a phase 1 ends with (uint64_t *workspaceSize, aclOpExecutor **executor)")
    inputs: list[str] = []
    outputs: list[str] = []
    ints: list[str] = []
    strings: list[str] = []
    kinds: list[tuple[str, str]] = []
    for p in params[:-2]:
        if p.canon == "struct aclTensor*":
            kind, group = ("in", inputs) if re.match(r"^\s*const\b", p.decl) else ("out", outputs)
        elif _INT_CANON.match(p.canon) or p.canon == "bool":
            kind, group = "a", ints
        elif p.canon == "char*":
            kind, group = "s", strings
        else:
            raise ValueError(f"{phase1.name}: parameter {p.name} ({p.decl}): a run helper passes tensors, "
                             "integers, bools and strings only")
        kinds.append((kind, p.name))
        group.append(p.name)
    call = tuple(("t", inputs.index(n)) if k == "in" else ("t", len(inputs) + outputs.index(n)) if k == "out"
                 else (k, (ints if k == "a" else strings).index(n)) for k, n in kinds)
    return RunLayout(phase1.name, phase1.name[:-len(PHASE1_SUFFIX)], tuple(inputs), tuple(outputs), tuple(ints),
                     tuple(strings), call)


def run_layouts(functions: Iterable[Prototype]) -> dict[str, RunLayout]:
    """The run helpers' layouts by phase-2 name: one per operator with both phases among `functions`."""
    by_name = {f.name: f for f in functions}
    return {name[:-len(PHASE1_SUFFIX)]: run_layout(f) for name, f in by_name.items()
            if name.endswith(PHASE1_SUFFIX) and name[:-len(PHASE1_SUFFIX)] in by_name}


def same_name(c_name: str, py_name: str) -> bool:
    """A C parameter (``expertIdsOptional``, ``expandXOut``) and a Python name (``expert_ids``,
    ``expand_x``, ``x_out``) name the same thing: compared without case, underscores and the
    ``Optional`` / ``Out`` suffixes."""
    return name_key(c_name) == name_key(py_name)


@functools.cache  # a few dozen parameter names, compared at each operator's first use in a process
def name_key(name: str) -> str:
    """What :func:`same_name` compares: the name without underscores, case and those suffixes."""
    key = name.replace("_", "").lower()
    for suffix in ("optional", "out"):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[:-len(suffix)]
    return key



def first_difference(ours: Prototype, theirs: Prototype) -> str | None:
    """None when the two prototypes pass arguments the same way, else a sentence naming the first
    differing parameter (1-based position, ours vs theirs) or the return type."""
    for i in range(max(len(ours.params), len(theirs.params))):
        a = ours.params[i] if i < len(ours.params) else None
        b = theirs.params[i] if i < len(theirs.params) else None
        if a is None or b is None or a.canon != b.canon:
            count = (f"; {len(ours.params)} parameters in aclnn-py, {len(theirs.params)} in the header"
                     if len(ours.params) != len(theirs.params) else "")
            return (f"parameter {i + 1} is `{a.decl if a else '(none)'}` in aclnn-py but "
                    f"`{b.decl if b else '(none)'}` in the header{count}")
    if ours.ret_canon != theirs.ret_canon:
        return f"it returns `{ours.ret}` in aclnn-py but `{theirs.ret}` in the header"
    return None

