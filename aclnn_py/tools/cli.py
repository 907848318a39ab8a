"""`aclnn-py` command line: ``doctor`` (what is loaded from where, and can it be trusted), ``demo``
(a seeded MoE round checked against the golden, on the mock or on an install) and ``mock-root`` (a
mock root exporting only some operator generations). ``bench`` only says how to run the benchmarks,
which are not installed: ``python -m benchmarks`` from a source checkout (docs/benchmarks.md).

Conventions: ``--help`` of every command shows the defaults; a mistake in the command line or the
environment prints one line ``aclnn-py <command>: error: ...`` and exits 2; an internal error prints
its traceback and exits 3. Commands describe their other exit codes in their ``--help``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from .. import env_values
from ..errors import EnvironmentValueError
from .cli_conventions import EXIT_USAGE, Parser, UsageError, run_main

DESCRIPTION = """\
aclnn-py: CANN's MoE dispatch / combine operators from Python, with a CPU mock of the same C ABI.

A mistake in the command line or the environment prints one line and exits 2; an internal error
prints its traceback and exits 3; each command's --help gives its defaults and other exit codes."""


BENCH_COMMAND = "python -m benchmarks"
BENCH_DESCRIPTION = f"""\
The benchmarks are not part of the installed package: they run from a source checkout of aclnn-py,
after `pip install .` there. From the checkout's root: `{BENCH_COMMAND} --help` (docs/benchmarks.md).
This command only says so; it exits 2 with the command line to use."""


def _add_bench_pointer(sub: Any) -> None:
    p = sub.add_parser("bench", help=f"not installed: run `{BENCH_COMMAND}` from a source checkout",
                       description=BENCH_DESCRIPTION)
    p.set_defaults(func=_bench_pointer, bench_args=[])


def _bench_pointer(args: argparse.Namespace) -> int:
    line = shlex.join([*BENCH_COMMAND.split(), *args.bench_args])
    raise UsageError("the benchmarks are not part of the installed package; from the root of a source checkout "
                     f"of aclnn-py, run: {line}")


def build_parser() -> Parser:
    from .. import __version__
    from . import demo, doctor, mock_roots

    ap = Parser(prog="aclnn-py", description=DESCRIPTION,
                epilog="Run `aclnn-py <command> --help` for a command's options and exit status.")
    ap.add_argument("--version", action="version", version=f"aclnn-py {__version__}")
    sub = ap.add_subparsers(dest="cmd", metavar="<command>", parser_class=Parser)
    doctor.add_parser(sub)
    demo.add_parser(sub)
    _add_bench_pointer(sub)
    mock_roots.add_parser(sub)
    return ap


#: The commands with a --json option: their refusals are JSON documents too.
JSON_COMMANDS = ("demo", "doctor")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aclnn-py`` script and ``python -m aclnn_py``; returns the exit status."""
    cmd: str | None = None

    words = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        try:
            return command()
        except UsageError as e:
            if "--json" not in words or cmd not in JSON_COMMANDS:
                raise
            # --json promises one JSON document on stdout and nothing on stderr, refusals included
            where = e.prog or f"aclnn-py {cmd}"
            print(json.dumps({"ok": False, "result": "USAGE_ERROR", "error": f"{where}: error: {e}",
                              "exit_code": EXIT_USAGE}, indent=2))
            return EXIT_USAGE

    def command() -> int:
        nonlocal cmd
        ap = build_parser()
        if words[:1] and words[0] in JSON_COMMANDS:
            cmd = words[0]  # known before parsing, so that a refused option of `demo --json` is JSON too
        args, extra = ap.parse_known_args(words)
        cmd = args.cmd
        if cmd == "bench":  # whatever follows is the benchmark's own command line
            args.bench_args = extra
        elif extra:
            ap.error(f"unrecognized arguments: {' '.join(extra)}")
        if cmd is None:  # bare `aclnn-py`: a usage error, as for any other missing argument
            ap.print_usage(sys.stderr)
            raise UsageError("a command is required (see aclnn-py --help)")
        try:
            env_values.check(mock=False)  # the mock's own: when a command loads the mock (init)
            return int(args.func(args))
        except EnvironmentValueError as e:
            raise UsageError(str(e)) from None

    return run_main("aclnn-py", body, lambda: f"aclnn-py {cmd}" if cmd else "aclnn-py")


if __name__ == "__main__":
    sys.exit(main())
