"""Progress lines of long bench stages on stderr (stdout stays the report: text, JSON or markdown)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Prints ``[  12.3 s] stage: message`` lines to `stream` (stderr), or nothing when quiet."""

    def __init__(self, quiet: bool = False, stream: TextIO | None = None):
        self.quiet = quiet
        self._stream = stream
        self._t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        out = self._stream if self._stream is not None else sys.stderr
        print(f"[{time.perf_counter() - self._t0:7.1f} s] {message}", file=out, flush=True)


SILENT = Progress(quiet=True)
