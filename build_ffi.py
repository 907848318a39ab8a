"""Generate the C source of ``aclnn_py._aclnn``, the cffi API-mode binding, from ``include/``.

The headers in ``include/`` are the one source of truth for the ABI. This script reads them with
the parser of ``aclnn_py/_abi.py`` (loaded from its file; the ABI guard uses the same one), keeps the
C declarations (typedefs, enums, ``#define`` integer constants, prototypes),
and emits a cffi out-of-line module in which every C function is a *trampoline*: a static function
of the same name that calls through a pointer. The pointers start out at per-function "missing"
stubs and are filled at run time by ``aclnn_py._loader`` with ``dlsym`` results, so the extension
links to no CANN library and one build serves the mock and real hardware. ``aclnnpy_prototypes()``
returns the prototype table (JSON) the module was generated from, for the guard to compare with the
headers of an installed CANN.

Usage: ``python build_ffi.py --include include --out _aclnn.c``
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import cffi


def _load_abi() -> ModuleType:
    """aclnn_py/_abi.py, the header parser the ABI guard shares, loaded from its file: the package
    itself (and its compiled parts) need not be importable while it is being built."""
    path = Path(__file__).resolve().parent / "aclnn_py" / "_abi.py"
    spec = importlib.util.spec_from_file_location("_aclnn_py_abi_for_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


_abi = _load_abi()


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
    headers = _abi.parse(include_dir)
    types, defines, functions = headers.types, headers.defines, headers.functions
    define_lines = "\n".join(f"#define {n} {v}" for n, v in defines)

    cdef = [define_lines, types]
    cdef.extend(f.decl + ";" for f in functions)
    # the plan's argument struct, declared once in build_ffi_plan.c; cffi's declarations need it too
    plan_struct = re.search(r"^struct aclnnpy_plan \{.*?^\};", _helper_source("build_ffi_plan.c"), re.M | re.S)
    assert plan_struct is not None, "build_ffi_plan.c declares struct aclnnpy_plan"
    cdef.append(plan_struct.group(0))
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
const char *aclnnpy_prototypes(void);
aclnnStatus aclnnpy_plan_launch(struct aclnnpy_plan *p, aclrtStream stream);
int aclnnpy_plan_enter(struct aclnnpy_plan *p);
void aclnnpy_plan_leave(struct aclnnpy_plan *p);
aclnnStatus aclnnpy_dispatch_v5_run(aclTensor **t, const int64_t *a, const char *commAlg, uintptr_t workspace,
                                    uint64_t workspace_cap, aclrtStream stream, uint64_t *workspace_size,
                                    aclOpExecutor **executor, int launch, int *launched);
aclnnStatus aclnnpy_combine_v5_run(aclTensor **t, const int64_t *a, const char *commAlg, uintptr_t workspace,
                                   uint64_t workspace_cap, aclrtStream stream, uint64_t *workspace_size,
                                   aclOpExecutor **executor, int launch, int *launched);
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
    src += [_helper_source(name) for name in ("build_ffi_dlpack.c", "build_ffi_plan.c", "build_ffi_ops.c")]
    # The prototypes this module was generated from, for the ABI guard (aclnn_py/_abi.py).
    src.append("const char *aclnnpy_prototypes(void) {\n    return " + _c_string(_abi.compiled_table(headers)) + ";\n}")
    return "\n".join(cdef), "\n".join(src)


def _helper_source(name: str) -> str:
    """A C helper compiled into the extension (a file next to this one)."""
    return (Path(__file__).resolve().parent / name).read_text()


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
