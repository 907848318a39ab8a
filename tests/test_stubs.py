"""The compiled core's stubs (aclnn_py/_core.pyi, what a user's type checker reads) agree with the module
and with the fields its bases declare (csrc/_core.pxd): the same public names, the same parameters of
every compiled function and method, and every public field of the .pxd typed in the stub."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STUB = REPO / "aclnn_py" / "_core.pyi"
PXD = REPO / "csrc" / "_core.pxd"


def _stub() -> ast.Module:
    return ast.parse(STUB.read_text(encoding="utf-8"))


def _stub_classes() -> dict[str, ast.ClassDef]:
    return {n.name: n for n in _stub().body if isinstance(n, ast.ClassDef)}


def _stub_functions() -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in _stub().body if isinstance(n, ast.FunctionDef)}


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def _runtime_params(obj: Any) -> list[str] | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        prefix = "*" if p.kind == p.VAR_POSITIONAL else "**" if p.kind == p.VAR_KEYWORD else ""
        out.append(prefix + p.name)
    return out


def test_the_stub_names_what_the_module_has(acl: Any) -> None:
    from aclnn_py import _core

    public = {n for n, v in vars(_core).items() if not n.startswith("_") and getattr(v, "__module__", None)
              in ("_core", "aclnn_py._core") and (inspect.isclass(v) or callable(v))}
    stubbed = set(_stub_classes()) | set(_stub_functions())
    assert public <= stubbed, f"compiled but not in the stub: {sorted(public - stubbed)}"
    assert stubbed <= set(vars(_core)), f"in the stub but not compiled: {sorted(stubbed - set(vars(_core)))}"


def test_compiled_functions_and_methods_take_the_stubs_parameters(acl: Any) -> None:
    from aclnn_py import _core

    checked = 0
    for name, fn in _stub_functions().items():
        got = _runtime_params(getattr(_core, name))
        if got is not None:
            assert got == _params(fn), name
            checked += 1
    for cname, cls in _stub_classes().items():
        compiled = getattr(_core, cname)
        for node in cls.body:
            # dunders are protocols (e.g. __buffer__: the buffer protocol a type checker reads), not methods
            if isinstance(node, ast.FunctionDef) and not node.decorator_list and not node.name.startswith("__"):
                member = inspect.getattr_static(compiled, node.name)
                got = _runtime_params(member)
                if got is not None and node.name != "__init__":
                    assert got == _params(node), f"{cname}.{node.name}"
                    checked += 1
    assert checked >= 8  # the operator functions, the buffer's methods, the plans' launch, ...


def test_every_public_field_of_the_pxd_is_in_the_stub() -> None:
    pxd = PXD.read_text(encoding="utf-8")
    classes = _stub_classes()
    found = 0
    for block in re.split(r"\ncdef class ", pxd)[1:]:
        name = block.split(":", 1)[0].strip()
        fields = re.findall(r"^\s+cdef public \w+ (\w+)", block, re.M)
        # a C field the Python side reaches through a property is named in its comment: "# _ptr: ..."
        fields += re.findall(r"#\s*(_?\w+): ", block)
        stub = classes[name]
        declared = {n.target.id for n in stub.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        declared |= {n.name for n in stub.body if isinstance(n, ast.FunctionDef)}
        missing = [f for f in fields if f not in declared]
        assert not missing, f"{name}: fields of csrc/_core.pxd the stub does not type: {missing}"
        found += len(fields)
    assert found >= 20
