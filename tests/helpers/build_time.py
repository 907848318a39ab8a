"""The build-time header reader (``build_abi.py`` at the checkout root, which does not ship in the
wheel), loaded from its file for the tests that compare what the build parsed with what runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def build_abi() -> ModuleType:
    name = "_aclnn_py_build_abi_for_tests"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "build_abi.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
