"""Where the package's compiled parts are: the cffi binding ``_aclnn``, the compiled core ``_core``,
the mock's control module ``_mock`` and the mock CANN root ``mock_root/``.

An installed package holds them next to its Python files. A source checkout does not, and Python
imports the checkout's ``aclnn_py/`` whenever the checkout root comes first on ``sys.path`` — ``python
-c`` or ``python -m`` run there, a script saved there, a rank process spawned from there. In that case
the compiled parts of the installed build are used when its version is this source tree's, and
``ACLNN_PY_BUILD_DIR`` names a CMake build tree's ``aclnn_py`` directory instead (development).
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

ENV_BUILD_DIR = "ACLNN_PY_BUILD_DIR"
DISTRIBUTION = "aclnn-py"


@dataclass(frozen=True)
class Origin:
    """Where ``aclnn_py`` came from in this process."""

    package_dir: Path             # the Python files that were imported
    compiled_dir: Path | None     # the directory holding _aclnn, _core, _mock and mock_root
    how: str                      # how compiled_dir was chosen, for `aclnn-py doctor`
    problem: str | None = None    # why there are no compiled parts, and the fix

    def describe(self) -> str:
        where = f"{self.package_dir} ({self.how})"
        if self.compiled_dir is not None and self.compiled_dir != self.package_dir:
            where += f"; compiled parts from {self.compiled_dir}"
        return where


def has_compiled_parts(directory: Path) -> bool:
    return all(any(directory.glob(f"{name}*.so")) for name in ("_aclnn", "_core")) \
        and (directory / "mock_root" / "lib64").is_dir()


def _installed() -> tuple[Path, str] | None:
    """(package directory, version) of the installed distribution, if any."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(str(dist.locate_file("aclnn_py"))), dist.version


_origin: Origin | None = None


def origin() -> Origin:
    """Where this process's ``aclnn_py`` came from (computed once)."""
    global _origin
    if _origin is None:
        from .._version import __version__

        _origin = locate(Path(__file__).resolve().parent.parent, __version__)
    return _origin


def locate(package_dir: Path, version: str) -> Origin:
    """Find the compiled parts for the Python files in `package_dir` (this source's `version`)."""
    build_dir = os.environ.get(ENV_BUILD_DIR)
    if build_dir:
        found = Path(build_dir)
        if has_compiled_parts(found):
            return Origin(package_dir, found, f"compiled parts from ${ENV_BUILD_DIR}")
        return Origin(package_dir, None, f"${ENV_BUILD_DIR}",
                      f"${ENV_BUILD_DIR}={build_dir} holds no compiled parts (_aclnn*.so, _core*.so and mock_root/); "
                      "build them with cmake --build, or unset the variable")
    if has_compiled_parts(package_dir):
        return Origin(package_dir, package_dir, "installed package")
    installed = _installed()
    source = (f"aclnn_py was imported from the source tree {package_dir}, which has no compiled parts "
              "(Python puts the current directory first on sys.path)")
    if installed is None:
        return Origin(package_dir, None, "source tree",
                      f"{source}, and no installed aclnn-py was found: run `pip install .` in the checkout "
                      f"(or build in place and set {ENV_BUILD_DIR}, see the README's Development section)")
    installed_dir, installed_version = installed
    if installed_version != version or not has_compiled_parts(installed_dir):
        return Origin(package_dir, None, "source tree",
                      f"{source}, and the installed aclnn-py at {installed_dir} is version {installed_version}, "
                      f"not this source's {version}: reinstall from this checkout (`pip install .`) or run "
                      "from another directory")
    return Origin(package_dir, installed_dir, "source tree; compiled parts of the installed build of the "
                  "same version")
