"""Generate the C source of ``aclnn_py._aclnn``, the cffi API-mode binding, from ``include/``.

The headers in ``include/`` are the one source of truth for the ABI (DESIGN.md §3.1). This script
reads them, keeps the C declarations (typedefs, enums, ``#define`` integer constants, prototypes),
and emits a cffi out-of-line module in which every C function is a *trampoline*: a static function
of the same name that calls through a pointer. The pointers start out at per-function "missing"
stubs and are filled at run time by ``aclnn_py._loader`` with ``dlsym`` results, so the extension
links to no CANN library and one build serves the mock and real hardware.

Usage: ``python build_ffi.py --include include --out _aclnn.c``
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import cffi
import pycparser
from pycparser import c_ast, c_generator

# Order matters: later headers use types of earlier ones.
HEADERS = [
    "acl/acl_base.h",
    "acl/acl_rt.h",
    "aclnn/acl_meta.h",
    "aclnn/aclnn_base.h",
    "aclnnop/aclnn_moe_distribute_dispatch_v5.h",
    "aclnnop/aclnn_moe_distribute_combine_v5.h",
    "hccl/hccl_types.h",
    "hccl/hccl_comm.h",
    "hccl/hccl_kfc.h",
]

# Types the headers take from <stdint.h>/<stddef.h>/<stdbool.h>; declared only so pycparser can parse.
_PARSE_PRELUDE = """
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t; typedef unsigned long size_t; typedef _Bool bool;
"""

_DEFINE_RE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\s+(-?(?:0x[0-9A-Fa-f]+|\d+))[uUlL]*\s*$")


def strip_header(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Remove comments and preprocessor lines; return (declarations, integer #defines)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out: list[str] = []
    defines: list[tuple[str, str]] = []
    skip_depth = 0  # inside `#ifdef __cplusplus` ... `#endif`
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            directive = s[1:].strip()
            if directive.startswith("ifdef __cplusplus"):
                skip_depth += 1
            elif directive.startswith("endif") and skip_depth:
                skip_depth -= 1
            else:
                m = _DEFINE_RE.match(s)
                if m and not skip_depth:
                    defines.append((m.group(1), m.group(2)))
            continue
        if not skip_depth:
            out.append(line)
    return "\n".join(out), defines


class _Function:
    def __init__(self, name: str, decl: str, ret: str, params: list[tuple[str, str]]):
        self.name = name
        self.decl = decl      # full prototype text, without the trailing ';'
        self.ret = ret        # return type text
        self.params = params  # (type-with-name declaration, name)


def parse(include_dir: Path) -> tuple[str, list[tuple[str, str]], list[_Function]]:
    """Return (type declarations, #defines, functions) of all bound headers."""
    decl_text = []
    defines: list[tuple[str, str]] = []
    for rel in HEADERS:
        body, defs = strip_header((include_dir / rel).read_text())
        decl_text.append(body)
        defines.extend(defs)
    source = "\n".join(decl_text)
    ast = pycparser.CParser().parse(_PARSE_PRELUDE + source, filename="<include>")
    gen = c_generator.CGenerator()
    types: list[str] = []
    functions: list[_Function] = []
    n_prelude = len(pycparser.CParser().parse(_PARSE_PRELUDE).ext)
    for node in ast.ext[n_prelude:]:
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            fdecl = node.type
            params: list[tuple[str, str]] = []
            for p in (fdecl.args.params if fdecl.args else []):
                if isinstance(p, c_ast.Typename):  # `(void)`
                    continue
                params.append((gen.visit(p), p.name))
            ret = _type_text(gen, fdecl.type)
            functions.append(_Function(node.name, gen.visit(node), ret, params))
        else:
            types.append(gen.visit(node) + ";")
    return "\n".join(types), defines, functions


def _type_text(gen: c_generator.CGenerator, node: c_ast.Node) -> str:
    """Render a declarator's type without its name (e.g. `const char *`)."""
    decl = c_ast.Typename(None, [], None, node)
    # Strip the declared name, if any, from the innermost TypeDecl.
    inner = node
    while not isinstance(inner, c_ast.TypeDecl):
        inner = inner.type
    saved = inner.declname
    inner.declname = None
    text = gen.visit(decl)
    inner.declname = saved
    return text


def _missing_value(ret: str) -> str:
    """What a trampoline returns when its symbol was not found in the loaded backend."""
    if "*" in ret:
        return "NULL"
    if ret == "HcclResult":
        return "HCCL_E_NOT_SUPPORT"
    if ret == "size_t":
        return "0"
    return "ACL_ERROR_API_NOT_SUPPORT"


def generate(include_dir: Path) -> tuple[str, str]:
    """Return (cdef, C source) for the cffi module."""
    types, defines, functions = parse(include_dir)
    define_lines = "\n".join(f"#define {n} {v}" for n, v in defines)

    cdef = [define_lines, types]
    cdef.extend(f.decl + ";" for f in functions)
    cdef.append(
        """
int aclnnpy_symbol_count(void);
const char *aclnnpy_symbol_name(int index);
int aclnnpy_symbol_bound(int index);
void aclnnpy_bind_symbol(int index, void *address);
void *aclnnpy_dlopen(const char *path, int global);
void *aclnnpy_dlsym(void *handle, const char *name);
const char *aclnnpy_dlerror(void);
const char *aclnnpy_last_missing(void);
uintptr_t aclnnpy_address_of(int index);
void aclnnpy_dlpack_deleter(void *managed);
void aclnnpy_dlpack_deleter_versioned(void *managed);
void aclnnpy_dlpack_capsule_destructor(void *capsule);
"""
    )

    src: list[str] = [
        "#include <stdbool.h>",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <dlfcn.h>",
        define_lines,
        types,
        "static __thread const char *aclnnpy_missing_name = NULL;",
        "const char *aclnnpy_last_missing(void) { return aclnnpy_missing_name; }",
    ]
    for f in functions:
        args = ", ".join(p for p, _ in f.params) or "void"
        names = ", ".join(n for _, n in f.params)
        src.append(f"typedef {f.ret} (*aclnnpy_fn_{f.name})({args});")
        src.append(
            f"static {f.ret} aclnnpy_missing_{f.name}({args}) {{\n"
            + "".join(f"    (void){n};\n" for _, n in f.params)
            + f'    aclnnpy_missing_name = "{f.name}";\n'
            f"    return {_missing_value(f.ret)};\n}}"
        )
        src.append(f"static aclnnpy_fn_{f.name} aclnnpy_ptr_{f.name} = aclnnpy_missing_{f.name};")
        src.append(f"static {f.ret} {f.name}({args}) {{ return aclnnpy_ptr_{f.name}({names}); }}")
    table = ",\n".join(
        f'    {{"{f.name}", (void **)&aclnnpy_ptr_{f.name}, (void *)aclnnpy_missing_{f.name}}}'
        for f in functions
    )
    src.append(
        "struct aclnnpy_symbol { const char *name; void **slot; void *missing; };\n"
        f"static struct aclnnpy_symbol aclnnpy_symbols[] = {{\n{table}\n}};\n"
        "#define ACLNNPY_N (int)(sizeof(aclnnpy_symbols) / sizeof(aclnnpy_symbols[0]))\n"
        "int aclnnpy_symbol_count(void) { return ACLNNPY_N; }\n"
        "const char *aclnnpy_symbol_name(int i) { return (i >= 0 && i < ACLNNPY_N) ? aclnnpy_symbols[i].name : NULL; }\n"
        "int aclnnpy_symbol_bound(int i) {\n"
        "    return (i >= 0 && i < ACLNNPY_N) && *aclnnpy_symbols[i].slot != aclnnpy_symbols[i].missing;\n}\n"
        "void aclnnpy_bind_symbol(int i, void *address) {\n"
        "    if (i < 0 || i >= ACLNNPY_N) return;\n"
        "    *aclnnpy_symbols[i].slot = address ? address : aclnnpy_symbols[i].missing;\n}\n"
        "uintptr_t aclnnpy_address_of(int i) {\n"
        "    return (i >= 0 && i < ACLNNPY_N) ? (uintptr_t)*aclnnpy_symbols[i].slot : 0;\n}\n"
        "void *aclnnpy_dlopen(const char *path, int global) {\n"
        "    return dlopen(path, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));\n}\n"
        "void *aclnnpy_dlsym(void *handle, const char *name) { return dlsym(handle, name); }\n"
        "const char *aclnnpy_dlerror(void) { return dlerror(); }\n"
    )
    src.append((Path(__file__).resolve().parent / "build_ffi_dlpack.c").read_text())
    return "\n".join(cdef), "\n".join(src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--include", type=Path, default=Path(__file__).parent / "include")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cdef, source = generate(args.include)
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source("aclnn_py._aclnn", source)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ffi.emit_c_code(str(args.out))


if __name__ == "__main__":
    main()
