"""The import path ``beton.bench`` from before the package was reorganised; it lives in :mod:`beton.tools.bench`."""

from beton.tools.bench import *  # noqa: F401,F403
from beton.tools.bench import __all__  # noqa: F401
