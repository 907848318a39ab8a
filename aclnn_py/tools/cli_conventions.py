"""The conventions every `aclnn-py` command shares: defaults in ``--help``, a user's mistake as one
line and exit 2 (:class:`UsageError`), an internal error as a traceback and exit 3. The commands
(doctor, demo) import this module; :mod:`aclnn_py.tools.cli` imports the commands. The checkout's
``python -m benchmarks`` follows the same conventions through :func:`run_main`."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool whose reader went away


class UsageError(Exception):
    """A mistake of the user's (arguments, environment, a request the install cannot serve): the
    CLI prints its one-line message and exits 2, without a traceback. `prog` names the command
    ("aclnn-py demo"); the CLI fills it in when a command raises without it."""

    def __init__(self, message: str, prog: str | None = None):
        super().__init__(message)
        self.prog = prog


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in every option's help (except flags, and None, which an option's help
    explains in words); descriptions and epilogs keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's conventions: defaults in help, and errors as :class:`UsageError`
    (one line) instead of usage + message on stderr."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)", self.prog)


def _exit_interrupted(signum: int, frame: object) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: exiting is what matters
            pass
    os._exit(130)


def run_main(name: str, body: Callable[[], int], prog: Callable[[], str] | None = None) -> int:
    """Run a command line's `body` and return its exit status, with the conventions: a
    :class:`UsageError` prints ``<prog>: error: <message>`` and gives 2, Ctrl-C gives 130, any other
    exception prints its traceback and gives 3; a closed pipe on stdout ends quietly with 141. `name` is the program (``aclnn-py``); `prog`, asked
    only after an error, names the command that was running when the error did not say."""
    try:
        return int(body())
    except UsageError as e:
        print(f"{e.prog or (prog() if prog else name)}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # what is left is the interpreter's exit: a Ctrl-C pressed again meanwhile ends it at once, quietly
        signal.signal(signal.SIGINT, _exit_interrupted)
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`aclnn-py doctor | head`): stop quietly, as other command-line tools do, and
        # point stdout at /dev/null so that the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception:  # noqa: BLE001 - an internal error: the traceback is what a bug report needs
        traceback.print_exc()
        print(f"{name}: internal error (traceback above)", file=sys.stderr)
        return EXIT_INTERNAL


# ---- option types: a value out of range is refused while parsing, as argparse refuses "abc" for an int ----

def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` for an integer option that must be >= `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low} (got {value})")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """An argparse ``type`` for a duration: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0 (got {text})")
    return value
