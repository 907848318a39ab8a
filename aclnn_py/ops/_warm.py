"""Imported by the fork server of :func:`aclnn_py.worlds.spawn` before it forks any rank: what each
rank's first operator call would otherwise work out for itself (the run helpers' layouts, parsed from
the extension's prototype table, and the operators' tensor names checked against them), worked out
once. Nothing here needs a backend; a failure is left for the rank to report, where the same call
raises it with its context."""

from __future__ import annotations

from contextlib import suppress

from . import combine, dispatch
from ._layout import LayoutMismatchError

with suppress(ImportError, LayoutMismatchError):
    for signature in (dispatch.SIGNATURE, combine.SIGNATURE):
        signature.layout  # noqa: B018 - a cached property, computed here once for every rank
