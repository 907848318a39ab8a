"""The C ABI aclnn-py is compiled for, and the guard that checks an installed CANN against it.

Two users share the header parser here:

* ``build_ffi.py`` parses the project's ``include/`` (clean C) to generate the cffi module, and embeds
  the resulting prototype table in it (``aclnnpy_prototypes()``, a JSON string). It loads this file
  by path, without importing the package, so only the standard library and pycparser may be imported
  at module level.
* :func:`check_root` runs when a real CANN root is loaded: it finds the installed headers that
  declare the bound functions (preferring the headers next to the library each symbol was bound
  from), extracts just those prototypes from headers that may be messy C++ (``extern "C"``,
  attributes, visibility macros, ``constexpr``, default arguments), and compares each one with the
  compiled table. A different prototype called through cffi is a crash or silent garbage, so
  :func:`enforce` refuses to load on any difference, and warns about (or, with
  ``ACLNN_PY_ABI_CHECK=strict``, refuses) every bound function whose prototype it could not compare.

Types are compared by how arguments are passed, not by spelling: the project's typedefs are expanded
(``aclrtStream`` is ``void *``), fixed-width integers are reduced to size and signedness
(``int64_t`` and ``long`` are the same on LP64), enums are ``int``, qualifiers and parameter names
are ignored and a parameter array is a pointer. Pointee types are compared (``const char *`` is not
``const aclTensor *``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pycparser  # type: ignore[import-untyped]
from pycparser import c_ast, c_generator

#: The project's headers, in dependency order (later headers use types of earlier ones).
HEADERS = [
    "acl/acl_base.h",
    "acl/acl_rt.h",
    "aclnn/acl_meta.h",
    "aclnn/aclnn_base.h",
    "aclnnop/aclnn_moe_distribute_dispatch.h",
    "aclnnop/aclnn_moe_distribute_dispatch_v2.h",
    "aclnnop/aclnn_moe_distribute_dispatch_v3.h",
    "aclnnop/aclnn_moe_distribute_dispatch_v4.h",
    "aclnnop/aclnn_moe_distribute_dispatch_v5.h",
    "aclnnop/aclnn_moe_distribute_combine.h",
    "aclnnop/aclnn_moe_distribute_combine_v2.h",
    "aclnnop/aclnn_moe_distribute_combine_v3.h",
    "aclnnop/aclnn_moe_distribute_combine_v4.h",
    "aclnnop/aclnn_moe_distribute_combine_v5.h",
    "hccl/hccl_types.h",
    "hccl/hccl_comm.h",
    "hccl/hccl.h",
    "hccl/hccl_kfc.h",
]

#: Environment variable that turns a refusal of the guard (a prototype mismatch, or under the strict
#: mode a prototype that could not be verified) into a warning.
ENV_SKIP = "ACLNN_PY_SKIP_ABI_CHECK"
#: Environment variable choosing what an unverifiable prototype does at load: "warn" (the default) or
#: "strict" (refuse to load).
ENV_MODE = "ACLNN_PY_ABI_CHECK"
_MODES = ("warn", "strict")

# Types the headers take from <stdint.h>/<stddef.h>/<stdbool.h>; declared only so pycparser can parse.
PARSE_PRELUDE = """
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t; typedef unsigned long size_t; typedef _Bool bool;
typedef unsigned long uintptr_t; typedef long intptr_t; typedef long ssize_t; typedef long ptrdiff_t;
"""
_PRELUDE_NAMES = frozenset(re.findall(r"(\w+);", PARSE_PRELUDE))

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


def _base_type(names: list[str]) -> str:
    words = [w for w in names if w not in ("signed", "int")] if len(names) > 1 else list(names)
    if "signed" in names and words == ["char"]:
        return "i8"
    if "unsigned" in words and len(words) == 1:
        return "u32"
    key = " ".join(words) if words else "int"
    return _BASE_TYPES.get(key, key)


def canonical(node: c_ast.Node, typedefs: Mapping[str, str]) -> str:
    """How a value of this declared type is passed: typedefs of `typedefs` expanded, integers as
    size and signedness, enums as ``i32``, qualifiers dropped, arrays as pointers."""
    if isinstance(node, (c_ast.Decl, c_ast.Typename, c_ast.TypeDecl)):
        return canonical(node.type, typedefs)
    if isinstance(node, (c_ast.PtrDecl, c_ast.ArrayDecl)):
        return canonical(node.type, typedefs) + "*"
    if isinstance(node, c_ast.FuncDecl):
        params = [p for p in (node.args.params if node.args else []) if not _is_void(p)]
        args = ",".join(canonical(p, typedefs) for p in params if not isinstance(p, c_ast.EllipsisParam))
        return f"{canonical(node.type, typedefs)}({args})"
    if isinstance(node, c_ast.IdentifierType):
        if len(node.names) == 1 and node.names[0] in typedefs:
            return typedefs[node.names[0]]
        return _base_type(list(node.names))
    if isinstance(node, c_ast.Struct):
        return f"struct {node.name}"
    if isinstance(node, c_ast.Union):
        return f"union {node.name}"
    if isinstance(node, c_ast.Enum):
        return "i32"
    raise TypeError(f"cannot canonicalise a {type(node).__name__}")


def _is_void(p: c_ast.Node) -> bool:
    """The lone ``void`` of ``f(void)``."""
    return (isinstance(p, c_ast.Typename) and isinstance(p.type, c_ast.TypeDecl)
            and isinstance(p.type.type, c_ast.IdentifierType) and p.type.type.names == ["void"])


def _type_text(gen: c_generator.CGenerator, node: c_ast.Node) -> str:
    """Render a declarator's type without its name (e.g. ``const char *``)."""
    decl = c_ast.Typename(None, [], None, node)
    inner = node
    while not isinstance(inner, c_ast.TypeDecl):
        inner = inner.type
    saved = inner.declname
    inner.declname = None
    text = str(gen.visit(decl))
    inner.declname = saved
    return text


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


def _prototype(node: c_ast.Decl, gen: c_generator.CGenerator, typedefs: Mapping[str, str]) -> Prototype:
    fdecl = node.type
    params: list[Param] = []
    for i, p in enumerate(fdecl.args.params if fdecl.args else []):
        if _is_void(p):
            continue
        name = p.name or f"arg{i}"
        params.append(Param(str(gen.visit(p)), name, canonical(p, typedefs)))
    ret = _type_text(gen, fdecl.type)
    return Prototype(node.name, str(gen.visit(node)), ret, canonical(fdecl.type, typedefs), tuple(params))


def _typedef_map(nodes: Iterable[c_ast.Node], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Canonical type of every typedef among `nodes`, in order (later ones may use earlier ones)."""
    out = dict(base or {})
    for node in nodes:
        if isinstance(node, c_ast.Typedef):
            inner = node.type.type if isinstance(node.type, c_ast.TypeDecl) else None
            if isinstance(inner, c_ast.Struct) and inner.name is None:
                out[node.name] = f"struct {node.name}"  # anonymous struct: name it after the typedef
            else:
                out[node.name] = canonical(node.type, out)
    return out


@dataclass
class HeaderSet:
    """The declarations of a header directory: type text, integer #defines, prototypes, typedefs."""

    types: str
    defines: list[tuple[str, str]]
    functions: list[Prototype]
    typedefs: dict[str, str]


def parse(include_dir: Path) -> HeaderSet:
    """Parse the project's headers (:data:`HEADERS` under `include_dir`), which are plain C."""
    decl_text: list[str] = []
    defines: list[tuple[str, str]] = []
    for rel in HEADERS:
        body, defs = strip_header((include_dir / rel).read_text())
        decl_text.append(body)
        defines.extend(defs)
    parser = pycparser.CParser()
    n_prelude = len(parser.parse(PARSE_PRELUDE).ext)
    ast = pycparser.CParser().parse(PARSE_PRELUDE + "\n".join(decl_text), filename="<include>")
    gen = c_generator.CGenerator()
    nodes = ast.ext[n_prelude:]
    typedefs = _typedef_map(nodes)
    types: list[str] = []
    functions: list[Prototype] = []
    for node in nodes:
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            functions.append(_prototype(node, gen, typedefs))
        else:
            types.append(gen.visit(node) + ";")
    return HeaderSet("\n".join(types), defines, functions, typedefs)


def compiled_table(headers: HeaderSet) -> str:
    """The JSON prototype table build_ffi embeds in the compiled module."""
    return json.dumps({"format": 1, "typedefs": headers.typedefs,
                       "functions": [f.to_json() for f in headers.functions]}, separators=(",", ":"))


@dataclass(frozen=True)
class CompiledAbi:
    """The prototypes the cffi module was generated from."""

    functions: dict[str, Prototype]
    typedefs: dict[str, str]

    @classmethod
    def from_json(cls, text: str) -> CompiledAbi:
        d = json.loads(text)
        return cls({f["name"]: Prototype.from_json(f) for f in d["functions"]}, dict(d["typedefs"]))


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
    return _name_key(c_name) == _name_key(py_name)


def _name_key(name: str) -> str:
    key = name.replace("_", "").lower()
    for suffix in ("optional", "out"):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[:-len(suffix)]
    return key


# ---- extracting prototypes from installed headers -------------------------------------------------
_C_WORDS = frozenset("""const volatile restrict signed unsigned char short int long float double void _Bool
    bool struct union enum""".split())
_DROP_WORDS = frozenset("extern static inline __inline __inline__ constexpr virtual explicit".split())
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _remove_balanced(text: str, pattern: re.Pattern[str]) -> str:
    """Remove every match of `pattern` (which ends just before a '(') with its balanced (...) group."""
    while True:
        m = pattern.search(text)
        if not m:
            return text
        i = _skip_parens(text, m.end())
        if i < 0:
            return text[:m.start()]
        text = text[:m.start()] + " " + text[i:]


def _skip_parens(text: str, i: int) -> int:
    """Index just past the balanced group whose '(' is at or after i (whitespace skipped); -1 if unbalanced."""
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "(":
        return -1
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


_ATTRIBUTE = re.compile(r"\b(__attribute__|__declspec|alignas|_Alignas)\s*(?=\()")
_MACRO_CALL = re.compile(r"\b[A-Z][A-Z0-9_]*\s*(?=\()")


def _denoise(text: str) -> str:
    """Drop what is not part of a C prototype: attributes, ``[[...]]``, ``extern "C"`` and string literals."""
    text = _remove_balanced(text, _ATTRIBUTE)
    text = re.sub(r"\[\[.*?\]\]", " ", text, flags=re.S)
    text = re.sub(r'extern\s*"C"', " ", text)
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', " ", text)


def _return_tokens(prefix: str, known: Mapping[str, str]) -> list[str] | None:
    """The return type's tokens from the text between the previous declaration and the function
    name, or None when that text is not the start of a declaration (a call, an expression, a typedef)."""
    prefix = _remove_balanced(prefix, _MACRO_CALL)  # e.g. ACL_DEPRECATED_MESSAGE("...")
    if re.search(r"[^\w\s*]", prefix):
        return None
    tokens = re.findall(r"[A-Za-z_]\w*|\*", prefix)
    kept = []
    for t in tokens:
        if t in ("typedef", "return"):
            return None
        if t in _DROP_WORDS or (re.fullmatch(r"[A-Z][A-Z0-9_]*|__\w+", t) and t not in known):
            continue  # storage class / visibility or calling-convention macros
        kept.append(t)
    return kept if any(t != "*" for t in kept) else None


def _split_params(text: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.split("=")[0].strip() for p in out if p.strip()]  # C++ default arguments dropped


def _type_names(decl: str) -> set[str]:
    """Identifiers used as type names in one parameter (or typedef) declaration; the declared name,
    if any, is not one. Function-pointer declarations give nothing (only known types work there)."""
    if "(" in decl:
        return set()
    tokens = re.findall(r"[A-Za-z_]\w*|\*|\[|\]|\d+", decl)
    while tokens and (tokens[-1] in ("[", "]") or tokens[-1].isdigit()):
        tokens.pop()  # an array suffix
    named = len(tokens) >= 2 and tokens[-1] != "*" and tokens[-1] not in _C_WORDS
    out: set[str] = set()
    prev = ""
    for t in tokens[:-1] if named else tokens:
        if t not in _C_WORDS and t != "*" and not t.isdigit() and prev not in ("struct", "union", "enum"):
            out.add(t)
        prev = t
    return out


_LOCAL_TYPEDEF = re.compile(r"\btypedef\s+([^;{}()]*?[\w*])\s*\b([A-Za-z_]\w*)\s*;")


@dataclass(frozen=True)
class Extracted:
    """A prototype found in an installed header, or why it could not be read."""

    header: str
    prototype: Prototype | None
    error: str = ""


def _find_declarations(body: str, names: list[str], known: Mapping[str, str]) -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, parameter declarations) of the first declaration of each name in `body`."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\s*(?=\()")
    found: dict[str, tuple[str, list[str]]] = {}
    for m in pattern.finditer(body):
        name = m.group(1)
        if name in found:
            continue
        start = max(body.rfind(c, 0, m.start()) for c in ";{}") + 1
        ret = _return_tokens(body[start:m.start()], known)
        end = _skip_parens(body, m.end())
        if ret is None or end < 0 or body[end:].lstrip()[:1] not in (";", "{"):
            continue  # a call, a function-pointer typedef, an expression: not the declaration
        found[name] = (" ".join(ret), _split_params(body[body.index("(", m.end()) + 1:end - 1]))
    return found


@dataclass
class _Scanned:
    """The declarations of bound functions found in one header's text, not yet parsed."""

    header: str
    decls: dict[str, str]                 # name -> "ret name(params);"
    local: list[tuple[str, str]]          # the header's own simple typedefs: (type, name)
    used: set[str]                        # identifiers used as type names


def _scan(text: str, names: Iterable[str], typedefs: Mapping[str, str], header: str) -> _Scanned | None:
    wanted = [n for n in set(names) if n in text]
    if not wanted:
        return None
    body = _denoise(strip_header(text)[0])
    found = _find_declarations(body, wanted, typedefs)
    if not found:
        return None
    local = [(t, n) for t, n in _LOCAL_TYPEDEF.findall(body) if n not in typedefs and n not in _PRELUDE_NAMES]
    used: set[str] = set()
    for ret, params in found.values():
        for d in [ret, *params]:
            used |= _type_names(d)
    for t, _ in local:
        used |= _type_names(t)
    decls = {name: f"{ret} {name}({', '.join(params) or 'void'});" for name, (ret, params) in found.items()}
    return _Scanned(header, decls, local, used)


def _parse_scanned(scans: list[_Scanned], typedefs: Mapping[str, str]) -> dict[str, Extracted]:
    """Parse every scanned declaration in one pycparser run; when that fails, header by header, and
    within a header declaration by declaration, so that only the unreadable ones are reported."""
    try:
        return _parse_group(scans, typedefs)
    except Exception as exc:  # noqa: BLE001 - any parser failure: narrow it down
        if len(scans) > 1:
            out: dict[str, Extracted] = {}
            for one in scans:
                out.update(_parse_scanned([one], typedefs))
            return out
        only = scans[0]
        if len(only.decls) == 1:
            name, decl = next(iter(only.decls.items()))
            if only.local:  # maybe one of the header's own typedefs is what pycparser cannot read
                return _parse_scanned([_Scanned(only.header, only.decls, [], only.used)], typedefs)
            return {name: Extracted(only.header, None, f"could not parse `{decl}`: {exc}")}
        out = {}
        for name, decl in only.decls.items():
            out.update(_parse_scanned([_Scanned(only.header, {name: decl}, only.local, only.used)], typedefs))
        return out


def _parse_group(scans: list[_Scanned], typedefs: Mapping[str, str]) -> dict[str, Extracted]:
    local: dict[str, str] = {}
    for one in scans:
        for t, n in one.local:
            if local.setdefault(n, t) != t:
                raise ValueError(f"typedef {n} differs between headers")
    used = set().union(*(one.used for one in scans))
    opaque = sorted((used | set(typedefs)) - set(local) - _PRELUDE_NAMES)
    source = (PARSE_PRELUDE + "".join(f"typedef struct __aclnnpy_{n} {n};\n" for n in opaque)
              + "".join(f"typedef {t} {n};\n" for n, t in local.items())
              + "\n".join(d for one in scans for d in one.decls.values()))
    ast = pycparser.CParser().parse(source, filename="<prototypes>")
    known = _typedef_map((n for n in ast.ext if isinstance(n, c_ast.Typedef) and n.name in local), typedefs)
    header_of = {name: one.header for one in scans for name in one.decls}
    gen = c_generator.CGenerator()
    out: dict[str, Extracted] = {}
    for node in ast.ext:
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl) and node.name in header_of:
            out[node.name] = Extracted(header_of[node.name], _prototype(node, gen, known))
    return out


def extract_prototypes(text: str, names: Iterable[str], typedefs: Mapping[str, str], header: str = "<header>",
                       ) -> dict[str, Extracted]:
    """The prototypes of `names` declared in the header `text` (first declaration of each), parsed with
    pycparser after removing what C++ headers wrap around them. `typedefs` are the canonical forms of
    the project's typedef names; simple typedefs of other names in the same header are expanded too."""
    scanned = _scan(text, names, typedefs, header)
    return _parse_scanned([scanned], typedefs) if scanned is not None else {}


# ---- comparing ------------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class FunctionCheck:
    """The guard's result for one bound function."""

    name: str
    status: str            # "match", "mismatch", "not found" or "unreadable"
    header: str = ""       # the header whose prototype was compared
    detail: str = ""       # the difference, or why the prototype could not be read


@dataclass(frozen=True)
class AbiReport:
    """The guard's result for a loaded root.

    ``status``: "verified" (every bound function's installed prototype equals the compiled one),
    "partial" (those found are equal, some were not found or could not be read), "unverified" (no
    installed header declares any bound function) or "mismatch"."""

    status: str
    checks: tuple[FunctionCheck, ...] = ()
    note: str = ""
    headers: tuple[str, ...] = field(default=())

    @property
    def mismatches(self) -> list[FunctionCheck]:
        return [c for c in self.checks if c.status == "mismatch"]

    @property
    def unchecked(self) -> list[FunctionCheck]:
        return [c for c in self.checks if c.status in ("not found", "unreadable")]

    def summary(self) -> str:
        """One line for people: what was verified against what (the header paths are in ``headers``)."""
        n = sum(c.status == "match" for c in self.checks)
        if self.status == "mismatch":
            bad = self.mismatches
            return f"MISMATCH in {len(bad)} function(s): " + "; ".join(f"{c.name} ({c.header})" for c in bad)
        if self.status == "verified":
            return f"verified: all {n} bound prototypes equal the installed headers ({len(self.headers)} files)"
        if self.status == "partial":
            return (f"partially verified: {n} prototypes equal the installed headers ({len(self.headers)} files); "
                    f"not checked: {', '.join(c.name for c in self.unchecked)}")
        return "unverified: " + (self.note or "no installed header declares a bound function")

    def refusal(self) -> str:
        """The error message of a mismatch: every differing function, its header and first difference."""
        lines = [f"{c.name}: {c.detail} ({c.header})" for c in self.mismatches]
        return ("the installed CANN declares a different C prototype than the one aclnn-py was built for, "
                "so calling it would pass wrong arguments: " + "; ".join(lines))

    def unverified_text(self) -> str:
        """What the guard could not verify, as the load-time warning (or strict refusal) states it:
        every such function with the header it was looked for in and why; "" when every bound
        prototype was compared."""
        unchecked = self.unchecked
        if self.status == "unverified" and all(c.status == "not found" for c in unchecked):
            return (f"aclnn-py could not verify any of the {len(self.checks)} bound C prototypes against the "
                    f"installed headers ({self.note or 'no installed header declares a bound function'}), "
                    "so a different prototype there would go unnoticed")
        if not unchecked:
            return ""
        groups: dict[tuple[str, str], list[str]] = {}
        for c in unchecked:
            groups.setdefault((c.header, c.detail), []).append(c.name)
        parts = [f"{', '.join(names)} ({f'{header}: ' if header else ''}{detail})"
                 for (header, detail), names in groups.items()]
        return (f"aclnn-py could not verify {len(unchecked)} of the {len(self.checks)} bound C prototypes against "
                "the installed headers, so a different prototype there would go unnoticed: " + "; ".join(parts))

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "summary": self.summary(), "headers": list(self.headers),
                "functions": {c.name: {"status": c.status, "header": c.header, "detail": c.detail}
                              for c in self.checks}}


# ---- where the installed headers are ----------------------------------------------------------------
_GROUP_INCLUDES = {"runtime": ("acl",), "meta": ("aclnn", "nnopbase"), "hccl": ("hccl", "hcomm"),
                   "ops": ("aclnnop",)}
_OP_HEADER_GLOB = "aclnn_moe_distribute*.h"


def header_dirs(root: Path, group: str, library: str | None) -> list[tuple[Path, str]]:
    """(directory, file glob) pairs to search, in order, for a function of `group` bound from `library`:
    the include folder next to that library first (an op package's ``op_api/include``, or the
    ``include/`` beside its ``lib64/``), then the root's own ``include/``."""
    bases: list[Path] = []
    out: list[tuple[Path, str]] = []
    if library:
        lib = Path(library)
        if group == "ops":
            for parent in lib.parents:
                if parent.name == "op_api":  # opp/vendors/<v>/op_api/lib or a built-in op_api/lib/linux/<arch>
                    out.append((parent / "include", _OP_HEADER_GLOB))
                    break
        if lib.parent.name == "lib64":
            bases.append(lib.parent.parent / "include")
    bases.append(root / "include")
    glob = _OP_HEADER_GLOB if group == "ops" else "*.h"
    for base in bases:
        for sub in _GROUP_INCLUDES[group]:
            pair = (base / sub, glob)
            if pair not in out:
                out.append(pair)
    return out


def _header_files(directory: Path, glob: str) -> list[Path]:
    try:
        return sorted(p for p in directory.rglob(glob) if p.is_file())
    except OSError:
        return []


def check_root(root: Path, bound: Mapping[str, str | None], groups: Mapping[str, str],
               compiled: CompiledAbi) -> AbiReport:
    """Compare every bound function (``bound``: name -> library it was bound from, None if missing;
    ``groups``: name -> library group) with its prototype in the installed headers of `root`."""
    texts: dict[Path, str] = {}
    plan: dict[tuple[tuple[Path, str], ...], list[str]] = {}
    for name, library in bound.items():
        if library is None or name not in compiled.functions:
            continue
        plan.setdefault(tuple(header_dirs(root, groups[name], library)), []).append(name)
    scans: list[_Scanned] = []
    seen: set[str] = set()  # names whose declaration was found (the first header in search order wins)
    for dirs, names in plan.items():
        for directory, glob in dirs:
            if all(n in seen for n in names):
                break
            for path in _header_files(directory, glob):
                if path not in texts:
                    try:
                        texts[path] = path.read_text(errors="replace")
                    except OSError:
                        texts[path] = ""
                scanned = _scan(texts[path], [n for n in names if n not in seen], compiled.typedefs, str(path))
                if scanned is not None:
                    scans.append(scanned)
                    seen |= set(scanned.decls)
    found = _parse_scanned(scans, compiled.typedefs) if scans else {}
    searched = {name: dirs for dirs, names in plan.items() for name in names}
    checks: list[FunctionCheck] = []
    for name in sorted(n for n, lib in bound.items() if lib is not None and n in compiled.functions):
        ex = found.get(name)
        if ex is None:
            checks.append(_not_found(name, searched[name], texts))
        elif ex.prototype is None:
            checks.append(FunctionCheck(name, "unreadable", ex.header, ex.error))
        else:
            diff = first_difference(compiled.functions[name], ex.prototype)
            checks.append(FunctionCheck(name, "match" if diff is None else "mismatch", ex.header, diff or ""))
    headers = tuple(sorted({c.header for c in checks if c.status in ("match", "mismatch")}))
    if any(c.status == "mismatch" for c in checks):
        status = "mismatch"
    elif all(c.status == "match" for c in checks) and checks:
        status = "verified"
    elif any(c.status == "match" for c in checks):
        status = "partial"
    else:
        status = "unverified"
    note = "" if status != "unverified" else f"no header under {root} declares a bound function"
    return AbiReport(status, tuple(checks), note, headers)


_UNREAD_DECLARATION = ("the header names it, but no C declaration of it could be read there (an #if or "
                       "extern \"C\" block left open hides the rest of the file, or the declaration is not plain C)")


def _not_found(name: str, dirs: Iterable[tuple[Path, str]], texts: Mapping[Path, str]) -> FunctionCheck:
    """The check of a bound function whose declaration was not found: "unreadable" in the first
    searched header that names it outside comments (a malformed header), else "not found", naming the
    folders searched."""
    dirs = list(dirs)
    pattern = re.compile(rf"\b{re.escape(name)}\s*\(")
    for directory, glob in dirs:
        for path in _header_files(directory, glob):
            text = texts.get(path, "")
            if name in text and pattern.search(_without_comments(text)):
                return FunctionCheck(name, "unreadable", str(path), _UNREAD_DECLARATION)
    where = ", ".join(str(d) for d, _ in dirs)
    return FunctionCheck(name, "not found", "", f"no installed header declares it (searched {where})")


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def abi_check_mode() -> str:
    """The mode of ``ACLNN_PY_ABI_CHECK``: "warn" (unset or empty) or "strict"; BackendError for any
    other value."""
    value = os.environ.get(ENV_MODE, "").strip().lower() or "warn"
    if value not in _MODES:
        from .errors import BackendError

        raise BackendError(f"{ENV_MODE} must be 'warn' or 'strict' (got {os.environ[ENV_MODE]!r})")
    return value


def enforce(report: AbiReport) -> None:
    """Raise BackendError for a mismatch, and under ``ACLNN_PY_ABI_CHECK=strict`` for any bound
    function whose prototype could not be verified (its ``abi_report`` attribute is `report`); warn
    (RuntimeWarning) about the unverified ones otherwise. ``ACLNN_PY_SKIP_ABI_CHECK=1`` turns every
    refusal into a warning."""
    mode = abi_check_mode()
    from . import env_values

    skip = env_values.flag(ENV_SKIP, False)
    if report.status == "mismatch":
        if not skip:
            raise _refusal_error(report, f"{report.refusal()}. Install the CANN / op package whose headers match")
        _warn(f"{report.refusal()} ({ENV_SKIP}=1: loading anyway; a call to these functions may crash or return "
              "garbage)")
    text = report.unverified_text()
    if not text:
        return
    if mode == "strict" and not skip:
        raise _refusal_error(report, f"{text}. {ENV_MODE}=strict refuses such a load: install headers that declare "
                             f"them readably; unset {ENV_MODE} to load with a warning")
    _warn(f"{text} ({f'{ENV_SKIP}=1: loading anyway' if mode == 'strict' else f'{ENV_MODE}=strict refuses this'})")


def _warn(message: str) -> None:
    """A RuntimeWarning attributed to the first caller outside the package (the init() or first use
    that loaded the backend)."""
    package = os.path.dirname(os.path.abspath(__file__))
    level = 2  # _warn's caller
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame = frame.f_back
        level += 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def _refusal_error(report: AbiReport, message: str) -> Exception:
    """A BackendError carrying the report (``abi_report``), so that doctor can show it in detail."""
    from .errors import BackendError

    exc = BackendError(f"{message}, or set {ENV_SKIP}=1 to load anyway")
    exc.abi_report = report  # type: ignore[attr-defined]
    return exc


def guard(root: Path, symbols: Mapping[str, str | None], module: object,
          group_of: Callable[[str], str]) -> AbiReport:
    """The loader's check of a CANN root: :func:`check_root` of every bound symbol of the compiled
    `module`, then :func:`enforce`."""
    compiled = compiled_abi(module)
    if compiled is None:
        report = AbiReport("unverified", note="the compiled module has no prototype table (built before it "
                           "existed); rebuild aclnn-py")
    else:
        report = check_root(root, symbols, {n: group_of(n) for n in symbols}, compiled)
    enforce(report)
    return report


def compiled_abi(module: object) -> CompiledAbi | None:
    """The prototype table embedded in the compiled cffi module, or None for a module built before it."""
    lib = getattr(module, "lib", None)
    fn = getattr(lib, "aclnnpy_prototypes", None)
    if fn is None:
        return None
    ffi = getattr(module, "ffi")  # noqa: B009 - the cffi module's ffi object
    return CompiledAbi.from_json(ffi.string(fn()).decode())


__all__ = ["AbiReport", "CompiledAbi", "ENV_MODE", "ENV_SKIP", "FunctionCheck", "HEADERS", "HeaderSet", "Param", "Prototype",
           "abi_check_mode", "canonical", "check_root", "compiled_abi", "compiled_table", "enforce", "extract_prototypes",
           "first_difference", "guard", "header_dirs", "parse", "strip_header"]
