"""``python -m aclnn_py``: the ``aclnn-py`` command line."""

from .cli import main

raise SystemExit(main())
