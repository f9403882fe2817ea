"""The import path ``beton.cli`` from before the package was reorganised; it lives in :mod:`beton.tools.cli`."""

from beton.tools.cli import *  # noqa: F401,F403
from beton.tools.cli import __all__  # noqa: F401
