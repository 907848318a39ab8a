"""The ABI guard: the header parser shared with build_ffi.py reads messy installed headers, compares
each bound prototype with the compiled table, and the loader refuses a CANN root whose headers
declare a bound function differently (end to end with copies of the mock root as CANN roots)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.build_time import build_abi
from helpers.root_copies import (
    COMBINE_HEADER,
    DISPATCH_HEADER,
    OP_INCLUDE,
    copy_mock_root,
    group_string_dispatch,
    run_python,
    unclosed_extern_c,
)

from aclnn_py._binding import guard as _guard
from aclnn_py._binding import headers as _headers
from aclnn_py._binding import prototypes as _abi

INCLUDE = Path(__file__).resolve().parents[1] / "include"
DISPATCH_WS = "aclnnMoeDistributeDispatchV5GetWorkspaceSize"
COMBINE_WS = "aclnnMoeDistributeCombineV5GetWorkspaceSize"


@pytest.fixture(scope="module")
def compiled() -> _abi.CompiledAbi:
    """The table the compiled module embeds (the same one the loader compares with)."""
    from aclnn_py import _aclnn

    table = _guard.compiled_abi(_aclnn)
    assert table is not None, "the compiled _aclnn module has no aclnnpy_prototypes(); rebuild"
    return table


def params_text(compiled: _abi.CompiledAbi, name: str) -> str:
    return ", ".join(p.decl for p in compiled.functions[name].params)


def extract_one(text: str, name: str, compiled: _abi.CompiledAbi) -> _abi.Prototype:
    got = _headers.extract_prototypes(text, [name], compiled.typedefs)
    assert name in got, f"{name} not found"
    assert got[name].prototype is not None, got[name].error
    return got[name].prototype


# ---- the table ------------------------------------------------------------------------------------
def test_compiled_table_is_what_build_ffi_parses_from_include(compiled):
    headers = build_abi().parse(INCLUDE)
    assert {f.name for f in headers.functions} == set(compiled.functions)
    ours = compiled.functions[DISPATCH_WS]
    assert len(ours.params) == 33 and len(compiled.functions[COMBINE_WS].params) == 39
    assert ours.params[8].decl == "int64_t epWorldSize" and ours.params[8].canon == "i64"
    assert compiled.typedefs["aclrtStream"] == "void*" and compiled.typedefs["aclTensor"] == "struct aclTensor"


def test_project_headers_verify_against_themselves(compiled):
    seen: set[str] = set()
    for rel in build_abi().HEADERS:
        text = (INCLUDE / rel).read_text()
        got = _headers.extract_prototypes(text, compiled.functions, compiled.typedefs, rel)
        for name, ex in got.items():
            assert ex.prototype is not None, ex.error
            assert _abi.first_difference(compiled.functions[name], ex.prototype) is None, name
        seen |= set(got)
    assert seen == set(compiled.functions)


# ---- messy installed headers ----------------------------------------------------------------------
def test_messy_cplusplus_header_is_read(compiled):
    """Real headers: doc comments naming the function, includes, visibility macros and attributes,
    extern "C" with and without #ifdef, C++ constexpr / bool / default arguments / inline calls, a
    function-pointer typedef of the same name, the header's own pointer typedef."""
    params = params_text(compiled, DISPATCH_WS)
    text = f"""
/**
 * Copyright (c) 2025. Documentation: {DISPATCH_WS}(context, x, ...) computes the workspace size.
 */
#ifndef OP_API_INC_MOE_DISTRIBUTE_DISPATCH_V5_H_
#define OP_API_INC_MOE_DISTRIBUTE_DISPATCH_V5_H_
#include <string>
#include "aclnn/aclnn_base.h"
#define ACLNN_API __attribute__((visibility("default")))
#define ACL_FUNC_VISIBILITY ACLNN_API
#if defined(__cplusplus)
#include <cstdint>
extern "C" {{
#else
#include <stdbool.h>
#endif
typedef void *rtStream_t;
typedef aclnnStatus (*{DISPATCH_WS}Fn)(const aclTensor *context);

__attribute__((visibility("default")))
aclnnStatus {DISPATCH_WS}(
    {params});

ACL_FUNC_VISIBILITY ACL_DEPRECATED_MESSAGE("use the next version") aclnnStatus
aclnnMoeDistributeDispatchV5(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                             rtStream_t stream);
#ifdef __cplusplus
}}
namespace ops {{
constexpr int64_t kMaxRanks = 768;
inline bool Launch(void *ws, bool sync = true) {{
    return aclnnMoeDistributeDispatchV5(ws, 0, nullptr, nullptr) == 0;
}}
}}
#endif
#endif
"""
    for name in (DISPATCH_WS, "aclnnMoeDistributeDispatchV5"):
        theirs = extract_one(text, name, compiled)
        assert _abi.first_difference(compiled.functions[name], theirs) is None, name


def test_cplusplus_only_header_with_bare_extern_c(compiled):
    text = """
#pragma once
#include <cstdint>
extern "C" {
[[nodiscard]] ACL_FUNC_VISIBILITY aclError aclrtSetDevice(int32_t deviceId);
ACL_FUNC_VISIBILITY aclError aclrtGetDeviceCount(uint32_t *count) __attribute__((nonnull));
ACL_FUNC_VISIBILITY const char *aclrtGetSocName();
}
static constexpr bool kEnabled = true;
"""
    for name in ("aclrtSetDevice", "aclrtGetDeviceCount", "aclrtGetSocName"):
        theirs = extract_one(text, name, compiled)
        assert _abi.first_difference(compiled.functions[name], theirs) is None, name


def test_spelling_differences_that_pass_arguments_the_same_way(compiled):
    """long for int64_t, void * for aclrtStream, an array for a pointer, a dropped const, no names."""
    text = ("aclError aclrtMemcpy(void *, size_t destMax, const void *src, unsigned long count, int kind);\n"
            "aclError aclrtSynchronizeStream(void *stream);\n"
            "aclError aclrtGetVersion(int majorVersion[], int32_t *minorVersion, int *const patchVersion);\n")
    for name in ("aclrtMemcpy", "aclrtSynchronizeStream", "aclrtGetVersion"):
        theirs = extract_one(text, name, compiled)
        assert _abi.first_difference(compiled.functions[name], theirs) is None, name


@pytest.mark.parametrize("text,expected", [
    ("aclError aclrtSetDevice(int64_t deviceId);",
     "parameter 1 is `int32_t deviceId` in aclnn-py but `int64_t deviceId` in the header"),
    ("aclError aclrtSetDevice(int32_t deviceId, int32_t flags);",
     "parameter 2 is `(none)` in aclnn-py but `int32_t flags` in the header; 1 parameters in aclnn-py, 2 in the header"),
    ("void aclrtSetDevice(int32_t deviceId);", "it returns `aclError` in aclnn-py but `void` in the header"),
    ("aclError aclrtSetDevice(const char *deviceId);",
     "parameter 1 is `int32_t deviceId` in aclnn-py but `const char *deviceId` in the header"),
])
def test_differences_are_named(compiled, text, expected):
    theirs = extract_one(text, "aclrtSetDevice", compiled)
    assert _abi.first_difference(compiled.functions["aclrtSetDevice"], theirs) == expected


def test_pointee_types_are_compared(compiled):
    text = "aclnnStatus aclnnInit(const aclTensor *configPath);"
    theirs = extract_one(text, "aclnnInit", compiled)
    assert "parameter 1" in (_abi.first_difference(compiled.functions["aclnnInit"], theirs) or "")


def test_group_string_variants_are_told_apart(compiled):
    """The draft V5 headers: dispatch with groupEp/groupTp, combine with groupEp first and no cclBufferSize."""
    dispatch = (INCLUDE / "aclnnop" / DISPATCH_HEADER).read_text()
    theirs = extract_one(group_string_dispatch(dispatch), DISPATCH_WS, compiled)
    assert _abi.first_difference(compiled.functions[DISPATCH_WS], theirs) == (
        "parameter 9 is `int64_t epWorldSize` in aclnn-py but `const char *groupEp` in the header; "
        "33 parameters in aclnn-py, 34 in the header")
    combine = (INCLUDE / "aclnnop" / COMBINE_HEADER).read_text()
    draft = combine.replace("const aclTensor *performanceInfoOptional, int64_t epWorldSize",
                            "const aclTensor *performanceInfoOptional, const char *groupEp, int64_t epWorldSize")
    draft = draft.replace("int64_t cclBufferSize", "const char *groupTp")
    assert "groupEp" in draft and "groupTp" in draft
    theirs = extract_one(draft, COMBINE_WS, compiled)
    assert _abi.first_difference(compiled.functions[COMBINE_WS], theirs) == (
        "parameter 20 is `int64_t epWorldSize` in aclnn-py but `const char *groupEp` in the header; "
        "39 parameters in aclnn-py, 40 in the header")


def test_unparseable_prototype_is_reported_not_guessed(compiled):
    got = _headers.extract_prototypes("aclError aclrtSetDevice(int32_t deviceId, ...garbage @@);", ["aclrtSetDevice"],
                                  compiled.typedefs)
    assert got["aclrtSetDevice"].prototype is None and "could not parse" in got["aclrtSetDevice"].error


def test_one_unreadable_prototype_does_not_hide_the_others(compiled):
    text = ("aclError aclrtSetDevice(int32_t deviceId);\n"
            "aclError aclrtResetDevice(int32_t deviceId, ...garbage @@);\n")
    got = _headers.extract_prototypes(text, ["aclrtSetDevice", "aclrtResetDevice"], compiled.typedefs)
    assert got["aclrtSetDevice"].prototype is not None and got["aclrtResetDevice"].prototype is None
    assert got["aclrtResetDevice"].error.startswith("could not parse `aclError aclrtResetDevice(")


def test_strip_header_keeps_the_c_branch_of_cplusplus_conditionals():
    text = ("#ifdef __cplusplus\nint cxx_only;\n#else\nint c_only;\n#endif\n"
            "#ifndef __cplusplus\nint c_too;\n#endif\n#if FOO\nint any1;\n#else\nint any2;\n#endif\n"
            "#define A 3\n#define B \\\n  4\n")
    body, defines = _abi.strip_header(text)
    assert "cxx_only" not in body and "c_only" in body and "c_too" in body
    assert "any1" in body and "any2" in body
    assert ("A", "3") in defines and ("B", "4") in defines


def test_op_headers_next_to_the_bound_library_come_first(tmp_path):
    lib = tmp_path / "opp/vendors/v/op_api/lib/libcust_opapi.so"
    dirs = _guard.header_dirs(tmp_path, "ops", str(lib))
    assert dirs[0] == (tmp_path / "opp/vendors/v/op_api/include", "aclnn_moe_distribute*.h")
    assert (tmp_path / "include/aclnnop", "aclnn_moe_distribute*.h") in dirs
    runtime = _guard.header_dirs(tmp_path, "runtime", str(tmp_path / "lib64/libascendcl.so"))
    assert runtime == [(tmp_path / "include/acl", "*.h")]


# ---- end to end: copies of the mock root loaded as CANN roots ---------------------------------------
LOAD = ("import aclnn_py as acl, sys\n"
        "b = acl.init(sys.argv[1] if len(sys.argv) > 1 else {root!r})\n"
        "print(b.kind, b.abi.status)\n"
        "print(b.abi.summary())\n"
        "print(*b.abi.headers, sep=chr(10))\n")


def test_unchanged_copy_is_verified(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    r = run_python(LOAD.format(root=str(root)))
    assert r.returncode == 0, r.stderr
    kind_status, summary, *headers = r.stdout.splitlines()
    assert kind_status == "cann verified"
    m = re.fullmatch(r"verified: all (\d+) bound prototypes equal the installed headers \((\d+) files\)", summary)
    assert m and int(m.group(1)) >= 60 and int(m.group(2)) == len(headers), summary
    assert str(root / OP_INCLUDE / DISPATCH_HEADER) in headers and str(root / "include/acl/acl_rt.h") in headers
    assert str(root / "include/aclnnop" / DISPATCH_HEADER) not in headers  # the op package's own header is used
    assert "Warning" not in r.stderr, r.stderr


def test_copy_named_by_the_environment_is_a_cann_root(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    r = run_python("import aclnn_py as acl\nb = acl.init()\nprint(b.kind, b.abi.status, b.root)\n",
                   ACLNN_PY_BACKEND=str(root))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"cann verified {root}"


def test_group_string_dispatch_header_is_refused(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    header = root / OP_INCLUDE / DISPATCH_HEADER
    header.write_text(group_string_dispatch(header.read_text()))
    r = run_python(LOAD.format(root=str(root)))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("aclnn_py.errors.BackendError: ")
    assert (f"{DISPATCH_WS}: parameter 9 is `int64_t epWorldSize` in aclnn-py but `const char *groupEp` in the "
            f"header; 33 parameters in aclnn-py, 34 in the header ({header})") in last
    assert "ACLNN_PY_SKIP_ABI_CHECK=1" in last
    # refused before any call: the symbols were unbound again
    probe = ("import aclnn_py as acl\ntry:\n    acl.init({root!r})\nexcept acl.BackendError:\n    pass\n"
             "from aclnn_py import _aclnn\nlib = _aclnn.lib\n"
             "print(sum(lib.aclnnpy_symbol_bound(i) for i in range(lib.aclnnpy_symbol_count())))\n")
    r = run_python(probe.format(root=str(root)))
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stdout + r.stderr


def test_skip_env_turns_the_refusal_into_a_warning(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    header = root / OP_INCLUDE / DISPATCH_HEADER
    header.write_text(group_string_dispatch(header.read_text()))
    r = run_python(LOAD.format(root=str(root)), ACLNN_PY_SKIP_ABI_CHECK="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "cann mismatch"
    assert "RuntimeWarning" in r.stderr and "parameter 9" in r.stderr


def test_header_next_to_the_bound_library_is_the_one_compared(tmp_path):
    """The root's include/aclnnop holds the draft, the op package (whose library was bound) the
    right one: verified. Without the op package's headers the root's draft is used and refused."""
    root = copy_mock_root(tmp_path / "cann")
    root_header = root / "include/aclnnop" / DISPATCH_HEADER
    root_header.write_text(group_string_dispatch(root_header.read_text()))
    r = run_python(LOAD.format(root=str(root)))
    assert r.returncode == 0 and r.stdout.startswith("cann verified"), r.stdout + r.stderr
    for h in (root / OP_INCLUDE).iterdir():
        h.unlink()
    r = run_python(LOAD.format(root=str(root)))
    assert r.returncode != 0 and f"({root_header})" in r.stderr.strip().splitlines()[-1]


def _bound_count() -> int:
    """How many C functions the compiled module binds (every one the guard checks)."""
    import importlib

    from aclnn_py._binding.guard import compiled_abi

    abi = compiled_abi(importlib.import_module("aclnn_py._aclnn"))
    assert abi is not None
    return len(abi.functions)


def test_copy_without_headers_is_unverified(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    for d in (root / "include", root / OP_INCLUDE):
        for h in sorted(d.rglob("*.h")):
            h.unlink()
    r = run_python(LOAD.format(root=str(root)))
    assert r.returncode == 0, r.stderr
    kind_status, summary = r.stdout.splitlines()[:2]
    assert kind_status == "cann unverified"
    assert summary == f"unverified: no header under {root} declares a bound function"
    warning = re.search(r"RuntimeWarning: (.*)", r.stderr)
    assert warning and warning.group(1).startswith(
        f"aclnn-py could not verify any of the {_bound_count()} bound C prototypes against the installed headers (no header "
        f"under {root} declares a bound function)"), r.stderr
    strict = run_python(LOAD.format(root=str(root)), ACLNN_PY_ABI_CHECK="strict")
    assert strict.returncode != 0 and "ACLNN_PY_ABI_CHECK=strict refuses such a load" in strict.stderr


# ---- prototypes that cannot be verified: a warning at load, a refusal when strict ------------------------
def _unreadable_dispatch_headers(tmp_path: Path) -> tuple[Path, Path]:
    """A copy whose dispatch headers (the op package's and the root's) leave their extern "C" block open:
    (root, the op package's header, which is searched first)."""
    root = copy_mock_root(tmp_path / "cann")
    for header in (root / OP_INCLUDE / DISPATCH_HEADER, root / "include/aclnnop" / DISPATCH_HEADER):
        header.write_text(unclosed_extern_c(header.read_text()))
    return root, root / OP_INCLUDE / DISPATCH_HEADER


def _unverified_text(header: Path) -> str:
    return (f"aclnn-py could not verify 2 of the {_bound_count()} bound C prototypes against the installed headers, so a "
            "different prototype there would go unnoticed: aclnnMoeDistributeDispatchV5, "
            f"{DISPATCH_WS} ({header}: the header names it, but no C declaration of it could be read there (an #if "
            'or extern "C" block left open hides the rest of the file, or the declaration is not plain C))')


def test_an_unreadable_header_warns_at_init_naming_the_functions_and_the_header(tmp_path):
    root, header = _unreadable_dispatch_headers(tmp_path)
    r = run_python(LOAD.format(root=str(root)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "cann partial"
    # attributed to the caller's init() (line 2 of the snippet), not to the package's internals
    warning = re.search(r"<string>:2: RuntimeWarning: (.*)", r.stderr)
    assert warning, r.stderr
    assert warning.group(1) == f"{_unverified_text(header)} (ACLNN_PY_ABI_CHECK=strict refuses this)"


def test_strict_abi_check_refuses_an_unverifiable_prototype_with_the_same_text(tmp_path):
    root, header = _unreadable_dispatch_headers(tmp_path)
    r = run_python(LOAD.format(root=str(root)), ACLNN_PY_ABI_CHECK="strict")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f"aclnn_py.errors.BackendError: {_unverified_text(header)}. ACLNN_PY_ABI_CHECK=strict refuses "
                    "such a load: install headers that declare them readably; unset ACLNN_PY_ABI_CHECK to load "
                    "with a warning, or set ACLNN_PY_SKIP_ABI_CHECK=1 to load anyway")
    anyway = run_python(LOAD.format(root=str(root)), ACLNN_PY_ABI_CHECK="strict", ACLNN_PY_SKIP_ABI_CHECK="1")
    assert anyway.returncode == 0 and anyway.stdout.startswith("cann partial"), anyway.stderr
    assert f"{_unverified_text(header)} (ACLNN_PY_SKIP_ABI_CHECK=1: loading anyway)" in anyway.stderr
    verified = run_python(LOAD.format(root=str(copy_mock_root(tmp_path / "intact"))), ACLNN_PY_ABI_CHECK="strict")
    assert verified.returncode == 0 and verified.stdout.startswith("cann verified"), verified.stderr


def test_an_unknown_abi_check_mode_is_refused(tmp_path):
    root = copy_mock_root(tmp_path / "cann")
    r = run_python(LOAD.format(root=str(root)), ACLNN_PY_ABI_CHECK="strcit")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == (
        "aclnn_py.errors.EnvironmentValueError: ACLNN_PY_ABI_CHECK='strcit' cannot be read: give warn or strict")


def test_a_function_no_header_declares_names_the_folders_searched(compiled, tmp_path):
    """Headers for the runtime only: the others are "not found", with the folders searched."""
    (tmp_path / "include/acl").mkdir(parents=True)
    (tmp_path / "include/acl/acl_rt.h").write_text("aclError aclrtSetDevice(int32_t deviceId);\n")
    bound = {"aclrtSetDevice": str(tmp_path / "lib64/libascendcl.so"), "aclnnInit": str(tmp_path / "lib64/libnnopbase.so")}
    report = _guard.check_root(tmp_path, bound, {"aclrtSetDevice": "runtime", "aclnnInit": "meta"}, compiled)
    assert report.status == "partial"
    [check] = report.unchecked
    assert (check.name, check.status, check.header) == ("aclnnInit", "not found", "")
    assert check.detail == f"no installed header declares it (searched {tmp_path / 'include/aclnn'}, " \
                           f"{tmp_path / 'include/nnopbase'})"
    assert report.unverified_text().endswith(f": aclnnInit ({check.detail})")


@pytest.mark.parametrize(("decl", "canon"), [
    ("void (*fn)(void *userData, int32_t flags)", "void(void*,i32)*"), ("int (*table[4])(const char *)", "i32(char*)**"),
    ("unsigned long int n", "u64"), ("const char *const *names", "char**"), ("int grid[2][3]", "i32**"),
    ("struct aclTensorList *list", "struct aclTensorList*"), ("enum aclDataType dtype", "i32"),
    ("long long total", "i64"), ("signed char s", "i8"), ("void (*(*factory)(int))(double)", "void(f64)*(i32)*"),
    ("bool flag", "bool"), ("aclrtStream stream", "void*"),
])
def test_the_reader_gives_how_a_declared_value_is_passed(compiled, decl, canon):
    """The one reader of C declarations (the build's table and the guard's reading of installed headers
    both use it): qualifiers dropped, arrays as pointers, integers as size and signedness, enums as
    i32, typedefs expanded, function pointers as return(params)*."""
    assert _headers.read_parameter(decl, compiled.typedefs, 0).canon == canon
