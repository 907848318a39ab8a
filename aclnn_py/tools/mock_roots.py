"""Mock CANN roots that export only some generations of the MoE operators, as an install with an
older op package does: ``aclnn-py mock-root DEST --generations 2,3`` (or :func:`make_root`).

The package's mock root holds, besides its full op package, one op package per generation under
``opp/generations/moe_v<N>`` whose library exports only that generation's entry points (the others
are hidden when it is linked, not at run time). A root made here is the mock's ``lib64``,
``include`` and version files (symbolic links) with just the chosen packages registered as vendors
in ``opp/vendors/config.ini``: the dynamic loader finds no other generation's symbols in it, so
aclnn-py (and ``aclnn-py doctor``, and a C program) see them missing exactly as on such an install.
Load it with ``aclnn_py.init("/path/to/DEST")`` or ``ACLNN_PY_BACKEND=/path/to/DEST``; it is a
CANN root to aclnn-py, so the ABI guard checks it against its headers (docs/testing_with_the_mock.md).
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .cli_conventions import UsageError

#: The generations the mock root has op packages for.
GENERATIONS = (1, 2, 3, 4, 5)


def _package(mock: Path, generation: int) -> Path:
    return mock / "opp" / "generations" / f"moe_v{generation}"


def parse_generations(text: str) -> list[int]:
    """``"2,3"`` or ``"v2,v3"`` → [2, 3]; ValueError naming what is wrong."""
    out: list[int] = []
    for part in filter(None, (p.strip().lower().removeprefix("v") for p in text.split(","))):
        if not part.isdigit() or int(part) not in GENERATIONS:
            raise ValueError(f"generations: each must be one of {', '.join(map(str, GENERATIONS))} (got {part!r})")
        if int(part) not in out:
            out.append(int(part))
    if not out:
        raise ValueError("generations: name at least one generation")
    return out


def make_root(dest: str | os.PathLike[str], generations: Iterable[int], mock: Path | None = None) -> Path:
    """Make `dest` (a new or empty directory) a CANN root of the mock that exports only the MoE
    operators of `generations` (1 to 5), listed in that order of priority. Returns its path."""
    from .._binding.loader import mock_root

    gens = parse_generations(",".join(str(g) for g in generations))
    src = (mock or mock_root()).resolve()
    for g in gens:
        if not (_package(src, g) / "op_api" / "lib" / "libcust_opapi.so").is_file():
            raise FileNotFoundError(f"{src} has no op package of generation {g} (opp/generations/moe_v{g})")
    root = Path(dest)
    if root.exists() and not root.is_dir():
        raise FileExistsError(f"{root} is a file, not a directory: name a new or empty directory")
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: name a new or empty directory")
    vendors = root / "opp" / "vendors"
    vendors.mkdir(parents=True)
    arch = f"{platform.machine()}-linux"
    for part in ("include", arch):
        if (src / part).exists():
            (root / part).symlink_to(src / part, target_is_directory=True)
    _link_lib64(src, root.resolve(), gens)
    for g in gens:
        (vendors / f"moe_v{g}").symlink_to(_package(src, g), target_is_directory=True)
    (vendors / "config.ini").write_text("load_priority=" + ",".join(f"moe_v{g}" for g in gens) + "\n")
    return root


#: The built-in operator library of a CANN root, named on CANN's example link lines.
BUILTIN_OPS = "libopapi_transformer.so"


def _link_lib64(src: Path, root: Path, gens: list[int]) -> None:
    """root/lib64: the mock's libraries, except that the built-in operator library offers only the
    chosen generations. Each generation's op package has a soname of its own
    (libcust_opapi_moe_v<N>.so, named here in lib64 so the dynamic loader finds it), and
    libopapi_transformer.so is a linker script joining them, so a program linked with CANN's
    ``-lopapi_transformer`` gets exactly these generations' symbols and needs exactly these libraries."""
    lib64 = root / "lib64"
    lib64.mkdir()
    for lib in sorted((src / "lib64").iterdir()):
        if lib.name != BUILTIN_OPS:
            (lib64 / lib.name).symlink_to(lib)
    # libopapi_math.so and libopapi.so are linker scripts naming -lopapi_transformer: linked against
    # this root they lead to the script below, through the program's own -L path
    joined = []
    for g in gens:
        name = lib64 / f"libcust_opapi_moe_v{g}.so"
        name.symlink_to(_package(src, g) / "op_api" / "lib" / "libcust_opapi.so")
        joined.append(str(name))
    (lib64 / BUILTIN_OPS).write_text(
        "/* generations " + ", ".join(map(str, gens)) + " of the mock's MoE operators (aclnn-py mock-root) */\n"
        "INPUT(" + " ".join(joined) + ")\n")


DESCRIPTION = """\
Make DEST a CANN root of the mock whose op package exports only the MoE operators of the chosen
generations (the others are missing for the dynamic loader), to test code on what an install with
an older op package offers. Load it with ACLNN_PY_BACKEND=DEST or aclnn_py.init("DEST")."""


def main(args: argparse.Namespace) -> int:
    try:
        gens = parse_generations(args.generations)
        root = make_root(args.dest, gens)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        raise UsageError(str(e), "aclnn-py mock-root") from None
    print(f"{root}: a mock CANN root exporting generations {', '.join(f'V{g}' for g in gens)}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("mock-root", help="make a mock CANN root that exports only some operator generations",
                       description=DESCRIPTION)
    p.add_argument("dest", metavar="DEST", help="a new or empty directory (not a file)")
    p.add_argument("--generations", default="5",
                   help="comma-separated generations to export (1 = the unsuffixed first generation, 2, 3, 4, 5), "
                        "first = highest priority")
    p.set_defaults(func=main)


__all__ = ["BUILTIN_OPS", "GENERATIONS", "add_parser", "main", "make_root", "parse_generations"]
