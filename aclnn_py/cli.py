"""`aclnn-py` command line: ``doctor`` (what is loaded from where), ``demo``, ``bench``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import bench, demo

ENV_VARS = (
    "ACLNN_PY_BACKEND", "ACLNN_PY_MOCK_ROOT", "ACLNN_PY_BUILD_DIR", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME",
    "ASCEND_OPP_PATH", "ASCEND_CUSTOM_OPP_PATH", "ACLNN_MOCK_SOC", "ACLNN_MOCK_DEVICE_COUNT",
    "ACLNN_MOCK_POISON", "HCCL_BUFFSIZE", "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT",
)


def doctor(args: argparse.Namespace) -> int:
    """Report the backend, its libraries, which bound symbols are present, SoC and settings."""
    import aclnn_py as acl
    from aclnn_py._loader import symbol_group

    try:
        b = acl.init(args.backend)
    except acl.BackendError as e:
        print(f"backend: NOT LOADED ({e})")
        return 1
    print(f"backend: {b.kind}")
    print(f"root:    {b.root}")
    for group in ("runtime", "meta", "hccl", "ops"):
        libs = b.libraries.get(group) or ["(none found)"]
        print(f"{group:8} {libs[0]}")
        for extra in libs[1:]:
            print(f"{'':8} {extra}")
    bad = 0
    print("symbols:")
    for group in ("runtime", "meta", "hccl", "ops"):
        names = sorted(n for n in b.symbols if symbol_group(n) == group)
        present = [n for n in names if b.symbols[n]]
        missing = [n for n in names if not b.symbols[n]]
        print(f"  {group:8} {len(present)}/{len(names)} present" + (f"; missing: {', '.join(missing)}" if missing else ""))
        bad += len(missing)
    try:
        print(f"soc:     {acl.soc_name()}")
        print(f"devices: {acl.Device.count()}")
    except acl.AclnnPyError as e:
        print(f"runtime query failed: {e}")
        bad += 1
    print("environment:")
    for var in ENV_VARS:
        print(f"  {var}={os.environ[var]}" if var in os.environ else f"  {var} (unset)")
    return 0 if bad == 0 or not args.strict else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="aclnn-py", description="aclnn-py: CANN MoE dispatch/combine from Python")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="which backend, libraries, symbols, SoC and settings")
    d.add_argument("--backend", default=None, help='"mock", "cann" or a CANN root (default: auto)')
    d.add_argument("--strict", action="store_true", help="exit 1 when any bound symbol is missing")
    d.set_defaults(func=doctor)
    demo.add_parser(sub)
    bench.add_parser(sub)
    args = ap.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
