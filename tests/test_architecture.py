"""The package's import structure: no module imports itself back through others (a circle makes
import order matter and hides which layer depends on which) — not even through imports made only for
the type checker — and the product does not depend on the golden, the tests' oracle."""

from __future__ import annotations

import ast
from pathlib import Path

import aclnn_py

PACKAGE = Path(aclnn_py.__file__).resolve().parent
#: Modules whose job is to compare with the golden.
COMPARING = ("aclnn_py.tools.demo", "aclnn_py.golden")


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = f
    return mods


def _imported(module: str, path: Path, known: dict[str, Path], typing: bool = False) -> set[str]:
    """The package's modules `module` imports anywhere (in functions too), with the packages that
    importing them runs; imports under ``if TYPE_CHECKING:`` do not run and are left out unless
    `typing` (the graph the type checker follows)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = set() if typing else {id(n) for node in ast.walk(tree)
                                        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                                        for n in ast.walk(node)}
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    closed: set[str] = set()
    for name in names:  # importing a.b.c runs a and a.b first
        parts = name.split(".")
        closed |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in closed if m in known and m != module and not module.startswith(m + ".")}


def _graph(typing: bool = False) -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imported(m, p, mods, typing) for m, p in mods.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_holds_known_edges():
    graph = _graph()
    assert "aclnn_py.runtime._stream" in graph["aclnn_py.runtime._device"]
    assert "aclnn_py.runtime.ordered" in graph["aclnn_py.runtime._stream"]
    assert "aclnn_py.golden" in graph["aclnn_py.tools.demo"]


def test_no_import_circles():
    circles = _circles(_graph())
    assert circles == [], "modules that import each other: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_typing_graph_adds_type_checking_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .b import B\n")
    known = {"p": tmp_path / "__init__.py", "p.m": f, "p.b": tmp_path / "b.py"}
    assert _imported("p.m", f, known) == set()
    assert _imported("p.m", f, known, typing=True) == {"p.b"}


def test_no_import_circles_for_the_type_checker():
    # e.g. the stream module imports the stream-ordered holds, which use memory: those two name a
    # stream by a protocol of their own (runtime/_queue.py), not by importing the Stream class
    graph = _graph(typing=True)
    assert "aclnn_py.runtime.ordered" in graph["aclnn_py.runtime._stream"]
    assert "aclnn_py.runtime._memory" in graph["aclnn_py.runtime.ordered"]
    circles = _circles(graph)
    assert circles == [], ("modules that import each other, counting imports under TYPE_CHECKING: "
                           + "; ".join(" <-> ".join(c) for c in circles))


def test_product_modules_do_not_import_the_golden():
    graph = _graph()
    users = sorted(m for m, deps in graph.items()
                   if "aclnn_py.golden" in deps and m != "aclnn_py" and not m.startswith(COMPARING))
    assert users == []


# ---- the source layout ------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]


def test_compiled_sources_are_in_their_folders():
    """The binding's C and Cython sources live in csrc/, none loose at the checkout's root; the helpers'
    header is there. Plans are called through the compiled core: no second module of hand-written C."""
    loose = sorted(p.name for p in REPO.glob("*") if p.suffix in (".c", ".h", ".pyx", ".pxd"))
    assert loose == []
    assert not (REPO / "fastpath").exists() and not (REPO / "aclnn_py" / "_fastpath.pyi").exists()
    assert (REPO / "csrc" / "aclnnpy.h").is_file() and (REPO / "csrc" / "_core.pyx").is_file()


def _compiled_sources() -> list[Path]:
    return sorted(p for p in (REPO / "csrc").rglob("*") if p.suffix in (".c", ".h", ".pyx", ".pxd", ".pxi"))


def test_the_core_uses_no_private_c_api():
    """Names with CPython's private prefix (``_Py``) are not part of its stable contract."""
    for path in _compiled_sources():
        text = path.read_text(encoding="utf-8")
        assert "_Py" not in text, path.name


def test_each_hot_entry_point_has_one_body():
    """One route per call: no switch between a Python and a compiled route, no reuse decided by exact
    reference counts, no fallback bases for a missing core, one binding technique per boundary (no
    ctypes.pythonapi, no hand-written C-API module next to the core)."""
    product = [p for p in PACKAGE.rglob("*.py")]
    for path in product:
        text = path.read_text(encoding="utf-8")
        assert "set_compiled_path" not in text and "ACLNN_PY_COMPILED" not in text, path
        assert "ctypes.pythonapi" not in text and "pythonapi" not in text, path
    for path in _compiled_sources():
        assert "Py_REFCNT" not in path.read_text(encoding="utf-8"), path.name
    assert not (PACKAGE / "_bases.py").exists() and not (REPO / "csrc" / "entry.h").exists()
    assert not (REPO / "csrc" / "plan.c").exists() and not (REPO / "csrc" / "dlpack.c").exists()


def test_operator_modules_are_named_apart_from_their_functions():
    """``import aclnn_py.ops.dispatch as m`` binds the module: no ops module shares its name with a
    function the ops package exports."""
    import inspect

    import aclnn_py.ops as ops

    modules = {p.stem for p in (PACKAGE / "ops").glob("*.py") if not p.stem.startswith("_")}
    exported = {name for name in ops.__all__ if not inspect.ismodule(getattr(ops, name))}
    assert {"dispatch", "combine"} <= modules
    assert modules.isdisjoint(exported)


def test_the_package_layers_are_folders():
    """The top level holds the library; the binding layer is _binding/, the command line is tools/, and
    the header parser (pycparser) runs at build time only: no module of the package imports it."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.name.startswith("__"))
    assert top == ["_version", "buffer", "dlpack", "dtypes", "env_values", "errors", "hccl", "socs", "tensor", "worlds"]
    assert {p.stem for p in (PACKAGE / "_binding").glob("*.py")} >= {"loader", "package", "prototypes",
                                                                       "headers", "guard"}
    assert {p.stem for p in (PACKAGE / "tools").glob("*.py")} >= {"cli", "demo", "doctor", "mock_roots"}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.split(".")[0] == "pycparser" for n in names), path


def test_loading_a_backend_imports_no_header_parser():
    import subprocess
    import sys

    code = ("import sys, aclnn_py as acl; acl.init('mock'); from aclnn_py._binding import guard; "
            "print('pycparser' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
