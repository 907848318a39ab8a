"""The benchmarks: host overhead per call and the mock's throughput, each measured side by side with a
baseline in the same run and reported as ratios (the README's performance tables are made from its
report by ``python -m benchmarks --markdown --update README.md``). They run from the root of a source
checkout after ``pip install .``, against the installed build, and are not part of the package
(docs/benchmarks.md).

Sections, one module each:

* :mod:`.host_overhead` — µs per dispatch / combine call with the mock's kernels skipped: a ctypes
  baseline, aclnn-py's per-call path and plans, and the C floors of both (:mod:`.c_floor`, a C loop
  over the same library functions, descriptors and executor);
* :mod:`.throughput` — one reference round against the memcpy floor and the numpy golden;
* :mod:`.scaling` — process worlds W = 2, 4, … up to ``--max-world`` (round time, memory), the first
  size that fails or would not fit reported as a row with the reason;
* :mod:`.thread_worlds` — one round with the ranks as threads of one process at the largest W of
  each SoC profile, checked against the golden;
* :mod:`.report` — the machine, the text summary, the markdown tables and the README update.

Medians over repeats with their spread; ``--json`` prints one JSON document.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_parser", "main", "run"]


def __getattr__(name: str) -> Any:
    # The command line is imported when asked for: every rank of a process world imports this package
    # to find its rank function, and the command line's imports would cost each rank tens of ms.
    if name in __all__:
        from . import cli

        return getattr(cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
