"""``python -m mccl_opt``: the ``mccl`` command line (an entry point, like the console script)."""

import sys

from mccl_opt.cli import main

sys.exit(main())
