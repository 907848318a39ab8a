"""The build-time reader of the project's headers (``include/``, plain C): ``build_ffi.py`` uses it to
write the cffi module and the prototype table embedded in it. It parses with pycparser, which the
package never imports at run time; this file is not part of the wheel.

The canonical forms and the table's format are those of ``aclnn_py/_binding/prototypes.py``, loaded from
its file (the package itself cannot be imported before it is built).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pycparser  # type: ignore[import-untyped]
from pycparser import c_ast, c_generator


def _load_prototypes() -> ModuleType:
    path = Path(__file__).resolve().parent / "aclnn_py" / "_binding" / "prototypes.py"
    spec = importlib.util.spec_from_file_location("_aclnn_py_prototypes_for_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


prototypes = _load_prototypes()
Param = prototypes.Param
Prototype = prototypes.Prototype
strip_header = prototypes.strip_header
run_layouts = prototypes.run_layouts
RunLayout = prototypes.RunLayout

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

# Types the headers take from <stdint.h>/<stddef.h>/<stdbool.h>; declared only so pycparser can parse.
PARSE_PRELUDE = """
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t; typedef unsigned long size_t; typedef _Bool bool;
typedef unsigned long uintptr_t; typedef long intptr_t; typedef long ssize_t; typedef long ptrdiff_t;
"""


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
        return prototypes.base_type(list(node.names))
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

