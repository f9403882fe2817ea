"""The import path ``beton.tune`` from before the package was reorganised; it lives in :mod:`beton.tools.tune`."""

from beton.tools.tune import *  # noqa: F401,F403
from beton.tools.tune import __all__  # noqa: F401
