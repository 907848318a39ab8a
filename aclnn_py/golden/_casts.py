"""The low-precision formats of ``aclnn_py.casts``, reached from the package or, when the golden is
loaded on its own (from its directory, without ``aclnn_py``), from the sibling ``casts.py`` file."""

from __future__ import annotations

try:
    from .. import casts
except ImportError:  # loaded as a top-level package: load ../casts.py from its path
    import importlib.util as _ilu
    import sys as _sys
    from pathlib import Path as _Path

    _name = __name__.rsplit(".", 1)[0] + "_casts"
    if _name in _sys.modules:
        casts = _sys.modules[_name]
    else:
        _spec = _ilu.spec_from_file_location(_name, _Path(__file__).resolve().parents[1] / "casts.py")
        assert _spec is not None and _spec.loader is not None
        casts = _ilu.module_from_spec(_spec)
        _sys.modules[_name] = casts
        _spec.loader.exec_module(casts)

__all__ = ["casts"]
