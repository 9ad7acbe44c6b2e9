"""``python -m harness``: see :mod:`harness.frontends.cli`."""

import sys

from harness.frontends.cli import main

sys.exit(main())
