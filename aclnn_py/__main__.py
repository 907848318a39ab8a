"""``python -m aclnn_py``: the ``aclnn-py`` command line."""

from .tools.cli import main

raise SystemExit(main())
