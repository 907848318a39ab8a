"""`aclnn-py` command line: ``doctor`` (what is loaded from where, and can it be trusted), ``demo``
(a seeded MoE round checked against the golden, on the mock or on an install), ``bench`` and
``mock-root`` (a mock root exporting only some operator generations).

Conventions: ``--help`` of every command shows the defaults; a mistake in the command line or the
environment prints one line ``aclnn-py <command>: error: ...`` and exits 2; an internal error prints
its traceback and exits 3. Commands describe their other exit codes in their ``--help``.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

from .cli_conventions import EXIT_INTERNAL, EXIT_USAGE, Parser, UsageError

DESCRIPTION = """\
aclnn-py: CANN's MoE dispatch / combine operators from Python, with a CPU mock of the same C ABI.

A mistake in the command line or the environment prints one line and exits 2; an internal error
prints its traceback and exits 3; each command's --help gives its defaults and other exit codes."""


def build_parser() -> Parser:
    from . import __version__, bench, demo, doctor, mock_roots

    ap = Parser(prog="aclnn-py", description=DESCRIPTION,
                epilog="Run `aclnn-py <command> --help` for a command's options and exit status.")
    ap.add_argument("--version", action="version", version=f"aclnn-py {__version__}")
    sub = ap.add_subparsers(dest="cmd", metavar="<command>", parser_class=Parser)
    doctor.add_parser(sub)
    demo.add_parser(sub)
    bench.add_parser(sub)
    mock_roots.add_parser(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aclnn-py`` script and ``python -m aclnn_py``; returns the exit status."""
    cmd: str | None = None
    try:
        ap = build_parser()
        args = ap.parse_args(argv)
        cmd = args.cmd
        if cmd is None:  # bare `aclnn-py`: a usage error, as for any other missing argument
            ap.print_usage(sys.stderr)
            raise UsageError("a command is required (see aclnn-py --help)")
        return int(args.func(args))
    except UsageError as e:
        prog = e.prog or (f"aclnn-py {cmd}" if cmd else "aclnn-py")
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("aclnn-py: interrupted", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - an internal error: the traceback is what a bug report needs
        traceback.print_exc()
        print("aclnn-py: internal error (traceback above)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
