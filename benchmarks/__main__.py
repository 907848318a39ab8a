"""``python -m benchmarks`` from the root of a source checkout."""

import sys

from .cli import main

sys.exit(main())
