"""``python -m mccl_opt.cli``."""

import sys

from . import main

sys.exit(main())
