"""``python -m harness``: see :mod:`harness._frontends.cli`."""

import sys

from harness._frontends.cli import main

sys.exit(main())
