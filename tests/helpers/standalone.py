"""Load parts of aclnn_py from their files, without the package (no compiled parts, no runtime): the
golden as a top-level package of its own, and single self-contained modules (casts, dtypes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2] / "aclnn_py"


def load_golden(name: str = "_aclnn_py_golden_standalone") -> ModuleType:
    """aclnn_py/golden as the top-level package `name` (self-contained: numpy, ml_dtypes)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "golden" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "golden")])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_module(file: str, name: str) -> ModuleType:
    """One module of aclnn_py (e.g. "casts.py") loaded from its file as `name`."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
