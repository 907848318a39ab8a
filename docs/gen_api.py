"""Generate docs/api.md from the docstrings and signatures of aclnn-py's public modules (and, for
the attributes a class's constructor sets, the ``#:`` comment above each assignment).

    python docs/gen_api.py            # rewrites docs/api.md
    python docs/gen_api.py --check    # exit 1 when docs/api.md is out of date

Only the standard library is used; the package is imported, no backend is loaded.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "api.md"

# module -> public names in reading order (None: the module's __all__)
MODULES: list[tuple[str, list[str] | None]] = [
    ("aclnn_py", ["init", "backend", "mock_root", "soc_name", "Backend"]),
    ("aclnn_py.runtime", ["Device", "Stream", "current_stream", "StreamLike", "Event", "DeviceMemory", "version"]),
    ("aclnn_py.tensor", ["Tensor", "contiguous_strides"]),
    ("aclnn_py.dtypes", ["DataType", "as_datatype", "to_numpy", "from_numpy", "pack_nibbles", "unpack_nibbles"]),
    ("aclnn_py.errors", ["AclnnPyError", "BackendError", "MissingSymbolError", "AclError", "AclTimeoutError",
                         "AclnnError", "AclnnParamNullptr", "AclnnParamInvalid", "AclnnRuntimeError",
                         "AclnnInnerError", "HcclError", "HcclTimeoutError", "ClosedError", "RecycledError"]),
    ("aclnn_py.hccl", None),
    ("aclnn_py.buffer", ["MoeDistributeBuffer", "LowLatencyDispatchResult"]),
    ("aclnn_py.ops.config", ["MoeConfig"]),
    ("aclnn_py.ops.sizing", ["window_requirement", "ccl_buffer_size_mb"]),
    ("aclnn_py.ops.dispatch", ["moe_distribute_dispatch", "prepare_dispatch", "PreparedDispatch",
                                              "DispatchOutputs", "DispatchPlan", "expand_x_dtype"]),
    ("aclnn_py.ops.combine", ["moe_distribute_combine", "prepare_combine", "PreparedCombine",
                                             "CombinePlan"]),
    ("aclnn_py.ops", ["Plan"]),
    ("aclnn_py.worlds", None),
    ("aclnn_py.golden", None),
    ("aclnn_py.golden.casts", None),
    ("aclnn_py.dlpack", ["export", "import_capsule", "is_mock_device_memory", "live_exports", "ImportedMemory"]),
]


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else "*(no docstring)*"


def _signature(name: str, obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = []
    for p in sig.parameters.values():  # annotations as written (they are strings: PEP 563)
        text = p.name if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) else ("*" if p.kind == p.VAR_POSITIONAL
                                                                                else "**") + p.name
        if p.annotation is not p.empty:
            text += f": {p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}" if not inspect.isclass(p.default) else f" = {p.default.__name__}"
        params.append((p.kind, text))
    parts: list[str] = []
    seen_kwonly = False
    for i, (kind, text) in enumerate(params):
        if kind == inspect.Parameter.KEYWORD_ONLY and not seen_kwonly:
            if not any(k == inspect.Parameter.VAR_POSITIONAL for k, _ in params[:i]):
                parts.append("*")
            seen_kwonly = True
        parts.append(text)
    ret = sig.return_annotation
    tail = "" if ret is sig.empty else f" -> {ret if isinstance(ret, str) else inspect.formatannotation(ret)}"
    return f"{name}({', '.join(parts)}){tail}"


def _takes_arguments(init: Any) -> bool:
    """Whether a constructor has named parameters of its own (not ``(self)``, nor a protocol's
    ``(self, *args, **kwargs)``)."""
    try:
        params = list(inspect.signature(init).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    return any(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def _compiled(cls: type) -> bool:
    return cls.__module__ == "aclnn_py._core" or cls.__module__ == "_core"


def _members(cls: type) -> list[tuple[str, Any]]:
    """The public members the class defines, with those of the compiled bases it adds methods to (a
    method written in the compiled core is part of the class as users see it)."""
    out: dict[str, Any] = {}
    for owner in cls.__mro__:
        if owner is not cls and not _compiled(owner):
            continue
        for name, value in owner.__dict__.items():
            if name in out or (name.startswith("_") and name not in ("__init__", "__call__", "__dlpack__",
                                                                       "__acl_stream__")):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if _is_property(value) or _is_function(value):
                out[name] = value
    return list(out.items())


def _is_property(value: Any) -> bool:
    return isinstance(value, property) or inspect.isgetsetdescriptor(value) or inspect.ismemberdescriptor(value)


def _is_function(value: Any) -> bool:
    """A function written in Python or compiled by Cython (a cyfunction or a method descriptor)."""
    value = inspect.unwrap(value)
    return inspect.isfunction(value) or type(value).__name__ in ("cython_function_or_method", "method_descriptor")


def _instance_attributes(cls: type) -> list[tuple[str, str]]:
    """(name, description) of the public attributes the class's own ``__init__`` sets on ``self``:
    the ``#:`` comment right above the assignment, else where the value comes from."""
    init = cls.__dict__.get("__init__")
    if not inspect.isfunction(init):
        return []
    try:
        source = textwrap.dedent(inspect.getsource(init))
    except (OSError, TypeError):
        return []
    lines = source.splitlines()
    params = set(inspect.signature(init).parameters)
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            for attr, origin in _origins(target, node.value, source, params):
                if (attr.startswith("_") or attr in found
                        or isinstance(inspect.getattr_static(cls, attr, None), property)):
                    continue
                found[attr] = above[2:].strip() if above.startswith("#:") else origin
    return list(found.items())


def _origins(target: ast.expr, value: ast.expr, source: str, params: set[str]) -> list[tuple[str, str]]:
    """(attribute of self, where its value comes from) for each ``self.<attribute>`` in `target`."""
    if isinstance(target, ast.Tuple):
        if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
            return [o for t, v in zip(target.elts, value.elts) for o in _origins(t, v, source, params)]
        whole = ast.get_source_segment(source, value)
        return [(attr, f"element {i} of `{whole}`") for i, t in enumerate(target.elts)
                for attr, _ in _origins(t, value, source, params)]
    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"):
        return []
    if isinstance(value, ast.Name) and value.id in params:
        return [(target.attr, f"the `{value.id}` argument")]
    return [(target.attr, f"set from `{ast.get_source_segment(source, value)}`")]


def _render_class(name: str, cls: type, lines: list[str]) -> None:
    lines += [f"### class `{name}`", ""]
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        lines += [f"Named tuple: `({', '.join(cls._fields)})`", ""]
    lines += [_doc(cls), ""]
    for mname, member in _members(cls):
        if _is_property(member):
            lines += [f"- **`{name}.{mname}`** (property) — " + (_doc(member).split("\n")[0] if member.__doc__ else ""),
                      ""]
            continue
        if not member.__doc__ and mname == "__init__":
            if _takes_arguments(member):  # the signature, explained by the class's docstring
                lines += [f"#### `{name}.{_signature(mname, member)}`", ""]
            continue
        lines += [f"#### `{name}.{_signature(mname, member)}`", "", _doc(member), ""]
    for aname, description in _instance_attributes(cls):
        lines += [f"- **`{name}.{aname}`** (attribute) — {description}", ""]


def render() -> str:
    lines = ["# API reference", "",
             "Generated from the docstrings by `docs/gen_api.py` — edit the docstrings (an attribute a "
             "constructor sets: the `#:` comment above it), then run `python docs/gen_api.py`. Signatures are "
             "shown as written in the source.", ""]
    lines += ["Modules: " + ", ".join(f"[`{m}`](#{m.replace('.', '')})" for m, _ in MODULES), ""]
    for modname, names in MODULES:
        mod = importlib.import_module(modname)
        lines += [f"## {modname}", "", _doc(mod), ""]
        for name in names if names is not None else list(getattr(mod, "__all__", [])):
            obj = getattr(mod, name, None)
            if obj is None:
                continue
            if inspect.isclass(obj):
                _render_class(name, obj, lines)
            elif callable(obj):
                lines += [f"### `{_signature(name, obj)}`", "", _doc(obj), ""]
            else:
                lines += [f"### `{name}` = `{obj!r}`", ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail when docs/api.md differs from the docstrings")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print("docs/api.md is out of date: run python docs/gen_api.py")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
