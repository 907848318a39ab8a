"""The build-time reader of the project's headers (``include/``, plain C): ``build_ffi.py`` uses it to
write the cffi module and the prototype table embedded in it. It parses with pycparser, which the
package never imports at run time; this file is not part of the wheel.

The canonical forms and the table's format are those of ``aclnn_py/_binding/prototypes.py``, and each
declaration's canonical form is computed by the run-time reader of installed headers
(``aclnn_py/_binding/headers.py``) from the text pycparser gives back: the two sides the loader's guard
compares come from one reader. Both are loaded from their files (the package itself cannot be imported
before it is built).
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


def _load_binding() -> tuple[ModuleType, ModuleType]:
    """``prototypes`` and ``headers`` of ``aclnn_py/_binding``, as submodules of a stand-in package (headers
    imports prototypes relatively)."""
    name = "_aclnn_py_binding_for_build"
    if name not in sys.modules:
        package = ModuleType(name)
        package.__path__ = [str(Path(__file__).resolve().parent / "aclnn_py" / "_binding")]
        sys.modules[name] = package
    return importlib.import_module(f"{name}.prototypes"), importlib.import_module(f"{name}.headers")


prototypes, headers = _load_binding()
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
        text = str(gen.visit(p))
        params.append(Param(text, p.name or f"arg{i}", headers.read_parameter(text, typedefs, i).canon))
    ret = _type_text(gen, fdecl.type)
    return Prototype(node.name, str(gen.visit(node)), ret, headers.read_type(ret, typedefs), tuple(params))


def _typedef_map(nodes: Iterable[c_ast.Node], gen: c_generator.CGenerator) -> dict[str, str]:
    """Canonical type of every typedef among `nodes`, in order (later ones may use earlier ones)."""
    out: dict[str, str] = {}
    for node in nodes:
        if not isinstance(node, c_ast.Typedef):
            continue
        inner = node.type.type if isinstance(node.type, c_ast.TypeDecl) else None
        if isinstance(inner, c_ast.Enum):
            out[node.name] = "i32"
        elif isinstance(inner, (c_ast.Struct, c_ast.Union)):
            # a tag (with or without its body, which is no type text to read); an anonymous one is
            # named after the typedef
            out[node.name] = f"{'struct' if isinstance(inner, c_ast.Struct) else 'union'} {inner.name or node.name}"
        else:
            out[node.name] = headers.read_type(_type_text(gen, node.type), out)
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
    typedefs = _typedef_map(nodes, gen)
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

