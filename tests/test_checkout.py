"""Running from a source checkout's root after ``pip install .``: Python imports the checkout's
``aclnn_py/`` (the current directory comes first on sys.path), which has no compiled parts; it must
use the installed build of the same version — in ``python -c``, in a script saved there and in rank
processes spawned from there — and say what to do when it cannot."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _checkout(tmp: Path) -> Path:
    """A copy of the checkout's Python package, without any compiled part."""
    root = tmp / "checkout"
    shutil.copytree(REPO / "aclnn_py", root / "aclnn_py",
                    ignore=shutil.ignore_patterns("*.so", "mock_root", "__pycache__"))
    return root


def _installed(tmp: Path, acl: Any, version: str) -> Path:
    """A site directory holding an "installed" aclnn-py of `version`: its metadata and the compiled
    parts of the build this test session uses."""
    site = tmp / "site"
    pkg = site / "aclnn_py"
    pkg.mkdir(parents=True)
    from aclnn_py._binding import package

    compiled = package.origin().compiled_dir
    for part in [*compiled.glob("_aclnn*.so"), *compiled.glob("_core*.so"), *compiled.glob("_mock*.so"),
                 compiled / "mock_root"]:
        (pkg / part.name).symlink_to(part)
    shutil.copytree(REPO / "aclnn_py", pkg, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.so", "mock_root", "__pycache__"))
    info = site / f"aclnn_py-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: aclnn-py\nVersion: {version}\n")
    (info / "RECORD").write_text("")
    return site


def _run(cwd: Path, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ACLNN_PY_BUILD_DIR", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = str(site)  # after the current directory, as an installed package is
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_python_c_from_the_checkout_root_uses_the_installed_build(acl: Any, tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    site = _installed(tmp_path, acl, acl.__version__)
    r = _run(root, site, "-c", "import aclnn_py as acl; print(acl.__file__); print(acl.mock_root()); "
                               "print(acl._binding.package.origin().describe()); print(acl.init('mock'))")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == str(root / "aclnn_py" / "__init__.py")  # the checkout's sources
    assert lines[1] == str(site / "aclnn_py" / "mock_root")      # the installed build's parts
    assert "installed build of the same version" in lines[2] and "Backend('mock'" in lines[3]


def test_spawned_ranks_from_the_checkout_root(acl: Any, tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    site = _installed(tmp_path, acl, acl.__version__)
    (root / "round.py").write_text(textwrap.dedent("""
        import numpy as np
        import aclnn_py as acl
        from aclnn_py.worlds import spawn

        def rank_main(rank, world_size, root):
            with acl.hccl.Communicator(world_size, rank, root) as comm:
                comm.barrier()
                return acl.__file__

        if __name__ == "__main__":
            print(spawn(rank_main, 2))
    """))
    r = _run(root, site, "round.py")
    assert r.returncode == 0, r.stderr
    assert str(root / "aclnn_py" / "__init__.py") in r.stdout


def test_a_version_mismatch_says_what_to_do(acl: Any, tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    site = _installed(tmp_path, acl, "0.0.1")
    r = _run(root, site, "-c", "import aclnn_py as acl; acl.init('mock')")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("aclnn_py.errors.BackendError: ")
    assert "is version 0.0.1, not this source's" in last and "pip install ." in last
    # the README's warning about running from the checkout quotes this error
    quoted = re.search(r"`(BackendError: [^`]*?) …`", (REPO / "README.md").read_text(encoding="utf-8"))
    assert quoted is not None and last.startswith(f"aclnn_py.errors.{quoted[1]}"), (quoted, last)


def test_a_checkout_without_any_installed_build_says_what_to_do(acl: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from aclnn_py._binding import package as _package

    monkeypatch.delenv("ACLNN_PY_BUILD_DIR", raising=False)
    monkeypatch.setattr(_package, "_installed", lambda: None)
    origin = _package.locate(_checkout(tmp_path) / "aclnn_py", acl.__version__)
    assert origin.compiled_dir is None and origin.problem is not None
    assert "no installed aclnn-py was found" in origin.problem and "pip install ." in origin.problem
