"""Generate the C source of ``aclnn_py._aclnn``, the cffi API-mode binding, from ``include/``.

The headers in ``include/`` are the one source of truth for the ABI. This script reads them with
the parser of ``build_abi.py`` (the canonical forms of ``aclnn_py/_binding/prototypes.py``), keeps the
C declarations (typedefs, enums, ``#define`` integer constants, prototypes),
and emits a cffi out-of-line module in which every C function is a *trampoline*: a static function
of the same name that calls through a pointer. The pointers start out at per-function "missing"
stubs and are filled at run time by ``aclnn_py._binding.loader`` with ``dlsym`` results, so the extension
links to no CANN library and one build serves the mock and real hardware. ``aclnnpy_prototypes()``
returns the prototype table (JSON) the module was generated from, for the guard to compare with the
headers of an installed CANN.

The module also holds the binding's own C helpers, declared once in ``csrc/aclnnpy.h`` (cffi's
declarations of them are parsed from that header) and defined in ``csrc/*.c``, and one *run helper*
per operator of ``include/aclnnop/`` (``aclnnpy_run_<phase 2>``: both phases in one call), generated
here from the phase-1 prototype so that the order of its tensors and attributes is the header's
(``aclnn_py._binding.prototypes.run_layout``).

Usage: ``python build_ffi.py --include include --out _aclnn.c``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cffi
import pycparser  # type: ignore[import-untyped]
from pycparser import c_ast, c_generator

sys.path.insert(0, str(Path(__file__).resolve().parent))  # build_abi.py sits beside this file
import build_abi as _abi  # noqa: E402


def _missing_value(ret: str) -> str:
    """What a trampoline returns when its symbol was not found in the loaded backend."""
    if "*" in ret:
        return "NULL"
    if ret == "HcclResult":
        return "HCCL_E_NOT_SUPPORT"
    if ret == "size_t":
        return "0"
    return "ACL_ERROR_API_NOT_SUPPORT"


HELPERS = Path(__file__).resolve().parent / "csrc"
HELPER_HEADER = "aclnnpy.h"


def helper_declarations(headers: _abi.HeaderSet) -> tuple[list[str], list[tuple[str, str]]]:
    """The declarations of csrc/aclnnpy.h as C text (for cffi's cdef), and the parameters of its run
    helper type ``aclnnpy_run_fn`` as (declaration, name) pairs."""
    body, _ = _abi.strip_header((HELPERS / HELPER_HEADER).read_text())
    prefix = _abi.PARSE_PRELUDE + headers.types
    n_before = len(pycparser.CParser().parse(prefix).ext)
    nodes = pycparser.CParser().parse(prefix + "\n" + body, filename=HELPER_HEADER).ext[n_before:]
    gen = c_generator.CGenerator()
    decls: list[str] = []
    run_params: list[tuple[str, str]] = []
    for node in nodes:
        if isinstance(node, c_ast.Typedef) and node.name == "aclnnpy_run_fn":
            run_params = [(gen.visit(p), p.name) for p in node.type.type.args.params]
            continue  # cffi gets each helper's prototype instead
        decls.append(gen.visit(node) + ";")
    assert run_params, f"{HELPER_HEADER} declares the run helper type aclnnpy_run_fn"
    return decls, run_params


def run_helper(layout: _abi.RunLayout, run_params: list[tuple[str, str]]) -> tuple[str, str]:
    """(prototype, definition) of an operator's run helper, with the argument order of its phase-1
    prototype (``layout``) and the parameters of ``aclnnpy_run_fn``."""
    (t, a, s, workspace, workspace_cap, stream, workspace_size, executor, launch, launched) = (n for _, n in run_params)
    arrays = {"t": t, "a": a, "s": s}
    args = ", ".join(f"{arrays[kind]}[{i}]" for kind, i in layout.call)
    proto = f"aclnnStatus {layout.helper}({', '.join(d for d, _ in run_params)})"
    body = (
        f"{proto} {{\n"
        f"    *{launched} = 0;\n"
        f"    aclnnStatus ret = {layout.phase1}({args}, {workspace_size}, {executor});\n"
        f"    if (ret != 0 || !{launch} || *{workspace_size} > {workspace_cap}) return ret;\n"
        f"    *{launched} = 1;\n"
        f"    return {layout.phase2}(*{workspace_size} ? (void *){workspace} : NULL, *{workspace_size}, "
        f"*{executor}, {stream});\n}}"
    )
    return proto, body


def generate(include_dir: Path) -> tuple[str, str]:
    """Return (cdef, C source) for the cffi module."""
    headers = _abi.parse(include_dir)
    types, defines, functions = headers.types, headers.defines, headers.functions
    define_lines = "\n".join(f"#define {n} {v}" for n, v in defines)
    helper_decls, run_params = helper_declarations(headers)
    runs = [run_helper(layout, run_params) for layout in _abi.run_layouts(functions).values()]

    cdef = [define_lines, types]
    cdef.extend(f.decl + ";" for f in functions)
    cdef.extend(helper_decls)
    cdef.extend(proto + ";" for proto, _ in runs)

    src: list[str] = [
        "#include <stdbool.h>",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <dlfcn.h>",
        define_lines,
        types,
        "#define ACLNNPY_ABI_TYPES_DECLARED",
        f'#include "{HELPER_HEADER}"',
        "static __thread const char *aclnnpy_missing_name = NULL;",
        "const char *aclnnpy_last_missing(void) { return aclnnpy_missing_name; }",
    ]
    for f in functions:
        args = ", ".join(p.decl for p in f.params) or "void"
        names = ", ".join(p.name for p in f.params)
        src.append(f"typedef {f.ret} (*aclnnpy_fn_{f.name})({args});")
        src.append(
            f"static {f.ret} aclnnpy_missing_{f.name}({args}) {{\n"
            + "".join(f"    (void){p.name};\n" for p in f.params)
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
    src += [body for _, body in runs]
    src.append('#include "hccl_comm.c"')  # csrc/: they call the trampolines above
    src.append('#include "hccl_context.c"')
    # The prototypes this module was generated from, for the ABI guard (aclnn_py/_binding/guard.py).
    src.append("const char *aclnnpy_prototypes(void) {\n    return " + _c_string(_abi.compiled_table(headers)) + ";\n}")
    return "\n".join(cdef), "\n".join(src)


def _c_string(text: str) -> str:
    """`text` (ASCII) as a C string literal, in pieces of at most 200 characters (split before
    escaping, so no escape sequence is cut in two)."""
    pieces = [text[i:i + 200] for i in range(0, len(text), 200)] or [""]
    return "\n".join('"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"' for p in pieces)


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
