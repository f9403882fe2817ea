"""The import path ``beton.bench.timing`` from before the package was reorganised; it lives in :mod:`beton.tools.bench.timing`."""

from beton.tools.bench.timing import *  # noqa: F401,F403
from beton.tools.bench.timing import __all__  # noqa: F401
