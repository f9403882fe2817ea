"""``python -m beton``: the ``beton`` command."""

import sys

from beton.cli import main

sys.exit(main())
