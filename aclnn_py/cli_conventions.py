"""The conventions every `aclnn-py` command shares: defaults in ``--help``, a user's mistake as one
line and exit 2 (:class:`UsageError`), an internal error as a traceback and exit 3. The commands
(doctor, demo, bench) import this module; :mod:`aclnn_py.cli` imports the commands."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

EXIT_USAGE = 2
EXIT_INTERNAL = 3


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
