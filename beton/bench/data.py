"""The import path ``beton.bench.data`` from before the package was reorganised; it lives in :mod:`beton.tools.bench.data`."""

from beton.tools.bench.data import *  # noqa: F401,F403
from beton.tools.bench.data import __all__  # noqa: F401
