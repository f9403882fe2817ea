"""``python -m beton``: the ``beton`` command."""

import sys

from beton.tools.cli import main

sys.exit(main())
